"""What a model family declares about itself, once, beside its model: `Family` and its `ResidualStream`.

Everything above the models (the activation cache's residual-stream helpers, the lens, patching, the command line,
the parity report, the tests) reads these declarations instead of testing a model's class or probing its hook names.
A family is a package `scratch_models/<name>/` whose `FAMILY` is listed in `scratch_models/registry/families.py`.
"""

import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from weight_mapping import ConfigError, MappingTable

from ..lens.names import LensTable
from ..parts.rotary import context as rotary_context
from .known import refuse_unbuilt


class _SkipInit(TorchFunctionMode):
    """torch.nn.init's initialisers as no-ops while a model is built for its shapes or for loading: its tensors are
    never read or about to be replaced, and on the meta device torch's first `normal_` would import its
    decomposition library (~1.5 s).

    A torch function mode, not a patch of nn.init: it holds for this thread only, so a module built elsewhere in
    the meantime is initialised as usual."""

    INITIALISERS = frozenset(getattr(nn.init, name) for name in dir(nn.init)
                             if name.endswith("_") and not name.startswith("_"))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def shapes_only():
    """Build modules on the meta device without running their initialisers: for their names and shapes, or to be
    filled from a checkpoint."""
    with torch.device("meta"), _SkipInit():
        yield


class ResidualStream:
    """Where a family's residual stream is, by hook name, and the modules that read it: what the activation cache's
    helpers (accumulated_resid, decompose_resid, apply_ln_to_stack, stack_head_results, the logit lens and direct
    logit attribution) need to know of a family. The defaults fit a stack of `model.layers` whose attention is
    `layers[l].attn` and whose stream between layers is `embeddings.out`, then `layers.{l}.out`."""

    post_ln: bool  # each sublayer's sum is renormalised at once (BERT): no sum of parts reaches past one LayerNorm
    # the hook point whose values direct logit attribution splits into parts (logit_attrs): the logits, unless the
    # family changes the unembedding's scores on their way to the logits (Gemma 2 caps them softly)
    attributed_logits = "logits"

    def __init__(self, model: nn.Module):
        self.model = model
        self.n_layers = len(model.layers)
        self.num_heads = model.layers[0].attn.num_heads if self.n_layers else 0

    def resid_pre(self, layer: int) -> str:
        """The stream layer `layer` reads (for layer = n_layers: the last layer's output)."""
        return "embeddings.out" if layer == 0 else f"layers.{layer - 1}.out"

    def resid_mid(self, layer: int) -> str:
        """The stream between layer's attention and its MLP (TransformerLens' resid_mid); a ValueError where there
        is none (see has_mid)."""
        raise NotImplementedError

    def attn_out(self, layer: int) -> str:
        """What layer's attention adds to the stream (TransformerLens' attn_out): its output projection's, unless
        a family normalises it on the way (Gemma 2's post-attention norm)."""
        return f"layers.{layer}.attn.proj"

    def mlp_out(self, layer: int) -> str:
        """What layer's MLP adds to the stream (TransformerLens' mlp_out)."""
        return f"layers.{layer}.mlp.proj"

    def attn_out_norm(self, layer: int) -> tuple[str, nn.Module] | None:
        """Where layer's attention output is normalised on its way into the stream (Gemma 2's post-attention norm):
        (the hook name of the tensor that norm reads, the norm), so a head's part of the stream is its result
        through it. None (the default): the output projection's output is added as it is, and each head's result
        is its part."""
        return None

    def mlp_out_norm(self, layer: int) -> tuple[str, nn.Module] | None:
        """As attn_out_norm, for the MLP's output (Gemma 2's post-MLP norm): where a neuron's part of the stream is
        its output through that norm."""
        return None

    @property
    def has_mid(self) -> bool:
        """Whether a stream runs between each layer's attention and its MLP (resid_mid)."""
        return True

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


class PreLNStream(ResidualStream):
    """Pre-LN (GPT-2, GPT-NeoX): each sublayer reads a normalised copy of the stream and adds its output to it, so
    the stream is a running sum of the embeddings and every attention and MLP output. A family sets `embed_parts`,
    (label, hook name) of the embeddings that sum to what layer 0 reads, and `parallel` where attention and MLP both
    read the stream a layer starts from (GPT-NeoX's use_parallel_residual): then no stream runs between them. Its
    model has `norm_f` (the final LayerNorm) and, per layer, `norm_1` and `norm_2` (the LayerNorms its attention and
    its MLP read through)."""

    post_ln = False
    embed_parts: tuple[tuple[str, str], ...] = ()
    parallel = False

    @property
    def has_mid(self) -> bool:
        return not self.parallel

    def resid_mid(self, layer: int) -> str:
        if self.parallel:
            raise ValueError(f"this {type(self.model).__name__} uses the parallel residual (attention and MLP both "
                             "read the stream the layer starts from, as in every Pythia model): no stream runs "
                             "between them, so there is no resid_mid; use resid_pre")
        return f"layers.{layer}.resid_mid"

    def decomposition(self, layer, mlp_input):
        if mlp_input and layer == self.n_layers:
            raise ValueError("mlp_input=True needs a layer below the number of layers (no MLP reads the final stream)")
        parts = [(label, name, "embed") for label, name in self.embed_parts]
        with_own_attn = mlp_input and not self.parallel  # the MLP reads the layer's own attention output too
        for l in range(layer + with_own_attn):
            parts.append((f"{l}_attn_out", self.attn_out(l), "attn"))
            if l < layer:
                parts.append((f"{l}_mlp_out", self.mlp_out(l), "mlp"))
        total = self.resid_mid(layer) if with_own_attn else self.resid_pre(layer)
        return parts, total, self.reading_norm(layer, mlp_input)

    def reading_norm(self, layer: int, mlp_input: bool):
        """The norm that reads the stream `layer` starts from (its MLP's with `mlp_input`; the final norm for the
        final stream): what the decomposition's parts pass through."""
        if mlp_input:
            return self.model.layers[layer].norm_2
        return self.model.norm_f if layer == self.n_layers else self.model.layers[layer].norm_1

    def final_norm(self, stack: torch.Tensor) -> torch.Tensor:
        return self.model.norm_f(stack)

    def read_out(self, stack):
        return F.linear(self.final_norm(stack), self.unembedding())

    def unembedding(self):
        model = self.model
        if not model.config.tie_word_embeddings and getattr(model, "lm_head", None) is None:
            raise ValueError(f"this {type(model).__name__}'s config unties the LM head from the token embeddings "
                             f"(tie_word_embeddings false) and the model has no lm_head: load the checkpoint as "
                             f"{model.family.lm.__name__}")
        return model.output_embeddings


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
    default_texts: tuple[str, ...]  # what the parity report runs when given no text
    default_pairs: tuple[str, ...] = ()  # second segments of default_texts, for a family with token types
    # our class name -> what the command line's heads and patch commands measure on its output (see targets.py):
    # "next" (the next token's logit), "mlm" (a masked token), "class" (a class logit), "pooler"; None: each class's
    # own `target` (the decoders' shared heads declare theirs: decoder.py, decoding/task_heads.py)
    targets: dict[str, str] | None = None
    # a small odd config of the family (2 layers, a few heads of 16, 3 or, with grouped key/value heads, 4 over 2;
    # an MLP width of 37, a vocabulary of 37 whose last id is the end of text where the family has one): the tests
    # build and vary every family from it, docs read the structure of models built from it
    tiny_config: dict = dataclasses.field(default_factory=dict)
    # the special tokens of the family's released tokenizers (role -> token: bos, eos, pad, unk) and whether they put
    # BOS first: `scratch-models tiny` gives its stand-in the same, so generate's end, padding and TransformerLens'
    # BOS defaults behave on it as on the real checkpoints
    tokenizer_specials: dict = dataclasses.field(default_factory=lambda: {"bos": "<|endoftext|>",
                                                                          "eos": "<|endoftext|>"})
    tokenizer_prepends_bos: bool = False
    summary: str = ""  # how the family's residual stream reads, for docs/hook_names.md
    # hook name ("{i}" for the layer) -> the transformers output field that holds the same tensor (tested)
    output_fields: dict = dataclasses.field(default_factory=dict)
    # a hub id of a pretrained checkpoint with the `lm` head (bert-base-uncased, gpt2): where a message points
    # someone whose checkpoint lacks that head
    lm_checkpoint: str = ""
    # our class name -> what the command line's classify reads from its output: "labels" (a score per label),
    # "tokens" (a label per token), "span" (a question's answer in a context), "next_sentence" (BERT's NSP); None:
    # each class's own `classify_as`, as targets
    classifiers: dict | None = None
    # TransformerLens' names for the family's tensors, weights and config (scratch_models.lens.names.LensTable, in
    # the family's transformer_lens.py); None: TL's names are refused, saying the family declares none
    transformer_lens: LensTable | None = None
    # the config field of a sliding attention window (Gemma 2's sliding_window), where layers have one: a query whose
    # window holds no real token sees no key there, though real tokens come before it
    window_field: str | None = None
    def __post_init__(self):
        for cls in (self.base, *self.heads):
            cls.family = self
        for field, attribute in (("targets", "target"), ("classifiers", "classify_as")):
            if getattr(self, field) is None:
                declared = {cls.__name__: getattr(cls, attribute, None) for cls in self.classes}
                object.__setattr__(self, field, {name: kind for name, kind in declared.items() if kind})

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

    def sighted(self, attention_mask: torch.Tensor, config=None) -> torch.Tensor:
        """[b, s] True where the query sees at least one key in every layer (causal: a real token at or before it,
        and, where `config` gives a sliding window (window_field), within the window's last tokens; else any real
        token in its sequence)."""
        real = attention_mask.bool()
        if not self.causal:
            return real.any(-1, keepdim=True).expand_as(real)
        before = real.long().cumsum(-1)  # real tokens at or before each query
        window = getattr(config, self.window_field) if config is not None and self.window_field else None
        if window is not None and window < real.shape[-1]:  # less those before the window
            before = before - F.pad(before, (window, 0))[..., :real.shape[-1]]
        return before > 0

    def check_pairs(self, pairs) -> None:
        """Sentence pairs need token types, which only some families have."""
        if pairs and not self.pairs:
            raise ValueError(f"--pair: {self.name} has no sentence pairs (no token types)")

    def position_limit(self, config) -> tuple[int, str]:
        """(how many positions a model of `config` reads, the config's name for that number): its position table,
        or as far as its rotary scaling is made for (parts/rotary.py's `context`, what the model's
        table_size("position_ids") answers too)."""
        limit = getattr(config, self.positions_field)
        scaling = getattr(config, "rope_scaling", None)
        return rotary_context(scaling, limit) if scaling else (limit, self.positions_field)

    def check_length(self, config, length: int, what: str) -> None:
        """A ValueError naming `what` when `length` tokens do not fit the model's position table."""
        limit, field = self.position_limit(config)
        if length > limit:
            raise ValueError(f"{what} is {length} tokens long; this model reads at most {limit} "
                             f"(config.json {field}={limit}): shorten it")

    def config_of(self, checkpoint):
        """The checkpoint's config.json as the family's config. A config without model_type whose `architectures`
        name only classes of other architectures (a RobertaModel's, say, whose weights have BERT's names) is
        refused, naming them: it would load, and compute something else. So is a model no family builds
        (known.refuse_unbuilt: quantized, a mixture of experts, multimodal), saying what it is."""
        raw = checkpoint.config_json
        refuse_unbuilt(raw, checkpoint.config_path)  # a quantized checkpoint, a mixture of experts, ...: said so
        named = architectures(raw)
        ours = [cls.__name__ for cls in self.classes]
        if "model_type" not in raw and named and not set(named) & set(ours):
            raise ConfigError(f"{checkpoint.config_path}: no model_type, and its architectures name "
                              f"{', '.join(named)}, which is not a {self.title} class ({', '.join(ours)}): a "
                              f"checkpoint of another architecture would load and compute something else. If it is "
                              f"a {self.title} checkpoint, add \"model_type\": \"{self.name}\" to config.json")
        return self.config_class.from_dict(raw, source=str(checkpoint.config_path))

    def missing_head_tensors(self, checkpoint, config, head: type) -> list[str]:
        """Checkpoint names of `head`'s own tensors (not tied ones) that the checkpoint lacks; all of them when
        the config cannot build that head (BertForQuestionAnswering with other than 2 labels, say). `config`: the
        checkpoint's (config_of)."""
        num_layers = getattr(config, self.table.layers_field)
        with shapes_only():
            base_names = set(self.base(config).state_dict())
            try:
                head_names = set(head(config).state_dict())
            except ValueError:  # ConfigError too
                return [f"({head.__name__} cannot be built from {checkpoint.config_path})"]
        present = {self.table.normalize(k) for k in checkpoint.keys()}
        present |= {self.table.aliases[k] for k in present if k in self.table.aliases}
        return [key for key, ours in self.table.tensor_names(num_layers).items()
                if ours in head_names - base_names and key not in present]

    def head_of(self, checkpoint, config=None, *, sequences_only: bool = False) -> type | None:
        """Our class with the checkpoint's head: the class config.json's `architectures` names, if the file holds
        its tensors; else the first of `heads` whose tensors it holds all of; None for a base-model checkpoint.
        `config`: the checkpoint's (config_of), when the caller has it. `sequences_only`: no class whose inputs
        are [batch, choices, seq] (multiple choice)."""
        config = self.config_of(checkpoint) if config is None else config
        named = architectures(checkpoint.config_json)
        candidates = [head for head in self.heads if not (sequences_only and head.multiple_choice)]
        for head in sorted(candidates, key=lambda head: head.__name__ not in named):
            if not self.missing_head_tensors(checkpoint, config, head):
                return head
        return None

    def widest_model(self, checkpoint, config=None, *, sequences_only: bool = False) -> type:
        """Our class with the checkpoint's task head when it has one (see head_of), else the base class."""
        return self.head_of(checkpoint, config, sequences_only=sequences_only) or self.base


def architectures(config_json: dict) -> list[str]:
    """config.json's `architectures`: the class names transformers saved it from (none when absent)."""
    names = config_json.get("architectures")
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []
