"""Readable, from-scratch BERT and GPT-2 that load real Hugging Face checkpoints and can be looked inside.

    from scratch_models import BertModel
    model = BertModel.from_pretrained("bert-base-uncased")
    out, cache = model.run_with_cache(input_ids, names=["layers.3.attn.probs"])

This package does not import transformers; only the parity report, the command line and the tests do.
"""

from .bert import BertForMaskedLM, BertModel
from .config import BertConfig, ConfigError, GPT2Config
from .gpt2 import GPT2LMHeadModel, GPT2Model
from weight_mapping import CheckpointError

__all__ = ["BertConfig", "BertForMaskedLM", "BertModel", "CheckpointError", "ConfigError", "GPT2Config",
           "GPT2LMHeadModel", "GPT2Model"]
