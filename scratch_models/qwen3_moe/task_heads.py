"""Qwen3-MoE's task heads, as transformers 5 has them (its generic classes): decoder_heads.py's, over
Qwen3MoeModel's last hidden state (see scratch_models/llama/task_heads.py)."""

from ..decoding.task_heads import GenericTokenClassification, QuestionAnswering, SequenceClassification
from .model import Qwen3MoeModel


class Qwen3MoeForSequenceClassification(SequenceClassification, Qwen3MoeModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class Qwen3MoeForTokenClassification(GenericTokenClassification, Qwen3MoeModel):
    """A class for every token."""


class Qwen3MoeForQuestionAnswering(QuestionAnswering, Qwen3MoeModel):
    """Extractive question answering: each token's score as the first and as the last of the answer. transformers
    keeps this class's base model as `transformer`, not `model`: so do its files."""

    checkpoint_prefixed = "transformer."
