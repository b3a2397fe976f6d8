"""Sparse dictionaries (SAEs) on our models: the formulas (sae.py), the published formats (loading.py), splicing them
in as hook points (splice.py), and, above them, what their features do over a corpus (features.py) and for one
prompt (attribution.py).

    from scratch_models.dictionaries import SAE
    sae = SAE.from_pretrained("jbloom/GPT2-Small-SAEs-Reformatted", "blocks.8.hook_resid_pre")
    model.attach(sae)                                   # model.detach(sae) takes it out again
    out, cache = model.run_with_cache(**batch)
    cache["layers.7.out.sae.acts"]                      # or cache["blocks.8.hook_resid_pre.hook_sae_acts_post"]
"""

from .config import DictionaryError, SAEConfig
from .sae import ARCHITECTURES, SAE, GatedSAE, JumpReLUSAE, StandardSAE, TopKSAE, build, load
from .splice import DictionaryMixin, Splice, resolve_hook

__all__ = ["ARCHITECTURES", "SAE", "DictionaryError", "DictionaryMixin", "GatedSAE", "JumpReLUSAE", "SAEConfig",
           "Splice", "StandardSAE", "TopKSAE", "build", "load", "resolve_hook"]
