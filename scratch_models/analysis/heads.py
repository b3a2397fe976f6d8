"""Which heads matter for a target, and what each one attends to: 144 attention maps read as one table.

Per head, over a batch of prompts:
- importance for a metric (metrics.py: a class logit, an MLM token's log-probability, the next token's logit,
  the pooler output): the change when the head is zero-ablated or mean-ablated (its output replaced by its mean
  over the batch's real tokens), all heads as batched runs (patching.run_patches); and the head-mask gradient of
  Michel et al. 2019, |d metric / d mask_h| with a mask of ones multiplied into each head's output, per prompt,
  then averaged;
- attention behaviour after Clark et al. 2019: the share of each query's attention that goes to [CLS], [SEP],
  punctuation (any groups of keys), itself, the previous and the next token, and its entropy; averaged over the
  real queries of the batch (padding queries and keys left out), and a short label from the dominant behaviour.

A head's output is `layers.{i}.attn.context` [b, n, s, d]: zeroing head h there is exactly the model with head h's
rows of the value weight and value bias zeroed (tested), since the attention weights of a query sum to 1 or 0.
With grouped-query attention (fewer key/value heads than query heads) a head here is a query head, n of them: its
context is its own weighted sum of the values its group shares, so zeroing it leaves the other heads of its group
alone, whereas zeroing a key/value head's value rows would silence its whole group.
A metric that gives a vector per prompt (the pooler output) is scored by the L2 norm of its change, and its
gradient score is the norm of d output / d mask_h: the first-order size of that change.
"""

import dataclasses
import unicodedata
from typing import Mapping, Sequence

import torch

from ..parts.attention import is_masked
from .patching import (DEFAULT_BATCH_SIZE, Metric, Patch, check_autograd, check_metric, forward_inputs, measure,
                       num_layers, run_patches)

LABEL_SHARE = 0.5  # a head is labelled by a behaviour that takes at least this share of its attention
BROAD_ENTROPY = 0.7  # else "broad" when its entropy is at least this fraction of the uniform attention's


def context_names(model) -> list[str]:
    return [f"layers.{layer}.attn.context" for layer in range(num_layers(model))]


def head_ablation_scores(model, tokens, metric: Metric, *, ablation: str = "zero",
                         batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, heads]: per head, the mean over the prompts of metric(ablated) - metric(unablated) (a vector
    metric: the L2 norm of the change). `ablation`: "zero" (the head's output set to 0) or "mean" (set to its mean
    over every real token of the batch)."""
    if ablation not in ("zero", "mean"):
        raise ValueError(f"ablation must be 'zero' or 'mean', got {ablation!r}")
    inputs = forward_inputs(tokens)
    batch = inputs["input_ids"].shape[0]
    names = context_names(model)
    with torch.no_grad():
        output, cache = model.run_with_cache(**inputs, names=names, return_type="output")
    base = check_metric(measure(model, metric, output), batch, vector_metric=True).double().cpu()
    heads = cache[names[0]].shape[1]
    if ablation == "zero":
        sources = {name: torch.zeros(()) for name in names}
    else:
        real = _real(inputs.get("attention_mask"), inputs["input_ids"].shape)
        sources = {name: _mean_over_tokens(cache[name], real) for name in names}
    patches = [Patch(name, torch.arange(heads)[:, None, None] == head) for name in names for head in range(heads)]
    ablated = run_patches(model, inputs, patches, sources, metric, batch_size=batch_size, vector_metric=True)
    return _change(ablated, base).view(len(names), heads)


def head_mask_importance(model, tokens, metric: Metric) -> torch.Tensor:
    """[layers, heads]: Michel et al. 2019's head importance, the mean over the prompts of |d metric / d mask_h|
    at mask = 1 (a vector metric: the L2 norm of d metric / d mask_h). One forward and backward pass; each
    prompt has masks of its own, so the gradient is taken per prompt before the absolute value."""
    inputs = forward_inputs(tokens)
    batch = inputs["input_ids"].shape[0]
    if model.training:
        raise ValueError("the model is in training mode: dropout would make the gradient random; call model.eval()")
    check_autograd("head_mask_importance")
    names = context_names(model)
    weight = next(model.parameters())
    masks = torch.ones(len(names), batch, model.layers[0].attn.num_heads, dtype=weight.dtype, device=weight.device,
                       requires_grad=True)

    def masked(layer):  # in the context's dtype, whatever autocast made it
        return lambda x, name: x * masks[layer][:, :, None, None].to(x.dtype)

    with torch.enable_grad():
        output = model.run_with_hooks(**inputs, hooks=[(name, masked(layer)) for layer, name in enumerate(names)],
                                      return_type="output")
        value = measure(model, metric, output)
        check_metric(value, batch, vector_metric=True)
        if value.dim() == 0:  # one number for the batch (TransformerLens' metrics): each prompt's share of it
            (grad,) = torch.autograd.grad(value, masks)
            return grad.abs().double().sum(1).cpu()
        if value.dim() == 1:
            (grad,) = torch.autograd.grad(value.sum(), masks)
            per_prompt = grad.abs()
        else:  # one backward pass per output dimension, batched: [k, layers, batch, heads]
            k = value.shape[1]
            basis = torch.eye(k, dtype=value.dtype, device=value.device)[:, None, :].expand(k, batch, k)
            (grads,) = torch.autograd.grad(value, masks, grad_outputs=basis, is_grads_batched=True)
            per_prompt = grads.double().norm(dim=0)
    return per_prompt.double().mean(1).cpu()


@dataclasses.dataclass
class AttentionSummary:
    """What each head attends to, averaged over the real queries of a batch (Clark et al. 2019)."""

    shares: dict[str, torch.Tensor]  # behaviour ("[SEP]", "punct", "self", "prev", "next", ...) -> [layers, heads]
    entropy: torch.Tensor  # [layers, heads] mean entropy of a query's attention, in nats
    uniform_entropy: float  # mean over the real queries of log(number of keys it may see): a uniform head's
    labels: list[list[str]]  # [layers][heads]: "→[SEP]", "prev", "self", "broad", ...

    @classmethod
    def from_cache(cls, cache, groups: Mapping[str, torch.Tensor] | None = None) -> "AttentionSummary":
        """The summary of the run `cache` holds (an ActivationCache from run_with_cache, with every layer's
        attn.probs and layers.0.attn.scores, as with no `names`), so a run already made costs no second one.
        groups: name -> [b, s] bool, the keys of each kind (token_groups makes [CLS], [SEP], punct from the
        tokens). Every query's weights over the keys in a group are summed, then averaged over the real queries;
        self, prev and next are the weight on the query's own position and its neighbours."""
        if not cache.has_batch_dim:
            raise ValueError("cache: a summary averages over the batch of the run; give the cache run_with_cache "
                             "returned, not one after remove_batch_dim")
        names = [f"layers.{layer}.attn.probs" for layer in range(num_layers(cache.model))]
        shape = cache[names[0]].shape[:1] + cache[names[0]].shape[-1:]  # [b, s]
        groups = dict(groups or {})
        for name, keys in groups.items():
            if keys.shape != shape or keys.dtype != torch.bool:
                raise ValueError(f"groups[{name!r}] must be bool {tuple(shape)} like input_ids, got "
                                 f"{keys.dtype} {tuple(keys.shape)}")
            if name in POSITIONAL:
                raise ValueError(f"groups: {name!r} is a positional behaviour already measured; name the group "
                                 "otherwise")
        real = _real(cache.attention_mask, shape).to(cache[names[0]].device)
        queries = real.double()  # [b, s] weight of each query in the averages
        count = queries.sum()
        if count == 0:
            raise ValueError("attention_mask masks every token: no query to summarise")
        shares = {name: [] for name in [*groups, *POSITIONAL]}
        entropy = []
        for name in names:
            probs = cache[name].double()  # [b, n, q, k]; 0 at padding keys already

            def average(per_query):  # [b, n, q] -> [n]
                return (per_query * queries[:, None, :]).sum((0, 2)) / count

            for group, keys in groups.items():
                shares[group].append(average((probs * keys.to(probs.device)[:, None, None, :]).sum(-1)))
            for offset, behaviour in ((0, "self"), (-1, "prev"), (1, "next")):
                shares[behaviour].append(average(_diagonal(probs, offset)))
            entropy.append(average(-torch.special.xlogy(probs, probs).sum(-1)))
        shares = {name: torch.stack(values).cpu() for name, values in shares.items()}
        entropy = torch.stack(entropy).cpu()
        # the keys each query may see are those the model did not mask (the same in every layer and head)
        visible = (~is_masked(cache["layers.0.attn.scores"][:, 0])).sum(-1).clamp(min=1)  # [b, q]
        uniform = float((torch.log(visible.double()) * queries).sum() / count)
        return cls(shares, entropy, uniform, _labels(shares, entropy, uniform, groups))

    def to_json(self) -> dict:
        return {"entropy": self.entropy.tolist(), "uniform_entropy": self.uniform_entropy,
                "shares": {name: values.tolist() for name, values in self.shares.items()}, "labels": self.labels}


POSITIONAL = ("self", "prev", "next")


def attention_summary(model, tokens, groups: Mapping[str, torch.Tensor] | None = None) -> AttentionSummary:
    """Runs `model` on `tokens`, caching its attention only, and summarises it (AttentionSummary.from_cache says
    how, and what `groups` are)."""
    inputs = forward_inputs(tokens)
    names = [f"layers.{layer}.attn.probs" for layer in range(num_layers(model))]
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs, names=[*names, "layers.0.attn.scores"])
    return AttentionSummary.from_cache(cache, groups)


def token_groups(tokens: Sequence[Sequence[str]], special_tokens: Sequence[str] = (),
                 attention_mask: torch.Tensor | None = None, first_token: bool = False) -> dict[str, torch.Tensor]:
    """[b, s] bool key groups from each row's tokens (as strings, padded alike): one per special token that
    occurs ("[CLS]", "[SEP]", ...), "punct" (tokens of punctuation only, word-piece marks such as ## and Ġ
    aside), and with `first_token` "first": each row's first real token (attention_mask says which are real),
    where GPT-2's heads park attention."""
    groups = {}
    for special in special_tokens:
        found = torch.tensor([[token == special for token in row] for row in tokens])
        if bool(found.any()):
            groups[special] = found
    groups["punct"] = torch.tensor([[_is_punctuation(token) and token not in special_tokens for token in row]
                                    for row in tokens])
    if first_token:
        first = torch.zeros(len(tokens), len(tokens[0]), dtype=torch.bool)
        starts = torch.zeros(len(tokens), dtype=torch.long) if attention_mask is None \
            else attention_mask.bool().long().argmax(-1).cpu()
        first[torch.arange(len(tokens)), starts] = True
        groups["first"] = first
    return groups


@dataclasses.dataclass
class HeadReport:
    """Everything `analyze_heads` measured, as tensors [layers, heads] and labels; to_json() for the page and
    for whoever draws them elsewhere."""

    target: str
    zero_ablation: torch.Tensor
    mean_ablation: torch.Tensor
    importance: torch.Tensor  # Michel et al.'s gradient score
    attention: AttentionSummary
    vector_target: bool  # ablation scores are L2 norms of a change, not signed changes

    @property
    def num_layers(self) -> int:
        return self.importance.shape[0]

    @property
    def num_heads(self) -> int:
        return self.importance.shape[1]

    def ranked(self) -> list[dict]:
        """One row per head, the largest |zero-ablation change| first."""
        rows = [{"layer": layer, "head": head, "label": self.attention.labels[layer][head],
                 "zero_ablation": float(self.zero_ablation[layer, head]),
                 "mean_ablation": float(self.mean_ablation[layer, head]),
                 "importance": float(self.importance[layer, head]),
                 "entropy": float(self.attention.entropy[layer, head]),
                 **{f"share {name}": float(values[layer, head]) for name, values in self.attention.shares.items()}}
                for layer in range(self.num_layers) for head in range(self.num_heads)]
        return sorted(rows, key=lambda row: -abs(row["zero_ablation"]))

    def to_json(self) -> dict:
        """Every number, as [layers][heads] lists (the ranking is ranked())."""
        return {"target": self.target, "vector_target": self.vector_target, "num_layers": self.num_layers,
                "num_heads": self.num_heads, "zero_ablation": self.zero_ablation.tolist(),
                "mean_ablation": self.mean_ablation.tolist(), "importance": self.importance.tolist(),
                **self.attention.to_json()}


def analyze_heads(model, tokens, metric: Metric, *, groups: Mapping[str, torch.Tensor] | None = None,
                  target: str = "", batch_size: int = DEFAULT_BATCH_SIZE) -> HeadReport:
    """Zero and mean ablation, Michel et al.'s gradient score and Clark et al.'s attention summary of every head;
    `target` describes the metric in the report."""
    zero = head_ablation_scores(model, tokens, metric, ablation="zero", batch_size=batch_size)
    with torch.no_grad():
        inputs = forward_inputs(tokens)
        vector = check_metric(measure(model, metric, model(**inputs, return_type="output")), inputs["input_ids"].shape[0],
                              vector_metric=True).dim() == 2
    return HeadReport(target=target, zero_ablation=zero,
                      mean_ablation=head_ablation_scores(model, tokens, metric, ablation="mean", batch_size=batch_size),
                      importance=head_mask_importance(model, tokens, metric),
                      attention=attention_summary(model, tokens, groups), vector_target=vector)


def _real(attention_mask: torch.Tensor | None, shape) -> torch.Tensor:
    """[b, s] bool: the real tokens (attention_mask, or all of `shape`)."""
    return torch.ones(tuple(shape), dtype=torch.bool) if attention_mask is None else attention_mask.bool()


def _mean_over_tokens(context: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """context [b, n, s, d] -> [1, n, 1, d]: each head's mean output over the real tokens of every prompt."""
    if not bool(real.any()):
        raise ValueError("attention_mask masks every token: no output to average for mean ablation")
    weights = real.to(context.device, context.dtype)[:, None, :, None]
    return ((context * weights).sum((0, 2)) / weights.sum((0, 2)))[None, :, None, :]


def _change(ablated: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """[patches, b] or [patches, b, k] against [b] or [b, k] -> [patches]."""
    delta = ablated - base
    return (delta if delta.dim() == 2 else delta.norm(dim=-1)).mean(1)


def _diagonal(probs: torch.Tensor, offset: int) -> torch.Tensor:
    """[b, n, q, k] -> [b, n, q]: each query's weight on key q + offset (0 where there is none)."""
    weights = torch.diagonal(probs, offset=offset, dim1=-2, dim2=-1)  # [b, n, s - |offset|]
    pad = probs.new_zeros(*probs.shape[:2], abs(offset))
    return torch.cat([weights, pad], -1) if offset > 0 else torch.cat([pad, weights], -1)


def _labels(shares: dict, entropy: torch.Tensor, uniform: float, groups: Mapping) -> list[list[str]]:
    names = list(shares)
    stacked = torch.stack([shares[name] for name in names])  # [behaviours, layers, heads]
    best, which = stacked.max(0)
    labels = []
    for layer in range(entropy.shape[0]):
        row = []
        for head in range(entropy.shape[1]):
            name = names[int(which[layer, head])]
            if float(best[layer, head]) >= LABEL_SHARE:
                row.append(f"→{name}" if name in groups else name)
            elif uniform > 0 and float(entropy[layer, head]) >= BROAD_ENTROPY * uniform:
                row.append("broad")
            else:
                row.append("mixed")
        labels.append(row)
    return labels


def _is_punctuation(token: str) -> bool:
    text = token.replace("##", "").replace("Ġ", "").strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)

