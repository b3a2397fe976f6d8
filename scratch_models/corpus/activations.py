"""Hook points over batches of sequences: which tensors, which positions, as rows.

A harvested tensor has one value per token: its hook point declares a batch axis first and one token axis "s"
(`layers.3.out` [b, s, h], `layers.3.attn.q` [b, n, s, d]); a row holds the rest ([h], [n, d]). A tensor with a
key axis (attention scores and probabilities, whose width is the sequence's length) has no fixed row and is
refused; one without a token axis (BERT's pooler [b, h]) has one value per sequence and goes with `positions`
first, last or mean.
"""

import dataclasses
import fnmatch

import torch

from ..hooks import _unknown_name_message

POSITIONS = ("all", "first", "last", "mean")  # every real token, or one row per sequence


class _Stop(Exception):
    """Raised by the listener on the last hook point needed: the rest of the forward pass is not run."""


def resolve_names(points: dict, patterns) -> list[str]:
    """Hook names matching `patterns` (names, or globs such as `layers.*.out`), in forward order; a pattern that
    matches nothing is an error naming it (with the names nearest to it)."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    if not patterns:
        raise ValueError("names: give at least one hook name or pattern (e.g. layers.*.out)")
    chosen = set()
    for pattern in patterns:
        matched = [name for name in points if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ValueError(_unknown_name_message(pattern, points).replace("unknown hook point", "no hook point "
                                                                               "matches"))
        chosen.update(matched)
    return [name for name in points if name in chosen]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a hook point's tensor keeps its tokens: `token_axis` (None: one value per sequence), and each row's
    shape."""

    token_axis: int | None
    row_shape: tuple[int, ...]


def layouts(model, names: list[str], positions: str) -> dict[str, Layout]:
    """Each name's Layout, from the shapes one tiny forward pass gives (its declared axes say which is which)."""
    dims = model.hook_dims()
    found = {}
    for name in names:
        axes = dims[name]
        if axes[0] != "b" or any("p" in axis for axis in axes) or axes.count("s") > 1:
            raise ValueError(f"{name} has axes [{', '.join(axes)}]: harvest takes tensors with a batch axis first "
                             "and at most one token axis (attention scores and probabilities have a row as long as "
                             "the sequence, which no fixed column holds)")
        if "s" not in axes and positions == "all":
            raise ValueError(f"{name} [{', '.join(axes)}] has one value per sequence, not per token: harvest it with "
                             "positions first, last or mean (one row per sequence)")
        found[name] = axes.index("s") if "s" in axes else None
    shapes = _shapes(model, names)
    return {name: Layout(axis, tuple(s for i, s in enumerate(shapes[name]) if i not in (0, axis)))
            for name, axis in found.items()}


def _shapes(model, names) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape on a batch of one sequence of two tokens."""
    shapes = {}

    def record(tensor, name):
        shapes[name] = tuple(tensor.shape)

    ids = torch.zeros(1, 2, dtype=torch.long)
    with torch.no_grad():
        model.run_with_hooks(ids.to(_device(model)), hooks=[(name, record) for name in names])
    return shapes


def _device(model) -> torch.device:
    return next(model.parameters()).device


class Runner:
    """Runs `model` on batches and hands back each hook point's tensor as rows (kept positions only).

    Eager: every named point listens, and the forward pass stops after the last of them (the layers above are
    not run). `compiled`: compile_model's run_with_cache, one graph per batch shape, which runs the whole model."""

    def __init__(self, model, names: list[str], layouts: dict[str, Layout], *, positions: str, drop_special: bool,
                 input_names: tuple[str, ...], compiled=None):
        self.model, self.names, self.layouts = model, names, layouts
        self.positions, self.drop_special = positions, drop_special
        self.input_names = input_names
        self.compiled = compiled
        self.device = _device(model)
        self.stop_at = None  # the last point the forward pass reaches, learned on the first batch

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
            keep[row, :n] = ~torch.tensor(sequence.special, dtype=torch.bool) if self.drop_special else True
        return columns | {"keep": keep}

    def run(self, batch) -> dict[str, torch.Tensor]:
        """Hook name -> [rows, *row_shape] in the model's dtype, on its device; and "token_id", "document",
        "position" -> [rows] on the CPU. Positions "all": a row per kept token. first / last / mean: a row per
        sequence with a kept token (mean's position and token_id are -1)."""
        columns = self.tensors(batch)
        keep = columns["keep"]
        inputs = {name: columns[name].to(self.device) for name in self.input_names}
        cache = self._cache(inputs)
        if self.positions == "all":
            rows = {name: self._tokens(cache[name], name, len(batch))[keep.to(self.device)] for name in self.names}
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
            tokens = self._tokens(cache[name], name, len(batch))
            if self.layouts[name].token_axis is None:
                rows[name] = tokens[any_kept.to(self.device)]
            elif self.positions == "mean":
                rows[name] = _mean(tokens, keep.to(self.device))[any_kept.to(self.device)]
            else:
                rows[name] = tokens[at.to(self.device), pick.to(self.device)]
        return rows | meta

    def _tokens(self, tensor: torch.Tensor, name: str, batch: int) -> torch.Tensor:
        """[b, s, *row] (or [b, *row] for a point without tokens)."""
        if tensor.shape[0] != batch:  # declared per row, computed once for all (GPT-2's position embeddings)
            tensor = tensor.expand(batch, *tensor.shape[1:])
        axis = self.layouts[name].token_axis
        return tensor if axis is None else tensor.movedim(axis, 1)

    def _cache(self, inputs) -> dict[str, torch.Tensor]:
        if self.compiled is not None:
            with torch.no_grad():
                return dict(self.compiled.run_with_cache(**inputs, names=self.names)[1])
        cache, order = {}, []

        def record(tensor, name):
            cache[name] = tensor
            order.append(name)
            if name == self.stop_at:
                raise _Stop

        with torch.no_grad():
            try:
                self.model.run_with_hooks(**inputs, hooks=[(name, record) for name in self.names])
            except _Stop:
                pass
        if self.stop_at is None:
            self.stop_at = order[-1]
        missing = [name for name in self.names if name not in cache]
        if missing:  # a point the first batch reached after the stop point: never expected, never ignored
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
