"""Qwen3's config.json fields: Qwen 2's (its sliding window included) with Qwen 3's defaults, attention_bias, and
the per-head norms of queries and keys."""

import dataclasses

from ..llama.config import BiasedByAttentionBias
from ..qwen2.config import Qwen2Config


@dataclasses.dataclass(frozen=True)
class Qwen3Config(BiasedByAttentionBias, Qwen2Config):
    """The dense Qwen 3 checkpoints as transformers' Qwen3Config reads them: an RMSNorm over each head's queries and
    one over its keys before the rotation (q_norm, k_norm: always there), head_dim given (128 in every release, not
    hidden / heads), and biases on q_proj, k_proj, v_proj and o_proj only where attention_bias says so (never in
    the releases)."""

    model_type = "qwen3"

    head_dim: int | None = 128
    attention_bias: bool = False

    qk_norm = True
