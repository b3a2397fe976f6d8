"""BERT declares itself: its classes, mapping table and residual stream, for the layers above the models."""

from weight_mapping import BERT

from ..registry.family import Family, ResidualStream
from . import transformer_lens
from .config import BertConfig
from .model import BertForMaskedLM, BertModel
from .task_heads import (BertForMultipleChoice, BertForNextSentencePrediction, BertForPreTraining,
                         BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification)


class BertStream(ResidualStream):
    """Post-LN: each sublayer's sum is renormalised at once, so a decomposition ends at the next LayerNorm."""

    post_ln = True

    def resid_mid(self, layer: int) -> str:
        return f"layers.{layer}.attn.out"

    def decomposition(self, layer, mlp_input):
        layers = self.model.layers
        if mlp_input:
            if layer == self.n_layers:
                raise ValueError("mlp_input=True needs a layer below the number of layers")
            parts = [(f"{layer}_pre", self.resid_pre(layer), "resid"),
                     (f"{layer}_attn_out", self.attn_out(layer), "attn")]
            return parts, f"layers.{layer}.attn.resid", layers[layer].attn.norm
        if layer == 0:
            parts = [("embed", "embeddings.word", "embed"), ("token_type_embed", "embeddings.token_type", "embed"),
                     ("pos_embed", "embeddings.position", "embed")]
            return parts, "embeddings.sum", self.model.embeddings.norm
        l = layer - 1
        parts = [(f"{l}_mid", self.resid_mid(l), "resid"), (f"{l}_mlp_out", self.mlp_out(l), "mlp")]
        return parts, f"layers.{l}.mlp.resid", layers[l].mlp.norm

    def out_weight(self, layer):
        return self.model.layers[layer].attn.dense.weight.T

    def read_out(self, stack):
        model = self.model
        if getattr(model, "mlm_head", None) is None:
            raise ValueError(f"the logit lens reads BERT's layers with its MLM head, and this {type(model).__name__} "
                             "has none (all-MiniLM-L6-v2 ships without one): load a checkpoint that has it "
                             "(cls.predictions.*) as BertForMaskedLM")
        return model.mlm_head(stack, model.embeddings.word_embeddings.weight)

    def unembedding(self):
        raise ValueError("BERT's MLM head is not linear in the residual stream (dense, activation and LayerNorm "
                         "before the decoder), so logits do not split into parts; patch activations to measure a "
                         "part's effect instead")


FAMILY = Family(
    name="bert", title="BERT", config_class=BertConfig, table=BERT, base=BertModel,
    heads=(BertForMaskedLM, BertForPreTraining, BertForNextSentencePrediction, BertForSequenceClassification,
           BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice),
    stream=BertStream,
    input_names=("input_ids", "attention_mask", "token_type_ids"),
    positions_field="max_position_embeddings",
    causal=False,
    targets={"BertForMaskedLM": "mlm", "BertForPreTraining": "mlm", "BertForSequenceClassification": "class",
             "BertForNextSentencePrediction": "class", "BertModel": "pooler"},
    classifiers={"BertForSequenceClassification": "labels", "BertForTokenClassification": "tokens",
                 "BertForQuestionAnswering": "span", "BertForNextSentencePrediction": "next_sentence"},
    default_texts=("The cat sat on the warm mat.", "Time flies like an arrow."),
    default_pairs=("It purred.", "Fruit flies like a banana, and a banana is ripe in June."),
    tiny_config=dict(vocab_size=37, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
                     max_position_embeddings=24, type_vocab_size=3),
    summary="""BERT is post-LN: each sublayer adds to the residual stream and then normalises it. So the residual
stream between layers is always normalised: `layers.{i}.out` (after the MLP's LayerNorm) is what layer i + 1
reads and is transformers' `hidden_states[i + 1]`; `embeddings.out` is `hidden_states[0]`. The sums before
each LayerNorm, `layers.{i}.attn.resid` and `layers.{i}.mlp.resid`, are never returned by transformers.""",
    transformer_lens=transformer_lens.TABLE,
    output_fields={
        "embeddings.out": "hidden_states[0]",
        "layers.{i}.attn.probs": "attentions[i]",
        "layers.{i}.out": "hidden_states[i + 1]",
        "pooler.out": "pooler_output",
        "logits": "logits",
        # the task heads: each hook is named after the output field it holds
        "prediction_logits": "prediction_logits",
        "seq_relationship_logits": "seq_relationship_logits",
        "start_logits": "start_logits",
        "end_logits": "end_logits",
    },
    lm_checkpoint="bert-base-uncased",
)
