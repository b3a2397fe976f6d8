"""Phi-3's task heads, as transformers 5 has them (its generic classes; transformers gives Phi-3 no question
answering): decoding/task_heads.py's, over Phi3Model's last hidden state.

    Phi3ForSequenceClassification   score: h -> L at every position, read at each row's last token
    Phi3ForTokenClassification      dropout, then score: h -> L at every position
"""

from ..decoding.task_heads import GenericTokenClassification, SequenceClassification
from .model import Phi3Model


class Phi3ForSequenceClassification(SequenceClassification, Phi3Model):
    """A class for the whole sequence, read at its last token that is not padding."""


class Phi3ForTokenClassification(GenericTokenClassification, Phi3Model):
    """A class for every token."""
