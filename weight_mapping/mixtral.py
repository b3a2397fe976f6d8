"""The Mixtral family: Mistral's table (weight_mapping/mistral.py) with a mixture of experts in place of each
layer's MLP, under the name the released files use, `block_sparse_moe` (transformers 5's modules call it `mlp`):
the router `gate` and per expert w1 (the gate), w3 (the linear branch) and w2 (down)."""

from .mistral import MISTRAL
from .moe import expert_rows, router_rows, with_experts

MIXTRAL = with_experts(MISTRAL, "mixtral", (
    *router_rows("layers.{i}.block_sparse_moe.gate"),
    *expert_rows("layers.{i}.block_sparse_moe.experts", gate="w1", up="w3", down="w2"),
), experts_field="num_local_experts")
