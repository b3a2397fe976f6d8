"""Look inside one run: the attention of one sequence, gathered for pictures, and a summary of a cache.

    output, cache = model.run_with_cache(input_ids, ...)
    capture = AttentionCapture.from_cache(cache, tokens)     # what the pictures draw
    print(format_summary(summarize(cache)))                  # shape, mean, std, min, max of every tensor
"""

import dataclasses
import re

import torch

from .attention import is_masked

ATTENTION_HOOKS = ("q", "k", "scores", "probs")  # what the pictures need from each layer's attention


@dataclasses.dataclass
class AttentionCapture:
    """One sequence's attention in every layer, as the model computed it (float32, on the CPU)."""

    tokens: list[str]
    probs: torch.Tensor  # [layers, heads, query, key]
    scores: torch.Tensor  # [layers, heads, query, key], scaled and masked, before softmax
    q: torch.Tensor  # [layers, heads, query, head_dim]
    k: torch.Tensor  # [layers, heads, key, head_dim]
    sentence_b_start: int | None = None  # first token of the second segment of a sentence pair

    @classmethod
    def from_cache(cls, cache: dict[str, torch.Tensor], tokens: list[str], *, row: int = 0,
                   sentence_b_start: int | None = None) -> "AttentionCapture":
        """Pick batch row `row` out of a cache holding `layers.{i}.attn.{q,k,scores,probs}` for every layer."""
        layers = sorted({int(m[1]) for name in cache if (m := re.fullmatch(r"layers\.(\d+)\.attn\.probs", name))})
        if not layers:
            raise ValueError("the cache holds no layers.{i}.attn.probs: run_with_cache with names=attention_names")
        missing = [f"layers.{i}.attn.{what}" for i in range(max(layers) + 1) for what in ATTENTION_HOOKS
                   if f"layers.{i}.attn.{what}" not in cache]
        if missing:
            raise ValueError(f"the cache lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")

        def stacked(what):
            return torch.stack([cache[f"layers.{i}.attn.{what}"][row] for i in layers]).float().cpu()

        # scores keep their own dtype's mask value: float32's finfo.min survives the cast from fp16 only as
        # -65504, so the masked entries are marked once here, where the dtype is known
        scores = torch.stack([_masked_to_minus_inf(cache[f"layers.{i}.attn.scores"][row]) for i in layers])
        capture = cls(tokens=list(tokens), probs=stacked("probs"), scores=scores.cpu(), q=stacked("q"),
                      k=stacked("k"), sentence_b_start=sentence_b_start)
        seq = capture.probs.shape[-1]
        if len(tokens) != seq or capture.q.shape[-2] != seq:
            raise ValueError(f"tokens: {len(tokens)} given for attention over {seq} positions "
                             "(with a KV cache, capture the whole sequence in one forward)")
        if sentence_b_start is not None and not 0 < sentence_b_start < seq:
            raise ValueError(f"sentence_b_start={sentence_b_start} must be in 1..{seq - 1}")
        return capture

    @property
    def num_layers(self) -> int:
        return self.probs.shape[0]

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]


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
