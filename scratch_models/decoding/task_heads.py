"""The task heads a decoder-only family has in transformers (GPT-2, GPT-NeoX, the Llama-like families), each a few
lines over its base model's last hidden state (after the final norm). Mixed in before the family's base model:

    class GPT2ForSequenceClassification(SequenceClassification, GPT2Model): ...

    SequenceClassification       score: h -> L at every position, read at each row's last token
    TokenClassification          classifier: h -> L at every position
    GenericTokenClassification   the same as transformers 5's generic head has it (Llama, Mistral, Qwen): `score`
    QuestionAnswering            qa_outputs: h -> 2 at every position, where the answer starts and ends

Their tensors sit beside the base model's under the family's base prefix, as transformers saves them. A head the
checkpoint lacks is an error naming its tensors, never a random init. The losses are transformers' (losses.py).
The config supplies `hidden_size`, `num_labels`, `pad_token_id`, `problem_type` and `token_classifier_dropout`.
Shapes: b batch, s sequence, h hidden, L num_labels.
"""

import warnings

import torch
from torch import nn

from ..parts.hook_point import HookPoint
from ..parts.kv_cache import KVCache
from ..parts.losses import check_classification_labels, classification_loss, cross_entropy, span_loss
from ..parts.outputs import QuestionAnsweringModelOutput, SequenceClassifierOutputWithPast, TokenClassifierOutput


class SequenceClassification:
    """A class for the whole sequence, read at its last token: the only one whose attention saw all the others."""

    checkpoint_prefixed = True
    reads_last_token = True
    target = "class"  # what the command line's heads and patch measure (Family.targets)
    classify_as = "labels"  # what its classify reads (Family.classifiers)

    def __init__(self, config):
        super().__init__(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.token_logits = HookPoint("b, s, L", "class scores at every position (score), before one is read")
        self.logits = HookPoint("b, L", "class scores at each row's last token that is not padding: the output")

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values: KVCache | None = None, use_cache: bool = False, output_hidden_states: bool = False,
                output_attentions: bool = False, labels=None, inputs_embeds=None) -> SequenceClassifierOutputWithPast:
        """As the base model's forward. `labels`: [b] class indices (torch.long), or float [b, L] 0/1 targets
        (multi-label), or float [b] (L = 1) / [b, L] values (regression); config.problem_type says which, or else
        the labels do (see losses.py). With a cache, the row is read at its last new token that is not padding."""
        self.check_tokens(input_ids, inputs_embeds)
        # checked before the forward pass, which would extend a cache
        last = self.last_tokens(input_ids, inputs_embeds, attention_mask)
        if labels is not None:
            problem_type = check_classification_labels(labels, (len(last), self.config.num_labels),
                                                       self.config.num_labels, self.config.problem_type)
        out = super().forward(input_ids, attention_mask, position_ids, past_key_values, use_cache,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              inputs_embeds=inputs_embeds)
        token_logits = self.token_logits(self.score(out.last_hidden_state))
        logits = self.logits(token_logits[torch.arange(len(last), device=last.device), last])
        loss = None
        if labels is not None:
            loss = classification_loss(logits, labels, self.config.num_labels, problem_type, checked=True)
        return SequenceClassifierOutputWithPast(logits=logits, loss=loss, past_key_values=out.past_key_values,
                                                hidden_states=out.hidden_states, attentions=out.attentions)

    def last_tokens(self, input_ids, inputs_embeds=None, attention_mask=None) -> torch.Tensor:
        """[b] the position each row is read at: its rightmost token that is not config.pad_token_id, so right and
        left padding both work (a row of nothing but padding: position 0). As transformers, from input_ids alone:
        attention_mask plays no part. Without a pad_token_id: the last position, which is right for one row only.
        Given inputs_embeds, whose padding cannot be told apart either: the last position, as transformers reads
        it, with a warning where `attention_mask` marks a row's last position as padding."""
        tokens = input_ids if input_ids is not None else inputs_embeds
        batch, seq = tokens.shape[:2]
        pad = self.config.pad_token_id
        if pad is None and batch > 1:
            raise ValueError(f"{type(self).__name__} reads each row at its last token that is not padding, and "
                             f"config.pad_token_id is not set, so padding cannot be told apart: cannot handle "
                             f"batch sizes > 1 (got {batch}). Set pad_token_id in config.json (fine-tuning "
                             "usually pads with eos_token_id), or pass one row at a time")
        if input_ids is None and attention_mask is not None and not bool(attention_mask[:, -1].all()):
            row = int((attention_mask[:, -1] == 0).nonzero()[0])
            warnings.warn(f"{type(self).__name__} reads each row of inputs_embeds at its last position, as "
                          f"transformers does (embeddings do not say which tokens are padding), and attention_mask "
                          f"marks row {row} as padding there: pad on the left, or pass input_ids", stacklevel=3)
        if pad is None or input_ids is None:
            return torch.full((batch,), seq - 1, device=tokens.device)
        real = (input_ids != pad).to(torch.int32)
        positions = torch.arange(seq, device=input_ids.device, dtype=torch.int32)
        return (positions * real).argmax(-1)  # the largest position holding a real token; 0 if there is none


class TokenClassification:
    """A class for every token (named entities, parts of speech)."""

    checkpoint_prefixed = True
    classify_as = "tokens"
    classifier_name = "classifier"  # the classifier's module, as transformers names it

    def __init__(self, config):
        super().__init__(config)
        self.dropout = nn.Dropout(config.token_classifier_dropout)
        self.add_module(self.classifier_name, nn.Linear(config.hidden_size, config.num_labels,
                                                        bias=self.classifier_bias(config)))
        self.logits = HookPoint("b, s, L", "class scores of every token")

    @staticmethod
    def classifier_bias(config) -> bool:
        """Whether the classifier adds a bias (GPT-2's and GPT-NeoX's always do)."""
        return True

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, output_hidden_states: bool = False,
                output_attentions: bool = False, labels=None, inputs_embeds=None) -> TokenClassifierOutput:
        """As the base model's forward, without a KV cache (the output has no place for one, as in transformers).
        `labels` [b, s]: class indices, -100 where a token is not scored (padding, a word's later pieces); the
        loss is their cross-entropy, whatever config.problem_type says (as in transformers)."""
        out = super().forward(input_ids, attention_mask, position_ids, output_hidden_states=output_hidden_states,
                              output_attentions=output_attentions, inputs_embeds=inputs_embeds)
        classifier = getattr(self, self.classifier_name)
        logits = self.logits(classifier(self.dropout(out.last_hidden_state)))
        loss = cross_entropy(logits, labels) if labels is not None else None
        return TokenClassifierOutput(logits=logits, loss=loss, hidden_states=out.hidden_states,
                                     attentions=out.attentions)


class GenericTokenClassification(TokenClassification):
    """transformers 5's GenericForTokenClassification, which the Llama-like families' ForTokenClassification are: the
    classifier is `score` (as the sequence classifier's is), with a bias unless config.json's
    token_classification_bias is false; its dropout is config.token_classifier_dropout, as for the others."""

    classifier_name = "score"

    @staticmethod
    def classifier_bias(config) -> bool:
        return config.token_classification_bias


class QuestionAnswering:
    """Extractive question answering: scores for each token as the first and as the last of the answer span."""

    checkpoint_prefixed = True
    classify_as = "span"

    def __init__(self, config):
        super().__init__(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.span_logits = HookPoint("b, s, 2", "qa_outputs: each token's start and end scores side by side")
        self.start_logits = HookPoint("b, s", "each token's score as the first of the answer")
        self.end_logits = HookPoint("b, s", "each token's score as the last of the answer")

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, output_hidden_states: bool = False,
                output_attentions: bool = False, start_positions=None, end_positions=None,
                inputs_embeds=None) -> QuestionAnsweringModelOutput:
        """As the base model's forward, without a KV cache (as in transformers). `start_positions`,
        `end_positions` [b]: the answer's first and last token; the loss is the mean of their two cross-entropies
        (losses.span_loss: a position past the sequence, an answer cut off by truncation, is not scored; a negative
        one is refused)."""
        if (start_positions is None) != (end_positions is None):
            raise ValueError("give both start_positions and end_positions (the loss needs both ends of the answer), "
                             "or neither")
        out = super().forward(input_ids, attention_mask, position_ids, output_hidden_states=output_hidden_states,
                              output_attentions=output_attentions, inputs_embeds=inputs_embeds)
        start, end = self.span_logits(self.qa_outputs(out.last_hidden_state)).unbind(-1)
        start_logits, end_logits = self.start_logits(start.contiguous()), self.end_logits(end.contiguous())
        loss = span_loss(start_logits, end_logits, start_positions, end_positions) if start_positions is not None \
            else None
        return QuestionAnsweringModelOutput(start_logits=start_logits, end_logits=end_logits, loss=loss,
                                            hidden_states=out.hidden_states, attentions=out.attentions)
