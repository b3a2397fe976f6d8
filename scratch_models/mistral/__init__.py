"""Mistral: Llama's model with Mistral's settings (scratch_models/llama/), its task heads, config and declaration."""

from .config import MistralConfig
from .family import FAMILY
from .model import MistralForCausalLM, MistralModel
from .task_heads import MistralForQuestionAnswering, MistralForSequenceClassification, MistralForTokenClassification

__all__ = ["FAMILY", "MistralConfig", "MistralForCausalLM", "MistralForQuestionAnswering",
           "MistralForSequenceClassification", "MistralForTokenClassification", "MistralModel"]
