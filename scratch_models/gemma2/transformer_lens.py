"""Gemma 2 in TransformerLens' names: its hook names, weights and config fields (see scratch_models/lens/names.py).

TL's Gemma 2 is this model. Its `hook_embed` is the stream layer 0 reads, the token embeddings already times
sqrt(hidden) (our `embeddings.out`; `W_E` is the table as stored). `hook_q` and `hook_k` are the queries and keys
before the rotary embedding, `hook_rot_q` and `hook_rot_k` the turned ones; `hook_k` and `hook_v` keep their n_kv
key/value heads, [b, s, n_kv, d] (TL's `ungroup_grouped_query_attention=False`, its default), and so do `W_K`, `W_V`
[n_kv, h, d]. Each sublayer's output passes a norm of its own before it joins the stream: `ln1_post` and
`ln2_post`, and `hook_attn_out` / `hook_mlp_out` are after them (what the stream adds). `hook_unembed` is the LM
head's scores before the final soft cap (our `uncapped_logits`); the logits a call returns are capped. The norms'
weights are stored as w and applied as 1 + w (`cfg.rmsnorm_uses_offset`); `ln1.w` is w, as TL's bridge reads it.
"""

from ..lens.names import (HEADS, Alias, LensTable, Missing, attention_hooks, final_stream, layer_bias,
                          no_unembedding_bias, norm_statistics, projection_weights, resid_pre, turned_weight,
                          unembedding)

NO_ANGLES = ("the rotary angles are computed once per forward pass (Gemma2Model.positional) and held at no hook "
             "point: model.rotary(position_ids, dtype) gives them (scratch_models.parts.rotary.RotaryEmbedding)")


HOOKS = {
    "hook_embed": Alias("embeddings.out"),
    "blocks.{i}.hook_resid_pre": Alias(resid_pre),
    **norm_statistics("blocks.{i}.ln1", "layers.{i}.norm_1", resid_pre),
    "blocks.{i}.ln1.hook_out": Alias("layers.{i}.ln_1"),
    **attention_hooks(q="q_unrotated", k="k_unrotated"),
    "blocks.{i}.attn.hook_rot_q": Alias("layers.{i}.attn.q", HEADS),
    "blocks.{i}.attn.hook_rot_k": Alias("layers.{i}.attn.k", HEADS),
    "blocks.{i}.attn.hook_cos": Missing(NO_ANGLES),  # TransformerBridge's
    "blocks.{i}.attn.hook_sin": Missing(NO_ANGLES),
    "rotary_emb.hook_cos": Missing(NO_ANGLES),
    "rotary_emb.hook_sin": Missing(NO_ANGLES),
    "blocks.{i}.attn.hook_out": Alias("layers.{i}.attn.proj"),  # the bridge's, before ln1_post
    **norm_statistics("blocks.{i}.ln1_post", "layers.{i}.post_attn_norm", "layers.{i}.attn.proj"),
    "blocks.{i}.ln1_post.hook_out": Alias("layers.{i}.attn_out"),
    "blocks.{i}.hook_attn_out": Alias("layers.{i}.attn_out"),
    "blocks.{i}.hook_resid_mid": Alias("layers.{i}.resid_mid"),
    **norm_statistics("blocks.{i}.ln2", "layers.{i}.norm_2", "layers.{i}.resid_mid"),
    "blocks.{i}.ln2.hook_out": Alias("layers.{i}.ln_2"),
    "blocks.{i}.mlp.hook_pre": Alias("layers.{i}.mlp.pre_act"),
    "blocks.{i}.mlp.hook_pre_linear": Alias("layers.{i}.mlp.up"),
    "blocks.{i}.mlp.hook_post": Alias("layers.{i}.mlp.post_act"),
    "blocks.{i}.mlp.hook_out": Alias("layers.{i}.mlp.proj"),  # the bridge's, before ln2_post
    **norm_statistics("blocks.{i}.ln2_post", "layers.{i}.post_mlp_norm", "layers.{i}.mlp.proj"),
    "blocks.{i}.ln2_post.hook_out": Alias("layers.{i}.mlp_out"),
    "blocks.{i}.hook_mlp_out": Alias("layers.{i}.mlp_out"),
    "blocks.{i}.hook_resid_post": Alias("layers.{i}.out"),
    **norm_statistics("ln_final", "norm_f", final_stream),
    "ln_final.hook_out": Alias("ln_f"),
    "hook_unembed": Alias("uncapped_logits"),
}


def _norm(name: str):
    return lambda model, layer: getattr(model.layers[layer], name).weight


WEIGHTS = {
    "embed.W_E": lambda model, _: model.embeddings.embed_tokens.weight,
    "blocks.{i}.ln1.w": _norm("norm_1"),
    "blocks.{i}.ln1_post.w": _norm("post_attn_norm"),
    **projection_weights(),
    "blocks.{i}.ln2.w": _norm("norm_2"),
    "blocks.{i}.ln2_post.w": _norm("post_mlp_norm"),
    "blocks.{i}.mlp.W_gate": turned_weight("mlp.gate_proj"),
    "blocks.{i}.mlp.W_in": turned_weight("mlp.up_proj"),
    "blocks.{i}.mlp.W_out": turned_weight("mlp.down_proj"),
    "blocks.{i}.mlp.b_in": layer_bias("mlp.up_proj"),
    "blocks.{i}.mlp.b_out": layer_bias("mlp.down_proj"),
    "ln_final.w": lambda model, _: model.norm_f.weight,
    "unembed.W_U": unembedding,
    "unembed.b_U": no_unembedding_bias,
}


def config(config) -> dict:
    return dict(n_layers=config.num_hidden_layers, d_model=config.hidden_size, n_heads=config.num_attention_heads,
                d_head=config.head_dim, d_mlp=config.intermediate_size, d_vocab=config.vocab_size,
                n_ctx=config.max_position_embeddings, act_fn=config.hidden_activation, eps=config.rms_norm_eps,
                normalization_type="RMS", final_rms=True, gated_mlp=True, n_key_value_heads=config.num_key_value_heads,
                positional_embedding_type="rotary", rotary_dim=config.head_dim, rotary_base=config.rope_theta,
                tie_word_embeddings=config.tie_word_embeddings, attn_scores_soft_cap=config.attn_logit_softcapping,
                output_logits_soft_cap=config.final_logit_softcapping, rmsnorm_uses_offset=True,
                uses_rms_norm=True, attn_scale=config.query_pre_attn_scalar ** 0.5,
                layer_types=list(config.layer_types), window_size=config.sliding_window)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
