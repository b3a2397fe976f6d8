"""The mapping-table machinery: declarative rows, expanded per layer, run forwards (load) or backwards (save).

A `Row` pairs one module of the checkpoint (the module path transformers uses, which is also the prefix of its
tensor names) with one module of ours. A row may carry tensors (loaded by leaf name: `{module}.weight`), and may
be marked `compare`: then the two modules' outputs are compared by the parity report. Weights and compared
activations come from the same rows, so the parity check hooks exactly the correspondence the loader uses.

In a mixture of experts a row with `{e}` repeats for every expert of every layer (the table's `experts_field` says
how many there are): the released files hold each expert's tensors under keys of their own, whatever layout a
version of transformers keeps them in once loaded.
"""

import dataclasses

WEIGHT = ("weight",)
WEIGHT_BIAS = ("weight", "bias")


@dataclasses.dataclass(frozen=True)
class Row:
    checkpoint: str  # module path in the checkpoint and in transformers; "{i}" stands for the layer index
    ours: str  # module path in our model (a HookPoint's path for compared activations)
    tensors: tuple[str, ...] = ()  # leaf names of the tensors under both modules
    compare: bool = False  # the parity report compares these two modules' outputs
    pick: int | None = None  # the transformers module returns a tuple: compare this element
    boundary: bool = False  # a residual-stream boundary: `verify --isolate` feeds transformers' value onward
    head: bool = False  # a task head: lives outside the base-model prefix and may be absent
    legacy: bool = False  # the original release spells these tensors with the table's legacy_leaf_names
    # the transformers module's output is [b * s, ...] (a mixture's router flattens the tokens): compared as ours,
    # [b, s, ...]
    flattened: bool = False


@dataclasses.dataclass(frozen=True)
class MappingTable:
    family: str
    rows: tuple[Row, ...]
    base_prefix: str  # prefix of base-model keys in checkpoints saved from a model with heads ("bert.")
    layers_field: str  # config field that says how many times "{i}" rows repeat
    legacy_leaf_names: dict  # old tensor leaf name -> current one ("gamma" -> "weight")
    ignored: dict  # checkpoint key ("{i}" for every layer) -> why it is not a weight (buffers transformers recomputes)
    # Tied weights: checkpoint key -> the key it is tied to while config.tie_word_embeddings (see load_state). Either
    # may stand for the other when absent; both present and equal, one is a duplicate; both present and different,
    # the model is built untied (as transformers 5 loads them), and the alias loads into its own row's tensor.
    aliases: dict
    # The original release's layout, written by save_pretrained(legacy=True):
    legacy_prefixed: bool  # base-model keys carry base_prefix whatever the model class
    legacy_copies: tuple[str, ...]  # aliases stored as a copy of the tensor they are tied to (when the model ties)
    # another writer's name of a module -> the name the rows use (transformers 5's state dict calls GPT-NeoX's
    # embed_out lm_head): read either way, written as the rows say
    renamed: dict = dataclasses.field(default_factory=dict)
    # prefixes a class with a head puts on base-model keys instead of base_prefix (transformers' Llama and Qwen
    # question answering classes keep their base model as `transformer`, for backward compatibility): read as
    # base_prefix is; the class says which it writes (PretrainedModel.checkpoint_prefixed)
    head_prefixes: tuple[str, ...] = ()
    # a module whose output is its parent's (its last step) -> that parent ("{i}" for every layer): for naming a
    # point by either module (sparsify names a dictionary's folder by the module it hooked), never compared twice
    same_output: dict = dataclasses.field(default_factory=dict)
    experts_field: str | None = None  # config field that says how many times "{e}" rows repeat (a mixture's)
    # modules of a checkpoint (their names after normalize, e.g. a multimodal file's vision tower) that belong to a
    # model this family does not build -> why: every tensor under one is skipped, and the loading notes say so once
    left_out: dict = dataclasses.field(default_factory=dict)

    def num_experts(self, config) -> int:
        """How many experts each "{e}" row stands for under `config` (0: the table has none)."""
        return getattr(config, self.experts_field) if self.experts_field else 0

    def expand(self, num_layers: int, num_experts: int = 0) -> list[Row]:
        """The rows with "{i}" filled in for every layer and "{e}" for every expert, in table order (the last
        depth's kept: a load asks for them three times, some 800 rows for a 16-layer Llama)."""
        kept = self.__dict__.get("_expanded")
        if kept is None or kept[0] != (num_layers, num_experts):
            rows = []
            for row in self.rows:
                layers = [_at_layer(row, i) for i in range(num_layers)] if _per_layer(row) else [row]
                rows += [dataclasses.replace(r, checkpoint=r.checkpoint.replace("{e}", str(e)),
                                             ours=r.ours.replace("{e}", str(e)))
                         for r in layers for e in range(num_experts)] if "{e}" in row.checkpoint else layers
            kept = (num_layers, num_experts), tuple(rows)
            object.__setattr__(self, "_expanded", kept)  # not a field: the table stays frozen and compares as before
        return list(kept[1])

    def tensor_names(self, num_layers: int, num_experts: int = 0) -> dict[str, str]:
        """checkpoint tensor name (current spelling, no prefix) -> our tensor name."""
        return {f"{row.checkpoint}.{t}": f"{row.ours}.{t}" for row in self.expand(num_layers, num_experts)
                for t in row.tensors}

    def ignored_keys(self, num_layers: int) -> dict[str, str]:
        """`ignored` with "{i}" filled in for every layer: checkpoint key (no prefix) -> why it is skipped."""
        out = {}
        for key, why in self.ignored.items():
            out |= {key.format(i=i): why for i in range(num_layers)} if "{i}" in key else {key: why}
        return out

    def compared(self, num_layers: int, with_heads: bool) -> list[Row]:
        """The compared module pairs in forward order.

        Rows above the first per-layer row run before the layers, rows below it after them; per-layer rows
        run layer by layer, in table order within a layer.
        """
        def wanted(r):
            return r.compare and (with_heads or not r.head)

        first = next(n for n, r in enumerate(self.rows) if _per_layer(r))
        before = [r for r in self.rows[:first] if wanted(r)]
        per_layer = [r for r in self.rows if _per_layer(r) and wanted(r)]
        after = [r for r in self.rows[first:] if not _per_layer(r) and wanted(r)]
        return before + [_at_layer(r, i) for i in range(num_layers) for r in per_layer] + after

    def normalize(self, key: str) -> str:
        """A checkpoint key in the current spelling, without the base-model prefix (the longest that fits: a
        multimodal file's `model.language_model.` before `model.`)."""
        prefix = max((p for p in self.prefixes if key.startswith(p)), key=len, default="")
        key = key[len(prefix):]
        for other, name in self.renamed.items():
            if key.startswith(f"{other}."):
                key = name + key[len(other):]
        module, _, leaf = key.rpartition(".")
        leaf = self.legacy_leaf_names.get(leaf, leaf)
        return f"{module}.{leaf}" if module else leaf

    def left_out_part(self, name: str) -> str | None:
        """The `left_out` module a normalized checkpoint name sits under, or None."""
        return next((part for part in self.left_out if name.startswith(f"{part}.")), None)

    def checkpoint_module(self, row: Row, prefixed: bool | str) -> str:
        """Where `row`'s module sits in a transformers model that does (or does not) use the base prefix; a string:
        the prefix that model's class uses (one of head_prefixes)."""
        prefix = prefixed if isinstance(prefixed, str) else self.base_prefix if prefixed else ""
        return row.checkpoint if row.head else prefix + row.checkpoint

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Every prefix a checkpoint of the family may put on base-model keys."""
        return (self.base_prefix, *self.head_prefixes)


# The task heads transformers gives GPT-2 and GPT-NeoX (scratch_models/decoding/task_heads.py), beside the base model:
# compared where transformers has a module of the same output (the sequence classifier's scores at every position,
# before it reads the last token; the QA head's two scores before they are split)
DECODER_TASK_HEADS = (
    Row("score",      "score",        WEIGHT, head=True),
    Row("score",      "token_logits", compare=True, head=True),
    Row("classifier", "classifier",   WEIGHT_BIAS, head=True),
    Row("qa_outputs", "qa_outputs",   WEIGHT_BIAS, head=True),
    Row("qa_outputs", "span_logits",  compare=True, head=True),
)


# The task heads of transformers 5's generic classes (GenericForSequenceClassification, GenericForTokenClassification,
# GenericForQuestionAnswering: the Llama-like families' and Gemma's): both classifiers are `score`, the sequence
# classifier's without a bias, the token classifier's with one unless its config says otherwise
GENERIC_TASK_HEADS = (
    Row("score",      "score",        WEIGHT_BIAS, head=True),
    Row("score",      "token_logits", compare=True, head=True),
    Row("qa_outputs", "qa_outputs",   WEIGHT_BIAS, head=True),
    Row("qa_outputs", "span_logits",  compare=True, head=True),
)


def _per_layer(row: Row) -> bool:
    return "{i}" in row.checkpoint


def _at_layer(row: Row, i: int) -> Row:
    return dataclasses.replace(row, checkpoint=row.checkpoint.replace("{i}", str(i)),
                               ours=row.ours.replace("{i}", str(i)))
