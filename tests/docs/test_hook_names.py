"""docs/hook_names.md: what it says of a model holds for a model of any depth, not only of the tiny config the page is
generated from."""

import re

from scratch_models.registry.families import FAMILIES
from scratch_models_docs.hook_names import hook_names_markdown


def test_a_name_read_from_the_last_layer_is_written_for_any_depth():
    """A name outside the layers never maps to a numbered layer of the config the page was generated from (the tiny
    config's `layers.1.out` once leaked there); TransformerLens' ln_final.hook_scale is the final norm's own point."""
    page = hook_names_markdown()
    assert not re.search(r"^\| `(?![^`]*\{i\})[^`]*` \| `layers\.\d+\.", page, re.M), \
        "a name outside the layers is mapped to a numbered layer"
    lens_families = [family for family in FAMILIES.values() if family.transformer_lens is not None
                     and not family.stream.post_ln]
    assert lens_families
    for family in lens_families:
        section = page.split(f"### {family.title} in TransformerLens' names")[1].split("\n## ")[0]
        assert re.search(r"^\| `ln_final\.hook_scale` \| `[a-z_.]*\.scale` \|", section, re.M), family.title
