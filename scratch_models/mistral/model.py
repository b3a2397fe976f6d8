"""Mistral (Jiang et al., 2023): Llama's model (scratch_models/llama/model.py) with grouped-query attention, no
biases, and a sliding window of `sliding_window` keys in every layer where config.json sets one: a query sees
itself and the sliding_window - 1 keys before it."""

from weight_mapping.mistral import MISTRAL

from ..decoding.decoder import CausalLM
from ..llama.model import LlamaModel
from .config import MistralConfig


class MistralModel(LlamaModel):
    config_class = MistralConfig
    mapping_table = MISTRAL


class MistralForCausalLM(CausalLM, MistralModel):
    """Mistral plus the language-model head (`lm_head`): logits over the vocabulary for the token after each
    position."""
