"""Mixtral declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

from weight_mapping.mixtral import MIXTRAL

from ..llama.family import GROUPED, LIKE_LLAMA
from ..registry.family import Family
from . import transformer_lens
from .config import MixtralConfig
from .model import MixtralForCausalLM, MixtralModel
from .task_heads import MixtralForQuestionAnswering, MixtralForSequenceClassification, MixtralForTokenClassification

# how a mixture of experts' layer reads (Mixtral's and Qwen 3 MoE's: parts/moe.py)
SUMMARY = """{title} is pre-norm, like Llama, with RMSNorm (`norm_1`, `norm_2`, `norm_f`, whose outputs are `ln_1`,
`ln_2`, `ln_f`) and the rotary embedding on each head's queries and keys (`attn.q`, `attn.k` turned,
`attn.q_unrotated`, `attn.k_unrotated` before). {heads} {mlp}

A mixture of experts' layer: the router `mlp.gate` scores every expert for each token (`mlp.router_logits`, [b, s,
E]); the token goes to the top k of their softmax probabilities (`mlp.chosen`, [b, s, k], best first), each weighted
by its probability{renormalised} (`mlp.routing_weights`; `mlp.expert_weights`, for a listener, holds them over every
expert, 0 where not chosen, [b, s, E]); each expert is a gated MLP run on its own tokens only
(`mlp.experts.{{e}}.pre_act`, `up`, `post_act`, `proj`: [t, ...], t the tokens routed to it, in batch and position
order, the rows of `x[(chosen == e).any(-1)]`); `mlp.proj` is the weighted sum, what the layer adds to the stream.
Editing `mlp.chosen` forces or forbids experts (the weights are then read from the probabilities at the experts
chosen); editing `mlp.expert_weights` re-routes each token to the top k of the edited weights, weighted as edited; editing `mlp.router_logits` to -inf at an expert forbids it; zeroing `mlp.experts.{{e}}.proj` ablates an
expert's output (parts/moe.py: forbid_experts, force_expert).

The stream is `embeddings.out` before layer 0, `layers.{{i}}.resid_mid` between attention and MLP, and
`layers.{{i}}.out` after layer i; as in GPT-2, `hidden_states[-1]` is the final norm's output (`ln_f`).{more}"""

WINDOW = """

Where config.json sets `sliding_window` (null in the releases), every layer's queries see only that many keys, the
query itself included, as in Mistral."""

FAMILY = Family(
    name="mixtral", title="Mixtral", config_class=MixtralConfig, table=MIXTRAL, base=MixtralModel,
    heads=(MixtralForCausalLM, MixtralForSequenceClassification, MixtralForTokenClassification,
           MixtralForQuestionAnswering),
    **LIKE_LLAMA,
    # three query heads of 20 over one key/value head and a window of 5 keys, as Mistral's; 5 experts of width 16,
    # each token routed to 2 (transformers' default experts kernel, grouped_mm, needs rows of 16-byte multiples)
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=16, num_hidden_layers=2, num_attention_heads=3,
                     num_key_value_heads=1, head_dim=20, max_position_embeddings=24, sliding_window=5,
                     num_local_experts=5, num_experts_per_tok=2, bos_token_id=36, eos_token_id=36),
    tokenizer_specials={"bos": "<s>", "eos": "</s>", "unk": "<unk>"}, tokenizer_prepends_bos=True,
    summary=SUMMARY.format(title="Mixtral", heads=GROUPED, mlp="Every layer's MLP is a mixture of experts.",
                           renormalised=", renormalised over the k chosen", more=WINDOW),
    lm_checkpoint="mistralai/Mixtral-8x7B-v0.1",
    window_field="sliding_window",  # every layer's window
    transformer_lens=transformer_lens.TABLE,
)
