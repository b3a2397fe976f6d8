"""OLMo 2 (OLMo-2-0425-1B to 0325-32B): the model, its task head, its config and its declaration."""

from .config import Olmo2Config
from .family import FAMILY
from .model import Olmo2ForCausalLM, Olmo2Model
from .task_heads import Olmo2ForSequenceClassification

__all__ = ["FAMILY", "Olmo2Config", "Olmo2ForCausalLM", "Olmo2ForSequenceClassification", "Olmo2Model"]
