"""GPT-NeoX's task heads, as transformers 5 has them: decoding/task_heads.py's, over GPTNeoXModel's last hidden state.

    GPTNeoXForSequenceClassification   score: h -> L at every position, read at each row's last token
    GPTNeoXForTokenClassification      dropout (classifier_dropout), then classifier: h -> L at every position
    GPTNeoXForQuestionAnswering        qa_outputs: h -> 2 at every position, where the answer starts and ends
"""

from ..decoding.task_heads import QuestionAnswering, SequenceClassification, TokenClassification
from .model import GPTNeoXModel


class GPTNeoXForSequenceClassification(SequenceClassification, GPTNeoXModel):
    """A class for the whole sequence, read at its last token that is not padding."""


class GPTNeoXForTokenClassification(TokenClassification, GPTNeoXModel):
    """A class for every token."""


class GPTNeoXForQuestionAnswering(QuestionAnswering, GPTNeoXModel):
    """Extractive question answering: each token's score as the first and as the last of the answer."""
