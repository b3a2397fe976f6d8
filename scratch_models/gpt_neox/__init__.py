"""GPT-NeoX (the Pythia suite, gpt-neox-20b): the model, its task heads, its config and its declaration."""

from .config import GPTNeoXConfig
from .family import FAMILY
from .model import GPTNeoXForCausalLM, GPTNeoXModel
from .task_heads import GPTNeoXForQuestionAnswering, GPTNeoXForSequenceClassification, GPTNeoXForTokenClassification

__all__ = ["FAMILY", "GPTNeoXConfig", "GPTNeoXForCausalLM", "GPTNeoXForQuestionAnswering",
           "GPTNeoXForSequenceClassification", "GPTNeoXForTokenClassification", "GPTNeoXModel"]
