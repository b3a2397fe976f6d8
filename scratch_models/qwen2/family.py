"""Qwen 2 declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the
models."""

import dataclasses

from weight_mapping.qwen2 import QWEN2

from ..llama import transformer_lens
from ..llama.family import GROUPED, LIKE_LLAMA, SUMMARY
from ..registry.family import Family
from .config import Qwen2Config
from .model import Qwen2ForCausalLM, Qwen2Model
from .task_heads import Qwen2ForQuestionAnswering, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

WINDOW = """ q_proj, k_proj and v_proj add biases.

With use_sliding_window (off in the released checkpoints) the layers layer_types names `sliding_attention` (by
default those from max_window_layers on) see only the last `sliding_window` keys, the query itself included:
`attn.scores` holds the dtype's lowest number at the keys further back, as at future ones."""

FAMILY = Family(
    name="qwen2", title="Qwen2", config_class=Qwen2Config, table=QWEN2, base=Qwen2Model,
    heads=(Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2ForTokenClassification, Qwen2ForQuestionAnswering),
    **LIKE_LLAMA,
    # four query heads of 12 reading two key/value heads, tied embeddings (as Qwen 2.5 0.5B), linear rope scaling,
    # and a window of 4 keys in the second layer only, shorter than the tests' sequences
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=24, rope_theta=1000.0,
                     rope_scaling={"rope_type": "linear", "factor": 2.0}, tie_word_embeddings=True,
                     use_sliding_window=True, sliding_window=4, max_window_layers=1, bos_token_id=36,
                     eos_token_id=36),
    tokenizer_specials={"eos": "<|endoftext|>", "pad": "<|endoftext|>"},  # no BOS; config's bos_token_id is the end
    summary=SUMMARY.format(title="Qwen 2", heads=GROUPED, more=WINDOW),
    lm_checkpoint="Qwen/Qwen2.5-0.5B",
    # TL 4.3's bridge gives Qwen 2 text no BOS by default (its Qwen2 adapter), as it does Qwen 3's
    transformer_lens=dataclasses.replace(transformer_lens.TABLE, prepend_bos=False),
    window_field="sliding_window",  # the window of its sliding layers (null without use_sliding_window)
)
