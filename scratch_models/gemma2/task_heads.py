"""Gemma 2's task heads, as transformers 5 has them (its generic ones): decoding/task_heads.py's, over Gemma2Model's
last hidden state.

    Gemma2ForSequenceClassification   score: h -> L at every position, read at each row's last token
    Gemma2ForTokenClassification      dropout, then score: h -> L at every position
"""

from ..decoding.task_heads import GenericTokenClassification, SequenceClassification
from .model import Gemma2Model


class Gemma2ForSequenceClassification(SequenceClassification, Gemma2Model):
    """A class for the whole sequence, read at its last token that is not padding."""


class Gemma2ForTokenClassification(GenericTokenClassification, Gemma2Model):
    """A class for every token."""
