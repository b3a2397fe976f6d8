"""GPT-OSS: Llama's model with attention sinks, alternating sliding-window layers and a mixture of clamped-SwiGLU
experts in every layer (scratch_models/llama/, parts/moe.py), its task heads, config and declaration."""

from .config import GptOssConfig
from .family import FAMILY
from .model import GptOssForCausalLM, GptOssModel
from .task_heads import GptOssForSequenceClassification, GptOssForTokenClassification

__all__ = ["FAMILY", "GptOssConfig", "GptOssForCausalLM", "GptOssForSequenceClassification",
           "GptOssForTokenClassification", "GptOssModel"]
