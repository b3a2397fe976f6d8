"""Qwen 3 (Yang et al., 2025), the dense models: Llama's model (scratch_models/llama/model.py) with an RMSNorm over
each head's queries and over its keys (q_norm, k_norm, over the head's d dimensions) before the rotary embedding,
and Qwen 2's sliding window where config.json asks for one."""

from weight_mapping.qwen3 import QWEN3

from ..decoding.decoder import CausalLM
from ..llama.model import LlamaModel
from .config import Qwen3Config


class Qwen3Model(LlamaModel):
    config_class = Qwen3Config
    mapping_table = QWEN3


class Qwen3ForCausalLM(CausalLM, Qwen3Model):
    """Qwen 3 plus the language-model head (`lm_head`, tied to embed_tokens in the small checkpoints): logits over
    the vocabulary for the token after each position."""
