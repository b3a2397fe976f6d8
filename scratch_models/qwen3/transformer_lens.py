"""Qwen 3 in TransformerLens' names: Llama's (scratch_models/llama/transformer_lens.py) and the norms of each head's
queries and keys.

In Qwen 3, TL's `hook_q` and `hook_k` are the queries and keys as q_proj and k_proj give them, before their norms
(our `attn.q_unnormalized`, `attn.k_unnormalized`); `hook_q_normed` and `hook_k_normed` are the normalised ones
before the rotation (our `attn.q_unrotated`, `attn.k_unrotated`, in TL's layout already, [b, n, s, d]); `attn.q_norm`
and `attn.k_norm` have their `hook_scale` and `hook_normalized`, [b, n, s, ...] as in TL, and their weights `w`.
"""

from ..lens.names import HEADS, Alias, LensTable, norm_statistics
from ..llama import transformer_lens as llama

HOOKS = {**llama.HOOKS,
         "blocks.{i}.attn.hook_q": Alias("layers.{i}.attn.q_unnormalized", HEADS),
         "blocks.{i}.attn.hook_k": Alias("layers.{i}.attn.k_unnormalized", HEADS),
         **norm_statistics("blocks.{i}.attn.q_norm", "layers.{i}.attn.q_norm", "layers.{i}.attn.q_unnormalized"),
         "blocks.{i}.attn.hook_q_normed": Alias("layers.{i}.attn.q_unrotated"),
         **norm_statistics("blocks.{i}.attn.k_norm", "layers.{i}.attn.k_norm", "layers.{i}.attn.k_unnormalized"),
         "blocks.{i}.attn.hook_k_normed": Alias("layers.{i}.attn.k_unrotated")}

WEIGHTS = {**llama.WEIGHTS,
           "blocks.{i}.attn.q_norm.w": lambda model, layer: model.layers[layer].attn.q_norm.weight,
           "blocks.{i}.attn.k_norm.w": lambda model, layer: model.layers[layer].attn.k_norm.weight}

# TL 4.3's bridge gives Qwen 3 text no BOS by default (its Qwen3 adapter), unlike Llama's
TABLE = LensTable(HOOKS, WEIGHTS, llama.config,
                  summary=llama.TABLE.summary + "\n\n" + __doc__.split("\n\n", 1)[1].strip(), prepend_bos=False)
