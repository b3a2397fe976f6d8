"""The losses of the task heads, computed as transformers computes them, with the labels checked first.

`problem_type` (config.json) says which loss a sequence classifier uses; when it is null the choice follows the
labels: one label means regression, integer labels single-label classification, float labels (one 0/1 column per
class) multi-label. transformers writes its choice into the config at the first call and keeps it; here it is made
on every call.

Labels of the wrong shape, dtype or range raise a ValueError naming the argument, where torch would fail deep
inside the loss, or silently broadcast (a regression target [b] against logits [b, 3]).
"""

import torch
import torch.nn.functional as F

from .inputs import check_ids
from .tracing import is_tracing

IGNORE = -100  # a class index that is not scored (cross-entropy's default ignore_index, as in transformers)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, name: str = "labels", classes: str = "num_labels",
                  *, checked: bool = False) -> torch.Tensor:
    """Mean cross-entropy of logits [..., n] against class indices `labels` [...] (an integer tensor, each in
    0..n-1, or -100: not scored), as transformers' CrossEntropyLoss()(logits.view(-1, n), labels.view(-1)).
    `name` and `classes` (what n counts) word the errors; `checked`: the caller checked the labels already
    (before a forward pass that extends a KV cache)."""
    if not checked:
        check_ids(name, labels, logits.shape[-1], classes, shapes=(tuple(logits.shape[:-1]),), ignore=IGNORE)
    # torch's cross-entropy takes int64 indices only (transformers fails on int32 labels); any integer type is fine
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), ignore_index=IGNORE)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, num_labels: int,
                        problem_type: str | None, *, checked: bool = False) -> torch.Tensor:
    """logits [..., num_labels]; labels [...] class indices (single-label), [..., num_labels] 0/1 targets
    (multi-label), or [..., num_labels] values (regression; [...] too with one label). `checked`: the caller
    checked the labels already, and `problem_type` is what check_classification_labels returned."""
    if not checked:
        problem_type = check_classification_labels(labels, tuple(logits.shape), num_labels, problem_type)
    if problem_type == "single_label_classification":
        return cross_entropy(logits, labels, checked=True)
    if problem_type == "regression":
        return F.mse_loss(logits.squeeze(), labels.squeeze()) if num_labels == 1 else F.mse_loss(logits, labels)
    return F.binary_cross_entropy_with_logits(logits, labels)


def check_classification_labels(labels, logits_shape: tuple[int, ...], num_labels: int,
                                problem_type: str | None) -> str:
    """Check `labels` for logits of `logits_shape`, before the forward pass if need be (a KV cache it would
    extend); return the problem type the loss uses: `problem_type`, or when None the one the labels imply."""
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "single_label_classification":
        check_ids("labels", labels, num_labels, "num_labels", shapes=(logits_shape[:-1],), ignore=IGNORE)
    else:
        _check_targets(logits_shape, labels, problem_type)
    return problem_type


def _check_targets(logits_shape: tuple[int, ...], labels: torch.Tensor, problem_type: str) -> None:
    """Regression and multi-label targets: one per logit (regression with one label: [...] as well)."""
    shapes = [logits_shape]
    if problem_type == "regression" and logits_shape[-1] == 1:
        shapes.append(logits_shape[:-1])
    if tuple(labels.shape) not in shapes:
        raise ValueError(f"labels for {problem_type} have shape {tuple(labels.shape)}, expected "
                         f"{' or '.join(map(str, shapes))}")
    if problem_type == "multi_label_classification" and not labels.is_floating_point():
        raise ValueError(f"labels for multi_label_classification must be floating point (a 0/1 target per class), "
                         f"got {labels.dtype}; class indices (torch.long) mean single_label_classification")
    if problem_type == "regression" and (labels.dtype == torch.bool or labels.is_complex()):
        raise ValueError(f"labels for regression must be real numbers, got {labels.dtype}")


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
              end_positions: torch.Tensor) -> torch.Tensor:
    """Question answering: the mean of the cross-entropies of the answer's start and end, start_logits and
    end_logits [b, s], positions [b] (or [b, 1]) token indices.

    As in transformers, a position past the sequence (>= s: the answer was cut off) is not scored; its loss is
    NaN when no position of the batch is scored. A negative position is refused: transformers would clamp it to
    0, the [CLS] token, and score it."""
    batch, seq = start_logits.shape
    losses = []
    for name, logits, positions in (("start_positions", start_logits, start_positions),
                                    ("end_positions", end_logits, end_positions)):
        _check_positions(name, positions, batch, seq)
        # transformers' clamp(0, s) and ignore_index=s: a position past the sequence is not scored
        positions = positions.reshape(batch).long().clamp(0, seq)
        losses.append(F.cross_entropy(logits, positions, ignore_index=seq))
    return (losses[0] + losses[1]) / 2


def _check_positions(name: str, positions, batch: int, seq: int) -> None:
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.is_complex() \
            or positions.dtype == torch.bool:
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"{name} must be an integer tensor of token indices, got {got}")
    if tuple(positions.shape) not in ((batch,), (batch, 1)):
        raise ValueError(f"{name} has shape {tuple(positions.shape)}, expected ({batch},) or ({batch}, 1)")
    if not is_tracing(positions) and bool((positions < 0).any()):
        raise ValueError(f"{name} holds a negative position, {int(positions.min())}; a position is a token index, "
                         f"and one past the sequence (>= {seq}) marks an answer that is not scored")
