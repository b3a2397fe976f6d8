"""The logit lens as a table: the most likely tokens at every layer and position (what `scratch-models lens` prints
and draws), from `ActivationCache.logit_lens`, which reads each layer's residual stream with the model's own
read-out as the family declares it.
"""

import dataclasses

import torch

from ..hooking.activation_cache import ActivationCache


@dataclasses.dataclass
class LensTable:
    """The logit lens of one sequence, most likely tokens first: what `scratch-models lens` prints and draws."""

    labels: list[str]  # one per entry of accumulated_resid: 0_pre (the embeddings), 1_pre, ..., final_post
    token_ids: torch.Tensor  # [entries, s, k] the k most likely tokens at each entry and position
    probs: torch.Tensor  # [entries, s, k] their probabilities (float32)


@torch.no_grad()
def lens_table(cache: ActivationCache, *, row: int = 0, k: int = 1, incl_mid: bool = False) -> LensTable:
    """The k most likely tokens of `logit_lens` at each entry and position of batch row `row` (any row of a cache
    without a batch axis), with their probabilities."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int of at least 1, got {k!r}")
    logits, labels = cache.logit_lens(incl_mid=incl_mid, return_labels=True)
    if cache.has_batch_dim:
        logits = logits[:, row]
    top = logits.float().softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
    return LensTable(labels=labels, token_ids=top.indices, probs=top.values)
