"""Llama (and the Llama-like families built from its model: Mistral, Qwen 2, Qwen 3): the model, its task heads, its
config and its declaration."""

from .config import LlamaConfig, LlamaLikeConfig
from .family import FAMILY
from .model import LlamaForCausalLM, LlamaModel
from .task_heads import LlamaForQuestionAnswering, LlamaForSequenceClassification, LlamaForTokenClassification

__all__ = ["FAMILY", "LlamaConfig", "LlamaForCausalLM", "LlamaForQuestionAnswering", "LlamaForSequenceClassification",
           "LlamaForTokenClassification", "LlamaLikeConfig", "LlamaModel"]
