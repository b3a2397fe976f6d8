"""Phi-3 (Phi-3-mini, Phi-3-medium, Phi-3.5-mini, Phi-4-mini): the model, its task heads, its config and its
declaration."""

from .config import Phi3Config
from .family import FAMILY
from .model import Phi3ForCausalLM, Phi3Model
from .task_heads import Phi3ForSequenceClassification, Phi3ForTokenClassification

__all__ = ["FAMILY", "Phi3Config", "Phi3ForCausalLM", "Phi3ForSequenceClassification", "Phi3ForTokenClassification",
           "Phi3Model"]
