"""What a model family declares about itself, once, beside its model: `Family` and its `ResidualStream`.

Everything above the models (the activation cache's residual-stream helpers, the lens, patching, the command line,
the parity report, the tests) reads these declarations instead of testing a model's class or probing its hook names.
A family is a package `scratch_models/<name>/` whose `FAMILY` is listed in `scratch_models/families.py`.
"""

import dataclasses
import json

import torch
from torch import nn

from weight_mapping import CheckpointError, MappingTable

from .lens_names import LensTable


class ResidualStream:
    """Where a family's residual stream is, by hook name, and the modules that read it: what the activation cache's
    helpers (accumulated_resid, decompose_resid, apply_ln_to_stack, stack_head_results, the logit lens and direct
    logit attribution) need to know of a family. The defaults fit a stack of `model.layers` whose attention is
    `layers[l].attn` and whose stream between layers is `embeddings.out`, then `layers.{l}.out`."""

    post_ln: bool  # each sublayer's sum is renormalised at once (BERT): no sum of parts reaches past one LayerNorm

    def __init__(self, model: nn.Module):
        self.model = model
        self.n_layers = len(model.layers)
        self.num_heads = model.layers[0].attn.num_heads if self.n_layers else 0

    def resid_pre(self, layer: int) -> str:
        """The stream layer `layer` reads (for layer = n_layers: the last layer's output)."""
        return "embeddings.out" if layer == 0 else f"layers.{layer - 1}.out"

    def resid_mid(self, layer: int) -> str:
        """The stream between layer's attention and its MLP (TransformerLens' resid_mid)."""
        raise NotImplementedError

    def decomposition(self, layer: int, mlp_input: bool) -> tuple[list[tuple[str, str, str]], str, nn.Module]:
        """(parts as (label, hook name, kind: embed / attn / mlp / resid), the hook name of their sum, the LayerNorm
        that reads the sum)."""
        raise NotImplementedError

    def final_norm(self, stack: torch.Tensor) -> torch.Tensor:
        """The last stream as the read-out sees it (pre-LN: through the final LayerNorm)."""
        raise NotImplementedError

    def out_weight(self, layer: int) -> torch.Tensor:
        """[n * d, h]: layer's attention output projection, input rows first."""
        raise NotImplementedError

    def read_out(self, stack: torch.Tensor) -> torch.Tensor:
        """[..., h] streams -> [..., V] logits, as the model reads its last stream (the logit lens)."""
        raise NotImplementedError

    def unembedding(self) -> torch.Tensor:
        """[V, h]: the matrix the read-out scores a normalised stream against, where the read-out is linear in the
        stream once the final LayerNorm's scale is frozen (direct logit attribution); a ValueError otherwise."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, eq=False)
class Family:
    """One model family: its classes, its mapping table, its residual stream and the facts the layers above need.
    Declaring it marks each of its classes with `cls.family`, so `model.family` answers for any of its models."""

    name: str  # config.json's model_type
    title: str  # the family as people write it: "BERT", "GPT-2"
    config_class: type
    table: MappingTable
    base: type  # the base model (BertModel, GPT2Model)
    # classes with a task head, each compared with transformers' class of the same name; the first is the head of
    # the family's pretrained checkpoints (BertForMaskedLM, GPT2LMHeadModel)
    heads: tuple[type, ...]
    stream: type[ResidualStream]
    input_names: tuple[str, ...]  # forward arguments our classes and transformers' both take
    positions_field: str  # the config field that bounds a sequence's length
    causal: bool  # a query sees the keys up to itself only (and the family's LM head generates text)
    # our class name -> what the command line's heads and patch commands measure on its output (see targets.py):
    # "next" (the next token's logit), "mlm" (a masked token), "class" (a class logit), "pooler"
    targets: dict[str, str]
    default_texts: tuple[str, ...]  # what the parity report runs when given no text
    default_pairs: tuple[str, ...] = ()  # second segments of default_texts, for a family with token types
    # a small config (one layer) of the family: docs read the structure of models built from it, tests vary it
    tiny_config: dict = dataclasses.field(default_factory=dict)
    summary: str = ""  # how the family's residual stream reads, for docs/hook_names.md
    # hook name ("{i}" for the layer) -> the transformers output field that holds the same tensor (tested)
    output_fields: dict = dataclasses.field(default_factory=dict)
    # TransformerLens' names for the family's tensors, weights and config (scratch_models.lens_names.LensTable, in
    # the family's transformer_lens.py); None: TL's names are refused, saying the family declares none
    transformer_lens: LensTable | None = None

    def __post_init__(self):
        for cls in (self.base, *self.heads):
            cls.family = self

    def tiny(self, **changes):
        """A config of the family from `tiny_config` with `changes`."""
        return self.config_class(**self.tiny_config | changes)

    @property
    def classes(self) -> tuple[type, ...]:
        return (self.base, *self.heads)

    @property
    def lm(self) -> type:
        """The class that reads the stream out as scores over the vocabulary (the first of `heads`)."""
        return self.heads[0]

    @property
    def pairs(self) -> bool:
        """Whether the family takes sentence pairs (token types)."""
        return "token_type_ids" in self.input_names

    def sighted(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """[b, s] True where the query may see at least one key (causal: a real token at or before it; else any
        real token in its sequence)."""
        real = attention_mask.bool()
        return real.cumsum(-1) > 0 if self.causal else real.any(-1, keepdim=True).expand_as(real)

    def check_pairs(self, pairs) -> None:
        """Sentence pairs need token types, which only some families have."""
        if pairs and not self.pairs:
            raise ValueError(f"--pair: {self.name} has no sentence pairs (no token types)")

    def check_length(self, config, length: int, what: str) -> None:
        """A ValueError naming `what` when `length` tokens do not fit the model's position table."""
        limit = getattr(config, self.positions_field)
        if length > limit:
            raise ValueError(f"{what} is {length} tokens long; this model reads at most {limit} "
                             f"(config.json {self.positions_field}={limit}): shorten it")

    def missing_head_tensors(self, checkpoint, config, head: type) -> list[str]:
        """Checkpoint names of `head`'s own tensors (not tied ones) that the checkpoint lacks; all of them when
        the config cannot build that head (BertForQuestionAnswering with other than 2 labels, say)."""
        num_layers = getattr(config, self.table.layers_field)
        with torch.device("meta"):
            base_names = set(self.base(config).state_dict())
            try:
                head_names = set(head(config).state_dict())
            except ValueError:  # ConfigError too
                return [f"({head.__name__} cannot be built from {checkpoint.config_path})"]
        present = {self.table.normalize(k) for k in checkpoint.keys()}
        present |= {self.table.aliases[k] for k in present if k in self.table.aliases}
        return [key for key, ours in self.table.tensor_names(num_layers).items()
                if ours in head_names - base_names and key not in present]

    def head_of(self, checkpoint, *, sequences_only: bool = False) -> type | None:
        """Our class with the checkpoint's head: the class config.json's `architectures` names, if the file holds
        its tensors; else the first of `heads` whose tensors it holds all of; None for a base-model checkpoint.
        `sequences_only`: no class whose inputs are [batch, choices, seq] (multiple choice)."""
        config = self.config_class.from_json_file(checkpoint.config_path)
        named = architectures(checkpoint.config_path)
        candidates = [head for head in self.heads if not (sequences_only and head.multiple_choice)]
        for head in sorted(candidates, key=lambda head: head.__name__ not in named):
            if not self.missing_head_tensors(checkpoint, config, head):
                return head
        return None

    def widest_model(self, checkpoint, *, sequences_only: bool = False) -> type:
        """Our class with the checkpoint's task head when it has one (see head_of), else the base class."""
        return self.head_of(checkpoint, sequences_only=sequences_only) or self.base


def architectures(config_path) -> list[str]:
    """config.json's `architectures`: the class names transformers saved it from (none when absent)."""
    try:
        names = json.loads(config_path.read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{config_path}: cannot read it as a JSON object ({e})") from None
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []
