"""The checkpoint's own tokenizer (scratch_models.registry.tokenizer, the `tokenizers` library on tokenizer.json)
against transformers' AutoTokenizer: all-MiniLM-L6-v2's WordPiece with [CLS] / [SEP], sentence pairs and token types,
and a GPT-2 byte-level BPE built here in the hub's gpt2 layout; the model's to_tokens / to_str_tokens / to_string."""

import copy
import json
import shutil

import pytest
import torch
import transformers

from helpers import byte_level_bpe, randomize_
from scratch_models import BertModel, CheckpointError, GPT2LMHeadModel
from scratch_models.registry.tokenizer import Tokenizer
from weight_mapping import embedded_checkpoint

MINILM = embedded_checkpoint()
TEXTS = ["Hello world", "The cat sat on the warm mat.", "  two leading spaces, a\ttab and a\nnewline ",
         "Héllo wörld — ünïcode ☃ and 😀", "don't stop: 12345 and 3.14!", "", "[SEP] as text, and [MASK]"]
LONG = "Time flies like an arrow; fruit flies like a banana. " * 30  # far past all-MiniLM-L6-v2's 128


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A byte-level BPE in the hub's gpt2 layout: tokenizer.json, vocab.json, merges.txt and config.json, no
    tokenizer_config.json (transformers then builds its GPT2Tokenizer with <|endoftext|> as BOS / EOS)."""
    scratch = tmp_path_factory.mktemp("bpe")
    bpe = byte_level_bpe([*TEXTS, LONG] * 3, 400)
    bpe.model.save(str(scratch))
    directory = tmp_path_factory.mktemp("gpt2-tokenizer")
    transformers.GPT2Tokenizer(vocab=str(scratch / "vocab.json"), merges=str(scratch / "merges.txt")).save_pretrained(
        directory)
    (directory / "tokenizer_config.json").unlink()
    shutil.copy(scratch / "vocab.json", directory)
    shutil.copy(scratch / "merges.txt", directory)
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=512, n_embd=24, n_layer=1, n_head=2,
                                     bos_token_id=0, eos_token_id=0)
    (directory / "config.json").write_text(json.dumps(config.to_dict()))
    return directory


@pytest.mark.parametrize("text", [*TEXTS, LONG])
def test_minilm_ids_equal_transformers(text):
    ours, theirs = Tokenizer.from_pretrained(MINILM), transformers.AutoTokenizer.from_pretrained(MINILM)
    expected = theirs(text)
    assert ours.encode(text) == expected["input_ids"]
    batch = ours(text)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert batch[key].tolist() == [expected[key]], key
    assert ours.str_tokens(expected["input_ids"]) == [theirs.decode([i]) for i in expected["input_ids"]]
    assert ours.decode(expected["input_ids"]) == theirs.decode(expected["input_ids"])
    assert ours.decode(expected["input_ids"], skip_special_tokens=True) == theirs.decode(
        expected["input_ids"], skip_special_tokens=True)


@pytest.mark.parametrize("side", ["right", "left"])
def test_minilm_padded_pairs_and_token_types_equal_transformers(side):
    ours = Tokenizer.from_pretrained(MINILM)
    theirs = transformers.AutoTokenizer.from_pretrained(MINILM, padding_side=side)
    texts, pairs = TEXTS[:4] + [LONG], ["It purred.", "", "Fruit flies like a banana.", "ünïcode", "Short."]
    expected = theirs(texts, pairs, padding=True, return_tensors="pt")
    batch = ours(texts, pairs, padding_side=side)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    for key in batch:
        assert torch.equal(batch[key], expected[key]), key
    assert batch["input_ids"].shape[1] > 128  # the file's truncation at 128 is off, as in transformers' call
    special = ours.special_ids
    assert (special["cls"], special["sep"], special["pad"], special["mask"]) == (101, 102, 0, 103)
    assert "bos" not in special and ours.prepends_bos and ours.bos_token_id is None
    # TransformerLens' prepend_bos: [CLS] is BERT's BOS, which the template puts first already; False drops it
    plain = ours(texts)["input_ids"]
    assert torch.equal(ours(texts, prepend_bos=True)["input_ids"], plain)
    assert ours(texts, prepend_bos=False)["input_ids"].tolist() == [row[1:] for row in plain.tolist()]


@pytest.mark.parametrize("text", [*TEXTS, LONG])
def test_gpt2_bpe_ids_equal_transformers(gpt2_dir, text):
    ours, theirs = Tokenizer.from_pretrained(gpt2_dir), transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    expected = theirs(text)["input_ids"]
    assert ours.encode(text) == expected  # no BOS added, as transformers' GPT-2 tokenizer adds none
    assert ours.str_tokens(expected) == [theirs.decode([i]) for i in expected]
    assert ours.decode(expected) == theirs.decode(expected)
    assert ours.encode(text, prepend_bos=True) == [theirs.bos_token_id, *expected]


@pytest.mark.parametrize("side", ["right", "left"])
def test_gpt2_padded_batch_equals_transformers_and_has_no_token_types(gpt2_dir, side):
    ours = Tokenizer.from_pretrained(gpt2_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(gpt2_dir, padding_side=side)
    theirs.pad_token = theirs.eos_token  # GPT-2 has no pad token; the mask says what is padding
    expected = theirs(TEXTS[:5], padding=True, return_tensors="pt")
    batch = ours(TEXTS[:5], padding_side=side)
    assert set(batch) == {"input_ids", "attention_mask"}
    for key in batch:
        assert torch.equal(batch[key], expected[key]), key
    assert ours.special_ids == {"bos": 0, "eos": 0}  # named by config.json only, as in the hub's gpt2


def test_a_checkpoint_with_vocab_files_only_is_refused_with_what_to_do(tmp_path, gpt2_dir):
    for source, files, found in ((MINILM, ["vocab.txt", "config.json"], "vocab.txt"),
                                 (gpt2_dir, ["vocab.json", "merges.txt"], "vocab.json, merges.txt")):
        directory = tmp_path / source.name
        directory.mkdir()
        for name in files:
            shutil.copy(source / name, directory)
        with pytest.raises(ValueError, match=rf"no tokenizer.json \(only {found}\).*save_pretrained"):
            Tokenizer.from_pretrained(directory)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken/tokenizer.json: not a tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path / "broken")


def test_special_tokens_named_outside_the_vocabulary_are_refused(tmp_path):
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(MINILM / name, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"mask_token": {"content": "[MASQUE]"}}))
    with pytest.raises(ValueError, match="mask_token '\\[MASQUE\\]' is not in the vocabulary"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    config = json.loads((MINILM / "config.json").read_text()) | {"bos_token_id": 40000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="bos_token_id 40000 is outside the vocabulary"):
        Tokenizer.from_pretrained(tmp_path)


def test_minilm_by_name_and_an_uncached_hub_id_offline(monkeypatch, tmp_path):
    assert Tokenizer.from_pretrained("minilm").encode("x") == Tokenizer.from_pretrained(MINILM).encode("x")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="someone/no-such-model: no such local path, and config.json is not in "
                                              "the local Hugging Face cache"):
        Tokenizer.from_pretrained("someone/no-such-model")
    with pytest.raises(CheckpointError, match="no such file or directory, and not a hub model id"):
        Tokenizer.from_pretrained(str(tmp_path / "missing" / "dir"))


def test_the_model_reads_its_own_tokenizer_on_first_use(tmp_path):
    model = BertModel.from_pretrained(MINILM)
    assert model.tokenizer._loaded is None  # loading the weights read no tokenizer file
    ids = model.to_tokens("Which head reads [SEP]?")
    theirs = transformers.AutoTokenizer.from_pretrained(MINILM)
    assert ids.tolist() == [theirs("Which head reads [SEP]?")["input_ids"]]
    # "[SEP]" in the text is the special token, as transformers reads it
    assert model.to_str_tokens("Which head reads [SEP]?") == ["[CLS]", "which", "head", "reads", "[SEP]", "?",
                                                               "[SEP]"]
    assert model.to_str_tokens(ids) == model.to_str_tokens("Which head reads [SEP]?")
    # a [1, s] tensor is a batch of one, and gives a list of one text, as TransformerLens' to_string
    assert model.to_string(ids) == ["[CLS] which head reads [SEP]? [SEP]"] and model.to_string(ids[0]) == \
        "[CLS] which head reads [SEP]? [SEP]"
    pair = model.to_tokens(["one", "two"], ["three", "four"])
    assert pair.shape == (2, 5) and model.to_string(pair) == ["[CLS] one [SEP] three [SEP]",
                                                              "[CLS] two [SEP] four [SEP]"]
    with pytest.raises(ValueError, match="token id 40000 is outside the vocabulary 0..30521"):
        model.to_string([101, 40000])
    # texts of different lengths are padded on the tokenizer's side (right), as TransformerLens pads them
    padded = model.to_tokens(["short", "a longer text"])
    assert padded.tolist() == theirs(["short", "a longer text"], padding=True)["input_ids"]
    assert torch.equal(copy.deepcopy(model).to_tokens("a copy"), model.to_tokens("a copy"))

    # weights without tokenizer files load; the tokenizer is refused when used
    (tmp_path / "weights").mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        shutil.copy(MINILM / name, tmp_path / "weights")
    bare = BertModel.from_pretrained(tmp_path / "weights")
    with pytest.raises(ValueError, match="only vocab.txt"):
        bare.to_tokens("x")
    with pytest.raises(ValueError, match="not loaded with from_pretrained.*model.tokenizer = "):
        BertModel(bare.config).to_tokens("x")


def test_a_gpt2_model_tokenizes_with_its_checkpoint(tmp_path, gpt2_dir):
    directory = tmp_path / "gpt2"
    shutil.copytree(gpt2_dir, directory)
    config = transformers.GPT2Config.from_pretrained(directory)
    randomize_(transformers.GPT2LMHeadModel(config), 0.1).save_pretrained(directory)
    model = GPT2LMHeadModel.from_pretrained(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    text = "The meaning of life is"
    assert model.to_tokens(text).tolist() == [theirs(text)["input_ids"]]
    assert model.to_tokens(text, prepend_bos=True)[0, 0] == 0
    assert "".join(model.to_str_tokens(text)) == text
    batch = model.tokenizer([text, "Once"], padding_side="left")
    with torch.no_grad():
        out = model(**batch)  # the batch goes in as it is: no token_type_ids for GPT-2
    assert out.logits.shape[:2] == (2, batch["input_ids"].shape[1])


def test_prepend_bos_adds_no_second_bos_where_the_template_adds_one(tmp_path, gpt2_dir):
    """Gemma's and Llama's tokenizer.json put <bos> in front of every text themselves (transformers' ids start with
    it): prepend_bos=True, which TransformerLens' conventions turn on for every causal model, must not add a
    second; without the template's BOS (add_special_tokens=False) it adds the one."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.processors import TemplateProcessing

    backend = Backend.from_file(str(gpt2_dir / "tokenizer.json"))
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    tokenizer = Tokenizer.from_backend(backend, {"bos": bos, "eos": bos}, token_type_ids=False, source="gemma-like")
    text = "The meaning of life is"
    plain = backend.encode(text).ids
    assert plain[0] == bos and plain[1] != bos and tokenizer.prepends_bos
    assert tokenizer.encode(text, prepend_bos=True) == tokenizer.encode(text) == plain
    assert tokenizer([text, "Once"], prepend_bos=True)["input_ids"][0].tolist() == plain
    assert tokenizer.encode(text, add_special_tokens=False, prepend_bos=True) == plain
    gpt2 = Tokenizer.from_pretrained(gpt2_dir)
    assert not gpt2.prepends_bos and gpt2.encode(text, prepend_bos=True) == [bos] + gpt2.encode(text)


def test_a_checkpoint_without_tokenizer_files_gets_advice_that_works(tmp_path):
    """No tokenizer file at all beside the weights: transformers' AutoTokenizer could not write one either. The
    message says where a tokenizer can come from, and following it works."""
    (tmp_path / "weights").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(MINILM / name, tmp_path / "weights")
    bare = BertModel.from_pretrained(tmp_path / "weights")
    with pytest.raises(ValueError) as error:
        bare.to_tokens("x")
    message = str(error.value)
    assert "no tokenizer files" in message and "AutoTokenizer" not in message
    assert "model.tokenizer = scratch_models.Tokenizer.from_pretrained(" in message
    assert "copy its tokenizer files" in message and "input_ids" in message
    bare.tokenizer = Tokenizer.from_pretrained(MINILM)  # the checkpoint these weights came from
    assert bare.to_tokens("x").tolist() == BertModel.from_pretrained("minilm").to_tokens("x").tolist()
