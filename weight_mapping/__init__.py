"""Checkpoint files <-> our models: one declarative table per model family, the readers, and the loader.

Nothing here imports transformers: the tables are plain data and the readers use safetensors, torch and
huggingface_hub only.
"""

from .bert import BERT
from .gpt2 import GPT2
from .loading import LoadingInfo, load_state
from .readers import Checkpoint, CheckpointError, open_checkpoint
from .table import MappingTable, Row

__all__ = ["BERT", "GPT2", "Checkpoint", "CheckpointError", "LoadingInfo", "MappingTable", "Row", "load_state",
           "open_checkpoint"]
