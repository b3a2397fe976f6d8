"""Mistral's task heads, as transformers 5 has them (its generic classes): decoding/task_heads.py's, over MistralModel's
last hidden state (see scratch_models/llama/task_heads.py)."""

from ..decoding.task_heads import GenericTokenClassification, QuestionAnswering, SequenceClassification
from .model import MistralModel


class MistralForSequenceClassification(SequenceClassification, MistralModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class MistralForTokenClassification(GenericTokenClassification, MistralModel):
    """A class for every token."""


class MistralForQuestionAnswering(QuestionAnswering, MistralModel):
    """Extractive question answering: each token's score as the first and as the last of the answer."""
