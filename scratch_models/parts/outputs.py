"""Output objects with the field names transformers uses, so code written for one reads the other."""

import dataclasses

import torch

from .kv_cache import KVCache


@dataclasses.dataclass
class ModelOutput:
    def __getitem__(self, key: str):
        if not isinstance(key, str):  # TransformerLens-style code indexing what it takes for the logits
            raise TypeError(f"{type(self).__name__} is the model's output, indexed by field name "
                            f"({', '.join(self.keys())}), not by {key!r}: its scores are .logits (load with "
                            "transformer_lens=True, or pass return_type='logits', for calls that return them)")
        return getattr(self, key)

    def keys(self):
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]


def logits_of(output) -> torch.Tensor:
    """The scores an output holds: `logits` (`prediction_logits`, the MLM scores, for BertForPreTraining); a tensor
    is taken to be the logits themselves (what a call with return_type="logits" returns)."""
    if isinstance(output, torch.Tensor):
        return output
    for field in ("logits", "prediction_logits"):
        value = getattr(output, field, None)
        if isinstance(value, torch.Tensor):
            return value
    fields = ", ".join(output.keys()) if isinstance(output, ModelOutput) else type(output).__name__
    raise ValueError(f"{type(output).__name__} has no logits (its fields: {fields}): return_type='logits' and the "
                     "built-in metrics need a model with a head; write your own metric for this output")


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


# Task heads: the same field names (and losses) as transformers' outputs of the classes of the same names.


@dataclasses.dataclass
class SequenceClassifierOutput(ModelOutput):
    logits: torch.Tensor  # [batch, num_labels]
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class SequenceClassifierOutputWithPast(ModelOutput):
    logits: torch.Tensor  # [batch, num_labels]
    loss: torch.Tensor | None = None
    past_key_values: KVCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class TokenClassifierOutput(ModelOutput):
    logits: torch.Tensor  # [batch, seq, num_labels]
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class QuestionAnsweringModelOutput(ModelOutput):
    start_logits: torch.Tensor  # [batch, seq]: where the answer span starts
    end_logits: torch.Tensor  # [batch, seq]: where it ends
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class MultipleChoiceModelOutput(ModelOutput):
    logits: torch.Tensor  # [batch, num_choices]
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class NextSentencePredictorOutput(ModelOutput):
    logits: torch.Tensor  # [batch, 2]: 0 = B follows A, 1 = B is random
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class BertForPreTrainingOutput(ModelOutput):
    prediction_logits: torch.Tensor  # [batch, seq, vocab]: the masked-LM scores
    seq_relationship_logits: torch.Tensor  # [batch, 2]: next-sentence prediction
    loss: torch.Tensor | None = None  # masked-LM loss + next-sentence loss
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclasses.dataclass
class GPT2DoubleHeadsModelOutput(ModelOutput):
    logits: torch.Tensor  # [batch, num_choices, seq, vocab]: the LM scores of every choice
    mc_logits: torch.Tensor  # [batch, num_choices]: which choice is right
    loss: torch.Tensor | None = None  # the LM loss
    mc_loss: torch.Tensor | None = None  # the multiple-choice loss
    past_key_values: KVCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
