"""Mixtral in TransformerLens' names: Llama's (scratch_models/llama/transformer_lens.py), its MLP's names replaced by
those TL 4.3's TransformerBridge gives a mixture of experts.

TL's Mixtral (its TransformerBridge) wraps each layer's whole mixture: `mlp.hook_in` and its alias `mlp.hook_pre`
are what the mixture reads (ln2's output, our `ln_2`), `mlp.hook_out` and its alias `mlp.hook_post` the weighted sum
of the chosen experts' outputs (our `mlp.proj`, as `hook_mlp_out`). Its router is `mlp.gate`: `mlp.gate.hook_in` and
`mlp.gate.hook_out` (the router's logits, our `mlp.router_logits`) hold one row per token, [b·s, ..], as the bridge
flattens them; so do `hook_expert_indices` (the chosen experts, best first, [b·s, k]: our `mlp.chosen`) and
`hook_expert_weights` (every expert's weight, renormalised over the chosen, 0 elsewhere, [b·s, E]: our
`mlp.expert_weights`), each under the router and under the mixture (`blocks.{i}.mlp.hook_expert_weights`). An edit of
hook_expert_weights re-routes each token to the top k of the edited weights, weighted by them as they are (no
renormalisation), as the bridge does; an edit of hook_expert_indices routes to the experts it names, weighted by
their router probabilities renormalised (ours; the bridge keeps the old weights). Ours feeds the router and the
experts one tensor, so an edit of `mlp.gate.hook_in` reaches the experts too (the bridge's reaches the router alone).
TL has no name for one expert's output: ours is `mlp.experts.{e}.proj` ([t, h], the tokens routed to expert e, and
`pre_act`, `up`, `post_act` before it). `hook_router_scores`, which the bridge fires only for mixtures that return
their router's scores, is not Mixtral's. A mixture has no W_gate, W_in, W_out (nor has the bridge): each expert's
are its own Linears (`model.layers[i].mlp.experts[e]`). The bridge's config says `final_rms=False` (its Mixtral
adapter's setting) though the final norm is an RMSNorm; ours says True, as HookedTransformer's did.
"""

from ..lens.names import LensTable, dense_mlp_only, moe_hooks
from ..llama import transformer_lens as llama

HOOKS = {**{name: entry for name, entry in llama.HOOKS.items() if ".mlp." not in name}, **moe_hooks()}

WEIGHTS = {name: dense_mlp_only(weight) if ".mlp." in name else weight for name, weight in llama.WEIGHTS.items()}


def config(config) -> dict:
    return llama.config(config) | dict(num_experts=config.num_local_experts,
                                       experts_per_token=config.num_experts_per_tok)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
