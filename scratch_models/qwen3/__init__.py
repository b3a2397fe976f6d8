"""Qwen 3 (the dense models): Llama's model with Qwen 3's settings (scratch_models/llama/), its task heads, config
and declaration."""

from .config import Qwen3Config
from .family import FAMILY
from .model import Qwen3ForCausalLM, Qwen3Model
from .task_heads import Qwen3ForQuestionAnswering, Qwen3ForSequenceClassification, Qwen3ForTokenClassification

__all__ = ["FAMILY", "Qwen3Config", "Qwen3ForCausalLM", "Qwen3ForQuestionAnswering", "Qwen3ForSequenceClassification",
           "Qwen3ForTokenClassification", "Qwen3Model"]
