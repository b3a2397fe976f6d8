"""Output objects with the field names transformers uses, so code written for one reads the other."""

import dataclasses

import torch

from .generation import KVCache


@dataclasses.dataclass
class ModelOutput:
    def __getitem__(self, key: str):
        return getattr(self, key)

    def keys(self):
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]


@dataclasses.dataclass
class BaseModelOutputWithPooling(ModelOutput):
    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None = None
    # embeddings output, then each layer's output: num_hidden_layers + 1 tensors [batch, seq, hidden]
    hidden_states: tuple[torch.Tensor, ...] | None = None
    # per layer: attention probabilities [batch, heads, query, key]
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class MaskedLMOutput(ModelOutput):
    logits: torch.Tensor  # [batch, seq, vocab]
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class BaseModelOutputWithPast(ModelOutput):
    last_hidden_state: torch.Tensor  # [batch, seq, hidden], after the final LayerNorm
    past_key_values: KVCache | None = None  # the cache in use, now holding these tokens too
    # embeddings output, each layer's output but the last, then the last one after the final LayerNorm (as in
    # transformers): n_layer + 1 tensors [batch, seq, hidden]
    hidden_states: tuple[torch.Tensor, ...] | None = None
    # per layer: attention probabilities [batch, heads, query, past + query]
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class CausalLMOutputWithPast(ModelOutput):
    logits: torch.Tensor  # [batch, seq, vocab]: scores for the token that follows each position
    loss: torch.Tensor | None = None
    past_key_values: KVCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
