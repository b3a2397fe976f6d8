"""A sparse mixture of experts (Shazeer et al., 2017; Fedus et al., 2021), the MLP of Mixtral, Qwen 3 MoE and GPT-OSS:
a router scores every expert for each token, the token goes to its top k, and its output is their outputs weighted.

    router_logits = gate(x)                         [b, s, E]   a linear map, no bias (Mixtral, Qwen 3 MoE), with
                                                                one (GPT-OSS)
    probs         = softmax(router_logits)          in float32 (or float64), as transformers computes it
    chosen        = top-k(probs)                    [b, s, k]   the experts each token is routed to, best first
    weights       = probs at chosen                 renormalised to sum to 1 where the family says so (Mixtral
                                                    always; Qwen 3 MoE where norm_topk_prob)
    out           = Σ_k weights_k · expert_{chosen_k}(x)          each expert a gated MLP (parts/mlp.py) by default

GPT-OSS takes the other order (`softmax_of_chosen`): chosen = top-k(router_logits), weights = softmax over the k
chosen logits alone, in the logits' dtype. In exact arithmetic these are the renormalised weights above; their
roundings differ, and so may a tie between two experts, so each family computes them as transformers does. Its
experts are not parts/mlp.py's (biases, a clamped SwiGLU, one tensor for all experts as its files hold them): a
family passes its own bank of experts (`experts`), indexed by expert like the default nn.ModuleList.

Only the experts some token is routed to run, each on its own tokens only (gathered by index, added back with
index_add, expert by expert in ascending order as transformers adds them), so a forward pass reads the weights of
those experts alone. Which experts those are depends on the values, which a captured graph (torch.jit.trace,
torch.export, torch.compile) cannot branch on: while one is captured every expert runs on every token, weighted 0
where not chosen, which adds the same numbers in the same order (E / k times the work), and each expert's hook
points hold every token.

Each step is a hook point, read and edited like any other: `router_logits`, `expert_weights` (every expert's weight
for each token, 0 where not chosen: TransformerLens' hook_expert_weights, computed only for a listener), `chosen`,
`routing_weights`, each expert's `experts.{e}.proj` (its output for its tokens, before weighting) and `proj` (the
combined output). Editing `expert_weights` re-routes as TransformerLens' bridge does: each token goes to the top k of
the edited weights, weighted by them as they are (no renormalisation), and `chosen` shows those. Editing `chosen`
forces or forbids experts: the weights are then read from the probabilities at the experts chosen (and renormalised
where the family does), so a forced expert gets its own router probability. `forbid_experts` and `force_expert`
write such edits. Ablating an expert: zero its `experts.{e}.proj` (its tokens keep the other
experts' weighted outputs), or forbid it (its tokens go to the next best).

Shapes: b batch, s tokens, h hidden, E experts, k experts per token, t tokens routed to one expert, m expert width.
"""

import torch
from torch import nn

from .hook_point import HookPoint
from .mlp import GatedMLP
from .tracing import is_tracing


class SparseMoeBlock(nn.Module):
    """E gated experts of width `expert_size` behind a top-`top_k` softmax router (`gate`). `renormalize`: the k
    weights are divided by their sum (Mixtral; Qwen 3 MoE's norm_topk_prob). `float32_weights`: the weights stay
    float32 (float64 in a float64 model) and each weighted expert output is rounded to the model's dtype once
    (Mixtral, as transformers computes it in half precision); else they are cast to the model's dtype first (Qwen 3
    MoE). `jitter`: in training only, the input is multiplied by noise uniform in [1 - jitter, 1 + jitter] before
    the router (Mixtral's router_jitter_noise). `router_bias`: the router adds a bias (GPT-OSS). `softmax_of_chosen`:
    top-k of the logits, then the softmax of the k chosen (GPT-OSS; `renormalize` then changes nothing). `experts`:
    the family's own bank (len, iteration, and experts[e](x [t, h]) -> [t, h], its hook points under `e`); None:
    num_experts gated MLPs of width expert_size with the activation `act`."""

    def __init__(self, hidden_size: int, expert_size: int, num_experts: int, top_k: int, act: str, *,
                 renormalize: bool, float32_weights: bool, jitter: float = 0.0, router_bias: bool = False,
                 softmax_of_chosen: bool = False, experts: nn.Module | None = None):
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"each token is routed to top_k={top_k} experts, which needs 1 to num_experts="
                             f"{num_experts}")
        self.num_experts, self.top_k = num_experts, top_k
        self.renormalize, self.float32_weights, self.jitter = renormalize, float32_weights, jitter
        self.softmax_of_chosen = softmax_of_chosen
        self.gate = nn.Linear(hidden_size, num_experts, bias=router_bias)  # the router: one score per expert
        self.router_logits = HookPoint("b, s, E", "the router's score of every expert for each token (gate)")
        ranked = "logits" if softmax_of_chosen else "probabilities"
        # before `chosen`, as TransformerLens' bridge fires them: an edit here re-routes, and `chosen` shows it
        self.expert_weights = HookPoint("b, s, E", "every expert's weight for each token: its routing weight if "
                                        "chosen, else 0 (computed only for a listener; an edit re-routes each token "
                                        "to the top k of the edited weights, weighted by them as they are)")
        self.chosen = HookPoint("b, s, k", f"the experts each token is routed to (top-k of the router's {ranked}, "
                                "best first; an edit forces or forbids experts)")
        self.routing_weights = HookPoint("b, s, k", "the weight of each chosen expert's output: " + (
            "the softmax of the k chosen experts' logits" if softmax_of_chosen else "its router probability"
            + (", renormalised over the k chosen" if renormalize else "")))
        self.experts = experts if experts is not None else nn.ModuleList(
            GatedMLP(hidden_size, expert_size, act, tokens="t") for _ in range(num_experts))
        self.proj = HookPoint("b, s, h", "the mixture's output: the chosen experts' outputs, weighted and summed")

    def forward(self, x):  # [b, s, h] -> [b, s, h]
        if self.training and self.jitter > 0:
            x = x * torch.empty_like(x).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        logits = self.router_logits(self.gate(x))
        if self.softmax_of_chosen:  # in the logits' dtype, as transformers computes GPT-OSS's
            ranked = logits
        else:  # in float32 at least, as transformers computes them (float64 stays: a float64 run is for precision)
            ranked = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        chosen = ranked.topk(self.top_k, dim=-1).indices
        weights = self.weigh(ranked, chosen, logits.dtype)
        if self.expert_weights.active:
            chosen, weights = self.reroute(chosen, weights)
        if self.chosen.active:  # an edit forces or forbids experts, weighted as the router weighs them
            picked = self.chosen(chosen.clone())
            if not is_tracing(picked):  # an edit may have put any tensor here
                check_chosen(picked, logits.shape, self.top_k)
            if is_tracing(picked) or not torch.equal(picked, chosen):
                chosen, weights = picked, self.weigh(ranked, picked, logits.dtype)
        weights = self.routing_weights(weights)
        return self.proj(self.combine(x, chosen, weights))

    def weigh(self, ranked, chosen, dtype):
        """The chosen experts' weights from what the router ranked them by: the softmax over the k chosen logits, or
        their router probabilities (renormalised over them where the family does); float32 or in the model's
        `dtype` as the family keeps them."""
        weights = ranked.gather(-1, chosen)
        if self.softmax_of_chosen:
            weights = torch.softmax(weights, dim=-1)
        elif self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights if self.float32_weights else weights.to(dtype)

    def reroute(self, chosen, weights):
        """The routing through `expert_weights`: the weights scattered over every expert ([b, s, E]) for its
        listeners; where they changed them, each token's k experts are the top k of theirs. The weights are always
        gathered back from the listeners' tensor, so a gradient reaches it (unedited, they are the same numbers)."""
        dense = torch.zeros(*chosen.shape[:-1], self.num_experts, dtype=weights.dtype,
                            device=weights.device).scatter(-1, chosen, weights)
        shown = self.expert_weights(dense.clone())  # a copy: an edit in place must not change what it is held to
        if not is_tracing(shown) and not torch.equal(shown, dense):
            chosen = shown.topk(self.top_k, dim=-1).indices
        return chosen, shown.gather(-1, chosen)

    def combine(self, x, chosen, weights):
        """Σ_k weights_k · expert_{chosen_k}(x) per token, each expert run once on the tokens routed to it."""
        flat, chosen, weights = x.reshape(-1, x.shape[-1]), chosen.reshape(-1, self.top_k), weights.flatten(0, -2)
        out = torch.zeros_like(flat)
        if is_tracing(x):  # no branch on which experts have tokens: all of them, on all tokens, 0 where not chosen
            dense = torch.zeros(*chosen.shape[:-1], self.num_experts, dtype=weights.dtype,
                                device=weights.device).scatter(-1, chosen, weights)
            for expert, mlp in enumerate(self.experts):
                out = out + (mlp(flat) * dense[:, expert, None]).to(out.dtype)
            return out.view_as(x)
        for expert in chosen.unique().tolist():  # ascending: the order transformers adds them in
            tokens, slot = torch.where(chosen == expert)  # its tokens in order, and where each chose it
            routed = self.experts[expert](flat[tokens])  # [t, h]
            out.index_add_(0, tokens, (routed * weights[tokens, slot, None]).to(out.dtype))
        return out.view_as(x)


def check_chosen(chosen: torch.Tensor, shape: torch.Size, top_k: int) -> None:
    """An edited `chosen` must still name k different experts per token, by index, in its shape."""
    if chosen.shape != (*shape[:-1], top_k) or chosen.dtype != torch.long:
        raise ValueError(f"chosen experts must be a LongTensor {list((*shape[:-1], top_k))} (k={top_k} per token), "
                         f"got {chosen.dtype} {list(chosen.shape)}")
    if bool(((chosen < 0) | (chosen >= shape[-1])).any()):
        raise ValueError(f"chosen experts must be in 0..{shape[-1] - 1}, got {chosen.min().item()}.."
                         f"{chosen.max().item()}")
    ordered = chosen.sort(-1).values
    if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
        raise ValueError("chosen experts name an expert twice for one token; each token's k experts must differ")


def forbid_experts(experts, where: torch.Tensor | None = None):
    """A hook for `router_logits`: the `experts` (an index or a list) never chosen, at the tokens `where` marks
    ([b, s] bool; None: every token); those tokens go to their next best experts, whose weights the softmax over the
    remaining ones gives."""
    experts = [experts] if isinstance(experts, int) else list(experts)

    def hook(logits, *_):  # a model's hooks also pass the point's name (TransformerLens: the hook)
        hidden = torch.zeros_like(logits, dtype=torch.bool)
        hidden[..., experts] = True
        if where is not None:
            hidden &= where.to(logits.device)[..., None]
        return logits.masked_fill(hidden, float("-inf"))

    return hook


def force_expert(expert: int, where: torch.Tensor | None = None):
    """A hook for `chosen`: every token `where` marks ([b, s] bool; None: every token) routed to `expert`, in place
    of its last choice unless it chose that expert already; its weight is then its router probability (renormalised
    with the others' where the family renormalises)."""

    def hook(chosen, *_):
        has = (chosen == expert).any(-1)
        take = ~has if where is None else ~has & where.to(chosen.device)
        out = chosen.clone()
        out[..., -1] = torch.where(take, torch.full_like(chosen[..., -1], expert), chosen[..., -1])
        return out

    return hook


def refuse_aux_loss(config) -> None:
    """Called for a loss: transformers adds a load-balancing loss over the routers' logits to the LM loss where
    config.json sets output_router_logits (a mixture's config); these models compute the LM loss alone, so they
    refuse a loss that would differ from transformers'."""
    if getattr(config, "output_router_logits", False):
        raise ValueError("config.output_router_logits is set: transformers adds the routers' load-balancing loss "
                         "(router_aux_loss_coef times it) to this loss, which these models do not compute; set "
                         "output_router_logits false in config.json for the LM loss alone")
