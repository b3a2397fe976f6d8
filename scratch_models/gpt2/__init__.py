"""GPT-2 (gpt2, gpt2-medium/large/xl, distilgpt2): the model, its task heads, its config and its declaration."""

from .config import GPT2Config
from .family import FAMILY
from .model import GPT2LMHeadModel, GPT2Model
from .task_heads import (GPT2DoubleHeadsModel, GPT2ForQuestionAnswering, GPT2ForSequenceClassification,
                         GPT2ForTokenClassification)

__all__ = ["FAMILY", "GPT2Config", "GPT2DoubleHeadsModel", "GPT2ForQuestionAnswering", "GPT2ForSequenceClassification",
           "GPT2ForTokenClassification", "GPT2LMHeadModel", "GPT2Model"]
