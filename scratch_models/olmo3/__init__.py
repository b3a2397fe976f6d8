"""OLMo 3 (Olmo-3-1025-7B, Olmo-3-1125-32B): the model, its task head, its config and its declaration."""

from .config import Olmo3Config
from .family import FAMILY
from .model import Olmo3ForCausalLM, Olmo3Model
from .task_heads import Olmo3ForSequenceClassification

__all__ = ["FAMILY", "Olmo3Config", "Olmo3ForCausalLM", "Olmo3ForSequenceClassification", "Olmo3Model"]
