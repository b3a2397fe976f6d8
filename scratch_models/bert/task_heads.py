"""BERT's task heads, the classes transformers 5 has of the same names: BertModel's encoder and a few lines each.

    BertForPreTraining              MLM scores per token, and next-sentence scores from the pooler (BERT's own)
    BertForNextSentencePrediction   Linear(h, 2) on the pooler: does segment B follow segment A?
    BertForSequenceClassification   Linear(h, L) on dropout(pooler)
    BertForTokenClassification      Linear(h, L) on dropout(each token's final hidden state); no pooler
    BertForQuestionAnswering        Linear(h, 2) on each token: is the answer's start / end here?; no pooler
    BertForMultipleChoice           Linear(h, 1) on dropout(pooler) of each (context, choice) pair, compared across
                                    the choices

Each class is a BertModel (its forward runs the encoder) plus a head; the checkpoint holds the encoder under `bert.`
and the head beside it (cls.*, classifier.*, qa_outputs.*), as weight_mapping/bert.py says. The losses are
transformers' own (see losses.py): cross-entropy where -100 marks a label that is not scored; for sequence
classification, regression, single- or multi-label as config.problem_type and the labels say. Labels of the wrong
shape, dtype or range raise a ValueError naming them. `inputs_embeds` stands in for input_ids, as in BertModel.

Shapes: b batch, s sequence, h hidden, L num_labels, c choices, V vocabulary.
"""

import torch
from torch import nn

from ..parts.hook_point import HookPoint
from ..parts.inputs import check_embeds, check_one_of
from ..parts.losses import classification_loss, cross_entropy, span_loss
from ..parts.outputs import (BertForPreTrainingOutput, MultipleChoiceModelOutput, NextSentencePredictorOutput,
                      QuestionAnsweringModelOutput, SequenceClassifierOutput, TokenClassifierOutput)
from .config import BertConfig
from .model import BertMLMHead, BertWithHead

NSP_DOC = "next-sentence scores from the pooler output: class 0 = segment B follows A, class 1 = B is random"


def classifier_dropout(config: BertConfig) -> nn.Dropout:
    """The dropout before a classifier: config.classifier_dropout, else hidden_dropout_prob (as transformers)."""
    return nn.Dropout(config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout)


class BertForPreTraining(BertWithHead):
    """The class bert-base-uncased was saved from: masked-LM and next-sentence heads. The loss, when both `labels`
    and `next_sentence_label` are given, is the sum of the two cross-entropies."""

    tied_output_layer = True

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=True)
        self.mlm_head = BertMLMHead(config)
        self.prediction_logits = HookPoint("b, s, V", "masked-LM scores over the vocabulary, per position")
        self.nsp_head = nn.Linear(config.hidden_size, 2)
        self.seq_relationship_logits = HookPoint("b, 2", f"{NSP_DOC}")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                next_sentence_label=None, output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> BertForPreTrainingOutput:
        """As BertModel.forward; `labels` [b, s] (token ids, -100 = not scored) and `next_sentence_label` [b]
        (0 or 1) add the loss. They go together: one without the other is an error (transformers would quietly
        return no loss)."""
        if (labels is None) != (next_sentence_label is None):
            raise ValueError("BertForPreTraining's loss needs both labels (masked LM) and next_sentence_label; "
                             f"only {'labels' if labels is not None else 'next_sentence_label'} was given")
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        mlm = self.prediction_logits(self.mlm_head(out.last_hidden_state, self.embeddings.word_embeddings.weight))
        nsp = self.seq_relationship_logits(self.nsp_head(out.pooler_output))
        loss = None
        if labels is not None:
            loss = (cross_entropy(mlm, labels, classes="vocab_size")
                    + cross_entropy(nsp, next_sentence_label, "next_sentence_label", classes="classes"))
        return BertForPreTrainingOutput(prediction_logits=mlm, seq_relationship_logits=nsp, loss=loss,
                                        hidden_states=out.hidden_states, attentions=out.attentions)


class BertForNextSentencePrediction(BertWithHead):
    """BERT's second pretraining task alone: is segment B (token type 1) the text that follows segment A?"""

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=True)
        self.nsp_head = nn.Linear(config.hidden_size, 2)
        self.logits = HookPoint("b, 2", f"{NSP_DOC}")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> NextSentencePredictorOutput:
        """As BertModel.forward; `labels` [b] (0: B follows A, 1: B is random, -100: not scored) adds the loss."""
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        logits = self.logits(self.nsp_head(out.pooler_output))
        loss = cross_entropy(logits, labels, classes="classes") if labels is not None else None
        return NextSentencePredictorOutput(logits=logits, loss=loss, hidden_states=out.hidden_states,
                                           attentions=out.attentions)


class BertForSequenceClassification(BertWithHead):
    """config.num_labels classes (id2label names them), or regression with one label."""

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=True)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.logits = HookPoint("b, L", "class scores of each sequence, from the pooler output (L = num_labels; "
                                "regression: the predicted values)")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> SequenceClassifierOutput:
        """As BertModel.forward; `labels` add the loss that config.problem_type names, or when it is null the one
        the labels imply: [b] torch.long class indices (-100: not scored) -> cross-entropy; [b, L] floats (0/1 per
        class) -> binary cross-entropy (multi-label); with num_labels 1, [b] values -> mean squared error."""
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        logits = self.logits(self.classifier(self.dropout(out.pooler_output)))
        config = self.config
        loss = None if labels is None else classification_loss(logits, labels, config.num_labels, config.problem_type)
        return SequenceClassifierOutput(logits=logits, loss=loss, hidden_states=out.hidden_states,
                                        attentions=out.attentions)


class BertForTokenClassification(BertWithHead):
    """A class per token (named entities, parts of speech): config.num_labels classes."""

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.logits = HookPoint("b, s, L", "class scores of each token (L = num_labels)")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> TokenClassifierOutput:
        """As BertModel.forward; `labels` [b, s] (class indices, -100 = not scored) add the cross-entropy loss."""
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        logits = self.logits(self.classifier(self.dropout(out.last_hidden_state)))
        loss = cross_entropy(logits, labels) if labels is not None else None
        return TokenClassifierOutput(logits=logits, loss=loss, hidden_states=out.hidden_states,
                                     attentions=out.attentions)


class BertForQuestionAnswering(BertWithHead):
    """Extractive question answering (SQuAD): the answer is the span of the context between the token with the
    highest start score and the one with the highest end score."""

    def __init__(self, config: BertConfig):
        if config.num_labels != 2:  # transformers builds the layer, then fails at the first forward
            raise ValueError(f"BertForQuestionAnswering scores a start and an end per token: it needs num_labels "
                             f"= 2, but the config names {config.num_labels} labels")
        super().__init__(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.span_logits = HookPoint("b, s, 2", "start and end score of each token, before they are split")
        self.start_logits = HookPoint("b, s", "score of each token as the first token of the answer")
        self.end_logits = HookPoint("b, s", "score of each token as the last token of the answer")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                start_positions=None, end_positions=None, output_hidden_states: bool = False,
                output_attentions: bool = False, inputs_embeds=None) -> QuestionAnsweringModelOutput:
        """As BertModel.forward; `start_positions` and `end_positions` [b] (token indices; one >= s, an answer cut
        off, is not scored) add the loss, the mean of the two cross-entropies. They go together: one without the
        other is an error (transformers would quietly return no loss)."""
        if (start_positions is None) != (end_positions is None):
            raise ValueError("BertForQuestionAnswering's loss needs both start_positions and end_positions; only "
                             f"{'start' if start_positions is not None else 'end'}_positions was given")
        out = super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        start, end = self.span_logits(self.qa_outputs(out.last_hidden_state)).unbind(-1)
        start, end = self.start_logits(start.contiguous()), self.end_logits(end.contiguous())
        loss = span_loss(start, end, start_positions, end_positions) if start_positions is not None else None
        return QuestionAnsweringModelOutput(start_logits=start, end_logits=end, loss=loss,
                                            hidden_states=out.hidden_states, attentions=out.attentions)


class BertForMultipleChoice(BertWithHead):
    """Each (context, choice) pair is a sequence of its own; one score each, compared across the choices (SWAG).
    The encoder sees b * c sequences, so hidden_states and attentions are [b * c, ...], as in transformers."""

    multiple_choice = True

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=True)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.logits = HookPoint("b, c", "score of each choice, from the pooler output of its (context, choice) "
                                "sequence")

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                inputs_embeds=None) -> MultipleChoiceModelOutput:
        """input_ids, attention_mask, token_type_ids, position_ids [b, c, s] (or inputs_embeds [b, c, s, h] in place
        of input_ids), each otherwise as in BertModel.forward; `labels` [b] (the right choice, -100 = not scored)
        add the cross-entropy loss."""
        check_one_of(input_ids, inputs_embeds)
        if inputs_embeds is not None:
            shape = check_embeds(inputs_embeds, self.get_input_embeddings().weight, ("batch", "num_choices", "seq"))
        elif not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3:
            raise ValueError(f"input_ids must be 3-D [batch, num_choices, seq], got {_described(input_ids)}")
        else:
            shape = tuple(input_ids.shape)
        batch, choices, seq = shape
        flat = [_one_sequence_per_choice(name, tensor, shape) for name, tensor in
                [("input_ids", input_ids), ("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                 ("position_ids", position_ids)]]
        embeds = None if inputs_embeds is None else inputs_embeds.reshape(batch * choices, seq, -1)
        out = super().forward(*flat, output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=embeds)
        scores = self.classifier(self.dropout(out.pooler_output))  # [b * c, 1]
        logits = self.logits(scores.view(batch, choices))
        loss = cross_entropy(logits, labels, classes="num_choices") if labels is not None else None
        return MultipleChoiceModelOutput(logits=logits, loss=loss, hidden_states=out.hidden_states,
                                         attentions=out.attentions)


def _one_sequence_per_choice(name: str, tensor, shape: tuple[int, int, int]):
    """[b, c, s] -> [b * c, s], one sequence per (example, choice); None stays None."""
    if tensor is None:
        return None
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must be [batch, num_choices, seq] = {shape} like input_ids, got "
                         f"{_described(tensor)}")
    return tensor.reshape(-1, shape[-1])


def _described(value) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
