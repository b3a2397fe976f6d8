"""TransformerLens' switched-on copies of the residual stream: `hook_q_input`, `hook_k_input`, `hook_v_input`
(`model.set_use_split_qkv_input(True)`), `hook_attn_in` (`set_use_attn_in(True)`) and `hook_mlp_in`
(`set_use_hook_mlp_in(True)`).

In TransformerLens these are copies of the stream a layer reads, one per head for the attention ([b, s, n, h]) or one
for the MLP ([b, s, h]), made so that an edit reaches only what is computed from the copy: patching head 3's
`hook_q_input` changes head 3's queries and nothing else, and a backward hook on it gets the gradient that flows
through that head's queries alone. Our models have no such copies in their forward pass, so a `Fork` makes one at
run time, only while someone listens: at the stream's hook point the copy is made and shown to the listeners; if
they edit it, or want its gradient, the tensors computed from it (TL's `hook_q` of the layer, or `ln2.hook_out`) are
recomputed from the copy, through the layer's norm (a post-LN family has none before its attention) and TL's
weights (W_Q, b_Q, ...), and replace ours at their hook points. Nobody listening: nothing happens at all, and a
listener that only reads changes nothing either (the recomputation rounds differently from the fused projection,
by about 1e-7 relative, as TransformerLens' own forked path does).
"""

import dataclasses

import torch

from .names import Resolved, in_forward_order, table_names

# TL name (in a layer) -> (the copy's target, TL's weight and bias that compute it from the normalised copy)
_ATTENTION_TARGETS = {kind: (f"attn.hook_{kind}", f"attn.W_{kind.upper()}", f"attn.b_{kind.upper()}")
                      for kind in "qkv"}


@dataclasses.dataclass(frozen=True)
class Fork:
    """TL's copy of the stream `Resolved.source` that feeds `targets` only: (TL name of a tensor computed from the
    copy, TL's weight path, bias path), both None where the target is the normalised copy itself. `flag`: the
    set_use_* switch that offers it; `per_head`: one copy per head, [b, s, n, h]; `mlp_input`: the stream the MLP
    reads (its norm is ln2), else the one the attention reads (ln1)."""

    flag: str
    per_head: bool
    mlp_input: bool
    targets: tuple[tuple[str, str | None, str | None], ...]
    note = "a copy of the stream that feeds only what is computed from it (TL's set_use_* switch offers it)"

    def heads(self, model, layer: int) -> int:
        weight = self.targets[0][1]
        return model.lens_attribute(weight.format(i=layer)).shape[0] if weight else 1

    def shown(self, x: torch.Tensor, model, layer: int) -> torch.Tensor:
        """The copy of stream `x`: a tensor of its own, so an edit in place touches the copy only."""
        if not self.per_head:
            return x.clone()
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.heads(model, layer), x.shape[-1]).clone()

    def computed(self, copy: torch.Tensor, target: int, model, layer: int) -> torch.Tensor:
        """Target `target` (an index into `targets`) recomputed from `copy`, in TL's layout."""
        stream = model.family.stream(model)
        normed = copy if stream.post_ln else stream.decomposition(layer, self.mlp_input)[2](copy)
        _, weight, bias = self.targets[target]
        if weight is None:
            return normed
        weight, bias = (model.lens_attribute(path.format(i=layer)) for path in (weight, bias))
        return torch.einsum("...nh,nhd->...nd", normed[..., :weight.shape[0], :], weight) + bias


def forks(model, stream, resolved: dict[str, Resolved]) -> dict[str, Resolved]:
    """TL's switched-on names of `model` (see the module's doc), from the hook names its table resolves and its
    residual stream: `blocks.{i}.hook_{q,k,v}_input` and `blocks.{i}.hook_attn_in` where the layer's hook_q, hook_k
    and hook_v are ours to replace, `blocks.{i}.hook_mlp_in` on a pre-LN family whose table names ln2's output or, where no norm
    reads the MLP's input, that input (`mlp.hook_in`); a table may name hook_mlp_in itself, as BERT's does."""
    out = {}

    def replaceable(name: str) -> bool:
        found = resolved.get(name)
        return found is not None and found.source is not None

    for layer in range(stream.n_layers):
        targets = {kind: (f"blocks.{{i}}.{name}", f"blocks.{{i}}.{w}", f"blocks.{{i}}.{b}")
                   for kind, (name, w, b) in _ATTENTION_TARGETS.items()}
        if all(replaceable(target.format(i=layer)) for target, _, _ in targets.values()):
            source = stream.resid_pre(layer)
            for kind, target in targets.items():
                name = f"blocks.{layer}.hook_{kind}_input"
                out[name] = Resolved(name, Fork("use_split_qkv_input", True, False, (target,)), source, layer)
            name = f"blocks.{layer}.hook_attn_in"
            out[name] = Resolved(name, Fork("use_attn_in", True, False, tuple(targets.values())), source, layer)
        # what the MLP reads, recomputed from the copy: ln2's output, or the MLP's input itself where no norm comes
        # between the stream and the MLP (OLMo 2)
        name = f"blocks.{layer}.hook_mlp_in"
        normalised = next((target for target in ("blocks.{i}.ln2.hook_out", "blocks.{i}.mlp.hook_in")
                           if replaceable(target.format(i=layer))), None)
        if not stream.post_ln and name not in resolved and normalised is not None:
            source = stream.decomposition(layer, True)[1]
            out[name] = Resolved(name, Fork("use_hook_mlp_in", False, True, ((normalised, None, None),)), source,
                                 layer)
    return out


class ForkRun:
    """One fork of one model during forward passes: the copy made from the stream, whether a listener edited it
    or wants its gradient, and which of its targets are still to be replaced. Every listener attached by the
    fork's name shares it, so they all see one copy and its targets are recomputed once."""

    def __init__(self, model, resolved: Resolved):
        self.model, self.resolved = model, resolved
        self.source = None  # the stream tensor the copy was made from (None: no copy in flight)
        self.copy = None

    def capture(self, x: torch.Tensor) -> torch.Tensor:
        """The copy of `x`, made once however many listeners ask."""
        if self.source is not x:
            fork = self.resolved.entry
            self.source, self.copy = x, fork.shown(x, self.model, self.resolved.layer)
            self.version, self.edited, self.grad_wanted = self.copy._version, False, False
            self.pending = set(range(len(fork.targets)))
        return self.copy

    def replaced(self, copy: torch.Tensor | None) -> None:
        """A listener returned `copy` for the copy (None: it may have edited it in place)."""
        if copy is not None:
            self.copy, self.edited = copy, True
        elif self.copy._version != self.version:
            self.edited = True

    def target(self, index: int, y: torch.Tensor, layout) -> torch.Tensor | None:
        """Our tensor `y` of target `index`, recomputed from the copy when it was edited or its gradient is wanted
        (None: keep `y`)."""
        if self.source is None or index not in self.pending:
            return None
        self.pending.discard(index)
        copy, needed = self.copy, self.edited or self.grad_wanted
        if not self.pending:
            self.source = self.copy = None
        if not needed:
            return None
        computed = layout.take(self.resolved.entry.computed(copy, index, self.model, self.resolved.layer), y)
        if computed.shape != y.shape:
            raise ValueError(f"{self.resolved.name}: the copy recomputes {tuple(computed.shape)} where our tensor is "
                             f"{tuple(y.shape)}")
        return computed.to(y.dtype)


def fork_run(model, resolved: Resolved) -> ForkRun:
    """The model's ForkRun of `resolved`, made on first use."""
    runs = model.__dict__.setdefault("_fork_runs", {})
    run = runs.get(resolved.name)
    if run is None or run.resolved != resolved:
        run = runs[resolved.name] = ForkRun(model, resolved)
    return run


def lens_names(model) -> dict[str, Resolved]:
    """Every TL hook name of `model` -> Resolved, in forward order: its family table's (lens/names.py) and TL's
    switched-on copies of the stream that they feed (set_use_split_qkv_input, ...). Empty for a family that declares
    no table."""
    resolved = table_names(model)
    if not resolved:
        return resolved
    resolved |= forks(model, model.family.stream(model), resolved)
    return in_forward_order(model, resolved)
