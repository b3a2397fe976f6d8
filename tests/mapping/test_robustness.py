"""Every bad checkpoint and every bad input gets a clear error that names the culprit; nothing half-done survives.

Bad checkpoints raise CheckpointError or ConfigError naming the file, key or shape; bad arguments to forward and
generate raise ValueError naming the argument and the limit. Where transformers answers differently, the test
says how. Every registered family, from its declaration: one layer of its tiny config with 9 positions, saved by
transformers itself; what only some families have (token types, a KV cache and generate) on those that have it.
"""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RemoteEntryNotFoundError
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from scratch_models import BertModel, CheckpointError, ConfigError
from scratch_models.registry.families import FAMILIES
from helpers import assert_parity, each_family, fake_hub, fused_attention, http_error, reference
POSITIONS = 9
each_causal = pytest.mark.parametrize("family", [name for name, family in FAMILIES.items() if family.causal])
each_paired = pytest.mark.parametrize("family", [name for name, family in FAMILIES.items() if family.pairs])

pytestmark = pytest.mark.usefixtures("one_thread")


def vocab(family: str) -> int:
    return FAMILIES[family].tiny().vocab_size


def lm(family: str) -> type:
    return FAMILIES[family].lm


def hf_model(family: str):
    """transformers' LM of one layer of the family's tiny config with POSITIONS positions, as initialised."""
    declared = FAMILIES[family]
    return reference(family, std=None, **{declared.positions_field: POSITIONS, declared.table.layers_field: 1})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Per family, a checkpoint as transformers' save_pretrained writes it (config.json, model.safetensors)."""
    root = tmp_path_factory.mktemp("saved")
    for family in FAMILIES:
        hf_model(family).save_pretrained(root / family)
    return {family: root / family for family in FAMILIES}


@pytest.fixture
def checkpoint(saved, tmp_path):
    """`checkpoint(family)`: a fresh copy of the saved checkpoint, free to break."""
    def copy(family: str) -> Path:
        return Path(shutil.copytree(saved[family], tmp_path / family))
    return copy


@pytest.fixture(scope="module")
def models(saved) -> dict:
    return {family: lm(family).from_pretrained(saved[family]) for family in FAMILIES}


def raises(exception, *fragments: str, call):
    """Assert `call()` raises `exception` and its message contains every fragment; return the message."""
    with pytest.raises(exception) as error:
        call()
    message = str(error.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the message:\n{message}"
    return message


def embedding_key(family: str, directory: Path) -> str:
    """The checkpoint's name of the token embeddings, as the family's table maps our model's input embeddings."""
    declared = FAMILIES[family]
    model = declared.lm(declared.tiny())
    ours = next(name for name, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    (name,) = (key for key, mine in declared.table.tensor_names(1).items() if mine == ours)
    return next(key for key in load_file(directory / "model.safetensors") if declared.table.normalize(key) == name)


def other(family: str) -> str:
    """The next family of the registry (another model_type)."""
    names = list(FAMILIES)
    return names[(names.index(family) + 1) % len(names)]


def foreign(family: str, saved) -> str:
    """The next family of the registry whose saved checkpoint holds no tensor `family`'s table knows (by any name: a
    row's, a tied alias's, an ignored buffer's)."""
    table = FAMILIES[family].table
    known = set(table.tensor_names(1)) | set(table.ignored_keys(1)) | set(table.aliases) | set(table.aliases.values())
    names = list(FAMILIES)
    start = names.index(family)
    for candidate in names[start + 1:] + names[:start]:
        with safe_open(saved[candidate] / "model.safetensors", "pt") as weights:
            if not any(table.normalize(key) in known for key in weights.keys()):
                return candidate
    pytest.skip(f"every other family's checkpoint shares a tensor name with the {family} table")


# ---------------------------------------------------------------------------------------------- bad checkpoints


CORRUPTIONS = {
    "truncated to half": (lambda data: data[:len(data) // 2], "file not fully covered"),
    "one byte short": (lambda data: data[:-1], "file not fully covered"),
    "header cut": (lambda data: data[:5], "header"),
    "random bytes": (lambda data: os.urandom(len(data)), "header"),
}


@each_family
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_safetensors_names_the_file(checkpoint, family, corruption):
    directory = checkpoint(family)
    cut, reason = CORRUPTIONS[corruption]
    weights = directory / "model.safetensors"
    weights.write_bytes(cut(weights.read_bytes()))
    raises(CheckpointError, f"{weights}: not a readable safetensors file", reason,
           call=lambda: lm(family).from_pretrained(directory))


@each_family
def test_truncated_bin_names_the_file(checkpoint, family):
    directory = checkpoint(family)
    weights = directory / "pytorch_model.bin"
    torch.save(load_file(directory / "model.safetensors"), weights)
    (directory / "model.safetensors").unlink()
    weights.write_bytes(weights.read_bytes()[:1000])
    raises(CheckpointError, f"{weights}: not a readable PyTorch weights file",
           call=lambda: lm(family).from_pretrained(directory))


@each_family
@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_empty_weights_file(checkpoint, family, name):
    directory = checkpoint(family)
    (directory / "model.safetensors").unlink()
    (directory / name).write_bytes(b"")
    raises(CheckpointError, f"{directory / name}: the file is empty",
           call=lambda: FAMILIES[family].base.from_pretrained(directory))


@each_family
def test_directory_without_weights(checkpoint, family):
    directory = checkpoint(family)
    (directory / "model.safetensors").rename(directory / "tf_model.h5")
    held = ", ".join(sorted(path.name for path in directory.iterdir()))  # config.json, [generation_config.json, ]...
    raises(CheckpointError, f"{directory}: no weights file; looked for model.safetensors,", f"holds {held}",
           call=lambda: FAMILIES[family].base.from_pretrained(directory))
    assert "tf_model.h5" in held


@each_family
def test_checkpoint_of_the_other_architecture(saved, family):
    """transformers warns and loads it anyway, every weight at random; we refuse, from config.json's model_type."""
    stranger = other(family)
    raises(ConfigError, f"{saved[stranger] / 'config.json'}: model_type is {stranger!r}",
           "another architecture", call=lambda: lm(family).from_pretrained(saved[stranger]))


@each_family
def test_weights_of_the_other_architecture_under_our_config(checkpoint, saved, family):
    """Another family's weights beside a config.json of ours: every tensor unexpected, every tensor missing."""
    directory = checkpoint(foreign(family, saved))
    shutil.copy(saved[family] / "config.json", directory / "config.json")
    with safe_open(directory / "model.safetensors", "pt") as weights:
        first = next(iter(weights.keys()))
        shape = tuple(weights.get_slice(first).get_shape())
    raises(CheckpointError, f"{directory}: checkpoint does not fit", f"{first} {shape}",
           f"none of the checkpoint's tensors is in the {FAMILIES[family].table.family} table: is this a checkpoint "
           "of another architecture?", call=lambda: lm(family).from_pretrained(directory))


@each_family
def test_tensor_shape_disagreeing_with_config(checkpoint, family):
    """config.json says one token more than the embeddings hold."""
    directory = checkpoint(family)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"vocab_size": config["vocab_size"] + 1}))
    key = embedding_key(family, directory)
    stored = tuple(load_file(directory / "model.safetensors")[key].shape)
    wanted = (stored[0] + 1, *stored[1:])
    raises(CheckpointError, f"{key}: {stored} in the checkpoint, {wanted} expected from config.json",
           call=lambda: lm(family).from_pretrained(directory))


@each_family
def test_tensor_that_is_not_floating_point(checkpoint, family):
    directory = checkpoint(family)
    state = load_file(directory / "model.safetensors")
    key = embedding_key(family, directory)
    state[key] = torch.zeros(state[key].shape, dtype=torch.int64)
    save_file(state, directory / "model.safetensors")
    raises(CheckpointError, f"{key!r} has dtype torch.int64", "floating-point",
           call=lambda: lm(family).from_pretrained(directory))


@each_family
def test_tensors_in_mixed_dtypes_need_a_dtype(checkpoint, family):
    """A model of mixed dtypes would fail at its first matmul; with dtype= every tensor is cast, and it loads."""
    directory = checkpoint(family)
    state = load_file(directory / "model.safetensors")
    key = embedding_key(family, directory)
    state[key] = state[key].half()
    save_file(state, directory / "model.safetensors")
    base = FAMILIES[family].base
    raises(CheckpointError, "several dtypes", f"torch.float16 such as {key!r}", "pass dtype=",
           call=lambda: base.from_pretrained(directory))
    model = base.from_pretrained(directory, dtype=torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def epsilon_field(family: str) -> str:
    """The family's norm epsilon (layer_norm_eps, layer_norm_epsilon, rms_norm_eps, ...)."""
    (name,) = (f.name for f in dataclasses.fields(FAMILIES[family].config_class) if "eps" in f.name)
    return name


def nan_epsilon(family: str):
    def write(path):
        path.write_text(json.dumps(json.loads(path.read_text()) | {epsilon_field(family): float("nan")}))
    return write


BAD_CONFIGS = {
    # name: (family -> how to write it, exception, family -> message fragment after the config path)
    "missing": (lambda family: lambda path: path.unlink(), CheckpointError,
                lambda family: "config.json not found beside the weights"),
    "not JSON": (lambda family: lambda path: path.write_text('{"vocab_size": 29,'), ConfigError,
                 lambda family: "not valid JSON"),
    "not UTF-8": (lambda family: lambda path: path.write_bytes(b"\xff\xfe{}"), ConfigError,
                  lambda family: "cannot read config.json"),
    "a list": (lambda family: lambda path: path.write_text("[]"), ConfigError,
               lambda family: "expected a JSON object, got list"),
    "NaN epsilon": (nan_epsilon, ConfigError,
                    lambda family: f"field {epsilon_field(family)!r} must be positive and finite, got nan"),
}


@each_family
@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_json_names_the_file(checkpoint, family, case):
    directory = checkpoint(family)
    write, exception, fragment = BAD_CONFIGS[case]
    write(family)(directory / "config.json")
    raises(exception, f"{directory / 'config.json'}: {fragment(family)}",
           call=lambda: FAMILIES[family].base.from_pretrained(directory))


REQUIRED = [(name, field.name) for name, family in FAMILIES.items() for field in
            dataclasses.fields(family.config_class) if field.init and field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING]


@pytest.mark.parametrize("family, field", REQUIRED)
def test_config_lacking_a_required_field(checkpoint, family, field):
    """Every field of the family's config class that has no default."""
    directory = checkpoint(family)
    config = json.loads((directory / "config.json").read_text())
    del config[field]
    (directory / "config.json").write_text(json.dumps(config))
    raises(ConfigError, f"{directory / 'config.json'}: required field {field!r} is missing",
           call=lambda: lm(family).from_pretrained(directory))


class RunsCode:
    """Unpickling this runs `touch marker`: what a malicious .bin would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@each_family
@pytest.mark.parametrize("where", ["second shard of an index", "the whole file"])
def test_bin_that_would_run_code_is_refused_before_it_runs(checkpoint, tmp_path, family, where):
    directory = checkpoint(family)
    state = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    if where == "the whole file":
        bad = directory / "pytorch_model.bin"
        torch.save(RunsCode(marker), bad)
    else:
        keys = sorted(state)
        first, bad = directory / "pytorch_model-00001-of-00002.bin", directory / "pytorch_model-00002-of-00002.bin"
        torch.save({k: state[k] for k in keys[:3]}, first)
        torch.save({k: state[k] for k in keys[3:]} | {keys[3]: RunsCode(marker)}, bad)
        index = {"weight_map": {k: (first if k in keys[:3] else bad).name for k in keys}}
        (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    raises(CheckpointError, f"{bad}: refused", "would run code", call=lambda: lm(family).from_pretrained(directory))
    assert not marker.exists()


@pytest.fixture(scope="module")
def saved_sharded(tmp_path_factory) -> dict[str, Path]:
    """Per family, the model saved by transformers in shards of at most 2 KB, with model.safetensors.index.json."""
    root = tmp_path_factory.mktemp("sharded")
    for family in FAMILIES:
        hf_model(family).save_pretrained(root / family, max_shard_size="2KB")
        assert len(list((root / family).glob("model-*.safetensors"))) > 2
    return {family: root / family for family in FAMILIES}


@pytest.fixture
def sharded(saved_sharded, tmp_path):
    """`sharded(family)`: a fresh copy of the sharded checkpoint, free to break."""
    def copy(family: str) -> Path:
        return Path(shutil.copytree(saved_sharded[family], tmp_path / "sharded"))
    return copy


@each_family
def test_sharded_index_naming_a_missing_shard(sharded, family):
    """transformers answers with a bare FileNotFoundError for the shard; we name the index too."""
    directory = sharded(family)
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.unlink()
    index = directory / "model.safetensors.index.json"
    raises(CheckpointError, f"{index}: names shard {shard.name!r}, which is not in {directory}",
           call=lambda: lm(family).from_pretrained(directory))


@each_family
@pytest.mark.parametrize("index, fragment", [
    ("{", "not a sharded-checkpoint index (JSONDecodeError"),
    ('{"metadata": {}}', "not a sharded-checkpoint index (KeyError"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}', "weight_map should map tensor names to shard file names"),
])
def test_unreadable_sharded_index(sharded, family, index, fragment):
    directory = sharded(family)
    (directory / "model.safetensors.index.json").write_text(index)
    raises(CheckpointError, f"{directory / 'model.safetensors.index.json'}: {fragment}",
           call=lambda: FAMILIES[family].base.from_pretrained(directory))


@each_family
def test_path_that_does_not_exist(tmp_path, family):
    """transformers takes a missing absolute path for a malformed hub id and says so."""
    raises(CheckpointError, f"{tmp_path / 'nowhere'}: no such file or directory, and not a hub model id",
           call=lambda: FAMILIES[family].base.from_pretrained(tmp_path / "nowhere"))


@each_family
def test_name_that_is_neither_a_path_nor_a_valid_hub_id(family):
    raises(CheckpointError, "a--b: no such local path, and not a valid hub model id",
           call=lambda: FAMILIES[family].base.from_pretrained("a--b"))


def test_offline_with_nothing_cached_names_the_file_and_the_cache(monkeypatch):
    """A bare name is tried as a hub id: the message also says there is no such local path. BERT's: the message
    points to the embedded MiniLM, a BERT."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub(monkeypatch, {"config.json": LocalEntryNotFoundError("not cached")})
    raises(CheckpointError, "no-such-model: no such local path, and config.json is not in the local Hugging Face "
           "cache (", ") while HF_HUB_OFFLINE is set. Download it once with network access", "use `minilm`",
           call=lambda: BertModel.from_pretrained("no-such-model"))


@each_family
def test_hub_unreachable_with_weights_not_cached(monkeypatch, saved, family):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fake_hub(monkeypatch, {"config.json": saved[family] / "config.json"}
             | {name: LocalEntryNotFoundError("not cached") for name in (
                 "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")})
    raises(CheckpointError, "org/model: no such local path, and model.safetensors / model.safetensors.index.json / "
           "pytorch_model.bin", "while the hub could not be reached; set HF_HUB_OFFLINE=1 to skip trying the hub",
           call=lambda: FAMILIES[family].base.from_pretrained("org/model"))


@each_family
@pytest.mark.parametrize("error, fragment", [
    (http_error(GatedRepoError, 403), "org/model: the hub model is gated"),
    (http_error(RemoteEntryNotFoundError, 404), "org/model: the hub repository has no config.json"),
])
def test_hub_refusals_name_the_model(monkeypatch, family, error, fragment):
    fake_hub(monkeypatch, {"config.json": error})
    raises(CheckpointError, fragment, call=lambda: FAMILIES[family].base.from_pretrained("org/model"))


@each_family
def test_hub_index_naming_a_shard_the_repository_lacks(monkeypatch, saved_sharded, family):
    directory = saved_sharded[family]
    fake_hub(monkeypatch, {"config.json": directory / "config.json",
                           "model.safetensors": http_error(RemoteEntryNotFoundError, 404),
                           "model.safetensors.index.json": directory / "model.safetensors.index.json"}
             | {p.name: (http_error(RemoteEntryNotFoundError, 404) if p.name.startswith("model-00002") else p)
                for p in directory.glob("model-*.safetensors")})
    raises(CheckpointError, "names shard 'model-00002-of-", "which the hub repository org/model lacks",
           call=lambda: FAMILIES[family].base.from_pretrained("org/model"))


# -------------------------------------------------------------------------------------------------- bad inputs


def call(models, family, **arguments):
    return lambda: models[family](**arguments)


IDS = torch.tensor([[1, 2, 3], [4, 5, 6]])


@each_family
@pytest.mark.parametrize("past, where", [(True, [1, 2]), (False, [0, 1])], ids=["vocab_size", "negative"])
def test_token_id_out_of_range(models, family, past, where):
    """transformers: a bare IndexError ("index out of range in self") on CPU, a device-side assert on CUDA."""
    bad = vocab(family) if past else -1
    ids = IDS.clone()
    ids[tuple(where)] = bad
    raises(ValueError, f"input_ids{where} = {bad} is out of range: must be 0 <= id < vocab_size = {vocab(family)}",
           call=call(models, family, input_ids=ids))


@each_family
def test_label_out_of_range(models, family):
    labels = IDS.clone()
    labels[0, 0] = -100  # not scored: legal
    labels[1, 2] = vocab(family)
    raises(ValueError, f"labels[1, 2] = {vocab(family)} is out of range: must be 0 <= id < vocab_size = "
           f"{vocab(family)} (or -100", call=call(models, family, input_ids=IDS, labels=labels))


@each_paired
def test_token_type_out_of_range(models, family):
    """The families with token types (BERT's sentence pairs)."""
    types = FAMILIES[family].tiny().type_vocab_size
    raises(ValueError, f"token_type_ids[0, 1] = {types} is out of range: must be 0 <= id < type_vocab_size = "
           f"{types}", call=call(models, family, input_ids=IDS, token_type_ids=torch.tensor([[0, types, 0],
                                                                                              [1, 1, 1]])))


@each_family
def test_sequence_longer_than_the_position_table(models, family):
    """transformers: BERT a RuntimeError about expanding a tensor, GPT-2 a bare IndexError, GPT-NeoX nothing (its
    rotary angles go on past the positions it was trained on). A causal family counts the cached tokens in."""
    field = FAMILIES[family].positions_field
    fragments = [f"this model has {field}={POSITIONS}, so", f"at most {POSITIONS} tokens"]
    if FAMILIES[family].causal:
        fragments.append(f"0 cached and {POSITIONS + 1} new tokens need positions up to {POSITIONS}")
    else:
        fragments.append(f"input_ids has {POSITIONS + 1} positions")
    raises(ValueError, *fragments,
           call=call(models, family, input_ids=torch.ones(1, POSITIONS + 1, dtype=torch.long)))


@each_family
def test_position_ids_past_the_table(models, family):
    limit = FAMILIES[family].positions_field
    raises(ValueError, f"position_ids[0, 2] = {POSITIONS} is out of range: must be 0 <= id < {limit} = {POSITIONS}",
           call=call(models, family, input_ids=IDS, position_ids=torch.tensor([[0, 1, POSITIONS]])))


@each_causal
def test_cache_and_new_tokens_longer_than_the_table(models, family):
    model = models[family]
    with torch.no_grad():
        cache = model(IDS, use_cache=True).past_key_values
        model(IDS[:, :2], past_key_values=cache)
    raises(ValueError, "5 cached and 5 new tokens need positions up to 9", "at most 9 tokens fit, cached ones included",
           call=lambda: model(torch.ones(2, 5, dtype=torch.long), past_key_values=cache))
    assert cache.length == 5


WRONG_ARGUMENTS = {
    # name: (arguments beside input_ids=IDS [2, 3], message fragment); transformers accepts the first two silently
    # and reads the additive mask as its opposite (-10000 != 0, so "attend"; 0, so "padding")
    "mask too long": (dict(attention_mask=torch.ones(2, 4)), "attention_mask has shape (2, 4), expected (2, 3)"),
    "mask broadcast over the batch": (dict(attention_mask=torch.ones(1, 3)),
                                      "attention_mask has shape (1, 3), expected (2, 3)"),
    "additive mask": (dict(attention_mask=torch.tensor([[0.0, 0.0, -1e4], [0.0, 0.0, 0.0]])),
                      "attention_mask[0, 2] = -10000.0 is not 1 (attend) or 0 (padding); an additive mask"),
    "complex mask": (dict(attention_mask=torch.ones(2, 3, dtype=torch.complex64)),
                     "attention_mask must be bool, integer or floating point, got dtype torch.complex64"),
    "mask a list": (dict(attention_mask=[[1, 1, 1], [1, 1, 1]]), "attention_mask must be a torch.Tensor, got list"),
    "position_ids wrong shape": (dict(position_ids=torch.arange(4)[None]),
                                 "position_ids has shape (1, 4), expected (2, 3) or (1, 3)"),
    "position_ids float": (dict(position_ids=torch.arange(3.0)[None]),
                           "position_ids must hold integers (torch.long), got dtype torch.float32"),
    "labels wrong shape": (dict(labels=torch.ones(2, 4, dtype=torch.long)), "labels has shape (2, 4), expected (2, 3)"),
    "labels float": (dict(labels=torch.ones(2, 3)), "labels must hold integers (torch.long), got dtype torch.float32"),
}


@each_family
@pytest.mark.parametrize("case", list(WRONG_ARGUMENTS))
def test_argument_of_the_wrong_shape_or_dtype(models, family, case):
    arguments, fragment = WRONG_ARGUMENTS[case]
    raises(ValueError, fragment, call=call(models, family, input_ids=IDS, **arguments))


@each_paired
@pytest.mark.parametrize("token_type_ids, fragment", [
    (torch.zeros(1, 3, dtype=torch.long), "token_type_ids has shape (1, 3), expected (2, 3)"),
    (torch.zeros(2, 3), "token_type_ids must hold integers (torch.long), got dtype torch.float32"),
])
def test_token_type_ids_of_the_wrong_shape_or_dtype(models, family, token_type_ids, fragment):
    raises(ValueError, fragment, call=call(models, family, input_ids=IDS, token_type_ids=token_type_ids))


@each_family
@pytest.mark.parametrize("input_ids, fragment", [
    (IDS.float(), "input_ids must hold integers (torch.long), got dtype torch.float32"),
    (IDS.bool(), "input_ids must hold integers (torch.long), got dtype torch.bool"),
    (IDS[:0], "input_ids is empty (shape (0, 3)): give at least one token"),
    (IDS[:, :0], "input_ids is empty (shape (2, 0))"),
    (IDS[0], "input_ids must be 2-D [batch, seq], got shape (3,)"),
    ([[1, 2, 3]], "input_ids must be a torch.Tensor, got list"),
], ids=["float", "bool", "no rows", "no tokens", "1-D", "list"])
def test_input_ids_that_are_not_a_batch_of_token_ids(models, family, input_ids, fragment):
    """transformers: float ids a RuntimeError from the embedding, an empty batch a RuntimeError from a reshape."""
    raises(ValueError, fragment, call=call(models, family, input_ids=input_ids))


@each_causal
def test_cache_of_the_wrong_kind_or_batch(models, family):
    model = models[family]
    raises(ValueError, "past_key_values must be a KVCache (as returned with use_cache=True), got tuple",
           call=lambda: model(IDS, past_key_values=((torch.zeros(1),),)))
    with torch.no_grad():
        cache = model(IDS, use_cache=True).past_key_values
    raises(ValueError, "input_ids has batch size 1, but past_key_values holds 2 rows",
           call=lambda: model(IDS[:1], past_key_values=cache))


@each_causal
def test_a_bad_call_leaves_the_cache_as_it_was(models, family):
    model = models[family]
    with torch.no_grad():
        untouched = model(IDS[:, :2], use_cache=True).past_key_values
        expected = model(IDS[:, 2:], past_key_values=untouched).logits
        cache = model(IDS[:, :2], use_cache=True).past_key_values
        for bad in (dict(attention_mask=torch.ones(2, 4)), dict(labels=torch.full((2, 1), vocab(family))),
                    dict(position_ids=torch.tensor([[POSITIONS]]))):
            with pytest.raises(ValueError):
                model(IDS[:, 2:], past_key_values=cache, **bad)
            assert cache.length == 2
        resumed = model(IDS[:, 2:], past_key_values=cache).logits
    assert torch.equal(resumed, expected)


@each_family
def test_all_zero_mask_row_is_finite_and_attends_to_nothing(saved, models, family):
    """A row with nothing to attend to gets zero weights and a zero context on both of our paths, as transformers'
    default SDPA attention gives it (its eager path spreads it evenly instead; fused_attention stands in for SDPA
    where a class has none); documented in forward's docstring. The other row matches eager attention too."""
    import transformers

    reference_class = getattr(transformers, lm(family).__name__)
    theirs = reference_class.from_pretrained(saved[family], attn_implementation="eager").eval()
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    model = models[family]
    with torch.no_grad():
        fused = model(IDS, attention_mask=mask)
        explicit = model(IDS, attention_mask=mask, output_attentions=True)
        ref = theirs(IDS, attention_mask=mask, output_attentions=True)
        theirs.set_attn_implementation(fused_attention(reference_class))
        ref_sdpa = theirs(IDS, attention_mask=mask)
    assert bool(fused.logits.isfinite().all()) and bool(explicit.logits.isfinite().all())
    assert not explicit.attentions[0][1].any()
    spread = ref.attentions[0][1]  # [heads, 3, 3]
    if any(name.endswith(".sinks") for name, _ in theirs.named_parameters()):
        assert not spread.any()  # attention sinks (GPT-OSS): a row that sees no key gives the sink all of its weight
    else:
        assert torch.allclose(spread, torch.full_like(spread, 1 / 3))
    assert_parity(explicit.logits[0], ref.logits[0], "logits of the real row, explicit attention")
    assert_parity(explicit.logits, ref_sdpa.logits, "logits, explicit attention against SDPA")
    assert_parity(fused.logits, ref_sdpa.logits, "logits, fused attention against SDPA")
    assert "all 0" in FAMILIES[family].base.forward.__doc__


# -------------------------------------------------------------------------------------------------------- generate


@each_causal
def test_generate_past_the_position_table_says_how_many_fit(models, family):
    """transformers warns, then fails with a bare IndexError at the first position past the table."""
    model = models[family]
    field = FAMILIES[family].positions_field
    assert model.generate(IDS, max_new_tokens=POSITIONS - 2).shape == (2, 3 + POSITIONS - 2)  # last one never fed
    raises(ValueError, "generating 8 tokens after these prompts reaches position 9; this model has "
           f"{field}=9, so at most max_new_tokens=7 fit", call=lambda: model.generate(IDS, max_new_tokens=8))
    raises(ValueError, f"input_ids: the longest prompt has 10 tokens; this model has {field}=9",
           call=lambda: model.generate(torch.ones(1, 10, dtype=torch.long)))


@each_causal
@pytest.mark.parametrize("arguments, fragment", [
    (dict(input_ids=IDS.float()), "input_ids must hold integers"),
    (dict(input_ids=IDS[:0]), "input_ids is empty (shape (0, 3))"),
    (dict(input_ids=IDS, attention_mask=torch.ones(2, 4)), "attention_mask has shape (2, 4), expected (2, 3)"),
    (dict(input_ids=IDS, max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
    (dict(input_ids=IDS, max_new_tokens=True), "max_new_tokens must be a positive integer, got True"),
], ids=["float ids", "empty batch", "mask shape", "no new tokens", "bool"])
def test_generate_arguments(models, family, arguments, fragment):
    raises(ValueError, fragment, call=lambda: models[family].generate(**arguments))


@each_causal
def test_generate_refuses_an_id_past_the_vocabulary(models, family):
    raises(ValueError, f"input_ids[0, 1] = {vocab(family)} is out of range",
           call=lambda: models[family].generate(torch.tensor([[1, vocab(family)]])))


# ------------------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@each_family
def test_cuda_id_out_of_range_is_a_value_error_not_a_device_assert(saved, family):
    """The range check runs before the embedding lookup, so no device-side assert poisons the CUDA context:
    the same model still runs afterwards."""
    model = lm(family).from_pretrained(saved[family], device="cuda")
    ids = IDS.cuda()
    raises(ValueError, f"input_ids[1, 2] = {vocab(family)} is out of range",
           call=lambda: model(torch.tensor([[1, 2, 3], [4, 5, vocab(family)]], device="cuda")))
    with torch.no_grad():
        assert bool(model(ids).logits.isfinite().all())
    torch.cuda.synchronize()
