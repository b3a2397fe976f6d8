"""The Qwen3 family (the dense Qwen 3 checkpoints): Llama's table (weight_mapping/llama.py) and the two norms of each
layer's attention, q_norm and k_norm, over each head's queries and keys before the rotation."""

import dataclasses

from .llama import LLAMA
from .table import WEIGHT, Row

QK_NORMS = (
    Row("layers.{i}.self_attn.q_norm", "layers.{i}.attn.q_norm", WEIGHT),  # [d]: one weight shared by every head
    Row("layers.{i}.self_attn.k_norm", "layers.{i}.attn.k_norm", WEIGHT),
)

_after = next(n for n, row in enumerate(LLAMA.rows) if row.checkpoint == "layers.{i}.self_attn.v_proj") + 1
QWEN3 = dataclasses.replace(LLAMA, family="qwen3", rows=(*LLAMA.rows[:_after], *QK_NORMS, *LLAMA.rows[_after:]))
