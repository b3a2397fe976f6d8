"""OLMo 2 declares itself: its classes, mapping table and residual stream, for the layers above the models."""

from weight_mapping.olmo2 import OLMO2

from ..llama.family import GROUPED, OUTPUT_FIELDS
from ..registry.family import Family, PreLNStream
from . import transformer_lens
from .config import Olmo2Config
from .model import Olmo2ForCausalLM, Olmo2Model
from .task_heads import Olmo2ForSequenceClassification


class AsIs:
    """What OLMo 2's attention and MLP read the stream through: nothing. Where the analysis asks for the norm that
    reads a layer's stream (apply_ln_to_stack), parts of the stream map to themselves."""

    bias = None

    def __call__(self, x):
        return x

    def divisor(self, x):
        return x.new_ones(x.shape[:-1] + (1,))

    def frozen(self, parts, divisor):
        return parts


class Olmo2Stream(PreLNStream):
    """The stream is a running sum of the token embeddings and every attention and MLP output through its post-norm
    (`attn_out`, `mlp_out`), as Gemma 2's, but the sublayers read it unnormalised: only the final norm reads a sum of
    parts through a divisor. A head's part of the stream is its result through the post-attention norm, a
    neuron's its output through the post-MLP norm."""

    embed_parts = (("embed", "embeddings.word"),)

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

    def reading_norm(self, layer, mlp_input):
        return super().reading_norm(layer, mlp_input) if layer == self.n_layers and not mlp_input else AsIs()


SUMMARY = """OLMo 2 places its norms after the sublayers: the attention and the MLP read the residual stream as it is
(no `ln_1`, no `ln_2`), and what each adds to the stream is its output RMS-normalised: `layers.{i}.attn_out` (after
`post_attn_norm`) and `layers.{i}.mlp_out` (after `post_mlp_norm`), not `attn.proj` and `mlp.proj`. So the stream is
`embeddings.out` (the token embeddings), `layers.{i}.resid_mid` between attention and MLP (what the MLP reads), and
`layers.{i}.out` after block i; a head's part of the stream is its `attn.result` through the post-attention norm
(`stack_head_results` gives it so). The queries and keys are RMS-normalised over the whole projection, every head
together (`attn.q_unnormalized` [b, s, n·d] -> `attn.q_norm` -> `attn.q_unrotated` [b, n, s, d], likewise k), then
turned by the rotary embedding (`attn.q`, `attn.k`). """ + GROUPED + """ The MLP is gated (SwiGLU): `mlp.pre_act` is
the gate before its activation, `mlp.up` the linear branch, `mlp.post_act` their product. As in GPT-2,
`hidden_states[-1]` is the final norm's output (`ln_f`)."""

FAMILY = Family(
    name="olmo2", title="OLMo 2", config_class=Olmo2Config, table=OLMO2, base=Olmo2Model,
    heads=(Olmo2ForCausalLM, Olmo2ForSequenceClassification),
    stream=Olmo2Stream,
    input_names=("input_ids", "attention_mask"),
    positions_field="max_position_embeddings",
    causal=True,
    default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
    # four query heads of 12 reading one key/value head (the releases have as many as query heads; here the grouping
    # is exercised), an untied head, as the releases have it
    tiny_config=dict(vocab_size=37, hidden_size=48, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=1, max_position_embeddings=24, rope_theta=500.0, pad_token_id=0,
                     bos_token_id=None, eos_token_id=36),
    tokenizer_specials={"bos": "<|endoftext|>", "eos": "<|endoftext|>", "pad": "<|pad|>"},
    summary=SUMMARY,
    output_fields={name: field for name, field in OUTPUT_FIELDS.items()
                   if not name.endswith(("start_logits", "end_logits"))},
    lm_checkpoint="allenai/OLMo-2-0425-1B",
    transformer_lens=transformer_lens.TABLE,
)
