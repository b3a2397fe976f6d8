"""Gemma 3 in TransformerLens' names: Gemma 2's (scratch_models/gemma2/transformer_lens.py) and the norms of each
head's queries and keys.

TL's Gemma 3 (its TransformerBridge) is this model. As in Gemma 2, `hook_embed` is the scaled embedding, `ln1_post`
and `ln2_post` are the norms each sublayer's output passes before `hook_attn_out` / `hook_mlp_out`, and the norm
weights are stored as w and applied as 1 + w (`cfg.rmsnorm_uses_offset`). `hook_q` and `hook_k` are the queries and
keys as q_proj and k_proj give them, before their norms (our `attn.q_unnormalized`, `attn.k_unnormalized`);
`attn.q_norm` and `attn.k_norm` have their `hook_scale`, `hook_normalized` and `hook_out`, the same tensor as
`hook_q_normed` / `hook_k_normed` (our `attn.q_unrotated`, the normalised queries before the rotation), and their
weights `w`; `hook_rot_q` and `hook_rot_k` are the turned
ones, by the local or the global rotary angles as the layer's kind says. No score is capped; `hook_unembed` is the
LM head's scores (our `uncapped_logits`). The config's `rotary_base` is the global layers' base (rope_theta) and
`rotary_base_local` the local layers' (rope_local_base_freq); TL 4.3's bridge reads neither and keeps its default
10000; `use_qk_norm` is true.
"""

from ..gemma2 import transformer_lens as gemma2
from ..lens.names import HEADS, Alias, LensTable, Missing, norm_statistics

NO_ANGLES = ("the rotary angles are computed once per forward pass for each kind of layer (Gemma3TextModel."
             "positional) and held at no hook point: model.rotary (global layers) and model.rotary_local (local "
             "layers), called with (position_ids, dtype), give them (scratch_models.parts.rotary.RotaryEmbedding)")

HOOKS = {**gemma2.HOOKS,
         **{name: Missing(NO_ANGLES) for name, alias in gemma2.HOOKS.items() if isinstance(alias, Missing)},
         "blocks.{i}.attn.hook_q": Alias("layers.{i}.attn.q_unnormalized", HEADS),
         "blocks.{i}.attn.hook_k": Alias("layers.{i}.attn.k_unnormalized", HEADS),
         **norm_statistics("blocks.{i}.attn.q_norm", "layers.{i}.attn.q_norm", "layers.{i}.attn.q_unnormalized"),
         "blocks.{i}.attn.q_norm.hook_out": Alias("layers.{i}.attn.q_unrotated"),
         "blocks.{i}.attn.hook_q_normed": Alias("layers.{i}.attn.q_unrotated"),
         **norm_statistics("blocks.{i}.attn.k_norm", "layers.{i}.attn.k_norm", "layers.{i}.attn.k_unnormalized"),
         "blocks.{i}.attn.k_norm.hook_out": Alias("layers.{i}.attn.k_unrotated"),
         "blocks.{i}.attn.hook_k_normed": Alias("layers.{i}.attn.k_unrotated")}

WEIGHTS = {**gemma2.WEIGHTS,
           "blocks.{i}.attn.q_norm.w": lambda model, layer: model.layers[layer].attn.q_norm.weight,
           "blocks.{i}.attn.k_norm.w": lambda model, layer: model.layers[layer].attn.k_norm.weight}


def config(config) -> dict:
    # no score is capped: TL's "off" value, -1, as the bridge gives it
    return gemma2.config(config) | dict(attn_scores_soft_cap=-1.0, rotary_base_local=config.rope_local_base_freq,
                                        use_qk_norm=True)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
