"""Gemma (gemma-2b, 7b and their -it versions): Llama's model with Gemma's settings (scratch_models/llama/), its task
heads, config and declaration."""

from .config import GemmaConfig
from .family import FAMILY
from .model import GemmaForCausalLM, GemmaModel
from .task_heads import GemmaForSequenceClassification, GemmaForTokenClassification

__all__ = ["FAMILY", "GemmaConfig", "GemmaForCausalLM", "GemmaForSequenceClassification",
           "GemmaForTokenClassification", "GemmaModel"]
