"""Export: our models -> save_pretrained -> transformers (clean loading, same numbers, transformers' own layout)
and -> ours (bitwise); the legacy layouts; dtype-converted exports; `scratch-models convert`; nothing half-written."""

import json

import pytest
import torch
import transformers
from safetensors import safe_open

from helpers import assert_parity, sighted, write_config, write_weights
from scratch_models import BertForMaskedLM, BertModel, GPT2LMHeadModel, GPT2Model
from scratch_models_cli.cli import main
from test_bert import SMALL as BERT_SMALL, hf_pretraining_model, legacy_state, padded_inputs as bert_inputs
from test_gpt2 import SMALL as GPT2_SMALL, hf_lm, hub_config, hub_state, padded_inputs as gpt2_inputs

BERT_INPUTS = bert_inputs(BERT_SMALL["vocab_size"], BERT_SMALL["type_vocab_size"])
GPT2_INPUTS = gpt2_inputs(GPT2_SMALL["vocab_size"])


def file_tensors(directory) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        return {key: f.get_tensor(key) for key in f.keys()}


def clean(info: dict) -> dict:
    """transformers' loading info, keeping only what went wrong (missing, unexpected, mismatched, errors)."""
    return {what: keys for what, keys in info.items() if keys}


def assert_same_state(ours, back):
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def bert_source(tmp_path_factory):
    """transformers' BertForPreTraining written in bert-base-uncased's legacy layout (.bin, gamma/beta, `bert.`)."""
    reference = hf_pretraining_model(seed=11, std=0.3, **{**BERT_SMALL, "num_hidden_layers": 2})
    directory = tmp_path_factory.mktemp("bert-legacy")
    write_config(reference.config, directory)
    write_weights(legacy_state(reference), directory, "bin")
    return reference, directory


@pytest.fixture(scope="module")
def gpt2_source(tmp_path_factory):
    """transformers' GPT2LMHeadModel written in the hub's gpt2 layout (no prefix, mask buffers, no lm_head)."""
    reference = hf_lm(12, 0.3, **GPT2_SMALL)
    directory = tmp_path_factory.mktemp("gpt2-hub")
    write_weights(hub_state(reference), directory, "safetensors")
    (directory / "config.json").write_text(json.dumps(hub_config(reference)))
    return reference, directory


def export(model, directory, hf_loader, **save_kwargs):
    """model -> save_pretrained -> transformers (eager, clean loading) and -> ours (bitwise the same)."""
    files = model.save_pretrained(directory, **save_kwargs)
    # a model that generates also writes generate's settings, as transformers' save_pretrained does
    generation = ["generation_config.json"] if hasattr(model, "generate") else []
    assert files == [directory / name for name in ("config.json", "model.safetensors", *generation)]
    assert sorted(p.name for p in directory.iterdir()) == sorted(["config.json", "model.safetensors", *generation])
    theirs, info = hf_loader.from_pretrained(directory, output_loading_info=True, attn_implementation="eager")
    assert clean(info) == {}
    assert type(theirs).__name__ == type(model).__name__
    assert transformers.AutoConfig.from_pretrained(directory).architectures == [type(model).__name__]
    back = type(model).from_pretrained(directory)
    assert_same_state(model, back)
    return theirs.eval(), back


def assert_transformers_layout(directory, theirs, tmp_path):
    """Our file holds exactly the keys (and tensors) transformers writes when it saves the model it loaded."""
    theirs.save_pretrained(tmp_path / "theirs")
    ours, saved = file_tensors(directory), file_tensors(tmp_path / "theirs")
    assert sorted(ours) == sorted(saved)
    for key in ours:
        assert torch.equal(ours[key], saved[key]), key


def assert_same_outputs(model, theirs, inputs):
    """Every hidden state and attention map, then the logits or the pooler output, whichever the model has, at
    every query that sees a key (eager attention is compared)."""
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        ref = theirs(**inputs, output_hidden_states=True, output_attentions=True)
    seen = sighted(model.config.model_type, inputs["attention_mask"])
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states, strict=True)):
        assert_parity(a[seen], b[seen], f"hidden_states[{i}]")
    for i, (a, b) in enumerate(zip(out.attentions, ref.attentions, strict=True)):
        assert_parity(a.transpose(1, 2)[seen], b.transpose(1, 2)[seen], f"attentions[{i}]")
    if getattr(out, "logits", None) is not None:
        assert_parity(out.logits[seen], ref.logits[seen], "logits")
    elif getattr(out, "pooler_output", None) is not None:
        assert_parity(out.pooler_output[seen.all(-1)], ref.pooler_output[seen.all(-1)], "pooler_output")


@pytest.mark.parametrize("our_class, hf_loader", [(BertModel, transformers.AutoModel),
                                                  (BertForMaskedLM, transformers.BertForMaskedLM)])
def test_bert_round_trips_through_transformers_and_ours(tmp_path, bert_source, our_class, hf_loader):
    _, source = bert_source
    model = our_class.from_pretrained(source)
    theirs, _ = export(model, tmp_path / "out", hf_loader)
    assert_transformers_layout(tmp_path / "out", theirs, tmp_path)
    assert_same_outputs(model, theirs, BERT_INPUTS)
    keys = file_tensors(tmp_path / "out")
    assert not any(key.endswith((".gamma", ".beta")) for key in keys)
    assert all(key.startswith(("bert.", "cls.")) == (our_class is BertForMaskedLM) for key in keys)


@pytest.mark.parametrize("our_class, hf_loader", [(GPT2Model, transformers.AutoModel),
                                                  (GPT2LMHeadModel, transformers.GPT2LMHeadModel)])
def test_gpt2_hub_layout_in_modern_layout_out(tmp_path, gpt2_source, our_class, hf_loader):
    _, source = gpt2_source
    model = our_class.from_pretrained(source)
    theirs, _ = export(model, tmp_path / "out", hf_loader)
    assert_transformers_layout(tmp_path / "out", theirs, tmp_path)
    assert_same_outputs(model, theirs, GPT2_INPUTS)
    keys = file_tensors(tmp_path / "out")
    assert "lm_head.weight" not in keys and not any(".attn.bias" in key for key in keys)
    assert all(key.startswith("transformer.") == (our_class is GPT2LMHeadModel) for key in keys)


@pytest.mark.parametrize("our_class", [BertModel, BertForMaskedLM])
def test_bert_legacy_layout_matches_bert_base_uncased(tmp_path, bert_source, our_class):
    """legacy=True: the original file's keys (`bert.`, gamma/beta, the decoder weight), less what we do not build
    (the NSP head, and the pooler or the MLM head); transformers reads gamma/beta too."""
    reference, source = bert_source
    model = our_class.from_pretrained(source)
    theirs, _ = export(model, tmp_path / "out", getattr(transformers, our_class.__name__), legacy=True)
    assert_same_outputs(model, theirs, BERT_INPUTS)
    keys = file_tensors(tmp_path / "out")
    not_built = ("cls.seq_relationship.", "bert.pooler." if our_class is BertForMaskedLM else "cls.")
    assert sorted(keys) == sorted(key for key in legacy_state(reference) if not key.startswith(not_built))
    if our_class is BertForMaskedLM:
        assert torch.equal(keys["cls.predictions.decoder.weight"], keys["bert.embeddings.word_embeddings.weight"])


def test_gpt2_legacy_layout_matches_the_hub_file(tmp_path, gpt2_source):
    """legacy=True for GPT-2: the hub gpt2's names (no prefix, no lm_head), without the recomputed mask buffers."""
    reference, source = gpt2_source
    model = GPT2LMHeadModel.from_pretrained(source)
    theirs, _ = export(model, tmp_path / "out", transformers.GPT2LMHeadModel, legacy=True)
    assert_same_outputs(model, theirs, GPT2_INPUTS)
    expected = [key for key in hub_state(reference) if not key.endswith(".attn.bias")]
    assert sorted(file_tensors(tmp_path / "out")) == sorted(expected)


def test_pooler_less_bertmodel_saves_as_transformers_without_pooler(tmp_path, bert_source):
    """A BertModel read from an MLM checkpoint has no pooler; transformers reads the export with
    add_pooling_layer=False, and ours builds none again."""
    _, source = bert_source
    mlm_dir = tmp_path / "mlm"
    BertForMaskedLM.from_pretrained(source).save_pretrained(mlm_dir)
    model = BertModel.from_pretrained(mlm_dir)
    model.save_pretrained(tmp_path / "out")
    theirs, info = transformers.BertModel.from_pretrained(tmp_path / "out", add_pooling_layer=False,
                                                          output_loading_info=True)
    assert clean(info) == {}
    assert not any(key.startswith("pooler.") for key in file_tensors(tmp_path / "out"))
    assert BertModel.from_pretrained(tmp_path / "out").pooler is None
    with torch.no_grad():
        assert_parity(model(**BERT_INPUTS).last_hidden_state, theirs.eval()(**BERT_INPUTS).last_hidden_state,
                      "last_hidden_state")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtype_export_casts_every_tensor(tmp_path, bert_source, gpt2_source, dtype):
    for our_class, (_, source) in [(BertForMaskedLM, bert_source), (GPT2LMHeadModel, gpt2_source)]:
        model = our_class.from_pretrained(source)
        model.save_pretrained(tmp_path / f"{our_class.__name__}-fp32")
        fp32 = file_tensors(tmp_path / f"{our_class.__name__}-fp32")
        directory = tmp_path / f"{our_class.__name__}-{dtype}"
        model.save_pretrained(directory, dtype=str(dtype).removeprefix("torch."))
        cast = file_tensors(directory)
        assert cast.keys() == fp32.keys()
        for key, tensor in cast.items():
            assert tensor.dtype == dtype and torch.equal(tensor, fp32[key].to(dtype)), key
        assert {p.dtype for p in model.parameters()} == {torch.float32}  # the model itself is left as it was
        assert json.loads((directory / "config.json").read_text())["dtype"] == str(dtype).removeprefix("torch.")
        theirs, info = getattr(transformers, our_class.__name__).from_pretrained(directory, output_loading_info=True)
        assert clean(info) == {} and theirs.dtype == dtype  # transformers' dtype="auto" reads config.json
        assert_same_state(our_class.from_pretrained(source, dtype=dtype), our_class.from_pretrained(directory))


def test_save_refuses_bad_dtypes_and_mixed_models(tmp_path, gpt2_source):
    model = GPT2Model.from_pretrained(gpt2_source[1])
    with pytest.raises(ValueError, match="float8_e4m3fn.*not supported"):
        model.save_pretrained(tmp_path / "a", dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="torch.int8 is not a floating-point type"):
        model.save_pretrained(tmp_path / "b", dtype=torch.int8)
    model.norm_f.half()
    with pytest.raises(ValueError, match="several dtypes"):
        model.save_pretrained(tmp_path / "c")
    assert list(tmp_path.iterdir()) == []


def test_save_is_all_or_nothing(tmp_path, gpt2_source, monkeypatch):
    """A save that fails leaves no file and no staging directory; one into a used directory replaces our two
    files and leaves the others (a tokenizer) alone."""
    model = GPT2LMHeadModel.from_pretrained(gpt2_source[1])
    target = tmp_path / "out"
    target.mkdir()
    (target / "tokenizer.json").write_text("{}")
    (target / "config.json").write_text("stale")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        model.save_pretrained(target)
    with pytest.raises(OSError, match="No space"):
        model.save_pretrained(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (target / "config.json").read_text() == "stale"
    monkeypatch.undo()
    model.save_pretrained(target)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                        "tokenizer.json"]
    assert_same_state(model, GPT2LMHeadModel.from_pretrained(target))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="file: exists and is not a directory"):
        model.save_pretrained(tmp_path / "file")


def test_convert_legacy_bin_to_modern_safetensors(tmp_path, bert_source, capsys):
    """bert-base-uncased's layout (.bin, gamma/beta, `bert.`, NSP head) -> what transformers 5 saves for
    BertForMaskedLM; a base-only legacy file -> BertModel's layout, with no prefix."""
    reference, source = bert_source
    assert main(["convert", str(source / "pytorch_model.bin"), str(tmp_path / "mlm")]) == 0
    report = capsys.readouterr().out
    assert "as BertForMaskedLM" in report and "used legacy names (gamma/beta), renamed" in report
    # the pooler and next-sentence tensors share one reason: one line names them (loading_info.ignored_lines)
    assert "cls.seq_relationship.weight, ...): not part of BertForMaskedLM" in report
    assert "read back bitwise equal" in report
    mlm = transformers.BertForMaskedLM._from_config(reference.config)
    mlm.save_pretrained(tmp_path / "theirs")
    assert sorted(file_tensors(tmp_path / "mlm")) == sorted(file_tensors(tmp_path / "theirs"))

    base_only = tmp_path / "base-only"
    write_config(reference.config, base_only)
    write_weights({k: v for k, v in legacy_state(reference).items() if k.startswith("bert.")}, base_only, "bin")
    assert main(["convert", str(base_only), str(tmp_path / "base"), "--dtype", "float16"]) == 0
    keys = file_tensors(tmp_path / "base")
    reference.bert.save_pretrained(tmp_path / "theirs-base")
    assert sorted(keys) == sorted(file_tensors(tmp_path / "theirs-base"))
    assert not any(key.startswith("bert.") or key.endswith((".gamma", ".beta")) for key in keys)
    assert {t.dtype for t in keys.values()} == {torch.float16}
    _, info = transformers.AutoModel.from_pretrained(tmp_path / "base", output_loading_info=True)
    assert clean(info) == {}


def test_convert_gpt2_hub_layout(tmp_path, gpt2_source, capsys):
    _, source = gpt2_source
    assert main(["convert", str(source), str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    assert "as GPT2LMHeadModel" in capsys.readouterr().out
    keys = file_tensors(tmp_path / "out")
    assert all(key.startswith("transformer.") and t.dtype == torch.bfloat16 for key, t in keys.items())
    _, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert clean(info) == {}


def test_convert_errors(tmp_path, bert_source, capsys):
    _, source = bert_source
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    assert main(["convert", str(source), str(used)]) == 2
    assert "used: exists and is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
    with pytest.raises(SystemExit) as exit_:
        main(["convert", str(source), str(tmp_path / "out"), "--dtype", "float64"])
    assert exit_.value.code == 2
    assert "invalid choice: 'float64'" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "nowhere: no such file or directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["used"]


def test_bert_model_without_a_pooler_exports_for_transformers_with_add_pooling_layer_false(tmp_path, bert_source):
    """transformers' BertModel has no config switch for the pooler: AutoModel reads our pooler-less export cleanly
    with add_pooling_layer=False (as the README says), and gives our numbers."""
    _, source = bert_source
    masked_lm = BertForMaskedLM.from_pretrained(source)
    masked_lm.save_pretrained(tmp_path / "mlm")
    model = BertModel.from_pretrained(tmp_path / "mlm")
    assert model.pooler is None
    model.save_pretrained(tmp_path / "out")
    theirs, info = transformers.AutoModel.from_pretrained(tmp_path / "out", output_loading_info=True,
                                                          add_pooling_layer=False, attn_implementation="eager")
    assert clean(info) == {} and theirs.pooler is None
    assert_same_outputs(model, theirs.eval(), BERT_INPUTS)
