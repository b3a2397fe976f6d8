"""Qwen 2's task heads, as transformers 5 has them (its generic classes): decoding/task_heads.py's, over Qwen2Model's
last hidden state (see scratch_models/llama/task_heads.py)."""

from ..decoding.task_heads import GenericTokenClassification, QuestionAnswering, SequenceClassification
from .model import Qwen2Model


class Qwen2ForSequenceClassification(SequenceClassification, Qwen2Model):
    """A class for the whole sequence, read at its last token that is not padding."""


class Qwen2ForTokenClassification(GenericTokenClassification, Qwen2Model):
    """A class for every token."""


class Qwen2ForQuestionAnswering(QuestionAnswering, Qwen2Model):
    """Extractive question answering: each token's score as the first and as the last of the answer. transformers
    keeps this class's base model as `transformer`, not `model`: so do its files."""

    checkpoint_prefixed = "transformer."
