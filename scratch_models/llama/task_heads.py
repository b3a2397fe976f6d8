"""Llama's task heads, as transformers 5 has them (its generic classes): decoding/task_heads.py's, over LlamaModel's
last hidden state.

    LlamaForSequenceClassification   score: h -> L at every position, read at each row's last token
    LlamaForTokenClassification      dropout, then score: h -> L at every position
    LlamaForQuestionAnswering        qa_outputs: h -> 2 at every position, where the answer starts and ends
"""

from ..decoding.task_heads import GenericTokenClassification, QuestionAnswering, SequenceClassification
from .model import LlamaModel


class LlamaForSequenceClassification(SequenceClassification, LlamaModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class LlamaForTokenClassification(GenericTokenClassification, LlamaModel):
    """A class for every token."""


class LlamaForQuestionAnswering(QuestionAnswering, LlamaModel):
    """Extractive question answering: each token's score as the first and as the last of the answer. transformers
    keeps this class's base model as `transformer`, not `model` (for backward compatibility): so do its files."""

    checkpoint_prefixed = "transformer."
