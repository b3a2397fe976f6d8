"""Scaled dot-product attention over heads, shared by every family.

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_head), over the keys each query may see) V

There are two paths that compute the same thing: the explicit one, which materialises the scores and
probabilities so they can be read or edited through hook points, and torch's fused
`scaled_dot_product_attention`, used when nobody needs them. Their last bits differ (some 1e-7 relative in
float32), so a model loaded with transformer_lens=True takes the explicit path on every call (HookPoint.always):
caching or hooking its attention then changes no bit of the logits, as in TransformerLens.

Grouped-query attention (Ainslie et al., 2023; Llama 2 70B and later, Mistral, Qwen, Gemma): there are fewer key and
value heads than query heads, and each group of n / n_kv consecutive query heads reads one key/value head. The keys
and values are computed, hooked (`attn.k`, `attn.v`: [b, n_kv, s, d]) and cached with their own n_kv heads; scores,
probabilities and contexts have one row per query head. TransformerLens' `ungroup_grouped_query_attention=False`
convention, its default, is the same.

Gemma 2 caps its scores softly before the mask (`softcap`: cap · tanh(scores / cap)), which the fused kernel cannot
compute: such a layer always takes the explicit path, as transformers' eager attention (its SDPA refuses soft-capping).

A query that may see no key at all (a padding token in GPT-2 with left padding, or a row of `attention_mask`
that is all 0) attends to nothing: its weights are all 0 and its context is 0, as torch's fused kernel and
transformers' default (SDPA) attention compute it. transformers' eager attention spreads such a row evenly over
every key instead, future ones included; its float16 version can even return NaN there. Both of our paths take
the same decision on purpose, and the fused kernel is never handed such a row: its backward pass gets the
gradients wrong there.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from .hook_point import HookPoint
from .tracing import is_tracing


@dataclasses.dataclass(frozen=True)
class Mask:
    """Which keys each query may see, built once per forward pass and shared by every layer."""

    keep: torch.Tensor  # [b or 1, 1, q or 1, k] bool: True where the query may see the key
    blind: torch.Tensor  # [b or 1, 1, q or 1, 1] bool: True where the query may see no key at all
    kernel: torch.Tensor  # keep, with every key shown to a blind query: the fused kernel never meets an empty row

    @classmethod
    def from_keep(cls, keep: torch.Tensor) -> "Mask":
        blind = ~keep.any(dim=-1, keepdim=True)
        return cls(keep, blind, keep | blind)


def padding_mask(attention_mask: torch.Tensor | None) -> Mask | None:
    """[batch, key] (1 attend, 0 padding) -> Mask over [batch, 1, 1, key], or None when there is no mask."""
    if attention_mask is None or nothing_padded(attention_mask):
        return None
    return Mask.from_keep(attention_mask[:, None, None, :].to(torch.bool))


def causal_mask(attention_mask: torch.Tensor | None, query_len: int, past_len: int,
                device: torch.device, window: int | None = None) -> Mask | None:
    """Mask over [batch or 1, 1, query, past + query]: query i, at position past + i, sees the keys 0 .. past + i
    that are not padding (attention_mask [batch, past + query], 1 attend, 0 padding, or None); with a sliding
    `window` (Mistral, Qwen 2, Gemma 2), only the last `window` of them, itself included: key j with
    j > past + i - window, counted in the input's positions (padding included), as transformers counts them.
    None if nothing is blocked (a single new token, no padding and no window)."""
    if attention_mask is None and query_len == 1 and window is None:
        return None  # one new token may see every key before it: the common decoding step, with no work
    keep = torch.ones(query_len, past_len + query_len, dtype=torch.bool, device=device).tril(diagonal=past_len)
    if window is not None:
        keep = keep.triu(diagonal=past_len - window + 1)
    keep = keep[None, None]  # [1, 1, query, key]
    if attention_mask is not None:
        keep = keep & attention_mask[:, None, None, :].to(torch.bool)  # [batch, 1, query, key]
    return Mask.from_keep(keep)


def nothing_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every entry is 1, so no mask needs building. While tracing, exporting or compiling the answer is
    always False: a Python branch on the values would be frozen into the graph for every later input."""
    return not is_tracing(attention_mask) and bool(attention_mask.all())


def is_masked(scores: torch.Tensor) -> torch.Tensor:
    """Where the `scores` hook point holds a blocked entry: the explicit path writes the dtype's most negative
    number there (finite, so even a row with every key blocked has a finite softmax)."""
    return scores == torch.finfo(scores.dtype).min


def attend(q, k, v, mask: Mask | None, *, scale: float, dropout_p: float, scores: HookPoint, probs: HookPoint,
           explicit: bool, causal: bool = False, upcast_softmax: bool = False,
           softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q [batch, heads, query, head_dim], k, v [batch, kv_heads, key, head_dim] -> (context [batch, heads, query,
    head_dim], probs or None). kv_heads divides heads: each group of heads / kv_heads consecutive query heads reads
    one key/value head (grouped-query attention; kv_heads = heads is plain multi-head attention).

    `mask`: a Mask broadcastable to [batch, heads, query, key], or None. `causal`: query i sees keys 0..i only,
    with no mask given (the fused kernel then applies causality itself, and skips the blocked half).
    `explicit` (or `scores` / `probs` being computed: listened to, or made `always`; or a `softcap`) takes the
    readable path and returns the probabilities [batch, heads, query, key]; otherwise the fused kernel runs and probs
    is None.
    `upcast_softmax`: the explicit path's softmax runs in float32 (at least) and is cast back (as transformers' eager
    attention computes it for GPT-NeoX and the Llama-like families); it changes nothing in float32.
    `softcap`: scores become softcap · tanh(scores / softcap) before the mask (Gemma 2).
    """
    groups = _groups(q, k)
    if not (explicit or scores.computed or probs.computed or softcap is not None):
        return _fused(q, k, v, mask, scale=scale, dropout_p=dropout_p, causal=causal, groups=groups), None
    if causal:
        mask = causal_mask(None, q.shape[2], 0, q.device)
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [batch, heads, query, key]: how well each query fits each key
    s = soft_cap(s, softcap)
    if mask is not None:
        s = s.masked_fill(~mask.keep, torch.finfo(s.dtype).min)  # set, not added: adding could overflow to -inf
    s = scores(s)
    # each query's weights over the keys it may see sum to 1
    # float32 at least: a float64 model's softmax stays in float64
    weights = F.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(s.dtype) if upcast_softmax \
        else F.softmax(s, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(mask.blind, 0.0)  # a query that may see nothing attends to nothing
    weights = probs(weights)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p else weights
    return torch.matmul(dropped, v), weights  # each query's weighted sum of the values


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap · tanh(x / cap), in transformers' order of operations: x where |x| << cap, never beyond ±cap (Gemma 2's
    attention scores and final logits); x itself for no cap."""
    return x if cap is None else torch.tanh(x / cap) * cap


def _fused(q, k, v, mask: Mask | None, *, scale: float, dropout_p: float, causal: bool, groups: int) -> torch.Tensor:
    """torch's fused kernel, handed grouped heads as transformers' SDPA attention hands them, so that the same
    kernel runs on the same layout and rounds the same: grouped by the kernel itself without a mask, packed (each
    group's queries as one key/value head's queries) for a single query, else with the key/value heads repeated."""
    shape = q.shape
    if groups > 1:
        if mask is None and k.shape[-1] == v.shape[-1] <= 256:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=causal,
                                                  enable_gqa=True)
        if shape[2] == 1:
            q = q.reshape(shape[0], k.shape[1], groups, shape[3])  # [b, n_kv, groups, d]: one query per head
        else:
            k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    if mask is None:
        context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale,
                                                 is_causal=causal and shape[2] > 1)
        return context.reshape(shape)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.kernel, dropout_p=dropout_p, scale=scale)
    return context.reshape(shape).masked_fill(mask.blind, 0.0)  # what a blind query got from the keys shown to it


def _groups(q: torch.Tensor, k: torch.Tensor) -> int:
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key/value heads: the count must divide")
    return heads // kv_heads


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, n_kv, s, d] -> [b, n_kv * groups, s, d]: each key/value head once per query head of its group, in the
    order the query heads come (head h reads key/value head h // groups)."""
    if groups == 1:
        return x
    b, kv_heads, s, d = x.shape
    return x[:, :, None].expand(b, kv_heads, groups, s, d).reshape(b, kv_heads * groups, s, d)


def result_point() -> HookPoint:
    """The opt-in `attn.result` hook point of an attention layer (see project_heads)."""
    return HookPoint("b, s, n, h", RESULT_DOC, opt_in=True)


RESULT_DOC = ("each head's output in the residual stream's basis: its context through its rows of the "
              "output projection, without the bias; the sum over heads plus the bias is `attn.proj`. Computed only "
              "while listened to (then `attn.proj` is built from it, edits included); `run_with_cache` caches it "
              "only when named")


def project_heads(merged: torch.Tensor, projection: nn.Module, weight: torch.Tensor, num_heads: int,
                  result: HookPoint) -> torch.Tensor:
    """merged [b, s, n * d] (the heads side by side) -> [b, s, h] through the output `projection`, whose matrix is
    `weight` [n * d, h] and bias `projection.bias` (or none).

    With someone listening on `result`, the projection is taken head by head instead: `result` [b, s, n, h] holds
    each head's term, and the output is their sum plus the bias, so an edit of one head's term reaches the output.
    That sum rounds differently from the one matmul (by about 1e-7 relative in float32); with nobody listening
    nothing changes and nothing extra is computed.
    """
    if not result.active:
        return projection(merged)
    per_head = merged.unflatten(-1, (num_heads, -1))  # [b, s, n, d]
    summed = result(head_results(per_head, weight)).sum(dim=-2)
    return summed if projection.bias is None else summed + projection.bias


def head_results(per_head: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """per_head [..., s, n, d] (each head's context), weight [n * d, h] (the output projection's matrix, input rows
    first) -> [..., s, n, h]: what each head writes into the residual stream, less the projection's bias, which
    belongs to no head."""
    heads, head_dim = per_head.shape[-2:]
    return torch.einsum("...nd,ndh->...nh", per_head, weight.unflatten(0, (heads, head_dim)))
