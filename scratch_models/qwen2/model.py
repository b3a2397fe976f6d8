"""Qwen 2 (Yang et al., 2024): Llama's model (scratch_models/llama/model.py) with biases on q_proj, k_proj and
v_proj, and, where config.json asks for one, a sliding window in the layers its layer_types name."""

from weight_mapping.qwen2 import QWEN2

from ..decoding.decoder import CausalLM
from ..llama.model import LlamaModel
from .config import Qwen2Config


class Qwen2Model(LlamaModel):
    config_class = Qwen2Config
    mapping_table = QWEN2


class Qwen2ForCausalLM(CausalLM, Qwen2Model):
    """Qwen 2 plus the language-model head (`lm_head`, tied to embed_tokens in the small checkpoints): logits over
    the vocabulary for the token after each position."""
