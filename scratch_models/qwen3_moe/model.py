"""Qwen3-MoE (Yang et al., 2025): Qwen 3's model (scratch_models/llama/model.py with q and k norms) whose MLPs are
sparse mixtures of experts (parts/moe.py), except in the layers config.json keeps dense:

    each layer:  x = x + Attention(RMSNorm1(x));  x = x + MoE(RMSNorm2(x))    (or the gated MLP, mlp_only_layers)
    MoE(x)     = Σ over the 8 (num_experts_per_tok) best of the 128 (num_experts) experts of
                 softmax(gate(x)) (renormalised over those 8 where norm_topk_prob) · SwiGLU_e(x)
"""

from torch import nn

from weight_mapping.qwen3_moe import QWEN3_MOE

from ..decoding.decoder import CausalLM
from ..llama.model import LlamaDecoderLayer, LlamaModel
from ..parts.moe import SparseMoeBlock
from .config import Qwen3MoeConfig


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    """Qwen 3's layer with a mixture of experts as its MLP where config.json makes the layer sparse."""

    @staticmethod
    def feed_forward(config: Qwen3MoeConfig, layer_idx: int) -> nn.Module:
        if not config.sparse_layers[layer_idx]:
            return LlamaDecoderLayer.feed_forward(config, layer_idx)
        return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                              config.num_experts_per_tok, config.hidden_act, renormalize=config.norm_topk_prob,
                              float32_weights=False)


class Qwen3MoeModel(LlamaModel):
    config_class = Qwen3MoeConfig
    mapping_table = QWEN3_MOE
    layer_class = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(CausalLM, Qwen3MoeModel):
    """Qwen3-MoE plus the language-model head (`lm_head`): logits over the vocabulary for the token after each
    position."""
