"""Gemma 2 (gemma-2-2b, 9b, 27b): the model, its task heads, its config and its declaration."""

from .config import Gemma2Config
from .family import FAMILY
from .model import Gemma2ForCausalLM, Gemma2Model
from .task_heads import Gemma2ForSequenceClassification, Gemma2ForTokenClassification

__all__ = ["FAMILY", "Gemma2Config", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification",
           "Gemma2ForTokenClassification", "Gemma2Model"]
