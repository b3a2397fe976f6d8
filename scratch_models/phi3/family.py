"""Phi-3 declares itself: its classes, mapping table and residual stream (Llama's), for the layers above the models."""

from weight_mapping.phi3 import PHI3

from ..llama.family import GROUPED, LIKE_LLAMA
from ..registry.family import Family
from . import transformer_lens
from .config import Phi3Config
from .model import Phi3ForCausalLM, Phi3Model
from .task_heads import Phi3ForSequenceClassification, Phi3ForTokenClassification

SUMMARY = """Phi-3 is Llama's pre-norm layer with RMSNorm (`norm_1`, `norm_2`, `norm_f`, whose outputs are `ln_1`,
`ln_2`, `ln_f`) and fused projections: `layers.{i}.attn.qkv` is qkv_proj's output, the queries', keys' and values'
dimensions side by side, split into `attn.q_unrotated`, `attn.k_unrotated` and `attn.v`; `layers.{i}.mlp.gate_up` is
gate_up_proj's, split into the gate (`mlp.pre_act`, before its activation) and the linear branch (`mlp.up`), whose
product is `mlp.post_act`, what down_proj reads. Positions turn the first partial_rotary_factor of each head's
dimensions (all of them in Phi-3, three quarters in Phi-4-mini): `attn.q` and `attn.k` are the turned queries and keys
whose products are the scores. With LongRoPE (the 128k releases, Phi-4-mini) a pass whose positions reach past
original_max_position_embeddings turns every position by the long factors, and `generate` feeds the whole sequence
again at the step that crosses it, as transformers does. """ + GROUPED + """ Where config.json sets `sliding_window`
(Phi-3-mini-4k: 2047), every layer's queries see only that many keys, the query itself included. The stream is
`embeddings.out` before layer 0, `layers.{i}.resid_mid` between attention and MLP, and `layers.{i}.out` after layer
i; as in GPT-2, `hidden_states[-1]` is the final norm's output (`ln_f`)."""

FAMILY = Family(
    name="phi3", title="Phi-3", config_class=Phi3Config, table=PHI3, base=Phi3Model,
    heads=(Phi3ForCausalLM, Phi3ForSequenceClassification, Phi3ForTokenClassification),
    **LIKE_LLAMA,
    # four query heads of 12 reading two key/value heads, half of each head turned (Phi-4-mini turns three
    # quarters) and a window of 5 keys, shorter than the tests' sequences; untied, as Phi-3's releases. No LongRoPE
    # (Phi-3-mini-4k has none): its long factors would turn a whole pass otherwise than the steps that made it, which
    # the tests every family passes assume of no family; tests/models/test_phi3.py adds it
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=24, partial_rotary_factor=0.5, sliding_window=5,
                     bos_token_id=1, eos_token_id=36, pad_token_id=36),
    # Phi-3-mini's tokenizer (Llama 2's SentencePiece vocabulary and Phi-3's own tokens): <s> is the BOS, which it
    # does not put first (add_bos_token false); <|endoftext|> ends a text and pads
    tokenizer_specials={"bos": "<s>", "eos": "<|endoftext|>", "pad": "<|endoftext|>", "unk": "<unk>"},
    summary=SUMMARY,
    lm_checkpoint="microsoft/Phi-3-mini-4k-instruct",
    transformer_lens=transformer_lens.TABLE,
    window_field="sliding_window",
)
