"""Qwen 3 declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

from weight_mapping.qwen3 import QWEN3

from ..llama.family import GROUPED, LIKE_LLAMA, SUMMARY
from ..registry.family import Family
from . import transformer_lens
from .config import Qwen3Config
from .model import Qwen3ForCausalLM, Qwen3Model
from .task_heads import Qwen3ForQuestionAnswering, Qwen3ForSequenceClassification, Qwen3ForTokenClassification

NORMS = """ Before the rotation each head's queries and keys pass an RMSNorm over their d dimensions
(`attn.q_norm`, `attn.k_norm`, one weight shared by every head), so `attn.q_unrotated` and `attn.k_unrotated` are
the normalised ones; their opt-in `scale` and `normalized` points hold the divisor and the normalised vectors, in
the layout the norm reads, [b, n, s, d]."""

FAMILY = Family(
    name="qwen3", title="Qwen3", config_class=Qwen3Config, table=QWEN3, base=Qwen3Model,
    heads=(Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3ForTokenClassification, Qwen3ForQuestionAnswering),
    **LIKE_LLAMA,
    # four query heads of 10 (not hidden / heads) reading two key/value heads, with attention biases (the releases
    # have none; here they are exercised)
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=10, max_position_embeddings=24, rope_theta=1000.0,
                     attention_bias=True, bos_token_id=36, eos_token_id=36),
    tokenizer_specials={"eos": "<|endoftext|>", "pad": "<|endoftext|>"},  # no BOS; config's bos_token_id is the end
    summary=SUMMARY.format(title="Qwen 3", heads=GROUPED + NORMS, more=""),
    lm_checkpoint="Qwen/Qwen3-0.6B",
    transformer_lens=transformer_lens.TABLE,
    window_field="sliding_window",  # Qwen 2's, which its config keeps (null without use_sliding_window)
)
