"""GPT-NeoX (Pythia) in TransformerLens' names: its hook names, weights and config fields (see
scratch_models/lens/names.py).

TL's Pythia is this model. Its `hook_q` and `hook_k` are the queries and keys before the rotary embedding (our
`attn.q_unrotated`, `attn.k_unrotated`), `hook_rot_q` and `hook_rot_k` the turned ones whose products are the scores
(our `attn.q`, `attn.k`); there is no `hook_pos_embed`. With the parallel residual (every Pythia model) ln2 reads the
stream the layer starts from and there is no `hook_resid_mid`; a sequential model has one. W_Q, W_K and W_V are
views of the fused query_key_value, whose rows hold each head's q, k and v side by side.
"""

import torch

from ..lens.names import (HEADS, Alias, LensTable, Missing, attention_hooks, final_stream, heads_out,
                          no_unembedding_bias, norm_statistics, resid_pre, unembedding)

NO_ANGLES = ("the rotary angles are computed once per forward pass (GPTNeoXModel.positional) and held at no hook "
             "point: model.rotary(position_ids, dtype) gives them (scratch_models.parts.rotary.RotaryEmbedding)")


def mlp_input(stream, layer: int) -> str:
    """The stream ln2 reads: the layer's input with the parallel residual, the stream after attention without."""
    return stream.resid_pre(layer) if stream.parallel else stream.resid_mid(layer)


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
    "blocks.{i}.hook_resid_mid": Alias("layers.{i}.resid_mid"),  # a sequential model's only
    **norm_statistics("blocks.{i}.ln2", "layers.{i}.norm_2", mlp_input),
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
    """W_Q, W_K or W_V [n, h, d]: query_key_value's weight [3h, h] holds, head after head, the head's q, k and v
    rows side by side."""
    def weight(model, layer):
        attn = _attn(model, layer)
        rows = attn.query_key_value.weight.unflatten(0, (attn.num_heads, 3, attn.head_dim))  # [n, 3, d, h]
        return rows[:, which].transpose(-1, -2)
    return weight


def _qkv_bias(which: int):
    """b_Q, b_K or b_V [n, d]; zeros without biases (attention_bias false), as TL gives them."""
    def bias(model, layer):
        attn = _attn(model, layer)
        linear = attn.query_key_value
        if linear.bias is None:
            return torch.zeros(attn.num_heads, attn.head_dim, dtype=linear.weight.dtype, device=linear.weight.device)
        return linear.bias.unflatten(0, (attn.num_heads, 3, attn.head_dim))[:, which]
    return bias


def _out_bias(model, layer):
    dense = _attn(model, layer).dense
    return dense.bias if dense.bias is not None else torch.zeros_like(dense.weight[:, 0])


WEIGHTS = {
    "embed.W_E": lambda model, _: model.embeddings.embed_in.weight,
    "blocks.{i}.ln1.w": lambda model, layer: model.layers[layer].norm_1.weight,
    "blocks.{i}.ln1.b": lambda model, layer: model.layers[layer].norm_1.bias,
    "blocks.{i}.attn.W_Q": _qkv(0),
    "blocks.{i}.attn.W_K": _qkv(1),
    "blocks.{i}.attn.W_V": _qkv(2),
    "blocks.{i}.attn.b_Q": _qkv_bias(0),
    "blocks.{i}.attn.b_K": _qkv_bias(1),
    "blocks.{i}.attn.b_V": _qkv_bias(2),
    "blocks.{i}.attn.W_O": heads_out,
    "blocks.{i}.attn.b_O": _out_bias,
    "blocks.{i}.ln2.w": lambda model, layer: model.layers[layer].norm_2.weight,
    "blocks.{i}.ln2.b": lambda model, layer: model.layers[layer].norm_2.bias,
    "blocks.{i}.mlp.W_in": lambda model, layer: model.layers[layer].mlp.dense_h_to_4h.weight.T,
    "blocks.{i}.mlp.b_in": lambda model, layer: model.layers[layer].mlp.dense_h_to_4h.bias,
    "blocks.{i}.mlp.W_out": lambda model, layer: model.layers[layer].mlp.dense_4h_to_h.weight.T,
    "blocks.{i}.mlp.b_out": lambda model, layer: model.layers[layer].mlp.dense_4h_to_h.bias,
    "ln_final.w": lambda model, _: model.norm_f.weight,
    "ln_final.b": lambda model, _: model.norm_f.bias,
    "unembed.W_U": unembedding,
    "unembed.b_U": no_unembedding_bias,
}


def config(config) -> dict:
    return dict(n_layers=config.num_hidden_layers, d_model=config.hidden_size, n_heads=config.num_attention_heads,
                d_head=config.head_dim, d_mlp=config.intermediate_size, d_vocab=config.vocab_size,
                n_ctx=config.max_position_embeddings, act_fn=config.hidden_act, eps=config.layer_norm_eps,
                positional_embedding_type="rotary", rotary_dim=config.rotary_dim, rotary_base=config.rotary_emb_base,
                parallel_attn_mlp=config.use_parallel_residual, tie_word_embeddings=config.tie_word_embeddings)


# TransformerBridge's GPT-NeoX adapter prepends no BOS to text (Pythia was trained without one)
TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip(), prepend_bos=False)
