"""Gemma 3's language model declares itself: its classes, mapping table and residual stream (Gemma 2's), for the
layers above the models."""

from weight_mapping.gemma3_text import GEMMA3

from ..gemma2.family import Gemma2Stream
from ..registry.family import Family
from . import transformer_lens
from .config import Gemma3TextConfig
from .model import Gemma3ForCausalLM, Gemma3TextModel
from .task_heads import Gemma3TextForSequenceClassification

FAMILY = Family(
    name="gemma3_text", title="Gemma 3", config_class=Gemma3TextConfig, table=GEMMA3, base=Gemma3TextModel,
    heads=(Gemma3ForCausalLM, Gemma3TextForSequenceClassification),
    stream=Gemma2Stream,
    input_names=("input_ids", "attention_mask"),
    positions_field="max_position_embeddings",
    causal=True,
    default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
    # 2 layers with a pattern of 2 (local, then global) so that both kinds and both rotary bases meet the tests; 4
    # query heads of 16 over a hidden of 48 sharing 2 key/value heads, a window of 5 (shorter than the tests'
    # sequences), a query scale that is not the head size, bases far apart, linear scaling on the global layer, and
    # a final cap low enough that random weights meet it
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=24, sliding_window=5,
                     sliding_window_pattern=2, query_pre_attn_scalar=12, rope_theta=1000.0,
                     rope_local_base_freq=10.0, rope_scaling={"rope_type": "linear", "factor": 2.0},
                     final_logit_softcapping=4.0, pad_token_id=0, bos_token_id=2, eos_token_id=36),
    tokenizer_specials={"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"},
    tokenizer_prepends_bos=True,
    summary="""Gemma 3's stream reads as Gemma 2's: the attention reads `ln_1` and the MLP `ln_2` ((1 + w) RMSNorms),
and what each adds to the residual stream is its output through a norm of its own: `layers.{i}.attn_out` (after
`post_attn_norm`) and `layers.{i}.mlp_out` (after `post_mlp_norm`), not `attn.proj` and `mlp.proj`. So the stream is
`embeddings.out` (the token embeddings times sqrt(hidden)), `layers.{i}.resid_mid` between attention and MLP, and
`layers.{i}.out` after block i; a head's `attn.result` sums to `attn.proj`, and its part of the stream is that result
through the post-attention norm (`stack_head_results` gives it so). Each head's queries and keys pass a (1 + w)
RMSNorm over their d dimensions (`attn.q_unnormalized` -> `attn.q_norm` -> `attn.q_unrotated`, likewise k) and are
then turned by the rotary embedding (`attn.q`, `attn.k`): local layers (sliding_attention, five of every six in the
releases) by base rope_local_base_freq and see only the last `sliding_window` tokens, global layers
(full_attention) by base rope_theta, scaled where rope_scaling says. Keys and values have their own, fewer heads.
No score is capped; `uncapped_logits` holds the LM head's scores, the logits themselves unless
final_logit_softcapping is set. As in GPT-2, `hidden_states[-1]` is the final norm's output (`ln_f`). A multimodal
checkpoint (Gemma3ForConditionalGeneration) loads as this language model, its vision tower left out.""",
    output_fields={
        "embeddings.out": "hidden_states[0]",
        "layers.{i}.attn.probs": "attentions[i]",
        "layers.{i}.out": "hidden_states[i + 1]",  # except the last layer's: see the summary
        "ln_f": "hidden_states[-1]",
        "logits": "logits",
    },
    lm_checkpoint="google/gemma-3-1b-pt",
    transformer_lens=transformer_lens.TABLE,
    window_field="sliding_window",
)
