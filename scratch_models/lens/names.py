"""TransformerLens' names for our tensors and weights, declared by each family in a table of its own.

A TransformerLens (TL) user reads `blocks.3.attn.hook_z` [b, s, n, d] where our model holds `layers.3.attn.context`
[b, n, s, d]. A family's `LensTable` (its package's transformer_lens.py, named by `Family.transformer_lens`) maps
each TL hook name to the tensor of ours that holds the same values and the layout that turns ours into TL's:

    Alias(source)            the same tensor (hook_resid_pre, hook_pattern, hook_mlp_out, ...)
    Alias(source, HEADS)     heads and positions swapped: [b, n, s, d] <-> TL's [b, s, n, d] (hook_q/k/v/z)
    Alias(source, SCORES)    blocked entries as TL writes them, -inf, where ours hold the dtype's lowest number
    Alias(source, BATCH)     one row for the batch ([1, s, h]) shown as TL shows it, one per sequence
    Alias(source, TOKENS)    one row per token, batch and positions flattened ([b·s, ..]), as TL's bridge shows a
                             mixture's router (moe_hooks() declares a mixture of experts' names)
    NormStatistic(norm, which, stream)
                             TL's norm hooks (hook_scale, hook_normalized): the opt-in `scale` / `normalized` hook
                             point of our norm module `norm`, real forwards and backwards; a cache that did not
                             record the point computes it from `stream`, the stream the norm reads, by the norm's
                             own formula (norm_statistics() declares both of a norm)
    Missing(reason)          a TL name whose meaning this family has no counterpart for: the reason is the error

`source` is our hook name with `{i}` for the layer, or a function of the family's ResidualStream and the layer
(`resid_pre`, `final_stream`) for the stream between layers. The table's weights map TL's weight attributes
(`blocks.{i}.attn.W_Q` [n, h, d], `unembed.W_U` [h, V], ...) to functions of the model and the layer, and its
`config` gives TL's config fields. Nothing here imports transformer_lens; TL's names and shapes are facts.

`get_act_name` is TL's `utils.get_act_name`, under its name (exported as scratch_models.get_act_name): ("pattern",
0, "attn") -> "blocks.0.attn.hook_pattern", the grammar `cache[name, layer, kind]` keys use.
"""

import dataclasses
import re
from typing import Callable

import torch

from ..parts.moe import SparseMoeBlock

# TL's shorthands for activation names (utils.get_act_name)
_ACT_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_KIND_ALIASES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}
_ATTENTION = ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores")
_MLP = ("pre", "post", "mid", "pre_linear")


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """TL's full hook name for a shorthand, as TL's `utils.get_act_name` builds it: ("resid_pre", 3) ->
    "blocks.3.hook_resid_pre", ("z", 3, "attn") -> "blocks.3.attn.hook_z", ("attn", 0) -> the pattern,
    ("embed") -> "hook_embed", ("scale") -> "ln_final.hook_scale", "k6" -> "blocks.6.attn.hook_k". A full name
    comes back as it is."""
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    packed = re.fullmatch(r"([a-z_]+?)(\d+)(.*)", name)
    if packed is not None:  # "k6", "scale4ln1"
        name, layer, layer_type = packed.group(1), int(packed.group(2)), packed.group(3) or None
    name = _ACT_ALIASES.get(name, name)
    if name in _ATTENTION:
        layer_type = "attn"
    elif name in _MLP:
        layer_type = "mlp"
    else:
        layer_type = _KIND_ALIASES.get(layer_type, layer_type)
    full = (f"blocks.{layer}." if layer is not None else "") + (f"{layer_type}." if layer_type else "") + f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        full = f"ln_final.{full}"
    return full


# ---- layouts: how TL holds a tensor we hold ----------------------------------------------------------------------


class Layout:
    """Ours as TL's (`show`) and TL's back as ours (`take`, for an edit). `view`: `show` returns a view of ours, so
    an edit TL-style code makes in place reaches our tensor. The default is the tensor itself."""

    view = True
    note = ""  # how TL's tensor differs from ours, for docs/hook_names.md

    def show(self, x: torch.Tensor, batch: int | None) -> torch.Tensor:
        return x

    def take(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`y` (TL's layout, edited) as our tensor `x` is laid out."""
        return y

    def widened(self, x: torch.Tensor, batch: int) -> torch.Tensor:
        """Ours with as many rows as TL's, for a gradient per row (the same values)."""
        return x


class _Heads(Layout):
    note = "heads and positions swapped: ours [.., n, s, d], TL's [.., s, n, d]"

    def show(self, x, batch):
        return x.transpose(-3, -2)

    def take(self, y, x):
        return y.transpose(-3, -2)


class _Scores(Layout):
    view = False
    note = "blocked entries -inf (ours: the dtype's lowest number)"

    def show(self, x, batch):
        return x.masked_fill(x == torch.finfo(x.dtype).min, float("-inf"))

    def take(self, y, x):
        return y.masked_fill(y == float("-inf"), torch.finfo(y.dtype).min)


class _Batch(Layout):
    note = "one row per sequence (ours may hold one row [1, s, h] for the whole batch)"

    def show(self, x, batch):
        return x.expand(batch, *x.shape[1:]) if batch is not None and x.shape[0] == 1 else x

    def widened(self, x, batch):
        return x.expand(batch, *x.shape[1:]) if x.shape[0] == 1 and batch > 1 else x

    def take(self, y, x):
        if y.shape[0] == x.shape[0]:
            return y
        if not torch.equal(y, y[:1].expand_as(y)):
            raise ValueError("this edit gives each sequence its own position embedding, and the model holds one "
                             "for the whole batch: pass position_ids of shape [batch, seq] to edit them per row")
        return y[:1]


class _Tokens(Layout):
    view = False  # a flattened copy where ours is not contiguous: an edit goes back through `take`
    note = "one row per token, as the router reads them: ours [b, s, ..], TL's [b·s, ..]"

    def show(self, x, batch):
        return x.flatten(0, 1) if x.dim() == 3 else x  # [s, ..] already: a cache whose batch axis was removed

    def take(self, y, x):
        return y.reshape(x.shape)


SAME, HEADS, SCORES, BATCH, TOKENS = Layout(), _Heads(), _Scores(), _Batch(), _Tokens()


# ---- what a TL name stands for -----------------------------------------------------------------------------------

Source = str | Callable  # our hook name ({i}: the layer), or fn(stream, layer) -> our hook name


def resid_pre(stream, layer: int) -> str:
    """The residual stream layer `layer` reads."""
    return stream.resid_pre(layer)


def final_stream(stream, layer: int) -> str:
    """The residual stream the last layer writes (what the final LayerNorm reads)."""
    return stream.resid_pre(stream.n_layers)


@dataclasses.dataclass(frozen=True)
class Alias:
    """TL's tensor is our hook point `source` in `layout`."""

    source: Source
    layout: Layout = SAME


@dataclasses.dataclass(frozen=True)
class NormStatistic:
    """TL's `hook_scale` (`which` "scale": the divisor, [.., s, 1]) or `hook_normalized` ("normalized": the stream
    centred where the norm centres and divided by it, before the weight) of our norm module at `norm` (a path from
    the model, `{i}` the layer): that module's opt-in hook point, so it can be read, edited and differentiated. Where
    a cache did not record the point (run_with_cache records opt-in points only when named), the value is computed
    from `stream`, the stream the norm reads, by the norm's own formula (scratch_models.parts.norms): nothing here
    assumes a LayerNorm."""

    norm: str
    which: str
    stream: Source
    layout = SAME

    @property
    def source(self) -> str:
        return f"{self.norm}.{self.which}"

    def compute(self, norm, x: torch.Tensor) -> torch.Tensor:
        return norm.divisor(x) if self.which == "scale" else norm.normalize(x)


def norm_statistics(prefix: str, norm: str, stream: Source) -> dict[str, NormStatistic]:
    """TL's two hooks of one norm: `{prefix}.hook_scale` and `{prefix}.hook_normalized` of our norm `norm`, which
    reads `stream`."""
    return {f"{prefix}.hook_{which}": NormStatistic(norm, which, stream) for which in ("scale", "normalized")}


@dataclasses.dataclass(frozen=True)
class Missing:
    """A TL name with no counterpart in this family: `reason` says why (and what to read instead; `{i}` there is the
    name's layer)."""

    reason: str

    def why(self, layer: int | None) -> str:
        return self.reason if layer is None else self.reason.replace("{i}", str(layer))


Entry = Alias | NormStatistic | Missing
Weight = Callable  # fn(model, layer) -> the tensor in TL's shape (layer is None outside blocks)


def attention_hooks(q: str = "q", k: str = "k") -> dict[str, Alias]:
    """TL's attention hooks of a decoder layer whose attention, `layers.{i}.attn`, has our usual points: hook_q,
    hook_k, hook_v and hook_z per head in TL's [b, s, n, d] (with grouped-query attention hook_k and hook_v keep
    their n_kv heads, TL's default, `ungroup_grouped_query_attention=False`), the scores with -inf where blocked,
    the pattern, each head's result and the attention's output. `q`, `k`: our points TL's hook_q and hook_k are
    (a rotary family's are before the rotation: its hook_rot_q / hook_rot_k are declared beside)."""
    attn = "layers.{i}.attn"
    return {
        "blocks.{i}.attn.hook_q": Alias(f"{attn}.{q}", HEADS),
        "blocks.{i}.attn.hook_k": Alias(f"{attn}.{k}", HEADS),
        "blocks.{i}.attn.hook_v": Alias(f"{attn}.v", HEADS),
        "blocks.{i}.attn.hook_attn_scores": Alias(f"{attn}.scores", SCORES),
        "blocks.{i}.attn.hook_pattern": Alias(f"{attn}.probs"),
        "blocks.{i}.attn.hook_z": Alias(f"{attn}.context", HEADS),
        "blocks.{i}.attn.hook_result": Alias(f"{attn}.result"),
        "blocks.{i}.hook_attn_out": Alias(f"{attn}.proj"),
    }


def by_mlp(mixture: str, dense: str) -> Callable:
    """A source that depends on the layer's MLP: our point `mixture` where it is a mixture of experts
    (parts/moe.py), `dense` where it is a gated MLP (Qwen 3 MoE keeps some layers dense)."""
    def source(stream, layer: int) -> str:
        return (mixture if isinstance(stream.model.layers[layer].mlp, SparseMoeBlock) else dense).format(i=layer)
    return source


NO_ROUTER_SCORES = ("TransformerBridge fires hook_router_scores only for a mixture whose block returns its router's "
                    "scores (GPT-OSS's); this one's are the router's logits, blocks.{i}.mlp.gate.hook_out (TL's) or "
                    "layers.{i}.mlp.router_logits (ours)")


def moe_hooks(dense_pre: str = "layers.{i}.mlp.pre_act", dense_post: str = "layers.{i}.mlp.post_act", *,
              router: str = "gate", router_scores: bool = False) -> dict:
    """TransformerBridge's names of a mixture of experts (MoEBridge around the block, MoERouterBridge around its
    router, `router` in the bridge's names: Mixtral's `gate`, GPT-OSS's `router`; ours is always `mlp.gate`) at
    `layers.{i}.mlp`, whose input is `layers.{i}.ln_2`: `mlp.hook_in` and its alias `hook_pre` (what the block
    reads), `mlp.hook_out` and `hook_post` (the weighted sum, our `proj`); the router's input and logits
    (`mlp.<router>.hook_in`, `hook_out`), the chosen experts (`hook_expert_indices`, best first) and every expert's
    weight (`hook_expert_weights`, 0 where not chosen) one row per token, [b·s, ..], under the router and under the
    block both. `router_scores`: the block returns its chosen experts' weights beside its output (GPT-OSS), which
    the bridge shows as `mlp.hook_router_scores` ([b·s, k], our `routing_weights`); else that name is refused. On a
    dense layer of the same model the bridge's `hook_pre` and `hook_post` are the gated MLP's, `dense_pre` and
    `dense_post` (the router's names have nothing there: no router)."""
    mlp = "layers.{i}.mlp"
    at = f"blocks.{{i}}.mlp.{router}"
    return {
        "blocks.{i}.mlp.hook_in": Alias("layers.{i}.ln_2"),
        "blocks.{i}.mlp.hook_pre": Alias(by_mlp("layers.{i}.ln_2", dense_pre)),
        # the router's input; ours is the experts' too, so an edit here reaches them as well (the bridge's, not)
        f"{at}.hook_in": Alias(by_mlp("layers.{i}.ln_2", f"{mlp}.gate"), TOKENS),
        f"{at}.hook_out": Alias(f"{mlp}.router_logits", TOKENS),
        **{f"{where}.hook_expert_weights": Alias(f"{mlp}.expert_weights", TOKENS) for where in (at, "blocks.{i}.mlp")},
        **{f"{where}.hook_expert_indices": Alias(f"{mlp}.chosen", TOKENS) for where in (at, "blocks.{i}.mlp")},
        "blocks.{i}.mlp.hook_router_scores": Alias(f"{mlp}.routing_weights", TOKENS) if router_scores
        else Missing(NO_ROUTER_SCORES),
        "blocks.{i}.mlp.hook_post": Alias(by_mlp(f"{mlp}.proj", dense_post)),
        "blocks.{i}.mlp.hook_out": Alias(f"{mlp}.proj"),
    }


def dense_mlp_only(weight: Callable, experts: str = "layers.{i}.mlp.experts.{{e}}.gate_proj, up_proj and down_proj "
                   "(nn.Linear, [out, in])") -> Callable:
    """A gated MLP's weight (W_gate, W_in, W_out and their biases) where the layer has one; a mixture of experts has
    no single one (nor has TransformerBridge), which the error says, with where each expert's are (`experts`, {i}
    the layer)."""
    def get(model, layer: int) -> torch.Tensor:
        if isinstance(model.layers[layer].mlp, SparseMoeBlock):
            raise ValueError(f"layer {layer}'s MLP is a mixture of experts, which has no single gated MLP's weight: "
                             f"each expert's are {experts.format(i=layer)}, the router's layers.{layer}.mlp.gate")
        return weight(model, layer)
    return get


# ---- weights a family's declaration already gives --------------------------------------------------------------


def heads_out(model, layer: int) -> torch.Tensor:
    """W_O [n, d, h]: the attention's output projection as the family's stream declares it (out_weight [n * d, h],
    input rows head by head), split per head; a view of the parameter."""
    stream = model.family.stream(model)
    return stream.out_weight(layer).unflatten(0, (stream.num_heads, -1))


def split_heads(projection: str):
    """W_Q [n, h, d], or W_K / W_V [n_kv, h, d] under grouped-query attention, of an attention with a projection
    each (`layers.{i}.attn.<projection>`, a Linear [heads * d, h], as Llama's and Gemma 2's): its weight split per
    head and turned; a view of the parameter."""
    def weight(model, layer: int) -> torch.Tensor:
        attn = model.layers[layer].attn
        return getattr(attn, projection).weight.unflatten(0, (-1, attn.head_dim)).transpose(-1, -2)
    return weight


def split_head_biases(projection: str):
    """b_Q [n, d], or b_K / b_V [n_kv, d], of the projections `split_heads` reads; zeros where a projection has no
    bias, as TL gives them."""
    def bias(model, layer: int) -> torch.Tensor:
        attn = model.layers[layer].attn
        linear = getattr(attn, projection)
        if linear.bias is None:
            return torch.zeros(linear.out_features // attn.head_dim, attn.head_dim, dtype=linear.weight.dtype,
                               device=linear.weight.device)
        return linear.bias.unflatten(0, (-1, attn.head_dim))
    return bias


def projection_weights() -> dict:
    """TL's attention weights of an attention with a projection each (q_proj, k_proj, v_proj, o_proj)."""
    return {**{f"blocks.{{i}}.attn.W_{x}": split_heads(f"{x.lower()}_proj") for x in "QKV"},
            **{f"blocks.{{i}}.attn.b_{x}": split_head_biases(f"{x.lower()}_proj") for x in "QKV"},
            "blocks.{i}.attn.W_O": heads_out, "blocks.{i}.attn.b_O": layer_bias("attn.o_proj")}


def turned_weight(path: str):
    """A Linear's weight at `layers.{i}.<path>` turned to [in, out], TL's orientation (W_in, W_gate, W_out)."""
    return lambda model, layer: model.layers[layer].get_submodule(path).weight.T


def layer_bias(path: str):
    """A Linear's bias at `layers.{i}.<path>` (b_O, b_in, b_out); zeros [out] where it has none, as TL gives them."""
    def bias(model, layer: int) -> torch.Tensor:
        linear = model.layers[layer].get_submodule(path)
        return linear.bias if linear.bias is not None else torch.zeros_like(linear.weight[:, 0])
    return bias


def unembedding(model, _) -> torch.Tensor:
    """W_U [h, V] of a pre-LN family: what its read-out scores the normalised stream against (the stream's
    unembedding, which says why where there is none)."""
    return model.family.stream(model).unembedding().T


def no_unembedding_bias(model, _) -> torch.Tensor:
    """b_U [V]: zeros, as TL gives them for a head without a bias."""
    return torch.zeros_like(unembedding(model, None)[0])


@dataclasses.dataclass(frozen=True, eq=False)
class LensTable:
    """A family's TransformerLens names. `hooks`: TL hook name ({i}: the layer) -> Entry. `weights`: TL weight
    path (`blocks.{i}.attn.W_Q`, `unembed.W_U`) -> fn(model, layer) giving the tensor in TL's shape, a view of our
    parameter where one exists. `config`: fn(our config) -> TL's config fields that are the family's own
    (n_layers, d_model, n_heads, d_head, d_mlp, d_vocab, n_ctx, act_fn, eps, ...). `summary`: how TL's names read
    on this family, for docs/hook_names.md. `prepend_bos`: TL's default for text (see the field)."""

    hooks: dict[str, Entry]
    weights: dict[str, Weight]
    config: Callable[[object], dict]
    summary: str = ""
    # TransformerBridge's cfg.default_prepend_bos for the family: whether text gets a BOS token by default (its
    # framework default, True, unless the family's adapter says otherwise)
    prepend_bos: bool = True


# ---- a model's names ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Resolved:
    """One TL name on one model: the entry, our hook point that holds its values (None for Missing), the layer, and
    whether that point is opt-in (computed only for a listener)."""

    name: str
    entry: Entry
    source: str | None
    layer: int | None
    opt_in: bool = False
    stream: str | None = None  # a NormStatistic's: the stream its norm reads, from which a cache computes it

    @property
    def cached_from(self) -> str | None:
        """What a cache must hold to show this name: the point, or for a norm statistic the stream it is computed
        from (so a predicate caching TL's names costs no explicit norm)."""
        return self.stream if isinstance(self.entry, NormStatistic) else self.source

    def show(self, x: torch.Tensor, model, batch: int | None) -> torch.Tensor:
        """Our `source` tensor as TL's."""
        if hasattr(self.entry, "shown"):  # a copy made another way (scratch_models.lens.forks)
            return self.entry.shown(x, model, self.layer)
        return self.entry.layout.show(x, batch)

    def read(self, tensors: dict, model, batch: int | None) -> torch.Tensor:
        """TL's tensor from a cache's `tensors`: the point's, or a norm statistic computed from its stream. A
        KeyError (naming what is missing) when neither is there."""
        if self.source in tensors:
            return self.show(tensors[self.source], model, batch)
        if isinstance(self.entry, NormStatistic) and self.stream in tensors:
            norm = resolve_path(model, self.entry.norm.format(i=self.layer))
            return self.entry.compute(norm, tensors[self.stream])
        raise KeyError(self.cached_from)


def table_names(model) -> dict[str, Resolved]:
    """The TL hook names of `model`'s family table, each layer's -> Resolved, in the table's order (lens/forks.py's
    lens_names adds TL's switched-on copies of the stream and puts them all in forward order). Empty for a family
    that declares no table."""
    family = getattr(model, "family", None)
    table = getattr(family, "transformer_lens", None)
    if table is None:
        return {}
    stream = family.stream(model)
    points = model.hook_points()
    resolved = {}
    for template, entry in table.hooks.items():
        layers = range(stream.n_layers) if "{i}" in template else (None,)
        for layer in layers:
            name = template.format(i=layer)
            found, source, read = entry, None, None
            if not isinstance(entry, Missing):
                source = _source(entry.source, stream, layer)
                read = _source(entry.stream, stream, layer) if isinstance(entry, NormStatistic) else None
                if source not in points:
                    found = Missing(f"it is our {source}, which {type(model).__name__} has not")
                    source = read = None
            resolved[name] = Resolved(name, found, source, layer, source is not None and points[source].opt_in, read)
    return resolved


def in_forward_order(model, resolved: dict[str, Resolved]) -> dict[str, Resolved]:
    """`resolved` in forward order: that of the hook points they read, then the layer's, then as given."""
    order = {name: i for i, name in enumerate(model.hook_points())}
    # a stream between layers is read by two: layer l's resid_post before layer l + 1's resid_pre
    return dict(sorted(resolved.items(), key=lambda item: (order.get(item[1].source, len(order)),
                                                            len(order) if item[1].layer is None else item[1].layer)))


def _source(source: Source, stream, layer: int | None) -> str:
    return source(stream, layer) if callable(source) else source.format(i=layer)


def resolve_path(root, path: str):
    """The attribute at a dotted `path` from `root`, a number indexing a list (`layers.3.norm_1`)."""
    node = root
    for part in path.split("."):
        node = node[int(part)] if part.isdigit() else getattr(node, part)
    return node


def layer_of(name: str) -> int:
    """The layer in a hook name, TL's (`blocks.3.…`) or ours (`layers.3.…`): TL's HookPoint.layer()."""
    found = re.match(r"(?:blocks|layers)\.(\d+)\.", name)
    if found is None:
        raise ValueError(f"{name} belongs to no layer")
    return int(found.group(1))
