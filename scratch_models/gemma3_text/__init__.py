"""Gemma 3's language model (gemma-3-270m, 1b, and inside the multimodal 4b, 12b, 27b): the model, its task head,
its config and its declaration."""

from .config import Gemma3TextConfig
from .family import FAMILY
from .model import Gemma3ForCausalLM, Gemma3TextModel
from .task_heads import Gemma3TextForSequenceClassification

__all__ = ["FAMILY", "Gemma3ForCausalLM", "Gemma3TextConfig", "Gemma3TextForSequenceClassification",
           "Gemma3TextModel"]
