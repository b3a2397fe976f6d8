"""Gemma 2 declares itself: its classes, mapping table and residual stream, for the layers above the models."""

from weight_mapping.gemma2 import GEMMA2

from ..parts.attention import soft_cap
from ..registry.family import Family, PreLNStream
from . import transformer_lens
from .config import Gemma2Config
from .model import Gemma2ForCausalLM, Gemma2Model
from .task_heads import Gemma2ForSequenceClassification, Gemma2ForTokenClassification


class Gemma2Stream(PreLNStream):
    """Pre-norm, with a second norm on each sublayer's output: the stream is a running sum of the scaled token
    embeddings and every attention and MLP output through its post-norm (`attn_out`, `mlp_out`). A head's part of
    the stream is its result through the post-attention norm, whose divisor is the whole attention output's (a
    neuron's, its output through the post-MLP norm). The read-out caps the logits softly, so direct logit
    attribution splits the scores before the cap."""

    embed_parts = (("embed", "embeddings.out"),)
    attributed_logits = "uncapped_logits"

    def attn_out(self, layer):
        return f"layers.{layer}.attn_out"

    def mlp_out(self, layer):
        return f"layers.{layer}.mlp_out"

    def attn_out_norm(self, layer):
        return f"layers.{layer}.attn.proj", self.model.layers[layer].post_attn_norm

    def mlp_out_norm(self, layer):
        return f"layers.{layer}.mlp.proj", self.model.layers[layer].post_mlp_norm

    def out_weight(self, layer):
        return self.model.layers[layer].attn.o_proj.weight.T

    def read_out(self, stack):
        return soft_cap(super().read_out(stack), self.model.config.final_logit_softcapping)


FAMILY = Family(
    name="gemma2", title="Gemma 2", config_class=Gemma2Config, table=GEMMA2, base=Gemma2Model,
    heads=(Gemma2ForCausalLM, Gemma2ForSequenceClassification, Gemma2ForTokenClassification),
    stream=Gemma2Stream,
    input_names=("input_ids", "attention_mask"),
    positions_field="max_position_embeddings",
    causal=True,
    default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
    # 2 layers (the first sliding, the second full), 4 query heads of 16 over a hidden of 48 sharing 2 key/value
    # heads, a window of 5 (shorter than the tests' sequences), a query scale that is not the head size, and caps
    # low enough that random weights meet them
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, max_position_embeddings=24, sliding_window=5,
                     query_pre_attn_scalar=12, attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
                     pad_token_id=0, bos_token_id=2, eos_token_id=36),
    tokenizer_specials={"bos": "<bos>", "eos": "<eos>", "pad": "<pad>", "unk": "<unk>"},
    tokenizer_prepends_bos=True,
    summary="""Gemma 2 normalises twice around each sublayer: the attention reads `ln_1` and the MLP `ln_2` (RMSNorms,
as GPT-2's LayerNorms), and what each adds to the residual stream is its output through a norm of its own:
`layers.{i}.attn_out` (after `post_attn_norm`) and `layers.{i}.mlp_out` (after `post_mlp_norm`), not `attn.proj` and
`mlp.proj`. So the stream is `embeddings.out` (the token embeddings times sqrt(hidden)), `layers.{i}.resid_mid`
between attention and MLP, and `layers.{i}.out` after block i, a sum of `embeddings.out` and every `attn_out` and
`mlp_out`; a head's `attn.result` sums to `attn.proj`, and its part of the stream is that result through the
post-attention norm (`stack_head_results` gives it so). Queries and keys are turned by the rotary embedding
(`attn.q`, `attn.k`; `attn.q_unrotated`, `attn.k_unrotated` before), keys and values have their own, fewer heads, and
the scores are soft-capped before the mask. Layers of type sliding_attention (the even ones) see only the last
`sliding_window` tokens. The logits are soft-capped too: `uncapped_logits` holds the LM head's scores before the cap.
As in GPT-2, `hidden_states[-1]` is the final norm's output (`ln_f`).""",
    output_fields={
        "embeddings.out": "hidden_states[0]",
        "layers.{i}.attn.probs": "attentions[i]",
        "layers.{i}.out": "hidden_states[i + 1]",  # except the last layer's: see the summary
        "ln_f": "hidden_states[-1]",
        "logits": "logits",
    },
    lm_checkpoint="google/gemma-2-2b",
    transformer_lens=transformer_lens.TABLE,
    window_field="sliding_window",
)
