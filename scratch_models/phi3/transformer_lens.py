"""Phi-3 in TransformerLens' names: its hook names, weights and config fields (see scratch_models/lens/names.py).

TL's Phi-3 (its TransformerBridge) is Llama's names over Phi-3's fused projections, which TL splits: `hook_q`,
`hook_k` and `hook_v` are the parts of qkv_proj's output (our `attn.q_unrotated`, `attn.k_unrotated`, `attn.v`),
before the rotary embedding, and `hook_rot_q`, `hook_rot_k` the turned ones (our `attn.q`, `attn.k`: only their first
rotary_dim dimensions turn, TL's `rotary_dim`). W_Q, W_K and W_V are the blocks of qkv_proj's rows, each split per
head ([n, h, d], [n_kv, h, d]); W_gate and W_in the two halves of gate_up_proj, [h, m] each; `mlp.hook_pre` the gate,
`mlp.hook_pre_linear` the linear branch, `mlp.hook_post` their product. Everything else reads as on Llama.
Checked against TL 4.3's bridge (tests/analysis/test_phi3_transformer_lens.py): the same tensors within the
tolerance, not bitwise (the bridge multiplies by the split matrices, which round otherwise than the fused ones
transformers multiplies by); the bridge lists `hook_rot_q` and `hook_rot_k` but never calls them on Phi-3, and leaves
its config's `rotary_dim` unset, where ours is HookedTransformer's meaning, the dimensions turned.
"""

from ..lens.names import LensTable, heads_out, turned_weight
from ..llama import transformer_lens as llama


def _qkv_block(which: int):
    """W_Q (which 0) [n, h, d], W_K (1) or W_V (2) [n_kv, h, d]: a block of qkv_proj's rows, split per head and
    turned; a view of the parameter."""
    def weight(model, layer: int):
        attn = model.layers[layer].attn
        sizes = (attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim)
        block = attn.qkv_proj.weight.split(sizes)[which]
        return block.unflatten(0, (-1, attn.head_dim)).transpose(-1, -2)
    return weight


def _qkv_bias(which: int):
    """b_Q [n, d], b_K / b_V [n_kv, d]: zeros, as TL gives them (no Phi-3 projection has a bias)."""
    def bias(model, layer: int):
        q_k_or_v = _qkv_block(which)(model, layer)
        return q_k_or_v.new_zeros(q_k_or_v.shape[0], q_k_or_v.shape[-1])
    return bias


def _gate_up_half(which: int):
    """W_gate (which 0) or W_in (1) [h, m]: a half of gate_up_proj's rows, turned; a view of the parameter."""
    return lambda model, layer: model.layers[layer].mlp.gate_up_proj.weight.chunk(2)[which].T


def _zeros_out(model, layer: int):
    return model.layers[layer].attn.o_proj.weight.new_zeros(model.config.hidden_size)


def _zeros_mlp(model, layer: int):
    return model.layers[layer].mlp.down_proj.weight.new_zeros(model.config.intermediate_size)


WEIGHTS = {
    **{name: weight for name, weight in llama.WEIGHTS.items() if ".attn." not in name and ".mlp." not in name},
    **{f"blocks.{{i}}.attn.W_{x}": _qkv_block(which) for which, x in enumerate("QKV")},
    **{f"blocks.{{i}}.attn.b_{x}": _qkv_bias(which) for which, x in enumerate("QKV")},
    "blocks.{i}.attn.W_O": heads_out,
    "blocks.{i}.attn.b_O": _zeros_out,
    "blocks.{i}.mlp.W_gate": _gate_up_half(0),
    "blocks.{i}.mlp.b_gate": _zeros_mlp,
    "blocks.{i}.mlp.W_in": _gate_up_half(1),
    "blocks.{i}.mlp.b_in": _zeros_mlp,
    "blocks.{i}.mlp.W_out": turned_weight("mlp.down_proj"),
    "blocks.{i}.mlp.b_out": lambda model, layer: model.layers[layer].mlp.down_proj.weight.new_zeros(
        model.config.hidden_size),
}


def config(config) -> dict:
    return llama.config(config) | dict(rotary_dim=config.rotary_dim)


TABLE = LensTable(llama.HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
