"""Pictures and pages of what the models and the analysis compute: attention maps (PNG and a self-contained page that
opens offline), the logit lens, head importance and patching. The pages' markup, style and scripts are package data
in static/, filled in by small renderers here; nothing here computes a model."""
