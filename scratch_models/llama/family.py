"""Llama declares itself: its classes, mapping table and residual stream, for the layers above the models."""

from weight_mapping.llama import LLAMA

from ..registry.family import Family, PreLNStream
from . import transformer_lens
from .config import LlamaConfig
from .model import LlamaForCausalLM, LlamaModel
from .task_heads import LlamaForQuestionAnswering, LlamaForSequenceClassification, LlamaForTokenClassification


class LlamaStream(PreLNStream):
    """Pre-norm: the stream is a running sum of the token embeddings and every attention and MLP output, each sublayer
    reading an RMS-normalised copy (which divides by the root mean square and does not centre)."""

    embed_parts = (("embed", "embeddings.word"),)

    def out_weight(self, layer):
        return self.model.layers[layer].attn.o_proj.weight.T


SUMMARY = """{title} is pre-norm, like GPT-2, with RMSNorm (no centring, no bias: `norm_1`, `norm_2`, `norm_f`,
whose outputs are `ln_1`, `ln_2`, `ln_f`) and no position embedding: positions turn each head's queries and keys (the
rotary embedding, on the whole head), so `layers.{{i}}.attn.q` and `attn.k` are the turned ones whose products are the
scores, and `attn.q_unrotated`, `attn.k_unrotated` the ones before. {heads} The MLP is gated (SwiGLU): `mlp.pre_act`
is the gate before its activation, `mlp.up` the linear branch, `mlp.post_act` their product, what down_proj reads.
The stream is `embeddings.out` before layer 0, `layers.{{i}}.resid_mid` between attention and MLP, and
`layers.{{i}}.out` after layer i; as in GPT-2, `hidden_states[-1]` is the final norm's output (`ln_f`).{more}"""

GROUPED = """With grouped-query attention (num_key_value_heads below num_attention_heads) `attn.k`, `attn.v` and the
KV cache hold the n_kv key/value heads, and each group of n / n_kv query heads reads one: `attn.scores`,
`attn.probs` and `attn.context` have a row per query head."""

OUTPUT_FIELDS = {
    "embeddings.out": "hidden_states[0]",
    "layers.{i}.attn.probs": "attentions[i]",
    "layers.{i}.out": "hidden_states[i + 1]",  # except the last layer's: see the summary
    "ln_f": "hidden_states[-1]",
    "logits": "logits",
    "start_logits": "start_logits",
    "end_logits": "end_logits",
}

# what every family of this one model declares alike (Llama and the variants over it: Mistral, Qwen 2, Qwen 3)
LIKE_LLAMA = dict(stream=LlamaStream, input_names=("input_ids", "attention_mask"),
                  positions_field="max_position_embeddings", causal=True,
                  default_texts=("The meaning of life is",
                                 "Once upon a time, in a small village by the sea, there lived"),
                  output_fields=OUTPUT_FIELDS)

FAMILY = Family(
    name="llama", title="Llama", config_class=LlamaConfig, table=LLAMA, base=LlamaModel,
    heads=(LlamaForCausalLM, LlamaForSequenceClassification, LlamaForTokenClassification, LlamaForQuestionAnswering),
    **LIKE_LLAMA,
    # six query heads of 8 reading two key/value heads, tied embeddings and Llama 3.1's rope scaling, as Llama
    # 3.2 1B has them
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=6,
                     num_key_value_heads=2, max_position_embeddings=24, rms_norm_eps=1e-5, rope_theta=500.0,
                     rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                     tie_word_embeddings=True, bos_token_id=36, eos_token_id=36),
    tokenizer_specials={"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>"}, tokenizer_prepends_bos=True,  # Llama 3's
    summary=SUMMARY.format(title="Llama", heads=GROUPED, more=""),
    lm_checkpoint="meta-llama/Llama-3.2-1B",
    transformer_lens=transformer_lens.TABLE,
)
