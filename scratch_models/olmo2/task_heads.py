"""OLMo 2's task head, as transformers 5 has it (its generic sequence classifier; transformers gives OLMo 2 no other
head): decoder_heads.py's, over Olmo2Model's last hidden state.

    Olmo2ForSequenceClassification   score: h -> L at every position, read at each row's last token
"""

from ..decoding.task_heads import SequenceClassification
from .model import Olmo2Model


class Olmo2ForSequenceClassification(SequenceClassification, Olmo2Model):
    """A class for the whole sequence, read at its last token that is not padding."""
