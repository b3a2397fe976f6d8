"""Mixtral: Mistral's model with a mixture of experts in every layer (scratch_models/llama/, parts/moe.py), its task
heads, config and declaration."""

from .config import MixtralConfig
from .family import FAMILY
from .model import MixtralForCausalLM, MixtralModel
from .task_heads import MixtralForQuestionAnswering, MixtralForSequenceClassification, MixtralForTokenClassification

__all__ = ["FAMILY", "MixtralConfig", "MixtralForCausalLM", "MixtralForQuestionAnswering",
           "MixtralForSequenceClassification", "MixtralForTokenClassification", "MixtralModel"]
