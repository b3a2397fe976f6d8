"""BERT in TransformerLens' names: its hook names, weights and config fields (see scratch_models/lens/names.py).

BERT is post-LN, so TL's names keep their TL meaning where BERT has one: `hook_resid_mid` is the residual plus
attention before ln1 (our `attn.resid`), `hook_resid_post` the stream plus MLP before ln2 (our `mlp.resid`),
`hook_normalized_resid_post` what the next layer reads (TL's HookedEncoder names), `ln1` the LayerNorm after
attention and `ln2` the one after the MLP. TransformerBridge's BERT differs on three names, where it follows
transformers' module boundaries instead: its `hook_attn_out` is after ln1, its `hook_resid_mid` is our `mlp.resid`
and its `hook_resid_post` our `layers.{i}.out` (and its `hook_attn_scores` repeats the pattern). No final LayerNorm
reads BERT's stream: the `ln_final` hooks are refused, saying so.
"""

from ..lens.names import (BATCH, HEADS, SCORES, Alias, LensTable, Missing, heads_out, norm_statistics, resid_pre)

NO_FINAL_NORM = ("BERT is post-LN: no final LayerNorm reads its residual stream, which each layer has already "
                 "normalised (the last layer's hook_normalized_resid_post is the last stream); the MLM head's own "
                 "LayerNorm follows a dense layer and an activation, where this model has no hook point")

HOOKS = {
    "hook_embed": Alias("embeddings.word"),
    "hook_token_type_embed": Alias("embeddings.token_type"),
    "hook_pos_embed": Alias("embeddings.position", BATCH),
    **norm_statistics("embed_ln", "embeddings.norm", "embeddings.sum"),
    "embed_ln.hook_out": Alias("embeddings.out"),
    "blocks.{i}.hook_resid_pre": Alias(resid_pre),
    "blocks.{i}.attn.hook_q": Alias("layers.{i}.attn.q", HEADS),
    "blocks.{i}.attn.hook_k": Alias("layers.{i}.attn.k", HEADS),
    "blocks.{i}.attn.hook_v": Alias("layers.{i}.attn.v", HEADS),
    "blocks.{i}.attn.hook_attn_scores": Alias("layers.{i}.attn.scores", SCORES),
    "blocks.{i}.attn.hook_pattern": Alias("layers.{i}.attn.probs"),
    "blocks.{i}.attn.hook_z": Alias("layers.{i}.attn.context", HEADS),
    "blocks.{i}.attn.hook_result": Alias("layers.{i}.attn.result"),
    "blocks.{i}.hook_attn_out": Alias("layers.{i}.attn.proj"),
    "blocks.{i}.hook_resid_mid": Alias("layers.{i}.attn.resid"),
    **norm_statistics("blocks.{i}.ln1", "layers.{i}.attn.norm", "layers.{i}.attn.resid"),
    "blocks.{i}.ln1.hook_out": Alias("layers.{i}.attn.out"),
    "blocks.{i}.hook_mlp_in": Alias("layers.{i}.attn.out"),
    "blocks.{i}.mlp.hook_pre": Alias("layers.{i}.mlp.pre_act"),
    "blocks.{i}.mlp.hook_post": Alias("layers.{i}.mlp.post_act"),
    "blocks.{i}.hook_mlp_out": Alias("layers.{i}.mlp.proj"),
    "blocks.{i}.hook_resid_post": Alias("layers.{i}.mlp.resid"),
    **norm_statistics("blocks.{i}.ln2", "layers.{i}.mlp.norm", "layers.{i}.mlp.resid"),
    "blocks.{i}.ln2.hook_out": Alias("layers.{i}.out"),
    "blocks.{i}.hook_normalized_resid_post": Alias("layers.{i}.out"),
    "ln_final.hook_scale": Missing(NO_FINAL_NORM),
    "ln_final.hook_normalized": Missing(NO_FINAL_NORM),
    "hook_unembed": Alias("logits"),
}


def _attn(model, layer):
    return model.layers[layer].attn


def _heads_in(linear: str):
    """W_Q, W_K or W_V [n, h, d] from an nn.Linear weight [n * d, h] (output rows head by head)."""
    def weight(model, layer):
        attn = _attn(model, layer)
        return getattr(attn, linear).weight.unflatten(0, (attn.num_heads, -1)).transpose(1, 2)
    return weight


def _heads_bias(linear: str):
    def bias(model, layer):
        attn = _attn(model, layer)
        return getattr(attn, linear).bias.unflatten(0, (attn.num_heads, -1))
    return bias


def _mlm_head(model):
    head = getattr(model, "mlm_head", None)
    if head is None:
        raise ValueError(f"TransformerLens' unembed is BERT's MLM head, and this {type(model).__name__} has none: "
                         "load a checkpoint that has it (cls.predictions.*) as BertForMaskedLM")
    return head


def _unembedding(model):
    """The MLM decoder [V, h] and its bias: tied to the word embeddings unless the config unties them."""
    head = _mlm_head(model)
    if head.decoder is None:
        return model.embeddings.word_embeddings.weight, head.bias
    return head.decoder.weight, head.decoder.bias


WEIGHTS = {
    "embed.W_E": lambda model, _: model.embeddings.word_embeddings.weight,
    "pos_embed.W_pos": lambda model, _: model.embeddings.position_embeddings.weight,
    "token_type_embed.W_token_type": lambda model, _: model.embeddings.token_type_embeddings.weight,
    "embed_ln.w": lambda model, _: model.embeddings.norm.weight,
    "embed_ln.b": lambda model, _: model.embeddings.norm.bias,
    "blocks.{i}.attn.W_Q": _heads_in("query"),
    "blocks.{i}.attn.W_K": _heads_in("key"),
    "blocks.{i}.attn.W_V": _heads_in("value"),
    "blocks.{i}.attn.b_Q": _heads_bias("query"),
    "blocks.{i}.attn.b_K": _heads_bias("key"),
    "blocks.{i}.attn.b_V": _heads_bias("value"),
    "blocks.{i}.attn.W_O": heads_out,
    "blocks.{i}.attn.b_O": lambda model, layer: _attn(model, layer).dense.bias,
    "blocks.{i}.ln1.w": lambda model, layer: _attn(model, layer).norm.weight,
    "blocks.{i}.ln1.b": lambda model, layer: _attn(model, layer).norm.bias,
    "blocks.{i}.mlp.W_in": lambda model, layer: model.layers[layer].mlp.up.weight.T,
    "blocks.{i}.mlp.b_in": lambda model, layer: model.layers[layer].mlp.up.bias,
    "blocks.{i}.mlp.W_out": lambda model, layer: model.layers[layer].mlp.down.weight.T,
    "blocks.{i}.mlp.b_out": lambda model, layer: model.layers[layer].mlp.down.bias,
    "blocks.{i}.ln2.w": lambda model, layer: model.layers[layer].mlp.norm.weight,
    "blocks.{i}.ln2.b": lambda model, layer: model.layers[layer].mlp.norm.bias,
    # TransformerBridge's BERT: ln_final is the MLM head's LayerNorm, unembed its decoder
    "ln_final.w": lambda model, _: _mlm_head(model).norm.weight,
    "ln_final.b": lambda model, _: _mlm_head(model).norm.bias,
    "unembed.W_U": lambda model, _: _unembedding(model)[0].T,
    "unembed.b_U": lambda model, _: _unembedding(model)[1],
}


def config(config) -> dict:
    return dict(n_layers=config.num_hidden_layers, d_model=config.hidden_size, n_heads=config.num_attention_heads,
                d_head=config.head_dim, d_mlp=config.intermediate_size, d_vocab=config.vocab_size,
                n_ctx=config.max_position_embeddings, act_fn=config.hidden_act, eps=config.layer_norm_eps,
                tie_word_embeddings=config.tie_word_embeddings)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
