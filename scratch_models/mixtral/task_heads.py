"""Mixtral's task heads, as transformers 5 has them (its generic classes): decoder_heads.py's, over MixtralModel's
last hidden state (see scratch_models/llama/task_heads.py)."""

from ..decoding.task_heads import GenericTokenClassification, QuestionAnswering, SequenceClassification
from .model import MixtralModel


class MixtralForSequenceClassification(SequenceClassification, MixtralModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class MixtralForTokenClassification(GenericTokenClassification, MixtralModel):
    """A class for every token."""


class MixtralForQuestionAnswering(QuestionAnswering, MixtralModel):
    """Extractive question answering: each token's score as the first and as the last of the answer."""
