"""Checkpoint files <-> our models: one declarative table per model family, the readers, the loader and the saver.

Nothing here imports transformers: the tables are plain data; the readers and the saver use safetensors, torch and
huggingface_hub only.
"""

from .bert import BERT
from .gpt2 import GPT2
from .loading import LoadingInfo, as_dtype, check_layer_count, load_state, tied_twins
from .locks import DirectoryBusy, DirectoryLock
from .readers import (EMBEDDED_HUB_ID, EMBEDDED_NAME, GENERATION_CONFIG, TOKENIZER_FILES, Checkpoint, CheckpointError,
                      ConfigError, HubRepository, NotCached, embedded_checkpoint, looks_like_checkpoint,
                      looks_like_hub_id, open_checkpoint,
                      read_config_json)
from .saving import checkpoint_state, staged, write_checkpoint
from .table import MappingTable, Row

__all__ = ["BERT", "Checkpoint", "CheckpointError", "ConfigError", "DirectoryBusy", "DirectoryLock", "EMBEDDED_HUB_ID",
           "EMBEDDED_NAME", "GENERATION_CONFIG", "GPT2", "HubRepository", "LoadingInfo", "MappingTable", "NotCached",
           "Row", "TOKENIZER_FILES", "as_dtype", "check_layer_count", "checkpoint_state", "embedded_checkpoint",
           "load_state", "looks_like_checkpoint", "looks_like_hub_id", "open_checkpoint", "read_config_json", "staged",
           "tied_twins", "write_checkpoint"]
