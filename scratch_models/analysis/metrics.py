"""What a patching sweep or a head score measures: a metric maps a model's output to one value per prompt.

    metric(output) -> tensor [batch]          (head scores also take [batch, k]: a vector per prompt)

`output` is what the model's call returns for a batch of prompts, in the order they were given: its output
object, or its logits for a model whose calls return them (loaded with transformer_lens=True), which is
TransformerLens' metric contract, metric(logits). A sweep hands each patched copy of the batch to the metric on its
own, so per-prompt answers and positions line up. Any callable will do, and one may return a single number for the
whole batch, as TL's patching metrics do; these cover the usual targets and take either form of output. Positions
are given per prompt: with right padding the last column is padding, so `last_positions(attention_mask)` says
where each prompt ends; without positions a metric reads the last position, the next token after each prompt of
a causal model when none is right-padded (the patching functions refuse it otherwise).
"""

import dataclasses

import torch
import torch.nn.functional as F

from ..parts.outputs import logits_of

PerPrompt = int | list[int] | torch.Tensor  # one value for every prompt, or one each


def last_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b] the index of each row's last real token (right or left padding alike); the next-token prediction
    of a causal model is read there."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (columns * attention_mask.bool()).argmax(-1)


@dataclasses.dataclass(frozen=True)
class LogitDiff:
    """logit of `answer` minus logit of `wrong`, at `positions` (None: the last) for [b, s, V] logits (LM and MLM
    heads) or of the row for [b, L] logits (sequence classifiers: answer and wrong are class indices).
    TransformerLens' tutorials' `logits_to_ave_logit_diff`, one value per prompt."""

    answer: PerPrompt
    wrong: PerPrompt
    positions: PerPrompt | None = None

    def __call__(self, output) -> torch.Tensor:
        scores = _scores(output, self.positions)
        return _pick(scores, self.answer, "answer") - _pick(scores, self.wrong, "wrong")


@dataclasses.dataclass(frozen=True)
class TokenLogit:
    """The logit of `token` (a class index for [b, L] logits): GPT-2's next-token logit, a class logit."""

    token: PerPrompt
    positions: PerPrompt | None = None

    def __call__(self, output) -> torch.Tensor:
        return _pick(_scores(output, self.positions), self.token, "token")


@dataclasses.dataclass(frozen=True)
class TokenLogProb:
    """log-softmax of the logits at `positions`, at `token`: an MLM token's log-probability (in float32 at least,
    as transformers computes its losses)."""

    token: PerPrompt
    positions: PerPrompt | None = None

    def __call__(self, output) -> torch.Tensor:
        scores = _scores(output, self.positions)
        return _pick(F.log_softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1),
                     self.token, "token")


@dataclasses.dataclass(frozen=True)
class PoolerOutput:
    """The pooler's output [b, h] itself: a vector per prompt; head scores then measure its L2 change."""

    def __call__(self, output) -> torch.Tensor:
        return _pooler(output)


@dataclasses.dataclass(frozen=True)
class PoolerCosine:
    """Cosine similarity of the pooler output with `reference` [b, h] (e.g. the clean run's): 1 when equal."""

    reference: torch.Tensor

    def __call__(self, output) -> torch.Tensor:
        pooled = _pooler(output)
        if pooled.shape != self.reference.shape:
            raise ValueError(f"pooler_output has shape {tuple(pooled.shape)}; the reference has "
                             f"{tuple(self.reference.shape)}")
        return F.cosine_similarity(pooled, self.reference.to(pooled), dim=-1)


def normalized(value, clean, corrupted):
    """(value - corrupted) / (clean - corrupted): 0 where a patch leaves the corrupted run's metric, 1 where it
    restores the clean run's, as in TransformerLens' tutorials. Refused when clean and corrupted agree: then
    there is nothing to restore, and every score would be a division by zero."""
    clean, corrupted = float(clean), float(corrupted)
    if clean == corrupted:
        raise ValueError(f"the clean and corrupted runs give the same metric ({clean:.6g}): nothing to restore, "
                         "so no normalised score; choose prompts (or answers) on which they differ")
    return (value - corrupted) / (clean - corrupted)


def _scores(output, positions) -> torch.Tensor:
    """[b, V] (or [b, L]): the logits at each prompt's position (None: the last)."""
    logits = logits_of(output)
    what = "the logits" if isinstance(output, torch.Tensor) else f"{type(output).__name__}.logits"
    if logits.dim() == 2:
        if positions is not None:
            raise ValueError(f"{what} are [batch, classes] {tuple(logits.shape)}, one row per prompt: positions do "
                             "not apply")
        return logits
    if logits.dim() != 3:
        raise ValueError(f"{what} have shape {tuple(logits.shape)}; the built-in metrics read [batch, seq, vocab] "
                         "or [batch, classes]: write your own metric for this head")
    if positions is None:
        return logits[:, -1]
    rows = torch.arange(logits.shape[0], device=logits.device)
    at = per_prompt(positions, logits.shape[0], "positions", logits.device)
    if bool(((at < -logits.shape[1]) | (at >= logits.shape[1])).any()):
        raise ValueError(f"positions {at.tolist()} out of range for {logits.shape[1]} positions")
    return logits[rows, at]


def _pooler(output) -> torch.Tensor:
    pooled = getattr(output, "pooler_output", None)
    if not isinstance(pooled, torch.Tensor):
        raise ValueError(f"{type(output).__name__} has no pooler_output (BertModel with its pooler has one)")
    return pooled


def _pick(scores: torch.Tensor, index: PerPrompt, what: str) -> torch.Tensor:
    """scores [b, V] at one index per row."""
    at = per_prompt(index, scores.shape[0], what, scores.device)
    if bool(((at < 0) | (at >= scores.shape[1])).any()):
        raise ValueError(f"{what} {at.tolist()} out of range: the output has {scores.shape[1]} entries")
    return scores.gather(1, at[:, None])[:, 0]


def per_prompt(value: PerPrompt, batch: int, what: str, device) -> torch.Tensor:
    """`value` as [batch] integers: one for every prompt, or one each; a ValueError naming `what` otherwise."""
    at = torch.as_tensor(value, device=device)
    if at.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"{what} must be integers, got {at.dtype}")
    if at.dim() == 0:
        return at.long().expand(batch)
    if tuple(at.shape) != (batch,):
        raise ValueError(f"{what} has shape {tuple(at.shape)}: give one int, or one per prompt ({batch})")
    return at.long()
