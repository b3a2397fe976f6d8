"""Gemma's task heads, as transformers 5 has them (its generic ones): decoder_heads.py's, over GemmaModel's last
hidden state.

    GemmaForSequenceClassification   score: h -> L at every position, read at each row's last token
    GemmaForTokenClassification      dropout, then score: h -> L at every position
"""

from ..decoding.task_heads import GenericTokenClassification, SequenceClassification
from .model import GemmaModel


class GemmaForSequenceClassification(SequenceClassification, GemmaModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class GemmaForTokenClassification(GenericTokenClassification, GemmaModel):
    """A class for every token."""
