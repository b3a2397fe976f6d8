"""Hook points over batches of sequences: which tensors, which positions, as rows.

A harvested tensor has one value per token: its hook point declares a batch axis first and one token axis "s"
(`layers.3.out` [b, s, h], `layers.3.attn.q` [b, n, s, d]); a row holds the rest ([h], [n, d]). A tensor with a
key axis (attention scores and probabilities, whose width is the sequence's length) has no fixed row and is
refused; one without a token axis (BERT's pooler [b, h]) has one value per sequence and goes with `positions`
first, last or mean.

Names are ours or TransformerLens' (`blocks.3.hook_resid_post`, from the family's table), and a pattern's `*`
stands for one part of a dotted name, as in `cache.stack` (activation_cache.glob). A TransformerLens name is
stored under that name: its rows are those of our tensor it stands for (its layout moves only the token and head
axes, or the batch's); a norm's `hook_scale` / `hook_normalized` are opt-in points of the norm, computed while
harvest listens to them.
"""

import contextlib
import dataclasses
import threading

import torch

from ..hooking.activation_cache import glob
from ..hooking.hooked_model import _lens_entry, _unknown_name_message

POSITIONS = ("all", "first", "last", "mean")  # every real token, or one row per sequence


class _Stop(Exception):
    """Raised by the listener on the last hook point needed: the rest of the forward pass is not run."""


def resolve_names(model, patterns) -> list[str]:
    """The hook names `patterns` stand for (ours or TransformerLens'; a pattern's `*` is one part of a dotted name,
    matched against our names, else against TL's), in forward order; a name or pattern that matches nothing is an
    error naming it (with the names nearest to it)."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not patterns:
        raise ValueError("names: give at least one hook name or pattern (e.g. layers.*.out)")
    points, lens = model.hook_points(), model.lens_names()
    chosen = {}
    for pattern in patterns:
        if "*" in pattern:
            regex = glob(pattern)
            matched = [name for name in points if regex.fullmatch(name)] or [
                name for name, resolved in lens.items() if model.lens_offers(resolved, points) and regex.fullmatch(name)]
            if not matched:
                raise ValueError(_unknown_name_message(pattern, points, lens).replace(
                    "unknown hook point", "no hook point matches"))
        else:
            matched = [pattern if pattern in points else _lens_entry(pattern, points, lens).name]
        chosen.update(dict.fromkeys(matched))
    order = {name: i for i, name in enumerate(points)}
    return sorted(chosen, key=lambda name: order[source_of(model, name)])


def source_of(model, name: str) -> str:
    """Our hook point that holds the values of `name` (ours, or a TransformerLens name)."""
    return name if name in model.hook_points() else model.lens_names()[name].source


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a name's values come from: our hook point `source` (a TransformerLens name's: its norms' hook_scale
    and hook_normalized are real opt-in points, computed while harvest listens), whose tensor keeps its tokens on
    `token_axis` (None: one value per sequence), and each row's shape. Moving the token axis to the second place
    is all TL's layouts ask (hook_q's heads and positions swapped)."""

    token_axis: int | None
    row_shape: tuple[int, ...]
    source: str


def layouts(model, names: list[str], positions: str, input_names: tuple[str, ...]) -> dict[str, Layout]:
    """Each name's Layout (its declared axes say which is which; the shapes come from one tiny forward pass), in the
    order the forward pass reaches their hook points: the last is where a forward pass may stop."""
    dims = model.hook_dims()
    found = {}
    for name in names:
        source = source_of(model, name)
        axes = dims[source]
        shown = f"{name} (our {source})" if source != name else name
        if axes[0] != "b" or any("p" in axis for axis in axes) or axes.count("s") > 1:
            raise ValueError(f"{shown} has axes [{', '.join(axes)}]: harvest takes tensors with a batch axis first "
                             "and at most one token axis (attention scores and probabilities have a row as long as "
                             "the sequence, which no fixed column holds)")
        if "s" not in axes and positions == "all":
            raise ValueError(f"{shown} [{', '.join(axes)}] has one value per sequence, not per token: harvest it "
                             "with positions first, last or mean (one row per sequence)")
        found[name] = (source, axes.index("s") if "s" in axes else None)
    shapes, reached = _probe(model, {source for source, _ in found.values()}, input_names)
    result = {}
    for name, (source, axis) in sorted(found.items(), key=lambda item: reached.index(item[1][0])):
        row = tuple(s for i, s in enumerate(shapes[source]) if i not in (0, axis))
        result[name] = Layout(axis, row, source)
    return result


def _probe(model, sources: set[str], input_names: tuple[str, ...]) -> tuple[dict, list[str]]:
    """Each source's shape on a batch of one sequence of two tokens, and the order the forward pass reaches them
    (it stops once it has reached them all)."""
    shapes, reached = {}, []

    def record(tensor, name):
        shapes[name] = tuple(tensor.shape)
        reached.append(name)
        if len(reached) == len(sources):
            raise _Stop

    inputs = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "attention_mask": torch.ones(1, 2, dtype=torch.long),
              "token_type_ids": torch.zeros(1, 2, dtype=torch.long)}
    with torch.no_grad(), model.hooks([(name, record) for name in sources]), contextlib.suppress(_Stop):
        model(**{name: inputs[name].to(_device(model)) for name in input_names})
    return shapes, reached


def _device(model) -> torch.device:
    return next(model.parameters()).device


class Runner:
    """Runs `model` on batches and hands back each name's tensor as rows (kept positions only).

    Eager, inside `listening()`: the named points' hook points record, and the forward pass stops after the last of
    them that it reaches (the layers above are not run); several threads may run batches at once, each recording
    its own. `compiled`: compile_model's run_with_cache, one graph per batch shape, which runs the whole model."""

    def __init__(self, model, names: list[str], layouts: dict[str, Layout], *, positions: str,
                 drop_special: bool | list[int], input_names: tuple[str, ...], compiled=None):
        self.model, self.names, self.layouts = model, names, layouts
        self.positions, self.drop_special = positions, drop_special
        self.input_names = input_names
        self.compiled = compiled
        self.device = _device(model)
        self.sources = list(dict.fromkeys(layout.source for layout in layouts.values()))
        self.stop_at = self.sources[-1]  # layouts come in the order the forward pass reaches them
        self._local = threading.local()  # per thread: the cache of the batch it runs

    @contextlib.contextmanager
    def listening(self):
        """The recorders attached, for the eager runs inside the block (a call outside it passes them by)."""
        if self.compiled is not None:
            yield
            return
        with self.model.hooks([(name, self._record) for name in self.sources]):
            yield

    def _record(self, tensor, name):
        cache = getattr(self._local, "cache", None)
        if cache is None:  # a forward pass that is not one of ours (the model used elsewhere meanwhile)
            return None
        cache[name] = tensor
        if name == self.stop_at:
            raise _Stop
        return None

    def tensors(self, batch) -> dict[str, torch.Tensor]:
        """[b, s] tensors of a batch of Sequences, padded on the right: the model's inputs (input_ids,
        attention_mask, token_type_ids) and each token's document, position and whether it is kept."""
        longest = max(len(s) for s in batch)
        columns = {name: torch.zeros(len(batch), longest, dtype=torch.long)
                   for name in ("input_ids", "attention_mask", "token_type_ids", "document", "position")}
        keep = torch.zeros(len(batch), longest, dtype=torch.bool)
        for row, sequence in enumerate(batch):
            n = len(sequence)
            columns["input_ids"][row, :n] = torch.tensor(sequence.ids)
            columns["attention_mask"][row, :n] = 1
            if sequence.token_types is not None:
                columns["token_type_ids"][row, :n] = torch.tensor(sequence.token_types)
            columns["document"][row, :n] = torch.tensor(sequence.document)
            columns["position"][row, :n] = torch.tensor(sequence.position)
            keep[row, :n] = ~torch.tensor(sequence.dropped(self.drop_special), dtype=torch.bool)
        return columns | {"keep": keep}

    def run(self, batch) -> dict[str, torch.Tensor]:
        """Name -> [rows, *row_shape] in the model's dtype, on its device; and "token_id", "document", "position" ->
        [rows] on the CPU. Positions "all": a row per kept token. first / last / mean: a row per sequence with a
        kept token (mean's position and token_id are -1). Eager runs need `listening()` around them."""
        columns = self.tensors(batch)
        keep = columns["keep"]
        inputs = {name: columns[name].to(self.device) for name in self.input_names}
        cache = self._cache(inputs)
        if self.positions == "all":
            rows = {name: self._tokens(cache, name, len(batch))[keep.to(self.device)] for name in self.names}
            return rows | {"token_id": columns["input_ids"][keep], "document": columns["document"][keep],
                           "position": columns["position"][keep]}
        any_kept = keep.any(1)
        pick = pick_position(keep, "first" if self.positions == "mean" else self.positions)[any_kept]
        at = torch.arange(len(batch))[any_kept]
        meta = {"token_id": columns["input_ids"][at, pick], "document": columns["document"][at, pick],
                "position": columns["position"][at, pick]}
        if self.positions == "mean":
            meta["token_id"] = meta["position"] = torch.full_like(meta["document"], -1)
        rows = {}
        for name in self.names:
            tokens = self._tokens(cache, name, len(batch))
            if self.layouts[name].token_axis is None:
                rows[name] = tokens[any_kept.to(self.device)]
            elif self.positions == "mean":
                rows[name] = _mean(tokens, keep.to(self.device))[any_kept.to(self.device)]
            else:
                rows[name] = tokens[at.to(self.device), pick.to(self.device)]
        return rows | meta

    def _tokens(self, cache: dict, name: str, batch: int) -> torch.Tensor:
        """[b, s, *row] (or [b, *row] for a point without tokens)."""
        layout = self.layouts[name]
        tensor = cache[layout.source]
        if tensor.shape[0] != batch:  # declared per row, computed once for all (GPT-2's position embeddings)
            tensor = tensor.expand(batch, *tensor.shape[1:])
        return tensor if layout.token_axis is None else tensor.movedim(layout.token_axis, 1)

    def _cache(self, inputs) -> dict[str, torch.Tensor]:
        if self.compiled is not None:
            with torch.no_grad():
                return dict(self.compiled.run_with_cache(**inputs, names=self.sources)[1])
        cache = self._local.cache = {}
        try:
            with torch.no_grad():
                self.model(**inputs)
        except _Stop:
            pass
        finally:
            self._local.cache = None
        missing = [name for name in self.sources if name not in cache]
        if missing:  # a point reached after the stop point on this batch, not on the probe: never ignored
            raise RuntimeError(f"the forward pass stopped at {self.stop_at} before reaching {', '.join(missing)}")
        return cache


def pick_position(keep: torch.Tensor, which: str) -> torch.Tensor:
    """[b] the first or last kept position of each row of `keep` [b, s] (0 in a row with none)."""
    index = torch.arange(keep.shape[1]).expand_as(keep)
    if which == "first":
        return torch.where(keep, index, keep.shape[1]).min(1).values.clamp(max=keep.shape[1] - 1)
    return torch.where(keep, index, 0).max(1).values


def _mean(tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[b, *row]: the mean over each row's kept positions, summed in float32."""
    weights = keep.to(torch.float32)[(...,) + (None,) * (tokens.dim() - 2)]
    summed = (tokens.to(torch.float32) * weights).sum(1)
    return (summed / weights.sum(1).clamp(min=1)).to(tokens.dtype)
