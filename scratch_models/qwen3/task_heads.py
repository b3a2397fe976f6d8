"""Qwen 3's task heads, as transformers 5 has them (its generic classes): decoding/task_heads.py's, over Qwen3Model's
last hidden state (see scratch_models/llama/task_heads.py)."""

from ..decoding.task_heads import GenericTokenClassification, QuestionAnswering, SequenceClassification
from .model import Qwen3Model


class Qwen3ForSequenceClassification(SequenceClassification, Qwen3Model):
    """A class for the whole sequence, read at its last token that is not padding (Qwen 3's rerankers)."""


class Qwen3ForTokenClassification(GenericTokenClassification, Qwen3Model):
    """A class for every token."""


class Qwen3ForQuestionAnswering(QuestionAnswering, Qwen3Model):
    """Extractive question answering: each token's score as the first and as the last of the answer. transformers
    keeps this class's base model as `transformer`, not `model`: so do its files."""

    checkpoint_prefixed = "transformer."
