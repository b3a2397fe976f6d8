"""Every bad checkpoint and every bad input gets a clear error that names the culprit; nothing half-done survives.

Bad checkpoints raise CheckpointError or ConfigError naming the file, key or shape; bad arguments to forward and
generate raise ValueError naming the argument and the limit. Where transformers answers differently, the test
says how. Tiny odd configs (hidden 15, 3 heads, vocab 29, 9 positions), saved by transformers itself.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RemoteEntryNotFoundError
from safetensors.torch import load_file, save_file

from scratch_models import BertForMaskedLM, BertModel, CheckpointError, ConfigError, GPT2LMHeadModel, GPT2Model
from helpers import LOGITS_ATOL, assert_parity, fake_hub, http_error

VOCAB, POSITIONS = 29, 9
BERT_CONFIG = dict(vocab_size=VOCAB, hidden_size=15, num_hidden_layers=1, num_attention_heads=3, intermediate_size=7,
                   max_position_embeddings=POSITIONS, type_vocab_size=2)
GPT2_CONFIG = dict(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=15, n_layer=1, n_head=3, bos_token_id=28,
                   eos_token_id=28)
MODELS = {"bert": BertForMaskedLM, "gpt2": GPT2LMHeadModel}
BASES = {"bert": BertModel, "gpt2": GPT2Model}
REFERENCES = {"bert": transformers.BertForMaskedLM, "gpt2": transformers.GPT2LMHeadModel}
OTHER = {"bert": "gpt2", "gpt2": "bert"}
FAMILIES = pytest.mark.parametrize("family", ["bert", "gpt2"])


def hf_model(family: str):
    torch.manual_seed(0)
    config = transformers.BertConfig(**BERT_CONFIG) if family == "bert" else transformers.GPT2Config(**GPT2_CONFIG)
    return REFERENCES[family]._from_config(config).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Per family, a checkpoint as transformers' save_pretrained writes it (config.json, model.safetensors)."""
    root = tmp_path_factory.mktemp("saved")
    for family in MODELS:
        hf_model(family).save_pretrained(root / family)
    return {family: root / family for family in MODELS}


@pytest.fixture
def checkpoint(saved, tmp_path):
    """`checkpoint(family)`: a fresh copy of the saved checkpoint, free to break."""
    def copy(family: str) -> Path:
        return Path(shutil.copytree(saved[family], tmp_path / family))
    return copy


@pytest.fixture(scope="module")
def models(saved) -> dict:
    return {family: MODELS[family].from_pretrained(saved[family]) for family in MODELS}


def raises(exception, *fragments: str, call):
    """Assert `call()` raises `exception` and its message contains every fragment; return the message."""
    with pytest.raises(exception) as error:
        call()
    message = str(error.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the message:\n{message}"
    return message


# ---------------------------------------------------------------------------------------------- bad checkpoints


CORRUPTIONS = {
    "truncated to half": (lambda data: data[:len(data) // 2], "file not fully covered"),
    "one byte short": (lambda data: data[:-1], "file not fully covered"),
    "header cut": (lambda data: data[:5], "header"),
    "random bytes": (lambda data: os.urandom(len(data)), "header"),
}


@FAMILIES
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_safetensors_names_the_file(checkpoint, family, corruption):
    directory = checkpoint(family)
    cut, reason = CORRUPTIONS[corruption]
    weights = directory / "model.safetensors"
    weights.write_bytes(cut(weights.read_bytes()))
    raises(CheckpointError, f"{weights}: not a readable safetensors file", reason,
           call=lambda: MODELS[family].from_pretrained(directory))


@FAMILIES
def test_truncated_bin_names_the_file(checkpoint, family):
    directory = checkpoint(family)
    weights = directory / "pytorch_model.bin"
    torch.save(load_file(directory / "model.safetensors"), weights)
    (directory / "model.safetensors").unlink()
    weights.write_bytes(weights.read_bytes()[:1000])
    raises(CheckpointError, f"{weights}: not a readable PyTorch weights file",
           call=lambda: MODELS[family].from_pretrained(directory))


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_empty_weights_file(checkpoint, name):
    directory = checkpoint("bert")
    (directory / "model.safetensors").unlink()
    (directory / name).write_bytes(b"")
    raises(CheckpointError, f"{directory / name}: the file is empty", call=lambda: BertModel.from_pretrained(directory))


def test_directory_without_weights(checkpoint):
    directory = checkpoint("gpt2")
    (directory / "model.safetensors").rename(directory / "tf_model.h5")
    raises(CheckpointError, f"{directory}: no weights file; looked for model.safetensors,",
           "holds config.json, generation_config.json, tf_model.h5", call=lambda: GPT2Model.from_pretrained(directory))


@FAMILIES
def test_checkpoint_of_the_other_architecture(saved, family):
    """transformers warns and loads it anyway, every weight at random; we refuse, from config.json's model_type."""
    other = OTHER[family]
    raises(ConfigError, f"{saved[other] / 'config.json'}: model_type is {other!r}",
           "another architecture", call=lambda: MODELS[family].from_pretrained(saved[other]))


@FAMILIES
def test_weights_of_the_other_architecture_under_our_config(checkpoint, saved, family):
    """The other family's weights beside a config.json of ours: every tensor unexpected, every tensor missing."""
    directory = checkpoint(OTHER[family])
    shutil.copy(saved[family] / "config.json", directory / "config.json")
    foreign = "transformer.wte.weight" if family == "bert" else "bert.embeddings.word_embeddings.weight"
    raises(CheckpointError, f"{directory}: checkpoint does not fit", f"{foreign} (29, 15)",
           f"none of the checkpoint's tensors is in the {family} table: is this a checkpoint of another architecture?",
           call=lambda: MODELS[family].from_pretrained(directory))


@pytest.mark.parametrize("family, field, value, tensor, stored, wanted", [
    ("bert", "intermediate_size", 8, "bert.encoder.layer.0.intermediate.dense.weight", (7, 15), (8, 15)),
    ("gpt2", "n_positions", 12, "transformer.wpe.weight", (9, 15), (12, 15)),
])
def test_tensor_shape_disagreeing_with_config(checkpoint, family, field, value, tensor, stored, wanted):
    directory = checkpoint(family)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {field: value}))
    raises(CheckpointError, f"{tensor}: {stored} in the checkpoint, {wanted} expected from config.json",
           call=lambda: MODELS[family].from_pretrained(directory))


def test_tensor_that_is_not_floating_point(checkpoint):
    directory = checkpoint("gpt2")
    state = load_file(directory / "model.safetensors")
    state["transformer.ln_f.bias"] = torch.zeros(15, dtype=torch.int64)
    save_file(state, directory / "model.safetensors")
    raises(CheckpointError, "'transformer.ln_f.bias' has dtype torch.int64", "floating-point",
           call=lambda: GPT2LMHeadModel.from_pretrained(directory))


def test_tensors_in_mixed_dtypes_need_a_dtype(checkpoint):
    """A model of mixed dtypes would fail at its first matmul; with dtype= every tensor is cast, and it loads."""
    directory = checkpoint("bert")
    state = load_file(directory / "model.safetensors")
    state["bert.embeddings.LayerNorm.weight"] = state["bert.embeddings.LayerNorm.weight"].half()
    save_file(state, directory / "model.safetensors")
    raises(CheckpointError, "several dtypes", "torch.float16 such as 'bert.embeddings.LayerNorm.weight'",
           "pass dtype=", call=lambda: BertModel.from_pretrained(directory))
    model = BertModel.from_pretrained(directory, dtype=torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


BAD_CONFIGS = {
    # name: (write it, exception, message fragments, after the config path)
    "missing": (lambda path: path.unlink(), CheckpointError, "config.json not found beside the weights"),
    "not JSON": (lambda path: path.write_text('{"vocab_size": 29,'), ConfigError, "not valid JSON"),
    "not UTF-8": (lambda path: path.write_bytes(b"\xff\xfe{}"), ConfigError, "cannot read config.json"),
    "a list": (lambda path: path.write_text("[]"), ConfigError, "expected a JSON object, got list"),
    "NaN epsilon": (lambda path: path.write_text(path.read_text().replace('"layer_norm_eps": 1e-12',
                                                                        '"layer_norm_eps": NaN')),
                    ConfigError, "field 'layer_norm_eps' must be positive and finite, got nan"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_json_names_the_file(checkpoint, case):
    directory = checkpoint("bert")
    write, exception, fragment = BAD_CONFIGS[case]
    write(directory / "config.json")
    raises(exception, f"{directory / 'config.json'}: {fragment}", call=lambda: BertModel.from_pretrained(directory))


@pytest.mark.parametrize("family, field", [("bert", "hidden_size"), ("bert", "num_attention_heads"),
                                           ("gpt2", "n_embd"), ("gpt2", "n_layer")])
def test_config_lacking_a_required_field(checkpoint, family, field):
    directory = checkpoint(family)
    config = json.loads((directory / "config.json").read_text())
    del config[field]
    (directory / "config.json").write_text(json.dumps(config))
    raises(ConfigError, f"{directory / 'config.json'}: required field {field!r} is missing",
           call=lambda: MODELS[family].from_pretrained(directory))


class RunsCode:
    """Unpickling this runs `touch marker`: what a malicious .bin would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("where", ["second shard of an index", "the whole file"])
def test_bin_that_would_run_code_is_refused_before_it_runs(checkpoint, tmp_path, where):
    directory = checkpoint("gpt2")
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
        torch.save({k: state[k] for k in keys[3:]} | {"transformer.wte.weight": RunsCode(marker)}, bad)
        index = {"weight_map": {k: (first if k in keys[:3] else bad).name for k in keys}}
        (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    raises(CheckpointError, f"{bad}: refused", "would run code",
           call=lambda: GPT2LMHeadModel.from_pretrained(directory))
    assert not marker.exists()


def sharded(family: str, tmp_path: Path) -> Path:
    """The family's model saved by transformers in shards of at most 2 KB, with model.safetensors.index.json."""
    directory = tmp_path / "sharded"
    hf_model(family).save_pretrained(directory, max_shard_size="2KB")
    assert len(list(directory.glob("model-*.safetensors"))) > 2
    return directory


@FAMILIES
def test_sharded_index_naming_a_missing_shard(tmp_path, family):
    """transformers answers with a bare FileNotFoundError for the shard; we name the index too."""
    directory = sharded(family, tmp_path)
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.unlink()
    index = directory / "model.safetensors.index.json"
    raises(CheckpointError, f"{index}: names shard {shard.name!r}, which is not in {directory}",
           call=lambda: MODELS[family].from_pretrained(directory))


@pytest.mark.parametrize("index, fragment", [
    ("{", "not a sharded-checkpoint index (JSONDecodeError"),
    ('{"metadata": {}}', "not a sharded-checkpoint index (KeyError"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}', "weight_map should map tensor names to shard file names"),
])
def test_unreadable_sharded_index(tmp_path, index, fragment):
    directory = sharded("bert", tmp_path)
    (directory / "model.safetensors.index.json").write_text(index)
    raises(CheckpointError, f"{directory / 'model.safetensors.index.json'}: {fragment}",
           call=lambda: BertModel.from_pretrained(directory))


def test_path_that_does_not_exist(tmp_path):
    """transformers takes a missing absolute path for a malformed hub id and says so."""
    raises(CheckpointError, f"{tmp_path / 'nowhere'}: no such file or directory, and not a hub model id",
           call=lambda: BertModel.from_pretrained(tmp_path / "nowhere"))


def test_name_that_is_neither_a_path_nor_a_valid_hub_id():
    raises(CheckpointError, "a--b: no such local path, and not a valid hub model id",
           call=lambda: GPT2Model.from_pretrained("a--b"))


def test_offline_with_nothing_cached_names_the_file_and_the_cache(monkeypatch):
    """A bare name is tried as a hub id: the message also says there is no such local path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub(monkeypatch, {"config.json": LocalEntryNotFoundError("not cached")})
    raises(CheckpointError, "no-such-model: no such local path, and config.json is not in the local Hugging Face "
           "cache (", ") while HF_HUB_OFFLINE is set. Download it once with network access", "use `minilm`",
           call=lambda: BertModel.from_pretrained("no-such-model"))


def test_hub_unreachable_with_weights_not_cached(monkeypatch, saved):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    fake_hub(monkeypatch, {"config.json": saved["bert"] / "config.json"}
             | {name: LocalEntryNotFoundError("not cached") for name in (
                 "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")})
    raises(CheckpointError, "org/model: no such local path, and model.safetensors / model.safetensors.index.json / "
           "pytorch_model.bin", "while the hub could not be reached; set HF_HUB_OFFLINE=1 to skip trying the hub",
           call=lambda: BertModel.from_pretrained("org/model"))


@pytest.mark.parametrize("error, fragment", [
    (http_error(GatedRepoError, 403), "org/model: the hub model is gated"),
    (http_error(RemoteEntryNotFoundError, 404), "org/model: the hub repository has no config.json"),
])
def test_hub_refusals_name_the_model(monkeypatch, error, fragment):
    fake_hub(monkeypatch, {"config.json": error})
    raises(CheckpointError, fragment, call=lambda: GPT2Model.from_pretrained("org/model"))


def test_hub_index_naming_a_shard_the_repository_lacks(monkeypatch, tmp_path):
    directory = sharded("gpt2", tmp_path)
    fake_hub(monkeypatch, {"config.json": directory / "config.json",
                           "model.safetensors": http_error(RemoteEntryNotFoundError, 404),
                           "model.safetensors.index.json": directory / "model.safetensors.index.json"}
             | {p.name: (http_error(RemoteEntryNotFoundError, 404) if p.name.startswith("model-00002") else p)
                for p in directory.glob("model-*.safetensors")})
    raises(CheckpointError, "names shard 'model-00002-of-", "which the hub repository org/model lacks",
           call=lambda: GPT2Model.from_pretrained("org/model"))


# -------------------------------------------------------------------------------------------------- bad inputs


def call(models, family, **arguments):
    return lambda: models[family](**arguments)


IDS = torch.tensor([[1, 2, 3], [4, 5, 6]])


@FAMILIES
@pytest.mark.parametrize("bad, where", [(VOCAB, [1, 2]), (-1, [0, 1])], ids=["vocab_size", "negative"])
def test_token_id_out_of_range(models, family, bad, where):
    """transformers: a bare IndexError ("index out of range in self") on CPU, a device-side assert on CUDA."""
    ids = IDS.clone()
    ids[tuple(where)] = bad
    raises(ValueError, f"input_ids{where} = {bad} is out of range: must be 0 <= id < vocab_size = {VOCAB}",
           call=call(models, family, input_ids=ids))


@FAMILIES
def test_label_out_of_range(models, family):
    labels = IDS.clone()
    labels[0, 0] = -100  # not scored: legal
    labels[1, 2] = VOCAB
    raises(ValueError, f"labels[1, 2] = {VOCAB} is out of range: must be 0 <= id < vocab_size = {VOCAB} (or -100",
           call=call(models, family, input_ids=IDS, labels=labels))


def test_token_type_out_of_range(models):
    raises(ValueError, "token_type_ids[0, 1] = 2 is out of range: must be 0 <= id < type_vocab_size = 2",
           call=call(models, "bert", input_ids=IDS, token_type_ids=torch.tensor([[0, 2, 0], [1, 1, 1]])))


@pytest.mark.parametrize("family, fragment", [
    ("bert", "input_ids has 10 positions; this model has max_position_embeddings=9, so a sequence may be at most "
             "9 tokens long"),
    ("gpt2", "0 cached and 10 new tokens need positions up to 9; this model has n_positions=9, so at most 9 tokens "
             "fit"),
])
def test_sequence_longer_than_the_position_table(models, family, fragment):
    """transformers: BERT a RuntimeError about expanding a tensor, GPT-2 a bare IndexError."""
    raises(ValueError, fragment, call=call(models, family, input_ids=torch.ones(1, POSITIONS + 1, dtype=torch.long)))


@FAMILIES
def test_position_ids_past_the_table(models, family):
    limit = "max_position_embeddings" if family == "bert" else "n_positions"
    raises(ValueError, f"position_ids[0, 2] = {POSITIONS} is out of range: must be 0 <= id < {limit} = {POSITIONS}",
           call=call(models, family, input_ids=IDS, position_ids=torch.tensor([[0, 1, POSITIONS]])))


def test_cache_and_new_tokens_longer_than_the_table(models):
    model = models["gpt2"]
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


@FAMILIES
@pytest.mark.parametrize("case", list(WRONG_ARGUMENTS))
def test_argument_of_the_wrong_shape_or_dtype(models, family, case):
    arguments, fragment = WRONG_ARGUMENTS[case]
    raises(ValueError, fragment, call=call(models, family, input_ids=IDS, **arguments))


@pytest.mark.parametrize("token_type_ids, fragment", [
    (torch.zeros(1, 3, dtype=torch.long), "token_type_ids has shape (1, 3), expected (2, 3)"),
    (torch.zeros(2, 3), "token_type_ids must hold integers (torch.long), got dtype torch.float32"),
])
def test_token_type_ids_of_the_wrong_shape_or_dtype(models, token_type_ids, fragment):
    raises(ValueError, fragment, call=call(models, "bert", input_ids=IDS, token_type_ids=token_type_ids))


@FAMILIES
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


def test_cache_of_the_wrong_kind_or_batch(models):
    model = models["gpt2"]
    raises(ValueError, "past_key_values must be a KVCache (as returned with use_cache=True), got tuple",
           call=lambda: model(IDS, past_key_values=((torch.zeros(1),),)))
    with torch.no_grad():
        cache = model(IDS, use_cache=True).past_key_values
    raises(ValueError, "input_ids has batch size 1, but past_key_values holds 2 rows",
           call=lambda: model(IDS[:1], past_key_values=cache))


def test_a_bad_call_leaves_the_cache_as_it_was(models):
    model = models["gpt2"]
    with torch.no_grad():
        untouched = model(IDS[:, :2], use_cache=True).past_key_values
        expected = model(IDS[:, 2:], past_key_values=untouched).logits
        cache = model(IDS[:, :2], use_cache=True).past_key_values
        for bad in (dict(attention_mask=torch.ones(2, 4)), dict(labels=torch.full((2, 1), VOCAB)),
                    dict(position_ids=torch.tensor([[POSITIONS]]))):
            with pytest.raises(ValueError):
                model(IDS[:, 2:], past_key_values=cache, **bad)
            assert cache.length == 2
        resumed = model(IDS[:, 2:], past_key_values=cache).logits
    assert torch.equal(resumed, expected)


@FAMILIES
def test_all_zero_mask_row_is_finite_and_attends_to_nothing(saved, models, family):
    """A row with nothing to attend to gets zero weights and a zero context on both of our paths, as transformers'
    default SDPA attention gives it (its eager path spreads it evenly instead); documented in forward's
    docstring. The other row matches eager attention too."""
    reference = REFERENCES[family].from_pretrained(saved[family], attn_implementation="eager").eval()
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    model = models[family]
    with torch.no_grad():
        fused = model(IDS, attention_mask=mask)
        explicit = model(IDS, attention_mask=mask, output_attentions=True)
        ref = reference(IDS, attention_mask=mask, output_attentions=True)
        reference.set_attn_implementation("sdpa")
        ref_sdpa = reference(IDS, attention_mask=mask)
    assert bool(fused.logits.isfinite().all()) and bool(explicit.logits.isfinite().all())
    assert not explicit.attentions[0][1].any()
    assert torch.allclose(ref.attentions[0][1], torch.full((3, 3, 3), 1 / 3))
    assert_parity(explicit.logits[0], ref.logits[0], "logits of the real row, explicit attention", atol=LOGITS_ATOL)
    assert_parity(explicit.logits, ref_sdpa.logits, "logits, explicit attention against SDPA", atol=LOGITS_ATOL)
    assert_parity(fused.logits, ref_sdpa.logits, "logits, fused attention against SDPA", atol=LOGITS_ATOL)
    assert "all 0" in BASES[family].forward.__doc__


# -------------------------------------------------------------------------------------------------------- generate


def test_generate_past_the_position_table_says_how_many_fit(models):
    """transformers warns, then fails with a bare IndexError at the first position past the table."""
    model = models["gpt2"]
    assert model.generate(IDS, max_new_tokens=POSITIONS - 2).shape == (2, 3 + POSITIONS - 2)  # last one never fed
    raises(ValueError, "generating 8 tokens after these prompts reaches position 9; this model has n_positions=9, "
           "so at most max_new_tokens=7 fit", call=lambda: model.generate(IDS, max_new_tokens=8))
    raises(ValueError, "input_ids: the longest prompt has 10 tokens; this model has n_positions=9",
           call=lambda: model.generate(torch.ones(1, 10, dtype=torch.long)))


@pytest.mark.parametrize("arguments, fragment", [
    (dict(input_ids=IDS.float()), "input_ids must hold integers"),
    (dict(input_ids=IDS[:0]), "input_ids is empty (shape (0, 3))"),
    (dict(input_ids=torch.tensor([[1, VOCAB]])), f"input_ids[0, 1] = {VOCAB} is out of range"),
    (dict(input_ids=IDS, attention_mask=torch.ones(2, 4)), "attention_mask has shape (2, 4), expected (2, 3)"),
    (dict(input_ids=IDS, max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
    (dict(input_ids=IDS, max_new_tokens=True), "max_new_tokens must be a positive integer, got True"),
], ids=["float ids", "empty batch", "id past vocab", "mask shape", "no new tokens", "bool"])
def test_generate_arguments(models, arguments, fragment):
    raises(ValueError, fragment, call=lambda: models["gpt2"].generate(**arguments))


# ------------------------------------------------------------------------------------------------------------ CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@FAMILIES
def test_cuda_id_out_of_range_is_a_value_error_not_a_device_assert(saved, family):
    """The range check runs before the embedding lookup, so no device-side assert poisons the CUDA context:
    the same model still runs afterwards."""
    model = MODELS[family].from_pretrained(saved[family], device="cuda")
    ids = IDS.cuda()
    raises(ValueError, f"input_ids[1, 2] = {VOCAB} is out of range",
           call=lambda: model(torch.tensor([[1, 2, 3], [4, 5, VOCAB]], device="cuda")))
    with torch.no_grad():
        assert bool(model(ids).logits.isfinite().all())
    torch.cuda.synchronize()
