"""GPT-2 declares itself: its classes, mapping table and residual stream, for the layers above the models."""

import torch
import torch.nn.functional as F

from weight_mapping import GPT2

from ..family import Family, ResidualStream
from . import transformer_lens
from .config import GPT2Config
from .model import GPT2LMHeadModel, GPT2Model
from .task_heads import (GPT2DoubleHeadsModel, GPT2ForQuestionAnswering, GPT2ForSequenceClassification,
                         GPT2ForTokenClassification)


class GPT2Stream(ResidualStream):
    """Pre-LN: the stream is a running sum of the embeddings and every attention and MLP output."""

    post_ln = False

    def resid_mid(self, layer: int) -> str:
        return f"layers.{layer}.resid_mid"

    def decomposition(self, layer, mlp_input):
        if mlp_input and layer == self.n_layers:
            raise ValueError("mlp_input=True needs a layer below the number of layers (no MLP reads the final stream)")
        parts = [("embed", "embeddings.word", "embed"), ("pos_embed", "embeddings.position", "embed")]
        for l in range(layer + mlp_input):
            parts.append((f"{l}_attn_out", f"layers.{l}.attn.proj", "attn"))
            if l < layer:
                parts.append((f"{l}_mlp_out", f"layers.{l}.mlp.proj", "mlp"))
        if mlp_input:
            return parts, self.resid_mid(layer), self.model.layers[layer].norm_2
        norm = self.model.norm_f if layer == self.n_layers else self.model.layers[layer].norm_1
        return parts, self.resid_pre(layer), norm

    def final_norm(self, stack: torch.Tensor) -> torch.Tensor:
        return self.model.norm_f(stack)

    def out_weight(self, layer):
        return self.model.layers[layer].attn.c_proj.weight

    def read_out(self, stack):
        return F.linear(self.final_norm(stack), self.unembedding())

    def unembedding(self):
        model = self.model
        if not model.config.tie_word_embeddings and getattr(model, "lm_head", None) is None:
            raise ValueError(f"this {type(model).__name__}'s config unties the LM head from wte (tie_word_embeddings "
                             "false) and the model has no lm_head: load the checkpoint as GPT2LMHeadModel")
        return model.output_embeddings


FAMILY = Family(
    name="gpt2", title="GPT-2", config_class=GPT2Config, table=GPT2, base=GPT2Model,
    heads=(GPT2LMHeadModel, GPT2ForSequenceClassification, GPT2ForTokenClassification, GPT2ForQuestionAnswering,
           GPT2DoubleHeadsModel),
    stream=GPT2Stream,
    input_names=("input_ids", "attention_mask"),
    positions_field="n_positions",
    causal=True,
    targets={"GPT2LMHeadModel": "next", "GPT2ForSequenceClassification": "class"},
    default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
    tiny_config=dict(vocab_size=10, n_positions=8, n_embd=4, n_layer=1, n_head=2),
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
)
