"""OLMo 3's task head, as transformers 5 has it (its generic sequence classifier; transformers gives OLMo 3 no other
head): decoder_heads.py's, over Olmo3Model's last hidden state.

    Olmo3ForSequenceClassification   score: h -> L at every position, read at each row's last token
"""

from ..decoding.task_heads import SequenceClassification
from .model import Olmo3Model


class Olmo3ForSequenceClassification(SequenceClassification, Olmo3Model):
    """A class for the whole sequence, read at its last token that is not padding."""
