"""Mistral declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

from weight_mapping.mistral import MISTRAL

from ..llama import transformer_lens
from ..llama.family import GROUPED, LIKE_LLAMA, SUMMARY
from ..registry.family import Family
from .config import MistralConfig
from .model import MistralForCausalLM, MistralModel
from .task_heads import MistralForQuestionAnswering, MistralForSequenceClassification, MistralForTokenClassification

WINDOW = """

Where config.json sets `sliding_window` (Mistral 7B v0.1: 4096), every layer's queries see only that many keys, the
query itself included: `attn.scores` holds the dtype's lowest number at the keys further back, as at future ones."""

FAMILY = Family(
    name="mistral", title="Mistral", config_class=MistralConfig, table=MISTRAL, base=MistralModel,
    heads=(MistralForCausalLM, MistralForSequenceClassification, MistralForTokenClassification,
           MistralForQuestionAnswering),
    **LIKE_LLAMA,
    # three query heads of 20 (not hidden / heads) reading one key/value head, and a window of 5 keys, shorter
    # than the tests' sequences
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=3,
                     num_key_value_heads=1, head_dim=20, max_position_embeddings=24, sliding_window=5,
                     bos_token_id=36, eos_token_id=36),
    tokenizer_specials={"bos": "<s>", "eos": "</s>", "unk": "<unk>"}, tokenizer_prepends_bos=True,
    summary=SUMMARY.format(title="Mistral", heads=GROUPED, more=WINDOW),
    lm_checkpoint="mistralai/Mistral-7B-v0.1",
    transformer_lens=transformer_lens.TABLE,
    window_field="sliding_window",  # every layer's window
)
