"""Gemma declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

from weight_mapping.gemma import GEMMA

from ..llama.family import GROUPED, LIKE_LLAMA, OUTPUT_FIELDS, SUMMARY
from ..registry.family import Family
from . import transformer_lens
from .config import GemmaConfig
from .model import GemmaForCausalLM, GemmaModel
from .task_heads import GemmaForSequenceClassification, GemmaForTokenClassification

GEMMA_PARTS = """

Gemma differs from Llama in three places, none of which adds a hook point: `embeddings.word` (and `embeddings.out`,
the same tensor) is the token embedding times sqrt(hidden); every RMSNorm scales by (1 + w), its stored weight w;
the MLP's gate activation is the tanh-approximated GELU (GeGLU)."""

FAMILY = Family(
    name="gemma", title="Gemma 1", config_class=GemmaConfig, table=GEMMA, base=GemmaModel,
    heads=(GemmaForCausalLM, GemmaForSequenceClassification, GemmaForTokenClassification),
    **LIKE_LLAMA | dict(output_fields={name: field for name, field in OUTPUT_FIELDS.items()
                                       if not name.endswith(("start_logits", "end_logits"))}),  # no QA head
    # four query heads of 16 (not hidden / heads) reading one key/value head, as gemma-2b's eight read one
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=1, head_dim=16, max_position_embeddings=24, rope_theta=1000.0,
                     pad_token_id=0, bos_token_id=2, eos_token_id=36),
    tokenizer_specials={"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"},
    tokenizer_prepends_bos=True,
    summary=SUMMARY.format(title="Gemma", heads=GROUPED, more=GEMMA_PARTS),
    lm_checkpoint="google/gemma-2b",
    transformer_lens=transformer_lens.TABLE,
)
