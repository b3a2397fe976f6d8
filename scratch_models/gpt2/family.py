"""GPT-2 declares itself: its classes, mapping table and residual stream, for the layers above the models."""

from weight_mapping import GPT2

from ..registry.family import Family, PreLNStream
from . import transformer_lens
from .config import GPT2Config
from .model import GPT2LMHeadModel, GPT2Model
from .task_heads import (GPT2DoubleHeadsModel, GPT2ForQuestionAnswering, GPT2ForSequenceClassification,
                         GPT2ForTokenClassification)


class GPT2Stream(PreLNStream):
    """Pre-LN: the stream is a running sum of the token and position embeddings and every attention and MLP output."""

    embed_parts = (("embed", "embeddings.word"), ("pos_embed", "embeddings.position"))

    def out_weight(self, layer):
        return self.model.layers[layer].attn.c_proj.weight


FAMILY = Family(
    name="gpt2", title="GPT-2", config_class=GPT2Config, table=GPT2, base=GPT2Model,
    heads=(GPT2LMHeadModel, GPT2ForSequenceClassification, GPT2ForTokenClassification, GPT2ForQuestionAnswering,
           GPT2DoubleHeadsModel),
    stream=GPT2Stream,
    input_names=("input_ids", "attention_mask"),
    positions_field="n_positions",
    causal=True,
    default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
    tiny_config=dict(vocab_size=37, n_positions=24, n_embd=48, n_layer=2, n_head=3, n_inner=37, bos_token_id=36,
                     eos_token_id=36),
    summary="""GPT-2 is pre-LN: each sublayer reads a normalised copy (`ln_1`, `ln_2`) and adds its output to a
residual stream that is never normalised in place. The stream is `embeddings.out` before block 0,
`layers.{i}.resid_mid` between attention and MLP, and `layers.{i}.out` after block i; transformers'
`hidden_states[i + 1]` is `layers.{i}.out` for every block but the last, whose place transformers gives to the
final LayerNorm's output: `hidden_states[-1]` (and `GPT2Model`'s `last_hidden_state`) is `ln_f`.""",
    transformer_lens=transformer_lens.TABLE,
    output_fields={
        "embeddings.out": "hidden_states[0]",
        "layers.{i}.attn.probs": "attentions[i]",
        "layers.{i}.out": "hidden_states[i + 1]",  # except the last block's, see the summary
        "ln_f": "hidden_states[-1]",
        "logits": "logits",
        # the task heads
        "start_logits": "start_logits",
        "end_logits": "end_logits",
        "mc_logits": "mc_logits",
    },
    lm_checkpoint="gpt2",
)
