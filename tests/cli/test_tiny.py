"""`scratch-models tiny FAMILY DIR`: a small random model of any registered family with a working tokenizer, on which
every command runs offline; and the messages that point to it where a hub checkpoint is out of reach."""

import json

import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError

from helpers import each_family, fake_hub
from scratch_models import CheckpointError
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.cli import main
from scratch_models_cli.tiny import tiny
from weight_mapping import embedded_checkpoint

MINILM_FAMILY = json.loads((embedded_checkpoint() / "config.json").read_text())["model_type"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """family -> the directory `scratch-models tiny FAMILY DIR` wrote."""
    out = {}
    for family in FAMILIES:
        directory = tmp_path_factory.mktemp("tiny") / family
        assert main(["tiny", family, str(directory)]) == 0
        out[family] = directory
    return out


@each_family
def test_the_model_verifies_against_transformers_and_its_tokenizer_reads_text(written, family, capsys):
    declared = FAMILIES[family]
    directory = written[family]
    generates = ["generation_config.json"] if declared.causal else []  # as transformers saves a causal LM
    assert sorted(p.name for p in directory.iterdir()) == sorted(["config.json", "model.safetensors", "tokenizer.json",
                                                                  "tokenizer_config.json", *generates])
    assert json.loads((directory / "config.json").read_text())["architectures"] == [declared.lm.__name__]
    capsys.readouterr()
    assert main(["verify", str(directory)]) == 0
    report = capsys.readouterr().out
    assert "within tolerance" in report and "random token ids" not in report  # the tokenizer read the texts
    model = declared.lm.from_pretrained(directory)
    ids = model.to_tokens(declared.default_texts[0])
    assert ids.shape[1] > 3 and int(ids.max()) < model.config.vocab_size
    assert model.tokenizer.vocab_size == model.config.vocab_size


@each_family
def test_the_families_own_command_runs_on_it(written, family, capsys, tmp_path):
    """A causal family's LM continues a prompt; a masked LM fills in its mask token; every family's pages draw."""
    declared = FAMILIES[family]
    directory = str(written[family])
    if declared.causal:
        assert main(["generate", directory, declared.default_texts[0], "--max-new-tokens", "5"]) == 0
    else:
        mask = declared.lm.from_pretrained(directory).tokenizer.special_tokens["mask"]
        assert main(["fill-mask", directory, f"Paris is the {mask} of France."]) == 0
        assert "mask at token" in capsys.readouterr().out
    assert main(["lens", directory, declared.default_texts[0], "--out", str(tmp_path / "lens")]) == 0
    assert (tmp_path / "lens" / "lens.png").is_file()


@each_family
def test_every_class_of_the_family_can_be_written(family, tmp_path):
    """--class: any class of the family, e.g. a classifier for `classify`, written and loaded back as itself."""
    declared = FAMILIES[family]
    for cls in declared.classes:
        summary = tiny(family, tmp_path / cls.__name__, class_name=cls.__name__, seed=1)
        assert f"a random {cls.__name__}" in summary
        model = cls.from_pretrained(tmp_path / cls.__name__)
        assert not model.loading_info.ignored
    for name, kind in declared.classifiers.items():
        if kind == "labels":
            assert main(["classify", str(tmp_path / name), declared.default_texts[0]]) == 0


def test_weights_are_seeded_and_refusals_name_the_argument(tmp_path):
    tiny("gpt2", tmp_path / "a", seed=3)
    tiny("gpt2", tmp_path / "b", seed=3)
    a, b = (FAMILIES["gpt2"].lm.from_pretrained(tmp_path / name).state_dict() for name in "ab")
    assert all(torch.equal(a[name], b[name]) for name in a)
    with pytest.raises(ValueError, match="exists and is not an empty directory"):
        tiny("gpt2", tmp_path / "a")
    with pytest.raises(ValueError, match="--class BertModel: not a GPT-2 class; choose one of GPT2Model, "):
        tiny("gpt2", tmp_path / "c", class_name="BertModel")
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------------------------- pointed to where the hub is out of reach


def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub(monkeypatch, {"config.json": LocalEntryNotFoundError("not cached")})


@each_family
def test_an_uncached_checkpoint_of_a_family_offers_that_familys_tiny_model(monkeypatch, family, capsys):
    """In Python the class says the family; on the command line the hub id does, where it reads as the family's
    pretrained checkpoint. Either way the message names a command that works for that family, and names minilm only
    for the family minilm is of."""
    declared = FAMILIES[family]
    offline(monkeypatch)
    with pytest.raises(CheckpointError) as error:
        declared.lm.from_pretrained(declared.lm_checkpoint)
    assert_offers(str(error.value), declared)
    assert main(["verify", declared.lm_checkpoint]) == 2
    assert_offers(capsys.readouterr().err, declared)


def assert_offers(message: str, declared) -> None:
    assert "is not in the local Hugging Face cache" in message
    assert f"`scratch-models tiny {declared.name} DIR` writes a small random {declared.title} model" in message
    assert ("minilm" in message) == (declared.name == MINILM_FAMILY), message


def test_an_uncached_hub_id_of_no_known_family_lists_every_familys_tiny_model(monkeypatch, capsys):
    offline(monkeypatch)
    assert main(["verify", "org/no-such-model"]) == 2
    message = capsys.readouterr().err
    assert "`scratch-models tiny FAMILY DIR` writes a small random model with a tokenizer (FAMILY: " in message
    assert all(name in message for name in FAMILIES)
    assert "`minilm`, the real BERT all-MiniLM-L6-v2 that comes with this package" in message


@each_family
def test_the_stand_ins_tokenizer_follows_its_familys_conventions_and_says_it_is_random(written, family, capsys):
    """A stand-in's tokenizer names the special tokens of the family's released tokenizers and puts BOS first
    where they do (Llama's, Mistral's, Gemma's), so text, padding and generate's end read as on the real model;
    transformers reads it alike. Every command says the weights are random before it prints anything."""
    import transformers

    from scratch_models.registry.tokenizer import Tokenizer
    from weight_mapping import open_checkpoint

    declared = FAMILIES[family]
    ours = Tokenizer(open_checkpoint(written[family]))
    theirs = transformers.AutoTokenizer.from_pretrained(written[family])
    ids = ours("The cat sat")["input_ids"][0].tolist()
    assert ids == theirs("The cat sat")["input_ids"]
    if declared.causal:
        for role, token in declared.tokenizer_specials.items():
            assert getattr(theirs, f"{role}_token") == token, role
        assert (ids[0] == theirs.bos_token_id) == declared.tokenizer_prepends_bos
        config = json.loads((written[family] / "config.json").read_text())
        assert config["eos_token_id"] == theirs.eos_token_id
        assert config["bos_token_id"] == (theirs.bos_token_id if "bos" in declared.tokenizer_specials
                                          else theirs.eos_token_id)  # Qwen's config names the end of text
    capsys.readouterr()
    assert main(["inspect", str(written[family]), "some text", "--out", str(written[family].parent / "seen")]) == 0
    assert "tokens: '" in capsys.readouterr().out  # each token quoted, so a leading space shows
    if declared.causal:
        assert main(["generate", str(written[family]), "Once upon a time", "--max-new-tokens", "2"]) == 0
        note = "random weights: a stand-in written by scratch-models tiny (seed 0); what it outputs means nothing"
        assert note in capsys.readouterr().err
