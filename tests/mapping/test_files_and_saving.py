"""Files in and out at their edges: saves that never leave a checkpoint half-replaced (mount points, read-only
parents, `~`, a full disk, a move cut short), configs of absurd nesting or size, dtypes we do not compute in, and
shard names that would leave the checkpoint directory.

Read-only and full disks are simulated by monkeypatching: these tests may run as root, which chmod does not stop.
"""

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub.errors import RemoteEntryNotFoundError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from helpers import assert_parity
from scratch_models import BertForMaskedLM, BertModel, CheckpointError, ConfigError, GPT2LMHeadModel, GPT2Model
from scratch_models_cli.cli import main
from helpers import fake_hub, http_error
from test_robustness import hf_model, raises


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Per family, a tiny checkpoint as transformers' save_pretrained writes it."""
    root = tmp_path_factory.mktemp("saved")
    for family in ("bert", "gpt2"):
        hf_model(family).save_pretrained(root / family)
    return {family: root / family for family in ("bert", "gpt2")}


@pytest.fixture
def gpt2(saved) -> GPT2Model:
    return GPT2Model.from_pretrained(saved["gpt2"])


def sharded(family: str, tmp_path: Path) -> Path:
    """The family's tiny model saved by transformers in shards of at most 2 KB, with model.safetensors.index.json."""
    directory = tmp_path / "sharded"
    hf_model(family).save_pretrained(directory, max_shard_size="2KB")
    return directory


def same_state(a, b) -> bool:
    x, y = a.state_dict(), b.state_dict()
    return x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)


def listing(directory: Path) -> dict[str, bytes]:
    """Every entry of `directory`, hidden ones included, with the bytes of the files."""
    return {p.name: p.read_bytes() if p.is_file() else b"<dir>" for p in directory.iterdir()}


def inside(path, directory: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(directory)


def raising(error: Exception):
    """A stand-in for a function: it raises `error`."""
    def fail(*args, **kwargs):
        raise error
    return fail


# ------------------------------------------------------------------------------------------------------- saving


@pytest.fixture
def mount_point(tmp_path, monkeypatch) -> Path:
    """An existing directory that is a mount point of its own under a read-only parent: a move into it from
    elsewhere fails with EXDEV, and nothing can be made outside it (EROFS)."""
    target = tmp_path / "volume"
    target.mkdir()
    real_replace, real_rename, real_mkdir = os.replace, os.rename, os.mkdir

    def move(real):
        def fake(src, dst, **kwargs):
            if inside(src, target) != inside(dst, target):
                raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))
            return real(src, dst, **kwargs)
        return fake

    def mkdir(path, *args, **kwargs):
        if not inside(path, target):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "replace", move(real_replace))
    monkeypatch.setattr(os, "rename", move(real_rename))
    monkeypatch.setattr(os, "mkdir", mkdir)
    return target


def test_save_into_a_mount_point_under_a_read_only_parent(mount_point, gpt2, saved, capsys):
    """The staging directory lives inside the target: no move crosses devices, nothing is made in the parent."""
    (mount_point / "tokenizer.json").write_text("{}")
    assert gpt2.save_pretrained(mount_point) == [mount_point / "config.json", mount_point / "model.safetensors"]
    assert sorted(p.name for p in mount_point.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert same_state(gpt2, GPT2Model.from_pretrained(mount_point))

    converted = mount_point / "converted"
    converted.mkdir()
    assert main(["convert", str(saved["gpt2"]), str(converted)]) == 0
    assert "read back bitwise equal" in capsys.readouterr().out
    # convert writes GPT2LMHeadModel, which generates: generation_config.json, as transformers saves it
    assert sorted(p.name for p in converted.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]


def test_save_and_convert_expand_the_home_directory(tmp_path, monkeypatch, gpt2, saved, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # where an unexpanded "~" would land
    home = tmp_path / "home"
    assert gpt2.save_pretrained("~/out") == [home / "out" / "config.json", home / "out" / "model.safetensors"]
    assert same_state(gpt2, GPT2Model.from_pretrained("~/out"))
    assert main(["convert", str(saved["gpt2"]), "~/converted"]) == 0
    assert f"wrote {home / 'converted' / 'model.safetensors'}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    assert sorted(p.name for p in home.iterdir()) == ["converted", "out"]


def test_save_into_a_new_nested_directory_that_fails_leaves_nothing(tmp_path, monkeypatch, gpt2):
    monkeypatch.setattr("safetensors.torch.save_file", raising(OSError(errno.ENOSPC, "No space left on device")))
    raises(OSError, f"{tmp_path / 'a' / 'b'}: cannot write the checkpoint", "No space left on device",
           call=lambda: gpt2.save_pretrained(tmp_path / "a" / "b"))
    assert list(tmp_path.iterdir()) == []


def test_full_disk_reported_by_safetensors_is_an_os_error_naming_the_directory(tmp_path, monkeypatch, gpt2):
    """safetensors reports an I/O failure as its own SafetensorError, which says neither OSError nor where."""
    target = tmp_path / "out"
    gpt2.save_pretrained(target)
    before = listing(target)
    full = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr("safetensors.torch.save_file", raising(full))
    raises(OSError, f"{target}: cannot write the checkpoint", "No space left on device (os error 28)",
           call=lambda: gpt2.save_pretrained(target))
    assert listing(target) == before


@pytest.fixture
def old_and_new(tmp_path, saved) -> tuple[Path, GPT2Model, GPT2Model]:
    """A directory holding `old` as saved, and `new`: the same shapes, other weights and another config, so that
    a config.json of one beside the weights of the other would load without a complaint."""
    old = GPT2Model.from_pretrained(saved["gpt2"])
    new = GPT2Model.from_pretrained(saved["gpt2"])
    with torch.no_grad():
        for p in new.parameters():
            p.add_(1.0)
    new.config = dataclasses.replace(new.config, layer_norm_epsilon=1e-3)
    target = tmp_path / "target"
    old.save_pretrained(target)
    (target / "tokenizer.json").write_text("{}")
    return target, old, new


def test_a_reader_never_sees_new_weights_beside_an_old_config(tmp_path, monkeypatch, old_and_new):
    """What a reader would load if the saving process died before each move: the old checkpoint, the new one, or a
    refusal for want of config.json or weights, never a config of one with the weights of the other."""
    target, old, new = old_and_new
    seen = []

    def reader_sees() -> str:
        copy = Path(shutil.copytree(target, tmp_path / f"seen-{len(seen)}", ignore=shutil.ignore_patterns(".*")))
        try:
            model = GPT2Model.from_pretrained(copy)
        except CheckpointError as e:
            return "refused" if "config.json not found" in str(e) or "no weights file" in str(e) else str(e)
        config = "old" if model.config == old.config else "new" if model.config == new.config else "other"
        weights = "old" if same_state(model, old) else "new" if same_state(model, new) else "other"
        return f"{config} config, {weights} weights"

    real_replace = os.replace

    def replace(src, dst):
        seen.append(reader_sees())
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    new.save_pretrained(target)
    seen.append(reader_sees())
    assert seen[0] == "old config, old weights" and seen[-1] == "new config, new weights"
    assert set(seen) <= {"old config, old weights", "refused", "new config, new weights"}, seen
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


@pytest.mark.parametrize("failing", range(4))  # the old config and weights moved aside, the new ones moved in
def test_a_failing_move_leaves_the_target_as_it_was(monkeypatch, old_and_new, failing):
    target, old, new = old_and_new
    before = listing(target)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == failing + 1:
            raise OSError(errno.EIO, "Input/output error", str(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="Input/output error"):
        new.save_pretrained(target)
    assert len(calls) > failing  # the failure did happen at that move
    assert listing(target) == before
    assert same_state(GPT2Model.from_pretrained(target), old)


def test_convert_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, saved, capsys):
    destination = tmp_path / "out"
    for error in (OSError(errno.ENOSPC, "No space left on device"),
                  SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")):
        monkeypatch.setattr("safetensors.torch.save_file", raising(error))
        assert main(["convert", str(saved["gpt2"]), str(destination)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("scratch-models convert: error: ") and err.count("\n") == 1, err
        assert str(destination) in err and "No space left on device" in err
        assert not destination.exists()


def test_convert_into_a_read_only_directory_is_one_line(tmp_path, monkeypatch, saved, capsys):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if inside(path, read_only):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert main(["convert", str(saved["bert"]), str(read_only / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scratch-models convert: error: ") and err.count("\n") == 1, err
    assert f"Permission denied: '{read_only / 'out'}'" in err
    assert list(read_only.iterdir()) == []


# ------------------------------------------------------------------------------------------------------ configs


def write_changed_config(directory: Path, **changes) -> Path:
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | changes))
    return directory / "config.json"


@pytest.fixture
def copy_of(saved, tmp_path):
    return lambda family: Path(shutil.copytree(saved[family], tmp_path / family))


@pytest.mark.parametrize("text, fragment", [
    ('{"vocab_size": ' + "[" * 100_000 + "]" * 100_000 + "}", "maximum recursion depth exceeded"),
    ('{"vocab_size": ' + "9" * 5000 + "}", "Exceeds the limit (4300 digits)"),
])
def test_config_json_python_cannot_parse_names_the_file(copy_of, text, fragment):
    directory = copy_of("gpt2")
    (directory / "config.json").write_text(text)
    raises(ConfigError, f"{directory / 'config.json'}: not valid JSON", fragment,
           call=lambda: GPT2Model.from_pretrained(directory))


@pytest.mark.parametrize("field", ["model_type", "add_cross_attention", "n_embd"])
def test_deeply_nested_value_is_shown_cut_short(copy_of, field):
    """A value nested 500 deep, in each kind of refusal: the message shows its start, not 1000 brackets."""
    directory = copy_of("gpt2")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {field: []})[:-1].replace(
        f'"{field}": []', f'"{field}": ' + "[" * 500 + "]" * 500) + "}")
    message = raises(ConfigError, str(directory / "config.json"), "[[[[[[...]]]]]]",
                     call=lambda: GPT2Model.from_pretrained(directory))
    assert len(message) < 400


@pytest.mark.parametrize("family, changes, fragment", [
    ("gpt2", {"n_layer": 20_000}, "field 'n_layer' is 20000, more than the 4096 layers accepted"),
    ("bert", {"num_hidden_layers": 4097}, "field 'num_hidden_layers' is 4097, more than the 4096 layers accepted"),
    ("gpt2", {"n_embd": 3 * 2**20, "n_head": 3}, "fields 'n_embd' x 'n_embd' (3145728 x 3145728)"),
    ("gpt2", {"n_embd": 3 * 2**40, "n_head": 3}, "fields 'vocab_size' x 'n_embd' (37 x 3298534883328)"),
    ("gpt2", {"n_embd": 3 * 2**62}, "fields 'vocab_size' x 'n_embd'"),
    ("gpt2", {"vocab_size": 2**62}, "fields 'vocab_size' x 'n_embd'"),
    ("gpt2", {"n_positions": 2**40}, "fields 'n_positions' x 'n_embd'"),
    ("gpt2", {"n_inner": 2**40}, "fields 'n_inner' x 'n_embd'"),
    ("bert", {"max_position_embeddings": 2**40}, "fields 'max_position_embeddings' x 'hidden_size'"),
    ("bert", {"type_vocab_size": 2**40}, "fields 'type_vocab_size' x 'hidden_size'"),
    ("bert", {"intermediate_size": 2**40}, "fields 'intermediate_size' x 'hidden_size'"),
])
def test_absurd_sizes_are_refused_naming_the_fields(copy_of, family, changes, fragment):
    directory = copy_of(family)
    config = write_changed_config(directory, **changes)
    model = {"bert": BertModel, "gpt2": GPT2Model}[family]
    raises(ConfigError, f"{config}: {fragment}", call=lambda: model.from_pretrained(directory))


def test_largest_real_sizes_are_accepted():
    """multilingual BERT's vocabulary at bert-large's width, and gpt2-xl: far inside the limits."""
    transformers_config = transformers.GPT2Config.from_dict(dict(n_embd=1600, n_layer=48, n_head=25)).to_dict()
    assert GPT2Model.config_class.from_dict(transformers_config).n_layer == 48
    bert = dict(vocab_size=119547, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                intermediate_size=4096)
    assert BertModel.config_class.from_dict(bert).vocab_size == 119547


@pytest.mark.parametrize("family, layers", [("gpt2", 2000), ("bert", 2)])
def test_config_with_more_layers_than_the_checkpoint_is_refused_before_building(copy_of, monkeypatch, family,
                                                                                layers):
    directory = copy_of(family)
    config = write_changed_config(directory, **{{"gpt2": "n_layer", "bert": "num_hidden_layers"}[family]: layers})
    model = {"bert": BertForMaskedLM, "gpt2": GPT2LMHeadModel}[family]
    monkeypatch.setattr(model, "__init__", raising(AssertionError("the model was built")))
    field, missing = {"gpt2": ("n_layer", "h.1.ln_1.weight"),
                      "bert": ("num_hidden_layers", "encoder.layer.1.attention.self.query.weight")}[family]
    raises(CheckpointError, f"{directory}: {config} says {field}={layers}, but the checkpoint holds 1 layer(s): "
                            f"it has no {missing}", call=lambda: model.from_pretrained(directory))


def test_config_with_fewer_layers_than_the_checkpoint_gets_the_full_report(tmp_path):
    """Building fewer layers costs nothing, so the loader reports everything that does not fit: the left-over
    layer's tensors as the file spells them (the legacy layout: `bert.` prefix, gamma/beta)."""
    torch.manual_seed(0)
    reference = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=29, hidden_size=15, num_hidden_layers=3, num_attention_heads=3, intermediate_size=7))
    state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
             for k, v in reference.state_dict().items()}
    save_file({k: v.clone() for k, v in state.items() if not k.startswith("cls.predictions.decoder.")},
              tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(reference.config.to_dict() | {"num_hidden_layers": 2}))
    raises(CheckpointError, "num_hidden_layers=2", "unexpected tensor(s) in the checkpoint",
           "bert.encoder.layer.2.attention.output.LayerNorm.gamma (15,)",
           call=lambda: BertModel.from_pretrained(tmp_path))


def test_a_gap_in_the_layers_is_left_to_the_full_report(copy_of, saved):
    """Layers 0 and 2 of 3: the count agrees, so the loader lists what layer 1 lacks."""
    directory = copy_of("gpt2")
    write_changed_config(directory, n_layer=3)
    state = load_file(directory / "model.safetensors")
    state |= {k.replace(".h.0.", ".h.2."): v.clone() for k, v in state.items() if ".h.0." in k}
    save_file(state, directory / "model.safetensors")
    raises(CheckpointError, "n_layer=3", "tensor(s) missing from the checkpoint", "h.1.ln_1.weight",
           call=lambda: GPT2Model.from_pretrained(directory))


# ------------------------------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype, fragment", [
    (torch.float8_e4m3fn, "torch.float8_e4m3fn is not supported"),
    (torch.float8_e5m2, "torch.float8_e5m2 is not supported"),
    (torch.int8, "torch.int8 is not a floating-point type"),
    (torch.int64, "torch.int64 is not a floating-point type"),
    (torch.bool, "torch.bool is not a floating-point type"),
    (torch.complex64, "torch.complex64 is not a floating-point type"),
    ("float8_e4m3fn", "'float8_e4m3fn' is not supported"),
    ("int8", "'int8' is not supported"),
    ("fp16", "'fp16' is not supported"),
    (16, "16 is not supported"),
])
def test_dtypes_we_do_not_compute_in_are_refused_before_any_tensor_is_read(tmp_path, monkeypatch, saved, gpt2,
                                                                          dtype, fragment):
    monkeypatch.setattr("weight_mapping.readers.Checkpoint.tensor", raising(AssertionError("a tensor was read")))
    supported = "use one of float32, float16, bfloat16, float64"
    raises(ValueError, f"dtype {fragment}; {supported}", call=lambda: GPT2Model.from_pretrained(saved["gpt2"],
                                                                                                dtype=dtype))
    raises(ValueError, f"dtype {fragment}; {supported}", call=lambda: gpt2.save_pretrained(tmp_path / "out",
                                                                                          dtype=dtype))
    assert list(tmp_path.iterdir()) == []


def test_float64_works_end_to_end_by_name_or_dtype(tmp_path, saved):
    """float64 computes what transformers computes in float64, saves, and transformers reads the file back."""
    by_name = GPT2LMHeadModel.from_pretrained(saved["gpt2"], dtype="float64")
    assert same_state(by_name, GPT2LMHeadModel.from_pretrained(saved["gpt2"], dtype=torch.float64))
    reference = transformers.GPT2LMHeadModel.from_pretrained(saved["gpt2"], dtype=torch.float64).eval()
    input_ids = torch.tensor([[1, 5, 7, 28, 3]])
    with torch.no_grad():
        ours = by_name(input_ids=input_ids).logits
        assert ours.dtype == torch.float64
        assert_parity(ours, reference(input_ids=input_ids).logits, "float64 logits")
    by_name.save_pretrained(tmp_path / "out", dtype="float64")
    assert transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").dtype == torch.float64
    assert same_state(by_name, GPT2LMHeadModel.from_pretrained(tmp_path / "out"))


# ------------------------------------------------------------------------------------------------------- shards


def rewrite_index(directory: Path, rename) -> Path:
    """Point every entry of the index at `rename(shard name)`; returns the index."""
    index = directory / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weight_map"] = {key: rename(shard) for key, shard in content["weight_map"].items()}
    index.write_text(json.dumps(content))
    return index


@pytest.mark.parametrize("spelling", ["absolute", "../outside/{}", "sub/../../outside/{}"])
def test_shard_outside_the_checkpoint_is_refused_before_it_is_looked_at(tmp_path, monkeypatch, spelling):
    directory = sharded("gpt2", tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    moved = sorted(directory.glob("model-*.safetensors"))[1].name
    shutil.move(directory / moved, outside / moved)
    shard = str(outside / moved) if spelling == "absolute" else spelling.format(moved)
    index = rewrite_index(directory, lambda name: shard if name == moved else name)
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        assert not inside(path, outside), f"{path} was looked at"
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    raises(CheckpointError, f"{index}: tensor ", f"is placed in shard {shard!r}, which is not a file name inside "
                                                 f"{directory}", call=lambda: GPT2Model.from_pretrained(directory))


def test_hub_index_naming_a_shard_outside_the_repository_fetches_nothing(tmp_path, monkeypatch):
    """The fake hub answers only for the files named here: asking it for the shard would fail the test."""
    directory = sharded("gpt2", tmp_path)
    index = rewrite_index(directory, lambda name: "../" + name)
    fake_hub(monkeypatch, {"config.json": directory / "config.json",
                           "model.safetensors": http_error(RemoteEntryNotFoundError, 404),
                           "model.safetensors.index.json": index})
    raises(CheckpointError, f"{index}: tensor ", "is placed in shard '../model-0000",
           call=lambda: GPT2Model.from_pretrained("org/model"))


def test_shards_in_a_subfolder_load_as_transformers_loads_them(tmp_path):
    """transformers joins an index's shard names to the checkpoint directory, so "sub/x.safetensors" works."""
    directory = sharded("gpt2", tmp_path)
    flat = GPT2LMHeadModel.from_pretrained(directory)
    (directory / "sub").mkdir()
    for shard in directory.glob("model-*.safetensors"):
        shard.rename(directory / "sub" / shard.name)
    rewrite_index(directory, lambda name: f"sub/{name}")
    ours = GPT2LMHeadModel.from_pretrained(directory)
    assert same_state(ours, flat)
    assert all(Path(f).parent == directory / "sub" for f in ours.loading_info.files)
    _, info = transformers.GPT2LMHeadModel.from_pretrained(directory, output_loading_info=True)
    assert not any(info.values())


def test_one_shard_spelled_two_ways_is_opened_once(tmp_path):
    directory = sharded("bert", tmp_path)
    index = directory / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    shards = list(content["weight_map"].values())
    fullest = max(shards, key=shards.count)
    assert shards.count(fullest) > 1
    content["weight_map"][next(k for k, shard in content["weight_map"].items() if shard == fullest)] = f"./{fullest}"
    index.write_text(json.dumps(content))
    model = BertForMaskedLM.from_pretrained(directory)
    assert len(model.loading_info.files) == len(list(directory.glob("model-*.safetensors")))


def test_tensor_the_index_does_not_list(tmp_path):
    directory = sharded("gpt2", tmp_path)
    index = directory / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    key, shard = next(iter(content["weight_map"].items()))
    del content["weight_map"][key]
    index.write_text(json.dumps(content))
    raises(CheckpointError, f"{directory / shard}: holds tensor {key!r}, which the index {index} does not list",
           call=lambda: GPT2Model.from_pretrained(directory))


def test_deeply_nested_index_names_the_index(tmp_path):
    directory = sharded("bert", tmp_path)
    index = directory / "model.safetensors.index.json"
    index.write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    raises(CheckpointError, f"{index}: not a sharded-checkpoint index (RecursionError",
           call=lambda: BertModel.from_pretrained(directory))
