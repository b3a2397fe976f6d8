"""OLMo 2 in TransformerLens' names: its hook names, weights and config fields (see scratch_models/lens/names.py).

TL's OLMo 2 (its TransformerBridge) is this model: no `ln1`, no `ln2` (the sublayers read the stream unnormalised);
`ln1_post` and `ln2_post` are the norms each sublayer's output passes, `hook_attn_out` and `hook_mlp_out` after them
(what the stream adds), `attn.hook_out` and `mlp.hook_out` before. `attn.q_norm` and `attn.k_norm` normalise the whole
projection, [b, s, n·d]: their `hook_scale` [b, s, 1], `hook_normalized` and `hook_out` (= `hook_q_normed`, our
`attn.q_normed` [b, s, n, d] flattened) keep that layout. TL's `hook_q` and `hook_k` are the projections before the norms, per head
[b, s, n, d] (our `attn.q_unnormalized`, `attn.k_unnormalized`, in that layout already); `mlp.hook_in` is what the
MLP reads, the stream itself (our `mlp_in`), and TL's switched-on `hook_mlp_in` a copy of that stream which feeds
the MLP alone. `hook_rot_q`, `hook_rot_k` are the normalised queries and keys turned, per head.
"""

import dataclasses

from ..lens.names import (HEADS, Alias, LensTable, Layout, Missing, NormStatistic, attention_hooks, final_stream,
                          layer_bias, no_unembedding_bias, norm_statistics, projection_weights, resid_pre,
                          turned_weight, unembedding)
from ..llama import transformer_lens as llama


class _Flat(Layout):
    note = "every head side by side, as the norm reads them: ours [.., n, d], TL's [.., n·d]"

    def show(self, x, batch):
        return x.flatten(-2)

    def take(self, y, x):
        return y.view_as(x)


FLAT = _Flat()


@dataclasses.dataclass(frozen=True)
class _FlatStatistic(NormStatistic):
    """A statistic of a norm over every head together, in TL's flat layout whether read or computed."""

    layout = FLAT

    def compute(self, norm, x):
        return FLAT.show(super().compute(norm, x), None)


def heads_norm_statistics(prefix: str, norm: str, stream: str) -> dict:
    return {f"{prefix}.hook_{which}": _FlatStatistic(norm, which, stream) for which in ("scale", "normalized")}


HOOKS = {
    "hook_embed": Alias("embeddings.word"),
    "blocks.{i}.hook_resid_pre": Alias(resid_pre),
    **attention_hooks(q="q_unnormalized", k="k_unnormalized"),
    # attention_hooks' hook_q / hook_k read [b, n, s, d]; ours before the norms are [b, s, n, d] already
    "blocks.{i}.attn.hook_q": Alias("layers.{i}.attn.q_unnormalized"),
    "blocks.{i}.attn.hook_k": Alias("layers.{i}.attn.k_unnormalized"),
    **heads_norm_statistics("blocks.{i}.attn.q_norm", "layers.{i}.attn.q_norm", "layers.{i}.attn.q_unnormalized"),
    "blocks.{i}.attn.q_norm.hook_out": Alias("layers.{i}.attn.q_normed", FLAT),
    "blocks.{i}.attn.hook_q_normed": Alias("layers.{i}.attn.q_normed", FLAT),
    **heads_norm_statistics("blocks.{i}.attn.k_norm", "layers.{i}.attn.k_norm", "layers.{i}.attn.k_unnormalized"),
    "blocks.{i}.attn.k_norm.hook_out": Alias("layers.{i}.attn.k_normed", FLAT),
    "blocks.{i}.attn.hook_k_normed": Alias("layers.{i}.attn.k_normed", FLAT),
    "blocks.{i}.attn.hook_rot_q": Alias("layers.{i}.attn.q", HEADS),
    "blocks.{i}.attn.hook_rot_k": Alias("layers.{i}.attn.k", HEADS),
    "blocks.{i}.attn.hook_cos": Missing(llama.NO_ANGLES),  # TransformerBridge's
    "blocks.{i}.attn.hook_sin": Missing(llama.NO_ANGLES),
    "rotary_emb.hook_cos": Missing(llama.NO_ANGLES),
    "rotary_emb.hook_sin": Missing(llama.NO_ANGLES),
    "blocks.{i}.attn.hook_out": Alias("layers.{i}.attn.proj"),  # the bridge's, before ln1_post
    **norm_statistics("blocks.{i}.ln1_post", "layers.{i}.post_attn_norm", "layers.{i}.attn.proj"),
    "blocks.{i}.ln1_post.hook_out": Alias("layers.{i}.attn_out"),
    "blocks.{i}.hook_attn_out": Alias("layers.{i}.attn_out"),
    "blocks.{i}.hook_resid_mid": Alias("layers.{i}.resid_mid"),
    "blocks.{i}.mlp.hook_in": Alias("layers.{i}.mlp_in"),  # the bridge's: what the MLP reads, no norm between
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
    "hook_unembed": Alias("logits"),
}


def _weight(path: str):
    def get(model, layer):
        module = model.layers[layer]
        for part in path.split("."):
            module = getattr(module, part)
        return module.weight
    return get


WEIGHTS = {
    "embed.W_E": lambda model, _: model.embeddings.embed_tokens.weight,
    **projection_weights(),
    "blocks.{i}.attn.q_norm.w": _weight("attn.q_norm"),
    "blocks.{i}.attn.k_norm.w": _weight("attn.k_norm"),
    "blocks.{i}.ln1_post.w": _weight("post_attn_norm"),
    "blocks.{i}.ln2_post.w": _weight("post_mlp_norm"),
    "blocks.{i}.mlp.W_gate": turned_weight("mlp.gate_proj"),
    "blocks.{i}.mlp.W_in": turned_weight("mlp.up_proj"),
    "blocks.{i}.mlp.W_out": turned_weight("mlp.down_proj"),
    "blocks.{i}.mlp.b_in": layer_bias("mlp.up_proj"),
    "blocks.{i}.mlp.b_out": layer_bias("mlp.down_proj"),
    "ln_final.w": lambda model, _: model.norm_f.weight,
    "unembed.W_U": unembedding,
    "unembed.b_U": no_unembedding_bias,
}

TABLE = LensTable(HOOKS, WEIGHTS, llama.config, summary=__doc__.split("\n\n", 1)[1].strip())
