"""Loading and saving edges a new user and an adversarial run found (issue 23, item 2): each was a silent wrong
answer or a bare error, and is now refused by name, or loaded as transformers loads it.

Tiny odd configs (hidden 15, 3 heads, vocab 29), saved by transformers itself.
"""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from scratch_models import BertModel, CheckpointError, ConfigError, GPT2LMHeadModel, GPT2Model
from scratch_models_cli.cli import main
from helpers import assert_parity, randomize_

BERT_CONFIG = dict(vocab_size=29, hidden_size=15, num_hidden_layers=1, num_attention_heads=3, intermediate_size=7,
                   max_position_embeddings=9)
GPT2_CONFIG = dict(vocab_size=29, n_positions=9, n_embd=15, n_layer=2, n_head=3)
IDS = torch.tensor([[3, 7, 1, 0, 5], [2, 2, 8, 4, 0]])


def saved(directory, model, **config_changes):
    """`model` saved by transformers into `directory`, its config.json edited: None deletes a field."""
    model.save_pretrained(directory)
    path = directory / "config.json"
    config = json.loads(path.read_text()) | config_changes
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not None}))
    return directory


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize_(transformers.BertModel(transformers.BertConfig(**BERT_CONFIG)), 0.3).eval()
    return saved(tmp_path_factory.mktemp("bert"), model), model


# ------------------------------------------------------------------ a config of another architecture


@pytest.mark.parametrize("architectures, family", [(["RobertaModel"], "RoBERTa"),
                                                   (["GPT2LMHeadModel"], "GPT-2"),
                                                   (["XLMRobertaForMaskedLM", "RobertaModel"], "two others")])
def test_a_config_without_model_type_naming_another_architecture_is_refused(tmp_path, bert_dir, architectures,
                                                                            family):
    """RoBERTa's weights carry BERT's names: without model_type, BertModel would load them and compute something
    else (its positions start after the padding index). transformers' BertModel loads it in silence."""
    directory, reference = bert_dir
    saved(tmp_path, reference, model_type=None, architectures=architectures)
    with pytest.raises(ConfigError, match=rf"no model_type, and its architectures name {', '.join(architectures)}, "
                                          r"which is not a BERT class \(BertModel, BertForMaskedLM, .*\): a checkpoint "
                                          r"of another architecture .* add \"model_type\": \"bert\" to config.json"):
        BertModel.from_pretrained(tmp_path)
    assert main(["verify", str(tmp_path)]) == 2  # the command line refuses it too, by the same rule


@pytest.mark.parametrize("changes", [dict(model_type=None), dict(model_type=None, architectures=None),
                                     dict(model_type=None, architectures=["BertForMaskedLM"]),
                                     dict(architectures=["RobertaModel"])],
                         ids=["BertModel named", "nothing named", "a BERT head named", "model_type says bert"])
def test_a_config_that_names_bert_or_nothing_else_loads(tmp_path, bert_dir, changes):
    _, reference = bert_dir
    model = BertModel.from_pretrained(saved(tmp_path, reference, **changes))
    with torch.no_grad():
        assert_parity(model(IDS).last_hidden_state, reference(IDS).last_hidden_state, "last_hidden_state")


def test_gpt2_refuses_a_config_that_names_a_bert_class(tmp_path):
    model = transformers.GPT2Model(transformers.GPT2Config(**GPT2_CONFIG))
    saved(tmp_path, model, model_type=None, architectures=["BertModel"])
    with pytest.raises(ConfigError, match="architectures name BertModel, which is not a GPT-2 class"):
        GPT2Model.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------- float8


def float8_checkpoint(directory, bert_dir):
    """bert_dir's weights, every one stored as float8_e4m3fn (as a quantised upload stores them)."""
    source, _ = bert_dir
    state = {key: tensor.to(torch.float8_e4m3fn) for key, tensor in load_file(source / "model.safetensors").items()
             if tensor.is_floating_point()}
    directory.mkdir(exist_ok=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text((source / "config.json").read_text())
    return state


def test_a_float8_checkpoint_is_refused_at_load_naming_the_tensor_and_dtype(tmp_path, bert_dir, capsys):
    """Before: it loaded, then the first forward died with NotImplementedError deep in a matmul."""
    float8_checkpoint(tmp_path, bert_dir)
    with pytest.raises(CheckpointError, match=r"tensor 'embeddings\.[\w.]+' is stored as "
                                              r"torch\.float8_e4m3fn, which torch stores but does not compute a "
                                              r"forward pass in; pass dtype= \(--dtype\) to cast"):
        BertModel.from_pretrained(tmp_path)
    assert main(["convert", str(tmp_path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is stored as torch.float8_e4m3fn" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_float8_checkpoint_loads_cast_when_a_dtype_is_asked_for(tmp_path, bert_dir, dtype):
    state = float8_checkpoint(tmp_path, bert_dir)
    model = BertModel.from_pretrained(tmp_path, dtype=dtype)
    assert torch.equal(model.embeddings.word_embeddings.weight,
                       state["embeddings.word_embeddings.weight"].to(dtype))
    with torch.no_grad():
        assert torch.isfinite(model(IDS).last_hidden_state).all()
    name = str(dtype).removeprefix("torch.")
    assert main(["convert", str(tmp_path), str(tmp_path / "out"), "--dtype", name]) == 0
    assert torch.equal(BertModel.from_pretrained(tmp_path / "out").embeddings.word_embeddings.weight,
                       model.embeddings.word_embeddings.weight)


# ------------------------------------------------------------------------------------- pad_token_id


@pytest.mark.parametrize("pad", [29, 1000, -1])
def test_a_bert_pad_token_id_outside_the_vocabulary_is_refused_by_name(tmp_path, bert_dir, pad):
    """transformers (and torch.nn.Embedding) answer 29 and 1000 with a bare AssertionError; -1 it reads as 28."""
    _, reference = bert_dir
    saved(tmp_path, reference, pad_token_id=pad)
    with pytest.raises(ConfigError, match=rf"config.json: field 'pad_token_id' is {pad}, outside the vocabulary "
                                          r"0\.\.28 \(vocab_size 29\); null if there is no padding token"):
        BertModel.from_pretrained(tmp_path)


def test_a_bert_pad_token_id_of_null_loads_as_transformers_loads_it(tmp_path, bert_dir):
    """No padding row: the word embeddings' every row takes a gradient, in transformers and here."""
    _, reference = bert_dir
    saved(tmp_path, reference)
    config = json.loads((tmp_path / "config.json").read_text()) | {"pad_token_id": None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = transformers.BertModel.from_pretrained(tmp_path).eval()
    ours = BertModel.from_pretrained(tmp_path)
    assert ours.config.pad_token_id is None and theirs.config.pad_token_id is None
    ids = torch.tensor([[0, 3, 0, 5]])  # id 0, the default padding id, takes a gradient now
    for model in (ours, theirs):
        model.zero_grad()
        model(ids).last_hidden_state.square().sum().backward()
    grad = ours.embeddings.word_embeddings.weight.grad
    assert grad[0].abs().sum() > 0
    assert_parity(grad, theirs.embeddings.word_embeddings.weight.grad, "word embedding gradient")
    with torch.no_grad():
        assert_parity(ours(ids).last_hidden_state, theirs(ids).last_hidden_state, "last_hidden_state")
    ours.save_pretrained(tmp_path / "again")  # and it saves as null, which transformers reads back
    assert json.loads((tmp_path / "again" / "config.json").read_text())["pad_token_id"] is None
    assert transformers.BertModel.from_pretrained(tmp_path / "again").config.pad_token_id is None


# ------------------------------------------------------------------------- saving over a directory


def test_save_pretrained_never_replaces_a_directory_of_a_files_name(tmp_path, bert_dir):
    """Before: the directory model.safetensors was moved aside with the old files and deleted, the user's files
    inside it with it."""
    model = BertModel.from_pretrained(bert_dir[0])
    target = tmp_path / "out"
    (target / "model.safetensors").mkdir(parents=True)
    (target / "model.safetensors" / "notes.txt").write_text("mine")
    with pytest.raises(IsADirectoryError, match=r"out/model.safetensors: is a directory; writing the file "
                                                r"model.safetensors there would replace it"):
        model.save_pretrained(target)
    assert (target / "model.safetensors" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors"]  # no config.json, no staging left


def test_a_directory_in_the_way_is_found_after_the_work_too_and_nothing_moves(tmp_path):
    """`staged` itself (the writer under every command's --out): a directory named like a file it writes."""
    from weight_mapping import staged

    (tmp_path / "attention.html").mkdir()
    (tmp_path / "attention.html" / "mine.txt").write_text("mine")
    (tmp_path / "summary.txt").write_text("old")
    with pytest.raises(IsADirectoryError, match="attention.html: is a directory"):
        with staged(tmp_path) as staging:
            (staging / "summary.txt").write_text("new")
            (staging / "attention.html").write_text("<html>")
    assert (tmp_path / "attention.html" / "mine.txt").read_text() == "mine"
    assert (tmp_path / "summary.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.html", "summary.txt"]


def test_a_link_of_a_files_name_is_replaced_and_what_it_points_to_kept(tmp_path, bert_dir):
    model = BertModel.from_pretrained(bert_dir[0])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors").symlink_to(elsewhere)
    model.save_pretrained(tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").is_file() and elsewhere.is_dir()


# ----------------------------------------------------------------------------- a cache of another model


@pytest.fixture(scope="module")
def gpt2_models():
    torch.manual_seed(0)
    models = {}
    for name, changes in (("2 layers", {}), ("3 layers", dict(n_layer=3)), ("5 heads", dict(n_head=5))):
        config = transformers.GPT2Config(**GPT2_CONFIG | changes)
        models[name] = GPT2LMHeadModel(GPT2LMHeadModel.config_class.from_dict(config.to_dict())).eval()
    return models


@pytest.mark.parametrize("other, message", [
    ("3 layers", "past_key_values holds 2 layers, but this model has 3: a cache serves the model that filled it"),
    ("5 heads", "past_key_values holds 3 key/value heads of size 5, but this model has 5 of size 3"),
])
def test_a_cache_from_another_model_is_refused_naming_both(gpt2_models, other, message):
    """Before: a bare IndexError (a 2-layer cache in a 3-layer model) or a shape error inside attention."""
    with torch.no_grad():
        cache = gpt2_models["2 layers"](IDS, use_cache=True).past_key_values
        with pytest.raises(ValueError, match=message):
            gpt2_models[other](IDS[:, :1], past_key_values=cache)
        assert cache.length == IDS.shape[1]  # untouched
        gpt2_models["2 layers"](IDS[:, :1], past_key_values=cache)  # its own model still reads it


# ------------------------------------------------------------------------- models no family builds


QUANTIZED = {"gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
             "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"},
             "bitsandbytes": {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}
NOT_BUILT = {
    "Qwen2-MoE": (dict(model_type="qwen2_moe", num_experts=60), "Qwen2-MoE, a mixture of experts"),
    # MXFP4 is read exactly for GPT-OSS's experts (known.DEQUANTIZED) and for no other family
    "Llama in MXFP4": (dict(model_type="llama", quantization_config={"quant_method": "mxfp4"}),
                       r"a quantized checkpoint .quantization_config, quant_method 'mxfp4'."),
    "LLaVA": (dict(model_type="llava", vision_config={}), "LLaVA, a multimodal model"),
    "Qwen2-VL": (dict(model_type="qwen2_vl", vision_config={}), "Qwen2-VL, a multimodal model"),
    "an unnamed mixture of experts": (dict(num_local_experts=4), "a mixture of experts .config.json counts"),
    "an unnamed multimodal model": (dict(audio_config={}), "a multimodal model .config.json has a audio_config"),
    **{f"quantized ({method})": (dict(quantization_config=q), rf"a quantized checkpoint .quantization_config, "
                                                              rf"quant_method '{method}'.")
       for method, q in QUANTIZED.items()},
}


@pytest.mark.parametrize("what", list(NOT_BUILT))
def test_a_model_no_family_builds_is_refused_at_load_saying_what_it_is(tmp_path, what, capsys):
    """A quantized checkpoint (its weights packed integers beside scales), a mixture of experts or a model that also
    reads images (Gemma 3's multimodal files aside: their language model loads, tests/models/test_gemma3.py): before, a model_type near a family's was "not supported" without saying what it is,
    and a quantized file of a supported model_type loaded far enough to list its packed tensors as unexpected. Now
    each is refused from config.json alone, by the class that would load it and by the command line, before any
    model is built; the message says what it is and which families are supported."""
    changes, message = NOT_BUILT[what]
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_CONFIG))
    saved(tmp_path, model, **changes)
    with pytest.raises(CheckpointError, match=rf"{message}.*, which none of the families here builds; supported: "
                                              r"bert, gpt2, gpt_neox"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    assert main(["verify", str(tmp_path)]) == 2
    assert "which none of the families here builds" in capsys.readouterr().err


def test_the_registered_mixtures_are_the_families_whose_tables_repeat_experts():
    """known.MIXTURES, which lets a registered mixture's expert count through the refusal below the registry, names
    exactly the families whose mapping tables repeat "{e}" rows; a dense family's file with an expert count is
    still refused (an unnamed mixture of experts, above, is a GPT-2 file with one)."""
    from scratch_models.registry.families import FAMILIES
    from scratch_models.registry.known import MIXTURES

    assert set(MIXTURES) == {name for name, family in FAMILIES.items() if family.table.experts_field is not None}
