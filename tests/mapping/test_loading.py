"""Readers and the mapping layer: hub ids through a local Hugging Face cache, bad checkpoints, bad configs."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from scratch_models import BertConfig, BertModel, CheckpointError, ConfigError
from weight_mapping import embedded_checkpoint
from helpers import fake_hub_cache, hub_model_available

MINILM = embedded_checkpoint()
REPO = Path(__file__).resolve().parents[2]


def run_offline(code: str, cache: Path) -> subprocess.CompletedProcess:
    """huggingface_hub reads HF_HUB_OFFLINE and the cache path at import, so test it in a fresh process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_hub_id_resolves_from_the_local_cache_offline(tmp_path):
    fake_hub_cache(tmp_path, "sentence-transformers/all-MiniLM-L6-v2",
                   {"config.json": MINILM / "config.json", "model.safetensors": MINILM / "model.safetensors"})
    done = run_offline("""
        import sys, torch
        from scratch_models import BertModel
        model = BertModel.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")
        print(model.loading_info.files[0], len(model.layers), 'transformers' in sys.modules)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    file, layers, imported = done.stdout.split()
    assert file.startswith(str(tmp_path)) and layers == "6" and imported == "False"


def test_hub_id_offline_and_not_cached_says_so(tmp_path):
    done = run_offline("""
        from scratch_models import BertModel
        BertModel.from_pretrained("google-bert/bert-base-uncased")
    """, tmp_path)
    assert done.returncode != 0
    assert "NotCached: google-bert/bert-base-uncased: no such local path, and config.json is not in the local " \
        "Hugging Face cache" in done.stderr and "while HF_HUB_OFFLINE is set. Download it once" in done.stderr


def test_hub_sharded_weights_missing_from_cache_named(tmp_path):
    index = tmp_path / "src" / "model.safetensors.index.json"
    index.parent.mkdir()
    index.write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}))
    fake_hub_cache(tmp_path / "cache", "org/sharded", {"config.json": MINILM / "config.json",
                                                        "model.safetensors.index.json": index})
    done = run_offline("""
        from scratch_models import BertModel
        BertModel.from_pretrained("org/sharded")
    """, tmp_path / "cache")
    assert "model-00001-of-00002.safetensors is not in the local Hugging Face cache" in done.stderr


@pytest.mark.skipif(not hub_model_available("bert-base-uncased"),
                    reason="bert-base-uncased is not in the local Hugging Face cache and huggingface.co is "
                           "unreachable (no network to the model hub here)")
def test_bert_base_uncased_from_the_hub():
    from scratch_models import BertForMaskedLM
    from scratch_models_cli.verify import verify

    report = verify("bert-base-uncased")
    assert report.passed, report.format()
    assert report.rows[-1].name == "logits"
    model = BertForMaskedLM.from_pretrained("bert-base-uncased")
    assert model.loading_info.prefixed and model.loading_info.legacy_names > 0


def small_checkpoint(directory: Path) -> dict:
    config = transformers.BertConfig(vocab_size=50, hidden_size=48, num_hidden_layers=1, num_attention_heads=3,
                                     intermediate_size=37)
    transformers.BertModel(config).save_pretrained(directory)
    return load_file(directory / "model.safetensors")


def test_missing_unexpected_and_misshaped_tensors_are_all_listed(tmp_path):
    state = small_checkpoint(tmp_path)
    del state["encoder.layer.0.attention.self.key.bias"]
    state["encoder.layer.0.attention.self.extra.weight"] = torch.zeros(2, 3)
    state["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(36, 48)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as error:
        BertModel.from_pretrained(tmp_path)
    message = str(error.value)
    assert "encoder.layer.0.intermediate.dense.weight: (36, 48) in the checkpoint, (37, 48) expected" in message
    assert "encoder.layer.0.attention.self.key.bias (48,) (our encoder.layers.0.attn.key.bias)" in message
    assert "encoder.layer.0.attention.self.extra.weight (2, 3)" in message


def test_layer_count_disagreeing_with_config(tmp_path):
    small_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 2}))
    with pytest.raises(CheckpointError, match=r"num_hidden_layers=2[\s\S]*encoder\.layer\.1\.attention"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported"),
    ({"hidden_act": "gelu_11"}, "hidden_act='gelu_11' is not supported"),
    ({"num_attention_heads": 5}, "hidden_size 48 is not divisible by num_attention_heads 5"),
    ({"hidden_size": "48"}, "field 'hidden_size' should be int, got '48'"),
    ({"model_type": "gpt2"}, "model_type is 'gpt2', but BertConfig needs 'bert'"),
    ({"is_decoder": True}, "is_decoder=True is not supported"),
])
def test_config_refusals_name_the_field(tmp_path, change, message):
    small_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("value, ok", [(7, True), ([7, 9], True), (None, True), ("7", False), (True, False),
                                       (7.0, False)])
def test_a_field_of_several_kinds_takes_each_and_names_them_all(value, ok):
    """Llama 3.1's config.json gives eos_token_id as a list of ids, older ones as one id: a field typed
    `int | list | None` takes both (and null), and anything else is named with every kind it may be."""
    import dataclasses

    from scratch_models.parts.config import ModelConfig

    @dataclasses.dataclass(frozen=True)
    class Config(ModelConfig):
        eos_token_id: int | list | None = None
        id2label: dict | None = None

    if ok:
        assert Config.from_dict({"eos_token_id": value}).eos_token_id == value
    else:
        with pytest.raises(ConfigError, match="field 'eos_token_id' should be int or list or null"):
            Config.from_dict({"eos_token_id": value})


def test_config_missing_required_field():
    with pytest.raises(ConfigError, match="required field 'vocab_size' is missing"):
        BertConfig.from_dict({"hidden_size": 48, "num_hidden_layers": 1, "num_attention_heads": 3,
                              "intermediate_size": 37})


def test_bin_that_would_run_code_is_refused_and_never_runs(tmp_path):
    small_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"embeddings.word_embeddings.weight": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused"):
        BertModel.from_pretrained(tmp_path)
    assert not marker.exists()


def test_paths_that_do_not_exist(tmp_path):
    with pytest.raises(CheckpointError, match="no such file or directory"):
        BertModel.from_pretrained(tmp_path / "nowhere" / "model.safetensors")
    with pytest.raises(CheckpointError, match="no weights file"):
        (tmp_path / "config.json").write_text("{}")
        BertModel.from_pretrained(tmp_path)


def test_forward_input_errors_name_the_argument():
    model = BertModel(BertConfig(vocab_size=50, hidden_size=48, num_hidden_layers=1, num_attention_heads=3,
                                 intermediate_size=37, max_position_embeddings=16)).eval()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"input_ids\[0, 2\] = 50 is out of range: must be 0 <= id < vocab_size"):
        model(torch.tensor([[1, 2, 50]]))
    with pytest.raises(ValueError, match="20 positions; this model has max_position_embeddings=16"):
        model(torch.ones(1, 20, dtype=torch.long))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 4\), expected \(1, 3\)"):
        model(ids, attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="input_ids must hold integers"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"token_type_ids\[0, 0\] = 2 is out of range"):
        model(ids, token_type_ids=torch.full((1, 3), 2))


@pytest.mark.slow
def test_import_does_not_load_transformers():
    done = subprocess.run([sys.executable, "-c", "import sys, scratch_models, weight_mapping; "
                           "print('transformers' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
    statement = re.compile(r"^\s*(import|from)\s+transformers\b", re.MULTILINE)
    for package in ("scratch_models", "weight_mapping"):
        for file in (REPO / package).rglob("*.py"):
            assert not statement.search(file.read_text()), f"{file} imports transformers"


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    command = next(line.strip() for line in ci.splitlines() if "pytest" in line)
    assert command in readme


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_parity_against_transformers_same_dtype(dtype):
    from scratch_models_cli.verify import verify

    report = verify(device="cuda", dtype=dtype)
    assert report.passed, report.format()


@pytest.mark.slow
def test_skipped_tests_say_why_without_asking(tmp_path):
    """The README's test command prints each skip's reason: pyproject's pytest options ask for it."""
    (tmp_path / "test_skips.py").write_text("import pytest\n\n\ndef test_needs_a_gpu():\n"
                                            "    pytest.skip('no CUDA device on this machine')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path / "test_skips.py")],
                          capture_output=True, text=True, timeout=120)
    assert "SKIPPED [1] " in done.stdout and "no CUDA device on this machine" in done.stdout, done.stdout


def test_a_left_out_module_is_skipped_once_noted_and_the_longest_prefix_is_stripped(tmp_path):
    """A table that reads a language model inside a bigger checkpoint (a multimodal file: `model.language_model.`
    before the layers, a vision tower beside them): the longest base prefix that fits is stripped (`model.` alone
    would leave `language_model.` on every key), every tensor under a `left_out` module is skipped for its reason,
    the notes say so once with the count, and the summary gives those hundreds of keys one line."""
    import dataclasses

    from weight_mapping import load_state, open_checkpoint
    from weight_mapping.gemma2 import GEMMA2

    table = dataclasses.replace(GEMMA2, head_prefixes=("model.language_model.",),
                                left_out={"vision_tower": "an image encoder, not built here"})
    assert table.normalize("model.language_model.layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    assert table.normalize("model.vision_tower.encoder.weight") == "vision_tower.encoder.weight"
    names = {"embed_tokens.weight": (5, 4), "norm.weight": (4,)}
    tensors = {f"model.language_model.{key}": torch.ones(shape) for key, shape in names.items()}
    tensors |= {f"model.vision_tower.block.{n}.weight": torch.zeros(2) for n in range(5)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text("{}")
    expected = {"embeddings.embed_tokens.weight": torch.Size((5, 4)), "norm_f.weight": torch.Size((4,))}
    state, info = load_state(table, open_checkpoint(tmp_path), expected, 0, model_name="M", tied=False)
    assert set(state) == set(expected) and info.loaded["norm_f.weight"] == "model.language_model.norm.weight"
    assert info.ignored == {f"model.vision_tower.block.{n}.weight": "an image encoder, not built here"
                            for n in range(5)}
    assert info.notes == ["left out vision_tower (5 tensors): an image encoder, not built here"]
    assert ("ignored 5 tensors (model.vision_tower.block.0.weight, model.vision_tower.block.1.weight, "
            "model.vision_tower.block.2.weight, ...): an image encoder, not built here") in info.summary()
    # without left_out the same tensors are unexpected, named
    with pytest.raises(CheckpointError, match="model.vision_tower.block.0.weight"):
        load_state(dataclasses.replace(table, left_out={}), open_checkpoint(tmp_path), expected, 0, model_name="M",
                   tied=False)
