"""Qwen 2 (and 2.5): Llama's model with Qwen 2's settings (scratch_models/llama/), its task heads, config and
declaration."""

from .config import Qwen2Config
from .family import FAMILY
from .model import Qwen2ForCausalLM, Qwen2Model
from .task_heads import Qwen2ForQuestionAnswering, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

__all__ = ["FAMILY", "Qwen2Config", "Qwen2ForCausalLM", "Qwen2ForQuestionAnswering", "Qwen2ForSequenceClassification",
           "Qwen2ForTokenClassification", "Qwen2Model"]
