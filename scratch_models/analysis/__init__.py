"""Analysis, a layer above the models: it reads their hook points and weights, and the models know nothing of it.

    out, cache = model.run_with_cache(input_ids, attention_mask=mask)   # an ActivationCache
    cache.stack("layers.*.attn.probs")                                 # [layers, b, n, s, s]
    cache.accumulated_resid(apply_ln=True, return_labels=True)         # the residual stream after each layer
    cache.decompose_resid()                                            # components that sum to the residual
    cache.logit_lens()                                                 # each layer's stream read as logits

The helpers keep TransformerLens' names and meanings where one exists; `docs/hook_names.md` lists them.
"""

from ..hooking.activation_cache import ActivationCache
from .lens import LensTable, lens_table

__all__ = ["ActivationCache", "LensTable", "lens_table"]
