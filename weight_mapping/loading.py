"""Fit a checkpoint's tensors to a model through a mapping table: every tensor accounted for, or an error.

The loader never sees the model itself, only the names and shapes of the tensors it needs, so it works for a
model built on the meta device and stays free of any model code.
"""

import dataclasses
import re
from collections.abc import Callable, Iterable

import torch

from .readers import Checkpoint, CheckpointError
from .table import MappingTable

# the floating-point dtypes a model computes in as stored; others (float8) load only when cast (`dtype`)
COMPUTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclasses.dataclass
class LoadingInfo:
    source: str
    origin: str  # where the files came from: a local path, the Hugging Face cache, the embedded copy
    files: list[str]
    loaded: dict[str, str]  # our tensor name -> the checkpoint key it came from
    ignored: dict[str, str]  # checkpoint key -> why it was not loaded
    legacy_names: int  # keys that used an old spelling (gamma/beta)
    prefixed: bool  # keys carried the base-model prefix ("bert.")
    notes: list[str] = dataclasses.field(default_factory=list)  # what else was decided (a tied pair loaded untied)

    def summary(self) -> str:
        lines = [f"loaded {len(self.loaded)} tensors from {', '.join(self.files)}", f"files from {self.origin}"]
        if self.prefixed:
            lines.append("checkpoint saved from a model with heads (base-model prefix stripped)")
        if self.legacy_names:
            lines.append(f"{self.legacy_names} tensors used legacy names (gamma/beta), renamed")
        lines += self.notes
        lines += self.ignored_lines()
        return "\n".join(lines)

    def ignored_lines(self) -> list[str]:
        """A line per ignored key, except that keys sharing one reason with more than MANY others (a vision tower's
        hundreds) make one line: their count, the first few, and the reason."""
        by_reason: dict[str, list[str]] = {}
        for key, why in self.ignored.items():
            by_reason.setdefault(why, []).append(key)
        lines = []
        for why, keys in by_reason.items():
            if len(keys) > MANY:
                lines.append(f"ignored {len(keys)} tensors ({', '.join(keys[:MANY])}, ...): {why}")
            else:
                lines += [f"ignored {key}: {why}" for key in keys]
        return lines


MANY = 3


def tied_twins(table: MappingTable, checkpoint: Checkpoint) -> dict[str, bool]:
    """For each tied pair of `table.aliases` whose two tensors the checkpoint both holds: alias -> whether they are
    equal (shape and every value, torch.equal, as transformers 5 compares them). Only those tensors are read."""
    key_of = {table.normalize(key): key for key in checkpoint.keys()}
    return {alias: _equal(checkpoint.tensor(key_of[alias]), checkpoint.tensor(key_of[twin]))
            for alias, twin in table.aliases.items() if alias in key_of and twin in key_of}


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b.to(a.dtype))


def load_state(table: MappingTable, checkpoint: Checkpoint, expected: dict[str, torch.Size], num_layers: int,
               *, model_name: str, tied: bool = True, twins: dict[str, bool] | None = None,
               base_names: Callable[[], Iterable[str]] = frozenset, dtype: torch.dtype | None = None,
               device=None, num_experts: int = 0) -> tuple[dict[str, torch.Tensor], LoadingInfo]:
    """Our tensor name -> tensor for every name in `expected`, read from `checkpoint` through `table` (its "{e}"
    rows for `num_experts` experts a layer).

    Every tensor of the file is loaded, skipped for a reason `LoadingInfo.ignored` gives, or named in the error.
    Skipped, as transformers skips them (it loads the rest and warns): a buffer the table lists (`ignored`), a tied
    duplicate (below), and a part of another class of the family under the same config.json: a task head's module
    the model has none of (a head checkpoint into the base model), or a module of the base model that this class
    leaves out (BERT's pooler in BertForMaskedLM). `base_names()`: our tensor names in the family's base model
    built from the same config, asked only when such a module turns up. Any other tensor is unexpected: one of a
    module the model holds without it (a bias config.json switches off, as GPT-NeoX's `attention_bias: false`),
    one of a module the config's model lacks, one the table does not name. transformers drops those with a
    warning and computes without them, which is not what the file's weights compute.

    `tied`: the checkpoint's config.json ties the pairs of `table.aliases` (tie_word_embeddings), as transformers 5
    reads it: a tensor absent from the file is then read from its twin, and one our model holds no tensor for is a
    "duplicate" only when equal to its twin. A tensor our model holds for it (an untied head) loads as its own,
    whatever `tied` says: when config.json ties the pair and the file holds two different tensors, that is how
    transformers 5 loads them, and a note says so. The caller builds the model untied then (see
    PretrainedModel.from_pretrained). `twins`: tied_twins(table, checkpoint), where the caller has it already.

    Raises CheckpointError listing every missing, unexpected or mis-shaped tensor, or naming a tensor that is not
    floating point or (without `dtype`) is stored in a dtype no forward pass computes in (float8); nothing is
    returned then. Without `dtype`, every tensor must be stored in the same dtype (a model of mixed dtypes would
    fail at its first matmul).
    """
    ours_by_checkpoint = table.tensor_names(num_layers, num_experts)
    skipped = table.ignored_keys(num_layers)
    keys = checkpoint.keys()
    normalized = {key: table.normalize(key) for key in keys}
    key_of = {name: key for key, name in normalized.items()}
    aliases = table.aliases if tied else {}
    twin_of = aliases | {twin: alias for alias, twin in aliases.items()}  # both ways: either may stand for the other
    if not tied:
        twins = {}
    elif twins is None:
        twins = tied_twins(table, checkpoint)

    per_layer = _per_layer_keys(table)
    sources: dict[str, str] = {}  # our name -> checkpoint key
    ignored: dict[str, str] = {}
    unexpected: dict[str, str] = {}  # checkpoint key -> why the model has no place for it
    notes: list[str] = []
    spare: list[str] = []  # tied tensors our model holds none for: each may stand for its twin
    left_out: dict[str, int] = {}  # a left-out module -> how many of its tensors the file holds
    for key, name in normalized.items():
        target = ours_by_checkpoint.get(name)
        if name in skipped:
            ignored[key] = skipped[name]
        elif (part := table.left_out_part(name)) is not None:
            ignored[key] = table.left_out[part]
            left_out[part] = left_out.get(part, 0) + 1
        elif target in expected:
            if target in sources:
                raise CheckpointError(f"{checkpoint.source}: {key!r} and {sources[target]!r} both map to {target!r}")
            sources[target] = key
            if twins.get(name) is False:
                notes.append(f"config.json ties {key} to {key_of[aliases[name]]}, but the file holds two different "
                             "tensors: loaded untied, as transformers 5 does")
        elif target is None and name not in twin_of:
            layer, expert = per_layer.fullmatch(name), _expert_of(table, name)
            unexpected[key] = (
                f"expert {expert}, past config.json's {table.experts_field}={num_experts}" if expert is not None
                and expert >= num_experts and int(layer[layer.lastindex]) < num_layers else
                f"layer {layer[layer.lastindex]}, past config.json's {table.layers_field}={num_layers}"
                if layer else f"no row of the {table.family} table names it")
        else:
            spare.append(key)
    for name, twin in twin_of.items():  # a tied tensor the file lacks is its twin (a safetensors save keeps one)
        target = ours_by_checkpoint.get(name)
        if target in expected and target not in sources and twin in key_of:
            sources[target] = key_of[twin]
    used = set(sources.values())
    place = _Place(table, num_layers, num_experts, expected, base_names)
    for key in spare:
        name = normalized[key]
        if key in used:
            continue
        if twins.get(name):  # a duplicate only when equal: two different tensors are never called one
            ignored[key] = f"duplicate of {aliases[name]} (tied)"
        elif (why := place.lacking(name)) is None:
            ignored[key] = f"not part of {model_name}"
        else:
            unexpected[key] = why

    notes += [f"left out {part} ({count} tensors): {table.left_out[part]}" for part, count in left_out.items()]
    missing = [name for name in expected if name not in sources]
    misshaped = [(key, checkpoint.shape(key), tuple(expected[name])) for name, key in sources.items()
                 if checkpoint.shape(key) != tuple(expected[name])]
    if missing or unexpected or misshaped:
        raise CheckpointError(_mismatch_message(checkpoint, table, model_name, num_layers, num_experts, expected,
                                                missing, unexpected, misshaped))

    state = {}
    stored: dict[torch.dtype, str] = {}  # dtype as stored -> the first key stored in it
    held: set[int] = set()  # the storages handed out
    for name, key in sources.items():
        tensor = checkpoint.tensor(key)
        if not tensor.is_floating_point():
            raise CheckpointError(f"{checkpoint.source}: tensor {key!r} has dtype {tensor.dtype}; "
                                  f"{model_name} needs floating-point weights")
        if dtype is None and tensor.dtype not in COMPUTED_DTYPES:
            raise CheckpointError(f"{checkpoint.source}: tensor {key!r} is stored as {tensor.dtype}, which torch "
                                  "stores but does not compute a forward pass in; pass dtype= (--dtype) to cast the "
                                  "weights while loading, e.g. to float32")
        stored.setdefault(tensor.dtype, key)
        if dtype is not None:
            tensor = tensor.to(dtype)
        tensor = tensor.to(device) if device is not None else tensor
        # no two of our tensors share memory, even where the file holds a tied pair the model keeps apart once (one
        # key read for both, or a .bin's two keys on one storage)
        storage = tensor.untyped_storage().data_ptr()
        state[name] = tensor.clone() if storage in held else tensor
        held.add(storage)
    if dtype is None and len(stored) > 1:
        raise CheckpointError(f"{checkpoint.source}: tensors are stored in several dtypes "
                              f"({', '.join(f'{d} such as {k!r}' for d, k in stored.items())}); "
                              "pass dtype= to cast them all to one")
    info = LoadingInfo(
        source=checkpoint.source,
        origin=checkpoint.origin,
        files=[str(f) for f in checkpoint.files],
        loaded=sources,
        ignored=ignored,
        legacy_names=sum(1 for key in keys if key.rpartition(".")[2] in table.legacy_leaf_names),
        prefixed=any(key.startswith(table.prefixes) for key in keys),
        notes=notes,
    )
    return state, info


class _Place:
    """Why the model has no place for a checkpoint tensor the table maps to a tensor the model lacks, or None where
    it is a part of another class of the family (see load_state)."""

    def __init__(self, table: MappingTable, num_layers: int, num_experts: int, expected,
                 base_names: Callable[[], Iterable[str]]):
        self.ours = table.tensor_names(num_layers, num_experts)
        self.head_rows = {f"{row.checkpoint}.{t}" for row in table.expand(num_layers, num_experts) if row.head
                          for t in row.tensors}
        self.held_modules = {name.rpartition(".")[0] for name in expected}
        self._base_names = base_names
        self._base = None

    def lacking(self, name: str) -> str | None:
        module, _, leaf = self.ours[name].rpartition(".")
        if module in self.held_modules:  # the model computes with this module: the file's tensor would be dropped
            return f"our {module} has no {leaf} under this config.json: a setting there leaves it out"
        if name in self.head_rows:
            return None  # another task's head
        if self._base is None:
            self._base = set(self._base_names())
        if self.ours[name] in self._base:
            return None  # a module of the base model this class leaves out
        return f"the model config.json describes has no {module}: a setting there leaves it out"


def check_layer_count(table: MappingTable, checkpoint: Checkpoint, num_layers: int) -> None:
    """Refuse a checkpoint with fewer layers than `num_layers` (config.json's count) before a model is built: a
    config saying 20000 layers beside weights of 12 would otherwise build 20000 layers to report the mismatch.
    A config with fewer layers than the checkpoint costs nothing to build: `load_state` then lists every tensor
    that is left over, with the rest of what does not fit.

    The layer indices are read from the keys of per-layer rows ("{i}") and per-layer ignored buffers; a
    checkpoint with none of them is left to `load_state`, which lists what is missing. Raises CheckpointError
    with both counts and the first tensor the checkpoint lacks.
    """
    per_layer = _per_layer_keys(table)
    found = {}  # layer index -> a checkpoint key of that layer
    for key in checkpoint.keys():
        if match := per_layer.fullmatch(table.normalize(key)):
            found.setdefault(int(match[match.lastindex]), key)
    if not found or max(found) + 1 >= num_layers:
        return
    count = max(found) + 1
    row = next(row for row in table.rows if "{i}" in row.checkpoint and row.tensors)
    evidence = f"it has no {row.checkpoint.format(i=count)}.{row.tensors[0]}"
    raise CheckpointError(f"{checkpoint.source}: {checkpoint.config_path} says {table.layers_field}={num_layers}, "
                          f"but the checkpoint holds {count} layer(s): {evidence}")


def _per_layer_keys(table: MappingTable) -> re.Pattern:
    """Matches a normalized per-layer key; its one matching group is the layer index (no leading zeros)."""
    templates = [f"{row.checkpoint}.{leaf}" for row in table.rows if "{i}" in row.checkpoint for leaf in row.tensors]
    templates += [key for key in table.ignored if "{i}" in key]
    return re.compile("|".join(re.escape(t).replace(re.escape("{i}"), "(0|[1-9][0-9]*)")
                               .replace(re.escape("{e}"), "(?:0|[1-9][0-9]*)") for t in dict.fromkeys(templates)))


def _expert_of(table: MappingTable, name: str) -> int | None:
    """The expert index of a normalized key that an "{e}" row of `table` names (any layer, any expert), else None."""
    number = "(0|[1-9][0-9]*)"
    for row in table.rows:
        if "{e}" in row.checkpoint:
            for leaf in row.tensors:
                pattern = re.escape(f"{row.checkpoint}.{leaf}").replace(re.escape("{i}"), number)
                if match := re.fullmatch(pattern.replace(re.escape("{e}"), number), name):
                    return int(match[match.lastindex])
    return None


def _mismatch_message(checkpoint, table, model_name, num_layers, num_experts, expected, missing, unexpected,
                      misshaped) -> str:
    checkpoint_by_ours = {ours: ckpt for ckpt, ours in table.tensor_names(num_layers, num_experts).items()}
    lines = [f"{checkpoint.source}: checkpoint does not fit {model_name} "
             f"({table.family} table, {table.layers_field}={num_layers})"]
    if unexpected and not misshaped and len(missing) == len(expected):
        lines.append(f"none of the checkpoint's tensors is in the {table.family} table: is this a checkpoint of "
                     "another architecture?")
    if misshaped:
        lines.append(f"{len(misshaped)} tensor(s) with the wrong shape (checkpoint vs model):")
        lines += [f"  {key}: {tuple(got)} in the checkpoint, {want} expected from config.json"
                  for key, got, want in misshaped]
    if missing:
        lines.append(f"{len(missing)} tensor(s) missing from the checkpoint:")
        lines += [f"  {checkpoint_by_ours.get(name, name)} {tuple(expected[name])} (our {name})"
                  for name in missing[:20]]
        lines += [f"  ... and {len(missing) - 20} more"] if len(missing) > 20 else []
    if unexpected:
        lines.append(f"{len(unexpected)} unexpected tensor(s) in the checkpoint:")
        lines += [f"  {key} {checkpoint.shape(key)}: {why}" for key, why in list(unexpected.items())[:20]]
        lines += [f"  ... and {len(unexpected) - 20} more"] if len(unexpected) > 20 else []
        if any("config.json" in why for why in unexpected.values()):
            lines.append(f"the weights and {checkpoint.config_path} disagree: the file holds tensors its config "
                         "leaves out, so the config does not describe what they compute (transformers would drop "
                         "them with a warning). Fix config.json, or use the config the weights were saved with")
    return "\n".join(lines)


# the dtypes our models compute in, by name; float64 computes exactly what transformers does in float64 (a reference
# for reduced-precision runs)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """`dtype`, a name or a torch.dtype, as one of the torch.dtypes our models compute in (None stays None).

    Raises ValueError for any other (float8, integer, complex: they would load, then fail at the first forward).
    """
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    not_float = isinstance(dtype, torch.dtype) and not dtype.is_floating_point
    raise ValueError(f"dtype {dtype!r} is {'not a floating-point type' if not_float else 'not supported'}; "
                     f"use one of {', '.join(DTYPES)}")
