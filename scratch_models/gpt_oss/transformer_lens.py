"""GPT-OSS in TransformerLens' names: Llama's (scratch_models/llama/transformer_lens.py), its MLP's names replaced by
those TL 4.3's TransformerBridge gives GPT-OSS's mixture of experts (see scratch_models/mixtral/transformer_lens.py).

TL's GPT-OSS (its TransformerBridge) names the mixture as Mixtral's but for its router, `mlp.router` (ours is
`mlp.gate`): `mlp.hook_in` / `mlp.hook_pre` (ln2's output), `mlp.router.hook_in`, `mlp.router.hook_out` (the
router's logits, its bias added), `hook_expert_indices` (the top k of the logits, best first), `hook_expert_weights`
(the softmax of the k chosen logits, 0 elsewhere), each under the router and under the mixture, one row per token,
[b·s, ..], and `mlp.hook_out` / `mlp.hook_post` (the weighted sum). Ours feeds the router and the experts one
tensor, so an edit of `mlp.router.hook_in` reaches the experts too (the bridge's, the router alone); one expert's
output has no TL name (ours: `mlp.experts.{e}.proj`, [t, h]). As the block returns its chosen experts' weights
beside its output, the bridge also fires `mlp.hook_router_scores` ([b·s, k], best first: our `mlp.routing_weights`);
it fires after the experts ran, so an edit there changes nothing downstream on the bridge, where ours reweighs the
experts' outputs. An edit of hook_expert_weights re-routes each token to the top k of the edited weights, weighted
by them as they are, on both; an edit of hook_expert_indices routes to the experts it names, weighted on the bridge
by the old weights at them (0 for an expert not chosen before), ours by the softmax over the named experts' logits.
The attention sinks (one learned logit per head, [n]) have no hook on either: the bridge's attention appends them to
the scores after `hook_attn_scores` and drops them after the softmax, so `hook_pattern` sums to 1 less the sink's
share, as our `attn.probs`; the parameter is `blocks.{i}.attn.sinks` on both (ours lists it in tl_parameters(), the
bridge's does not). A mixture has no W_gate, W_in, W_out (nor has the bridge): the experts are
layers.{i}.mlp.experts' gate_up_proj [E, h, 2m] and down_proj [E, m, h] with their biases. The bridge's config says
`final_rms=False` (its adapter's setting) though the final norm is an RMSNorm, and `rotary_base=10000` (TL's
default: transformers 5 keeps rope_theta in rope_parameters); ours says True and the config's rope_theta. As the
bridge, text gets a BOS token by default.
"""

from ..lens.names import LensTable, dense_mlp_only, moe_hooks
from ..llama import transformer_lens as llama

HOOKS = {**{name: entry for name, entry in llama.HOOKS.items() if ".mlp." not in name},
         **moe_hooks(router="router", router_scores=True)}

# where each expert's weights are (the error W_gate, W_in, W_out give on a mixture)
EXPERTS = ("slices [e] of layers.{i}.mlp.experts.gate_up_proj [E, h, 2m] (gate and up in alternate columns), "
           "down_proj [E, m, h] and their biases")

WEIGHTS = {**{name: dense_mlp_only(weight, EXPERTS) if ".mlp." in name else weight
              for name, weight in llama.WEIGHTS.items()},
           "blocks.{i}.attn.sinks": lambda model, layer: model.layers[layer].attn.sinks}


def config(config) -> dict:
    return llama.config(config) | dict(num_experts=config.num_local_experts,
                                       experts_per_token=config.num_experts_per_tok)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip())
