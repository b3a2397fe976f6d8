"""Qwen 3 MoE in TransformerLens' names: Qwen 3's (scratch_models/qwen3/transformer_lens.py), its mixtures of
experts named as TL 4.3's TransformerBridge names them (see scratch_models/mixtral/transformer_lens.py).

TL's Qwen 3 MoE (its TransformerBridge) names a mixture as Mixtral's: `mlp.hook_in` / `mlp.hook_pre` (ln2's output),
`mlp.gate.hook_in`, `mlp.gate.hook_out` (the router's logits), `hook_expert_indices`, `hook_expert_weights` (one row
per token, [b·s, ..]; the weights renormalised over the chosen only where norm_topk_prob), `mlp.hook_out` /
`mlp.hook_post` (the weighted sum); an edit of hook_expert_weights re-routes to the top k of the edited weights. A
layer config.json keeps dense (mlp_only_layers, decoder_sparse_step) is a gated MLP with Qwen 3's names there:
`mlp.hook_pre` the gate before its activation, `mlp.hook_pre_linear`, `mlp.hook_post` their product, `mlp.hook_out`,
and its W_gate, W_in, W_out; the router's names have nothing on it, and a mixture has no single W_in (nor has the
bridge). As Qwen 3's, text gets no BOS by default.
"""

from ..lens.names import LensTable, dense_mlp_only, moe_hooks
from ..llama import transformer_lens as llama
from ..qwen3 import transformer_lens as qwen3

HOOKS = {**qwen3.HOOKS, **moe_hooks()}

WEIGHTS = {name: dense_mlp_only(weight) if ".mlp." in name else weight for name, weight in qwen3.WEIGHTS.items()}


def config(config) -> dict:
    return llama.config(config) | dict(num_experts=config.num_experts,
                                       experts_per_token=config.num_experts_per_tok)


TABLE = LensTable(HOOKS, WEIGHTS, config, summary=__doc__.split("\n\n", 1)[1].strip(), prepend_bos=False)
