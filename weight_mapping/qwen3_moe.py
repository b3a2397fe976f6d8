"""The Qwen3-MoE family: Qwen 3's table (weight_mapping/qwen3.py) with a mixture of experts beside the gated MLP,
each layer holding one or the other as config.json says (decoder_sparse_step, mlp_only_layers): the router
`mlp.gate` and per expert `mlp.experts.{e}.gate_proj`, `up_proj`, `down_proj`, as the released files name them."""

from .moe import expert_rows, router_rows, with_experts
from .qwen3 import QWEN3

QWEN3_MOE = with_experts(QWEN3, "qwen3_moe", (
    *router_rows("layers.{i}.mlp.gate"),
    *expert_rows("layers.{i}.mlp.experts", gate="gate_proj", up="up_proj", down="down_proj"),
), experts_field="num_experts", keep_dense=True)
