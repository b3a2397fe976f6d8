"""Readable, from-scratch PyTorch models of every registered transformer family (FAMILIES) that load real Hugging
Face checkpoints and can be looked inside: {families}.

    from scratch_models import BertModel
    model = BertModel.from_pretrained("bert-base-uncased")
    out, cache = model.run_with_cache(input_ids, names=["layers.3.attn.probs"])

Each family is a package (scratch_models.bert, scratch_models.gpt2, ...) registered by its name in
scratch_models.registry.known; its classes and config are exported here. This package does not import transformers;
only the parity report, the command line and the tests do.
"""

from .lens.names import get_act_name
from .parts.config import ConfigError
from .registry.families import FAMILIES
from .registry.tokenizer import Tokenizer
from weight_mapping import CheckpointError

if __doc__:  # the registry's families, so the line is never stale (python -OO strips docstrings)
    __doc__ = __doc__.replace("{families}", ", ".join(family.title for family in FAMILIES.values()))
_exported = {cls.__name__: cls for family in FAMILIES.values() for cls in (family.config_class, *family.classes)}
globals().update(_exported)

__all__ = sorted(["CheckpointError", "ConfigError", "FAMILIES", "Tokenizer", "get_act_name", *_exported])
