"""Mixtral (Jiang et al., 2024, "Mixtral of Experts"): Mistral's model (scratch_models/llama/model.py) whose every
MLP is a sparse mixture of experts (parts/moe.py):

    each layer:  x = x + Attention(RMSNorm1(x));  x = x + MoE(RMSNorm2(x))
    MoE(x)     = Σ over the 2 (num_experts_per_tok) best of the 8 (num_local_experts) experts of
                 softmax(gate(x)) renormalised over those two · SwiGLU_e(x)
"""

from weight_mapping.mixtral import MIXTRAL

from ..decoding.decoder import CausalLM
from ..llama.model import LlamaDecoderLayer, LlamaModel
from ..parts.moe import SparseMoeBlock
from .config import MixtralConfig


class MixtralDecoderLayer(LlamaDecoderLayer):
    """Mistral's layer with a mixture of experts in place of its MLP (transformers' `block_sparse_moe`, named `mlp`
    in transformers 5's modules and in ours)."""

    @staticmethod
    def feed_forward(config: MixtralConfig, layer_idx: int) -> SparseMoeBlock:
        return SparseMoeBlock(config.hidden_size, config.intermediate_size, config.num_local_experts,
                              config.num_experts_per_tok, config.hidden_act, renormalize=True, float32_weights=True,
                              jitter=config.router_jitter_noise)


class MixtralModel(LlamaModel):
    config_class = MixtralConfig
    mapping_table = MIXTRAL
    layer_class = MixtralDecoderLayer


class MixtralForCausalLM(CausalLM, MixtralModel):
    """Mixtral plus the language-model head (`lm_head`): logits over the vocabulary for the token after each
    position."""
