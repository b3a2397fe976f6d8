"""Gemma 3's task head, as transformers 5 has it (its generic sequence classifier; transformers gives Gemma 3 no
token classifier and no question answering): decoder_heads.py's, over Gemma3TextModel's last hidden state.

    Gemma3TextForSequenceClassification   score: h -> L at every position, read at each row's last token
"""

from ..decoding.task_heads import SequenceClassification
from .model import Gemma3TextModel


class Gemma3TextForSequenceClassification(SequenceClassification, Gemma3TextModel):
    """A class for the whole sequence, read at its last token that is not padding."""
