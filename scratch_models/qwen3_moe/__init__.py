"""Qwen3-MoE: Qwen 3's model with mixtures of experts (scratch_models/llama/, parts/moe.py), its task heads, config
and declaration."""

from .config import Qwen3MoeConfig
from .family import FAMILY
from .model import Qwen3MoeForCausalLM, Qwen3MoeModel
from .task_heads import Qwen3MoeForQuestionAnswering, Qwen3MoeForSequenceClassification, Qwen3MoeForTokenClassification

__all__ = ["FAMILY", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "Qwen3MoeForQuestionAnswering",
           "Qwen3MoeForSequenceClassification", "Qwen3MoeForTokenClassification", "Qwen3MoeModel"]
