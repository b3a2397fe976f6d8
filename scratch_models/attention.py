"""Scaled dot-product attention over heads, shared by BERT and GPT-2.

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_head) + M) V

M is an additive mask: 0 where a query may look at a key, a huge negative number where it may not. There are
two paths that compute the same thing: the explicit one, which materialises the scores and probabilities so
they can be read or edited through hook points, and torch's fused `scaled_dot_product_attention`, used when
nobody needs them.
"""

import torch
import torch.nn.functional as F

from .hooks import HookPoint


def padding_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[batch, key] (1 attend, 0 padding) -> additive mask [batch, 1, 1, key], or None if nothing is padded.

    Padding gets the most negative finite number rather than -inf: its exp() underflows to exactly 0 all the
    same, but a row with every key padded still has a finite softmax (uniform) instead of NaN.
    """
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return _additive(attention_mask[:, None, None, :].to(torch.bool), dtype)


def causal_mask(attention_mask: torch.Tensor | None, query_len: int, past_len: int, dtype: torch.dtype,
                device: torch.device) -> torch.Tensor | None:
    """Additive mask [batch or 1, 1, query, past + query]: query i, at position past + i, sees the keys
    0 .. past + i that are not padding (attention_mask [batch, past + query], 1 attend, 0 padding, or None).
    None if nothing is blocked (a single new token and no padding).

    Causality and padding are joined as booleans and turned into numbers once, as transformers does: a key both
    in the future and padded gets finfo.min once, not twice (-inf), and a padding query that may see no key at
    all gets a uniform row, as in transformers, instead of NaN.
    """
    if attention_mask is None and query_len == 1:
        return None  # one new token may see every key before it: the common decoding step, with no work
    see = torch.ones(query_len, past_len + query_len, dtype=torch.bool, device=device).tril(diagonal=past_len)
    see = see[None, None]  # [1, 1, query, key]
    if attention_mask is not None:
        see = see & attention_mask[:, None, None, :].to(torch.bool)  # [batch, 1, query, key]
    if bool(see.all()):
        return None
    return _additive(see, dtype)


def _additive(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean keep-mask -> 0 where kept, the most negative finite `dtype` number where blocked."""
    blocked = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
    return blocked.masked_fill(~keep, torch.finfo(dtype).min)


def is_masked(scores: torch.Tensor) -> torch.Tensor:
    """Where masked scores hold the value `_additive` puts there: adding a score to the dtype's most negative
    number leaves that number, so the blocked entries of the `scores` hook point are exactly it."""
    return scores == torch.finfo(scores.dtype).min


def attend(q, k, v, mask, *, scale: float, dropout_p: float, scores: HookPoint, probs: HookPoint,
           explicit: bool, causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [batch, heads, query, head_dim], k, v [batch, heads, key, head_dim] -> (context [batch, heads, query,
    head_dim], probs or None).

    `mask`: additive, broadcastable to [batch, heads, query, key], or None. `causal`: query i sees keys 0..i
    only, with no mask given (the fused kernel then applies causality itself, and skips the blocked half).
    `explicit` (or anyone listening on the `scores` / `probs` hook points) takes the readable path and returns
    the probabilities [batch, heads, query, key]; otherwise the fused kernel runs and probs is None.
    """
    if not (explicit or scores.active or probs.active):
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                                 is_causal=causal)
        return context, None
    if causal:
        mask = causal_mask(None, q.shape[2], 0, q.dtype, q.device)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [batch, heads, query, key]: how well each query fits each key
    if mask is not None:
        s = s + mask
    weights = probs(F.softmax(scores(s), dim=-1))  # each query's weights over the keys sum to 1
    dropped = F.dropout(weights, p=dropout_p) if dropout_p else weights
    return torch.matmul(dropped, v), weights  # each query's weighted sum of the values
