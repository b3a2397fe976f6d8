"""Look inside one run: the attention of one sequence, gathered for pictures, and a summary of a cache.

    output, cache = model.run_with_cache(input_ids, ...)
    capture = AttentionCapture.from_cache(cache, tokens)     # what the pictures draw
    print(format_summary(summarize(cache)))                  # shape, mean, std, min, max of every tensor
"""

import dataclasses
import re

import torch

from ..parts.attention import is_masked, repeat_kv

ATTENTION_HOOKS = ("q", "k", "scores", "probs")  # what the pictures need from each layer's attention
_MASKED_BELOW = -1e30  # a score at or below this is a mask value, not a score a model computed


@dataclasses.dataclass
class AttentionCapture:
    """One sequence's attention in every layer, as the model computed it, for the pictures to draw.

    `from_cache` builds it from a cache and leaves out padding; `window` cuts out a stretch of tokens. Either way
    `positions` says where each token sat in the model's input, so a picture of part of a sequence can say so.
    """

    tokens: list[str]
    probs: torch.Tensor  # [layers, heads, query, key]
    scores: torch.Tensor  # [layers, heads, query, key], scaled and masked, before softmax
    q: torch.Tensor  # [layers, heads, query, head_dim]
    k: torch.Tensor  # [layers, heads, key, head_dim]: with grouped-query attention, each query head's shared key head
    sentence_b_start: int | None = None  # index in `tokens` of the first token of segment B (0: all of them)
    positions: list[int] | None = None  # each token's position in the model's input; None: 0, 1, 2, ...
    input_length: int | None = None  # tokens in the model's input, shown or not; None: len(tokens)

    def __post_init__(self):
        """Check the fields against each other, so every picture draws from a consistent capture."""
        tokens = self.tokens
        if not isinstance(tokens, (list, tuple)) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise ValueError("tokens must be a non-empty list of strings")
        for name in ("probs", "scores", "q", "k"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 4:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 4-d floating point tensor, got {shape}")
            setattr(self, name, t.detach().cpu())  # a snapshot to draw: no autograd graph, on the CPU
        seq = len(tokens)
        if tuple(self.probs.shape[2:]) != (seq, seq):
            raise ValueError(f"probs must be [L, H, S, S] with S = len(tokens) = {seq}, got {tuple(self.probs.shape)}")
        if self.scores.shape != self.probs.shape:
            raise ValueError(f"scores shape {tuple(self.scores.shape)} differs from probs shape "
                             f"{tuple(self.probs.shape)}")
        if self.q.shape[:3] != self.probs.shape[:3]:
            raise ValueError(f"q shape {tuple(self.q.shape)} does not match probs shape {tuple(self.probs.shape)} "
                             "in [L, H, S]")
        if self.k.shape != self.q.shape:
            raise ValueError(f"k shape {tuple(self.k.shape)} differs from q shape {tuple(self.q.shape)}")
        for name in ("probs", "q", "k"):
            if not bool(torch.isfinite(getattr(self, name)).all()):
                raise ValueError(f"{name} contains NaN or infinite values")
        if self.sentence_b_start is not None and not 0 <= self.sentence_b_start < seq:
            raise ValueError(f"sentence_b_start must be None or in 0..{seq - 1}, got {self.sentence_b_start}")
        self.tokens = list(tokens)
        self.input_length = seq if self.input_length is None else self.input_length
        self.positions = list(range(seq)) if self.positions is None else list(self.positions)
        if (len(self.positions) != seq or any(b <= a for a, b in zip(self.positions, self.positions[1:]))
                or self.positions[0] < 0 or self.positions[-1] >= self.input_length):
            raise ValueError(f"positions must be {seq} increasing indices in 0..{self.input_length - 1}")

    @classmethod
    def from_cache(cls, cache: dict[str, torch.Tensor], tokens: list[str], *, row: int = 0,
                   sentence_b_start: int | None = None, drop_padding: bool = True) -> "AttentionCapture":
        """Pick batch row `row` out of a cache holding `layers.{i}.attn.{q,k,scores,probs}` for every layer.

        `tokens` and `sentence_b_start` describe the whole row, padding included. With `drop_padding`, the
        positions that no query may attend to in any layer (the row's padding, wherever its attention_mask is 0)
        are left out of every picture: their rows would be drawn like tokens though they attend to nothing the
        model uses. `positions` records which positions remain.
        """
        names = cache.hook_names() if hasattr(cache, "hook_names") else cache  # ours, whatever the cache's keys
        layers = sorted({int(m[1]) for name in names if (m := re.fullmatch(r"layers\.(\d+)\.attn\.probs", name))})
        if not layers:
            raise ValueError("the cache holds no layers.{i}.attn.probs: run_with_cache with names=attention_names")
        missing = [f"layers.{i}.attn.{what}" for i in range(max(layers) + 1) for what in ATTENTION_HOOKS
                   if f"layers.{i}.attn.{what}" not in cache]
        if missing:
            raise ValueError(f"the cache lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
        batch = cache[f"layers.{layers[0]}.attn.probs"].shape[0]
        if not 0 <= row < batch:
            raise ValueError(f"row={row} is out of range: the cache holds a batch of {batch}")

        def stacked(what):
            return torch.stack([cache[f"layers.{i}.attn.{what}"][row] for i in layers]).float()

        # scores keep their own dtype's mask value: float32's finfo.min survives the cast from fp16 only as
        # -65504, so the masked entries are marked once here, where the dtype is known
        scores = torch.stack([_masked_to_minus_inf(cache[f"layers.{i}.attn.scores"][row]) for i in layers])
        probs, q, k = stacked("probs"), stacked("q"), stacked("k")
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each key head serves a group of query heads
            k = repeat_kv(k, q.shape[1] // k.shape[1])
        seq = probs.shape[-1]
        if len(tokens) != seq or q.shape[-2] != seq:
            raise ValueError(f"tokens: {len(tokens)} given for attention over {seq} positions "
                             "(with a KV cache, capture the whole sequence in one forward)")
        if sentence_b_start is not None and not 0 < sentence_b_start < seq:
            raise ValueError(f"sentence_b_start={sentence_b_start} must be in 1..{seq - 1}")
        full = cls(tokens=list(tokens), probs=probs, scores=scores, q=q, k=k, sentence_b_start=sentence_b_start)
        if not drop_padding:
            return full
        kept = (~full.masked.flatten(0, 2).all(0)).nonzero().flatten().tolist()  # keys some query may see
        if not kept:
            raise ValueError(f"row {row}: every position is masked (an attention_mask row of 0s): nothing to draw")
        return full._keep(kept)

    def window(self, start: int, end: int) -> "AttentionCapture":
        """Tokens start..end-1 only (as a slice), attending among themselves: each query's weights on the keys
        outside the window are left out, so its row no longer sums to 1."""
        if not 0 <= start < end <= len(self.tokens):
            raise ValueError(f"window {start}:{end} must satisfy 0 <= start < end <= {len(self.tokens)} (tokens)")
        return self._keep(list(range(start, end)))

    def _keep(self, indices: list[int]) -> "AttentionCapture":
        """The tokens at `indices` (increasing), as queries and as keys."""
        at = torch.tensor(indices)
        b_start = self.sentence_b_start
        if b_start is not None:  # the kept tokens before segment B are segment A
            b_start = sum(i < b_start for i in indices)
            b_start = None if b_start == len(indices) else b_start
        return dataclasses.replace(self, tokens=[self.tokens[i] for i in indices],
                                   probs=self.probs[..., at[:, None], at], scores=self.scores[..., at[:, None], at],
                                   q=self.q[..., at, :], k=self.k[..., at, :], sentence_b_start=b_start,
                                   positions=[self.positions[i] for i in indices])

    @property
    def num_layers(self) -> int:
        return self.probs.shape[0]

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]

    @property
    def part(self) -> str:
        """Which of the input's positions the capture holds, in words; "" when it holds them all."""
        shown, first, last = len(self.tokens), self.positions[0], self.positions[-1]
        if shown == self.input_length:
            return ""
        return f"{shown} of {self.input_length} positions" + (f": {first}..{last}" if last - first + 1 == shown else "")

    @property
    def masked(self) -> torch.Tensor:
        """[layers, heads, query, key] bool: True where the model blocked the score (its probability is 0). The
        dtype's most negative number is tested in that dtype: float16 masks with -65504, far above -1e30."""
        wide = self.scores.float()
        return is_masked(self.scores) | torch.isneginf(wide) | (wide <= _MASKED_BELOW)


def attention_names(name: str) -> bool:
    """`run_with_cache(names=attention_names)` keeps just what AttentionCapture needs."""
    return re.fullmatch(rf"layers\.\d+\.attn\.({'|'.join(ATTENTION_HOOKS)})", name) is not None


def _masked_to_minus_inf(scores: torch.Tensor) -> torch.Tensor:
    return scores.float().masked_fill(is_masked(scores), float("-inf"))


def summarize(cache: dict[str, torch.Tensor]) -> list[dict]:
    """One row per cached tensor: name, shape, dtype, and mean, std, min, max over its finite elements (masked
    attention scores are the dtype's most negative number; they would swamp every statistic, so they are
    counted apart as `masked`)."""
    rows = []
    for name, tensor in cache.items():
        values = tensor.detach().double()
        masked = is_masked(tensor) if tensor.is_floating_point() else torch.zeros_like(
            tensor, dtype=torch.bool)
        kept = values[~masked]
        stats = dict(mean=kept.mean().item(), std=kept.std(correction=0).item(), min=kept.min().item(),
                     max=kept.max().item()) if kept.numel() else dict(mean=None, std=None, min=None, max=None)
        rows.append(dict(name=name, shape=list(tensor.shape), dtype=str(tensor.dtype).removeprefix("torch."),
                         **stats, masked=int(masked.sum())))
    return rows


def format_summary(rows: list[dict]) -> str:
    """`summarize`'s rows as an aligned text table."""
    header = ("name", "shape", "dtype", "mean", "std", "min", "max", "masked")

    def number(x):
        return "-" if x is None else f"{x:.4g}"

    body = [(r["name"], "x".join(map(str, r["shape"])), r["dtype"], *(number(r[k]) for k in header[3:7]),
             str(r["masked"]) if r["masked"] else "") for r in rows]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in [header, *body])
