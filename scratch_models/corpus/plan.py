"""What a harvest runs: the model (the narrowest of its family's classes that has the named hook points), the
names, how the corpus becomes sequences, and the settings that identify the run (a resumed run must match them).

Everything about a family comes from its declaration (`Family`: causal, pairs, input names, positions field) and
its tokenizer (`special_ids`): no family is named here.
"""

import dataclasses
import hashlib
import itertools
import weakref
from pathlib import Path
from typing import Iterator

import torch

from ..registry.families import family_of
from ..registry.family import shapes_only
from . import batching
from .activations import POSITIONS, Layout, Runner, layouts, resolve_names
from .reading import Corpus
from .storage import STORAGE_DTYPES

BATCHINGS = ("pack", "document")
LAYOUTS = ("rows", "saelens")
DEFAULT_CONTEXT = 128  # SAELens' default context_size (or the model's positions, if fewer)
# iter_activations sorts sentences by length within windows of this many rows (harvest: within each shard)
WINDOW_ROWS = 1 << 16


@dataclasses.dataclass
class Options:
    batching: str | None = None  # "pack" or "document"; None: pack for a causal family, else document
    context: int | None = None  # pack: tokens per sequence (default 128)
    positions: str = "all"
    drop_special: bool | list[int] = False  # True: every special token; a list: the tokens of those ids
    # SAELens' name for drop_special (its runner's exclude_special_tokens: True, or a list of token ids)
    exclude_special_tokens: bool | list[int] | None = None
    prepend_bos: bool | None = None  # None: pack puts BOS first in each sequence, document adds none
    batch_size: int = 8
    text_column: str | None = None
    pair_column: str | None = None
    ids_column: str | None = None
    layout: str = "rows"
    dtype: str | None = None  # storage dtype (None in iter_activations: the model's own)


def load_model(source, patterns, *, device=None, dtype=None):
    """The narrowest class of the checkpoint's family that has hook points for every pattern (ours or
    TransformerLens' names; the base model unless a name lives in a head, such as `logits`), loaded; a head whose
    tensors the checkpoint lacks is passed over."""
    from weight_mapping import open_checkpoint

    checkpoint = open_checkpoint(source)
    family = family_of(checkpoint)
    config = family.config_of(checkpoint)
    first_error = None
    for cls in family.classes:
        try:
            with shapes_only():
                resolve_names(cls(config), patterns)
        except ValueError as e:  # a head this config cannot build, or a name it has not
            first_error = first_error or e
            continue
        if cls is family.base or not family.missing_head_tensors(checkpoint, config, cls):
            return cls.from_pretrained(checkpoint, config=config, device=device, dtype=dtype)
        first_error = ValueError(f"{source}: no class of the {family.title} family has hook points matching all of "
                                 f"{', '.join([patterns] if isinstance(patterns, str) else patterns)} and the "
                                 "tensors for them in this checkpoint")
    raise first_error


def weights_hash(model, recorded: dict | None = None) -> str:
    """sha256 over the model's tensors (names, dtypes, shapes and bytes): the same weights in the same dtype.
    Remembered per model while no tensor of it is modified in place (torch counts each tensor's versions).
    `recorded`: a `weights_record` an earlier run wrote; its hash is taken without reading a tensor when the model
    was loaded by from_pretrained from files that still have the recorded identity (see `weights_identity`)."""
    state = model.state_dict()
    versions = tuple((name, tensor.data_ptr(), tensor._version) for name, tensor in state.items())
    if recorded is not None and isinstance(recorded.get("sha256"), str):
        identity = weights_identity(model)
        if identity is not None and identity == recorded.get("identity"):
            _HASHES[model] = (versions, recorded["sha256"])
            return recorded["sha256"]
    known = _HASHES.get(model)
    if known is not None and known[0] == versions:
        return known[1]
    _HASHES[model] = (versions, _digest(state))
    return _HASHES[model][1]


def _digest(state: dict) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes: reads all of them."""
    digest = hashlib.sha256()
    for name, tensor in state.items():
        tensor = tensor.detach().contiguous().cpu()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def weights_identity(model) -> dict | None:
    """A cheap identity of the model's weights, for a rerun to trust the hash an earlier run recorded instead of
    reading every tensor again: the checkpoint's files (config.json and the weight files: path, size, modification
    and change times in ns, inode) as from_pretrained found them, and the class, tensor names, dtypes and shapes it
    built from them. None (hash the tensors) unless the model came from from_pretrained, no tensor was replaced or
    changed in place since, and the files are as they were when it read them.

    What it trusts: that a file whose size, times and inode are unchanged holds the same bytes. A rewrite changes its
    modification and change times (the change time cannot be set back, so even a copy that restores the old
    modification time is caught); it would miss only a rewrite to the same size within one tick of the file
    system's clock (a few ms on Linux, up to 2 s on FAT), or a file system that keeps no times."""
    from ..registry.pretrained import files_identity, tensor_versions

    loaded = getattr(model, "weights_loaded", None)
    if loaded is None:
        return None
    files, versions = loaded
    try:
        if tensor_versions(model) != versions or files_identity(path for path, *_ in files) != files:
            return None
    except OSError:  # a file gone
        return None
    tensors = hashlib.sha256("".join(f"{name}:{t.dtype}:{tuple(t.shape)};"
                                     for name, t in model.state_dict().items()).encode()).hexdigest()
    return {"files": files, "class": type(model).__name__, "tensors": tensors}


def weights_record(model) -> dict | None:
    """What a run writes beside its settings so that a rerun can trust its hash (`weights_hash`'s `recorded`); None
    where the model has no cheap identity."""
    identity = weights_identity(model)
    return None if identity is None else {"identity": identity, "sha256": weights_hash(model)}


def recorded_weights(manifest: Path) -> dict | None:
    """The `weights_record` a manifest holds, or None (none, or a manifest the run's own checks will name)."""
    import json

    try:
        record = json.loads(manifest.read_text()).get("weights")
    except (OSError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) else None


_HASHES = weakref.WeakKeyDictionary()  # model -> (its tensors' versions, their hash)
_COMPILED = weakref.WeakKeyDictionary()  # model -> its compile_model wrapper: graphs compiled once per shape


def compiled(model):
    from ..decoding.compiled import compile_model

    if model not in _COMPILED:
        _COMPILED[model] = compile_model(model)
    return _COMPILED[model]


class Plan:
    """A model, names and options made ready to run over a corpus."""

    def __init__(self, model, data, names, options: Options, *, compile: bool = False):
        self.options = options = dataclasses.replace(options)
        self.model = model
        family = self.family = model.family
        self.tokenizer, self.no_tokenizer = _tokenizer(model)
        self.corpus = data if isinstance(data, Corpus) else Corpus(
            data, text_column=options.text_column, pair_column=options.pair_column, ids_column=options.ids_column)
        self._check_options(family)
        self.names = resolve_names(model, names)
        self.layouts: dict[str, Layout] = layouts(model, self.names, options.positions, family.input_names)
        if options.layout == "saelens":
            self._check_saelens()
        self.runner = Runner(model, self.names, self.layouts, positions=options.positions,
                             drop_special=options.drop_special, input_names=family.input_names,
                             compiled=compiled(model) if compile else None)
        self.counts = {}  # "empty": documents without a token, filled as the corpus is read

    @property
    def limit(self) -> int:
        return self.family.position_limit(self.model.config)[0]

    def _check_options(self, family) -> None:
        o = self.options
        if o.batching is None:
            o.batching = "pack" if family.causal else "document"
        _choice("batching", o.batching, BATCHINGS)
        _choice("positions", o.positions, POSITIONS)
        _choice("layout", o.layout, LAYOUTS)
        if o.dtype is not None:
            _choice("dtype", o.dtype, STORAGE_DTYPES)
        if o.exclude_special_tokens is not None:
            if o.drop_special not in (False, o.exclude_special_tokens):
                raise ValueError(f"drop_special={o.drop_special!r} and exclude_special_tokens="
                                 f"{o.exclude_special_tokens!r} (SAELens' name for it) disagree: give one")
            o.drop_special, o.exclude_special_tokens = o.exclude_special_tokens, None
        ids = o.drop_special if isinstance(o.drop_special, list) else []
        if not isinstance(o.drop_special, (bool, list)) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.model.config.vocab_size
                for i in ids):
            raise ValueError(f"drop_special / exclude_special_tokens must be true, false or a list of token ids "
                             f"(0 <= id < vocab_size {self.model.config.vocab_size}), got {o.drop_special!r}")
        if not isinstance(o.batch_size, int) or o.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {o.batch_size!r}")
        if o.batching == "pack":
            if not family.causal:
                raise ValueError(f"batching 'pack' lays documents end to end for a causal model; {family.title} "
                                 "reads both ways, so a token would see the next document: use batching 'document'")
            if o.positions != "all":
                raise ValueError(f"positions {o.positions!r} pools each sequence, and a packed sequence holds parts "
                                 "of several documents: use batching 'document' (one document per sequence)")
            o.context = min(DEFAULT_CONTEXT, self.limit) if o.context is None else o.context
            if not isinstance(o.context, int) or not 1 <= o.context <= self.limit:
                raise ValueError(f"context must be 1..{self.limit} ({family.positions_field} of this model), got "
                                 f"{o.context!r}")
        elif o.context is not None:
            raise ValueError("context sets the length of packed sequences: it goes with batching 'pack' (batching "
                             "'document' runs each document at its own length)")
        if self.corpus.pair_column:
            family.check_pairs([True])
            if o.batching != "document":
                raise ValueError("sentence pairs go one pair per sequence: batching 'document'")
        if o.prepend_bos is None:
            o.prepend_bos = o.batching == "pack"
        if o.prepend_bos and self._special("bos") is None:
            raise ValueError("prepend_bos: this tokenizer names no BOS token (a BERT sequence starts with [CLS], "
                             "which its tokenizer adds)")
        if not self.corpus.tokenized and self.tokenizer is None:
            raise ValueError(f"{self.corpus.name} holds texts, and this {type(self.model).__name__} has no tokenizer "
                             f"({self.no_tokenizer}): set model.tokenizer, or give pre-tokenized input_ids")

    def _check_saelens(self) -> None:
        o = self.options
        (name, layout), *others = self.layouts.items()
        problems = []
        if others:
            problems.append(f"one hook point (got {len(self.layouts)})")
        if o.batching != "pack":
            problems.append("batching 'pack' (every row a full context)")
        if o.drop_special or o.positions != "all":
            problems.append("every position kept (positions 'all', no drop_special)")
        if len(layout.row_shape) != 1:
            problems.append(f"a hook point with one vector per token ({name} has rows of shape "
                            f"{list(layout.row_shape)})")
        if o.dtype == "bfloat16":
            problems.append("dtype float32 or float16 (Arrow has no bfloat16, and SAELens would read the 16-bit "
                            "patterns harvest stores instead as integers)")
        if problems:
            raise ValueError(f"layout 'saelens' (SAELens' CacheActivationsRunner's) needs {'; '.join(problems)}")

    def _special(self, role: str) -> int | None:
        if self.tokenizer is not None:
            ids = self.tokenizer.special_ids
            return ids.get(role)
        value = getattr(self.model.config, f"{role}_token_id", None)
        if not isinstance(value, int):
            return None
        if not 0 <= value < self.model.config.vocab_size:
            raise ValueError(f"the model's config has {role}_token_id {value}, outside its vocabulary "
                             f"0..{self.model.config.vocab_size - 1}")
        return value

    def settings(self, recorded_weights: dict | None = None) -> dict:
        """What identifies the harvest: resuming with anything else is refused. `recorded_weights`: the manifest's
        `weights_record`, whose hash is taken when the weights' files are unchanged (weights_hash)."""
        o = self.options
        source = getattr(self.tokenizer, "source", None)
        if source is not None and Path(source).expanduser().exists():  # a path given relative or absolute alike
            source = Path(source).expanduser().resolve()
        return {"model": source and str(source),
                "model_class": type(self.model).__name__, "weights_sha256": weights_hash(self.model, recorded_weights),
                "names": self.names, "dtype": o.dtype, "data": self.corpus.fingerprint(), "batching": o.batching,
                "context": o.context, "positions": o.positions, "drop_special": o.drop_special,
                "prepend_bos": o.prepend_bos, "layout": o.layout, "batch_size": o.batch_size}

    def computation(self, compile: bool, torch_threads: int) -> dict:
        """How the rows are computed beyond the weights (whose hash covers their dtype, `model_dtype` says it in
        words): each of these changes a row's bits, so a resume that mixed them would mix rows of two kinds (an
        eager and a compiled run differ by up to ~1e-5): compiled or not; the device, and which (a GPU's name, the
        CPU's vector instructions); the intra-op threads each forward pass runs on, which decide how a matmul's
        sums are split (harvest's forward threads side by side change nothing: each batch runs on one of them)."""
        return {"compile": compile, **how_it_rounds(self.runner.device, torch_threads),
                "model_dtype": str(next(self.model.parameters()).dtype).removeprefix("torch.")}

    def sequences(self) -> Iterator[batching.Sequence]:
        o = self.options
        pack = o.batching == "pack"
        tokens = batching.tokenize(self.corpus, self.tokenizer, add_special_tokens=not pack,
                                   prepend_bos=o.prepend_bos and not pack, vocab_size=self.model.config.vocab_size)
        if pack:
            separator = self._special("bos") if self._special("bos") is not None else self._special("eos")
            bos = self._special("bos") if o.prepend_bos else None
            return batching.packed(tokens, o.context, bos, separator, self.counts)
        return batching.per_document(tokens, self.limit, self.family.positions_field, self.corpus,
                                     self.corpus.pair_column is not None, self.counts, self.family.causal)

    def rows_of(self, sequence: batching.Sequence) -> int:
        """The rows a sequence stores."""
        dropped = sequence.dropped(self.options.drop_special)
        if self.options.positions == "all":
            return len(sequence) - sum(dropped)
        return int(not all(dropped))

    def blocks(self, rows_per_block: int) -> Iterator[list[batching.Sequence]]:
        return batching.blocks(self.sequences(), self.rows_of, rows_per_block)

    def batches(self, block):
        return batching.batches(block, self.options.batch_size, by_length=self.options.batching == "document")


def _tokenizer(model):
    """(the model's tokenizer, or None and why there is none)."""
    from ..registry.tokenizer import NoTokenizerJson

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None, "it was not loaded with from_pretrained"
    try:
        tokenizer.special_ids  # reads its files
    except NoTokenizerJson as e:
        return None, str(e)
    return tokenizer, None


def _choice(what: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def peek(iterator):
    """(the first item or None, an iterator that still yields it)."""
    iterator = iter(iterator)
    first = next(iterator, None)
    return first, (itertools.chain([first], iterator) if first is not None else iter(()))


def how_it_rounds(device: torch.device, torch_threads: int) -> dict:
    """What decides a computation's bits beside its inputs and weights, for a resume that must not mix two kinds of
    rows: the device, and which (a GPU's name, the CPU's vector instructions), and on a CPU the intra-op threads,
    which decide how a matmul's sums are split."""
    if device.type == "cuda":
        return {"device": f"cuda ({torch.cuda.get_device_name(device)})", "torch_threads": None}
    return {"device": f"{device.type} ({torch.backends.cpu.get_cpu_capability()})", "torch_threads": torch_threads}
