"""Llama (and the Llama-like families) in TransformerLens' names: its hook names, weights and config fields (see
scratch_models/lens/names.py).

TL's Llama is this model. Its `hook_q` and `hook_k` are the queries and keys before the rotary embedding (our
`attn.q_unrotated`, `attn.k_unrotated`), `hook_rot_q` and `hook_rot_k` the turned ones whose products are the scores
(our `attn.q`, `attn.k`); there is no `hook_pos_embed`. With grouped-query attention `hook_k`, `hook_v` and
`hook_rot_k` keep their n_kv key/value heads, [b, s, n_kv, d], as TL gives them by default
(`ungroup_grouped_query_attention=False`; TL's True repeats each key/value head for the query heads of its group, as
our `attn.scores` reads them); W_K, W_V, b_K and b_V likewise are [n_kv, h, d] and [n_kv, d]. The gated MLP's
`hook_pre` is the gate before its activation (gate_proj), `hook_pre_linear` the linear branch (up_proj), `hook_post`
the activated gate times that branch: what down_proj reads; W_gate, W_in and W_out are gate_proj, up_proj and
down_proj. The RMS norms have `hook_scale` and `hook_normalized` (the stream divided by its root mean square, before
the weight), and no bias.
"""

from ..lens.names import (HEADS, Alias, LensTable, Missing, attention_hooks, final_stream, layer_bias,
                          no_unembedding_bias, norm_statistics, projection_weights, resid_pre, turned_weight,
                          unembedding)

NO_ANGLES = ("the rotary angles are computed once per forward pass (the model's `positional`) and held at no hook "
             "point: model.rotary(position_ids, dtype) gives them (scratch_models.parts.rotary.RotaryEmbedding)")


def mid_stream(stream, layer: int) -> str:
    return stream.resid_mid(layer)


HOOKS = {
    "hook_embed": Alias("embeddings.word"),
    "blocks.{i}.hook_resid_pre": Alias(resid_pre),
    **norm_statistics("blocks.{i}.ln1", "layers.{i}.norm_1", resid_pre),
    "blocks.{i}.ln1.hook_out": Alias("layers.{i}.ln_1"),
    **attention_hooks(q="q_unrotated", k="k_unrotated"),
    "blocks.{i}.attn.hook_rot_q": Alias("layers.{i}.attn.q", HEADS),
    "blocks.{i}.attn.hook_rot_k": Alias("layers.{i}.attn.k", HEADS),
    "blocks.{i}.attn.hook_cos": Missing(NO_ANGLES),  # TransformerBridge's
    "blocks.{i}.attn.hook_sin": Missing(NO_ANGLES),
    "blocks.{i}.hook_resid_mid": Alias("layers.{i}.resid_mid"),
    **norm_statistics("blocks.{i}.ln2", "layers.{i}.norm_2", mid_stream),
    "blocks.{i}.ln2.hook_out": Alias("layers.{i}.ln_2"),
    "blocks.{i}.mlp.hook_pre": Alias("layers.{i}.mlp.pre_act"),
    "blocks.{i}.mlp.hook_pre_linear": Alias("layers.{i}.mlp.up"),
    "blocks.{i}.mlp.hook_post": Alias("layers.{i}.mlp.post_act"),
    "blocks.{i}.hook_mlp_out": Alias("layers.{i}.mlp.proj"),
    "blocks.{i}.hook_resid_post": Alias("layers.{i}.out"),
    **norm_statistics("ln_final", "norm_f", final_stream),
    "ln_final.hook_out": Alias("ln_f"),
    "hook_unembed": Alias("logits"),
}


WEIGHTS = {
    "embed.W_E": lambda model, _: model.embeddings.embed_tokens.weight,
    "blocks.{i}.ln1.w": lambda model, layer: model.layers[layer].norm_1.weight,
    **projection_weights(),
    "blocks.{i}.ln2.w": lambda model, layer: model.layers[layer].norm_2.weight,
    "blocks.{i}.mlp.W_gate": turned_weight("mlp.gate_proj"),
    "blocks.{i}.mlp.b_gate": layer_bias("mlp.gate_proj"),
    "blocks.{i}.mlp.W_in": turned_weight("mlp.up_proj"),
    "blocks.{i}.mlp.b_in": layer_bias("mlp.up_proj"),
    "blocks.{i}.mlp.W_out": turned_weight("mlp.down_proj"),
    "blocks.{i}.mlp.b_out": layer_bias("mlp.down_proj"),
    "ln_final.w": lambda model, _: model.norm_f.weight,
    "unembed.W_U": unembedding,
    "unembed.b_U": no_unembedding_bias,
}


def config(config) -> dict:
    return dict(n_layers=config.num_hidden_layers, d_model=config.hidden_size, n_heads=config.num_attention_heads,
                d_head=config.head_dim, d_mlp=config.intermediate_size, d_vocab=config.vocab_size,
                n_ctx=config.max_position_embeddings, act_fn=config.hidden_act, eps=config.rms_norm_eps,
                normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=config.head_dim,
                rotary_base=config.rope_theta, n_key_value_heads=config.num_key_value_heads, gated_mlp=True,
                final_rms=True, tie_word_embeddings=config.tie_word_embeddings)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
