"""GPT-OSS's task heads, as transformers 5 has them (its generic classes; no question answering):
decoding/task_heads.py's, over GptOssModel's last hidden state (see scratch_models/llama/task_heads.py)."""

from ..decoding.task_heads import GenericTokenClassification, SequenceClassification
from .model import GptOssModel


class GptOssForSequenceClassification(SequenceClassification, GptOssModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class GptOssForTokenClassification(GenericTokenClassification, GptOssModel):
    """A class for every token."""
