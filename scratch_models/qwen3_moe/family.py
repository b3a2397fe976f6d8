"""Qwen3-MoE declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

from weight_mapping.qwen3_moe import QWEN3_MOE

from ..llama.family import GROUPED, LIKE_LLAMA
from ..mixtral.family import SUMMARY
from ..qwen3.family import NORMS
from ..registry.family import Family
from . import transformer_lens
from .config import Qwen3MoeConfig
from .model import Qwen3MoeForCausalLM, Qwen3MoeModel
from .task_heads import Qwen3MoeForQuestionAnswering, Qwen3MoeForSequenceClassification, Qwen3MoeForTokenClassification

MLP = """Each layer's MLP is a mixture of experts, except those config.json keeps dense (mlp_only_layers, and all
but every decoder_sparse_step-th), whose gated MLP reads as Qwen 3's: `mlp.pre_act` the gate before its activation,
`mlp.up` the linear branch, `mlp.post_act` their product."""

WINDOW = """

With use_sliding_window (off in the releases) every layer's queries see only the last `sliding_window` keys."""

FAMILY = Family(
    name="qwen3_moe", title="Qwen3-MoE", config_class=Qwen3MoeConfig, table=QWEN3_MOE, base=Qwen3MoeModel,
    heads=(Qwen3MoeForCausalLM, Qwen3MoeForSequenceClassification, Qwen3MoeForTokenClassification,
           Qwen3MoeForQuestionAnswering),
    **LIKE_LLAMA,
    # four query heads of 10 over two key/value heads with attention biases, as Qwen 3's; layer 0 dense (width 16),
    # layer 1 a mixture of 6 experts of width 8, each token routed to 2, renormalised as the releases do (widths of
    # 16-byte rows, which transformers' default experts kernel, grouped_mm, needs)
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=10, max_position_embeddings=24, rope_theta=1000.0,
                     attention_bias=True, moe_intermediate_size=8, num_experts=6, num_experts_per_tok=2,
                     norm_topk_prob=True, mlp_only_layers=[0], bos_token_id=36, eos_token_id=36),
    tokenizer_specials={"eos": "<|endoftext|>", "pad": "<|endoftext|>"},  # no BOS; config's bos_token_id is the end
    summary=SUMMARY.format(title="Qwen3-MoE", heads=GROUPED + NORMS, mlp=MLP,
                           renormalised=" (renormalised over the k chosen where norm_topk_prob)", more=WINDOW),
    lm_checkpoint="Qwen/Qwen3-30B-A3B",
    window_field="sliding_window",  # every layer's (null without use_sliding_window)
    transformer_lens=transformer_lens.TABLE,
)
