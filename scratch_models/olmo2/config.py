"""OLMo 2's config.json fields (OLMo-2-0425-1B, 1124-7B, 13B, 0325-32B and their -Instruct versions): the Llama-like
fields (scratch_models/llama/config.py) with transformers' Olmo2Config defaults. OLMo 2 has no head_dim field: a
head is hidden / heads wide."""

import dataclasses

from ..llama.config import BiasedByAttentionBias, LlamaLikeConfig


@dataclasses.dataclass(frozen=True)
class Olmo2Config(BiasedByAttentionBias, LlamaLikeConfig):
    model_type = "olmo2"

    vocab_size: int = 50304
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False  # q_proj, k_proj, v_proj and o_proj add a bias
    pad_token_id: int | None = 1
    bos_token_id: int | None = None
    eos_token_id: int | list | None = 50279
    tie_word_embeddings: bool = False
