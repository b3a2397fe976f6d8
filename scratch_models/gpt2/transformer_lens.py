"""GPT-2 in TransformerLens' names: its hook names, weights and config fields (see scratch_models/lens/names.py).

TL's GPT-2 is this model: pre-LN, so every TL name has a tensor of ours. The LayerNorms' `hook_scale` and
`hook_normalized` are their opt-in `scale` and `normalized` hook points, real forwards and backwards. Weights are views of our parameters where TL's shape allows, laid out as TL lays them:
W_Q [n, h, d] per block, [layers, n, h, d] on the model.
"""

from ..lens.names import (BATCH, Alias, LensTable, attention_hooks, final_stream, heads_out, no_unembedding_bias,
                          norm_statistics, resid_pre, unembedding)

HOOKS = {
    "hook_embed": Alias("embeddings.word"),
    "hook_pos_embed": Alias("embeddings.position", BATCH),
    "blocks.{i}.hook_resid_pre": Alias(resid_pre),
    **norm_statistics("blocks.{i}.ln1", "layers.{i}.norm_1", resid_pre),
    "blocks.{i}.ln1.hook_out": Alias("layers.{i}.ln_1"),
    **attention_hooks(),
    "blocks.{i}.hook_resid_mid": Alias("layers.{i}.resid_mid"),
    **norm_statistics("blocks.{i}.ln2", "layers.{i}.norm_2", "layers.{i}.resid_mid"),
    "blocks.{i}.ln2.hook_out": Alias("layers.{i}.ln_2"),
    "blocks.{i}.mlp.hook_pre": Alias("layers.{i}.mlp.pre_act"),
    "blocks.{i}.mlp.hook_post": Alias("layers.{i}.mlp.post_act"),
    "blocks.{i}.hook_mlp_out": Alias("layers.{i}.mlp.proj"),
    "blocks.{i}.hook_resid_post": Alias("layers.{i}.out"),
    **norm_statistics("ln_final", "norm_f", final_stream),
    "ln_final.hook_out": Alias("ln_f"),
    "hook_unembed": Alias("logits"),
}


def _attn(model, layer):
    return model.layers[layer].attn


def _qkv(which: int):
    """W_Q, W_K or W_V [n, h, d]: c_attn's weight [h, 3h] holds q, k and v side by side, columns head by head."""
    def weight(model, layer):
        attn = _attn(model, layer)
        h = attn.c_attn.weight.shape[0]
        return attn.c_attn.weight[:, which * h:(which + 1) * h].unflatten(1, (attn.num_heads, -1)).transpose(0, 1)
    return weight


def _qkv_bias(which: int):
    def bias(model, layer):
        attn = _attn(model, layer)
        h = attn.c_attn.weight.shape[0]
        return attn.c_attn.bias[which * h:(which + 1) * h].unflatten(0, (attn.num_heads, -1))
    return bias


WEIGHTS = {
    "embed.W_E": lambda model, _: model.embeddings.wte.weight,
    "pos_embed.W_pos": lambda model, _: model.embeddings.wpe.weight,
    "blocks.{i}.ln1.w": lambda model, layer: model.layers[layer].norm_1.weight,
    "blocks.{i}.ln1.b": lambda model, layer: model.layers[layer].norm_1.bias,
    "blocks.{i}.attn.W_Q": _qkv(0),
    "blocks.{i}.attn.W_K": _qkv(1),
    "blocks.{i}.attn.W_V": _qkv(2),
    "blocks.{i}.attn.b_Q": _qkv_bias(0),
    "blocks.{i}.attn.b_K": _qkv_bias(1),
    "blocks.{i}.attn.b_V": _qkv_bias(2),
    "blocks.{i}.attn.W_O": heads_out,
    "blocks.{i}.attn.b_O": lambda model, layer: _attn(model, layer).c_proj.bias,
    "blocks.{i}.ln2.w": lambda model, layer: model.layers[layer].norm_2.weight,
    "blocks.{i}.ln2.b": lambda model, layer: model.layers[layer].norm_2.bias,
    "blocks.{i}.mlp.W_in": lambda model, layer: model.layers[layer].mlp.c_fc.weight,
    "blocks.{i}.mlp.b_in": lambda model, layer: model.layers[layer].mlp.c_fc.bias,
    "blocks.{i}.mlp.W_out": lambda model, layer: model.layers[layer].mlp.c_proj.weight,
    "blocks.{i}.mlp.b_out": lambda model, layer: model.layers[layer].mlp.c_proj.bias,
    "ln_final.w": lambda model, _: model.norm_f.weight,
    "ln_final.b": lambda model, _: model.norm_f.bias,
    "unembed.W_U": unembedding,
    "unembed.b_U": no_unembedding_bias,
}


def config(config) -> dict:
    return dict(n_layers=config.n_layer, d_model=config.n_embd, n_heads=config.n_head, d_head=config.head_dim,
                d_mlp=config.inner_dim, d_vocab=config.vocab_size, n_ctx=config.n_positions,
                act_fn=config.activation_function, eps=config.layer_norm_epsilon,
                scale_attn_by_inverse_layer_idx=config.scale_attn_by_inverse_layer_idx,
                use_attn_scale=config.scale_attn_weights, tie_word_embeddings=config.tie_word_embeddings)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary="""GPT-2 is TransformerLens' own model: every name has its
tensor. `hook_scale` and `hook_normalized` (TransformerBridge's meaning: the stream centred and divided by the
scale, before the LayerNorm's weight) are the LayerNorm's own opt-in points (`layers.{i}.norm_1.scale`, ...): they
can be read, edited and differentiated; a cache that did not name them computes them from the stream the LayerNorm
reads.""")
