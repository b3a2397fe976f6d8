"""The command line's one tokenizer: scratch_models.Tokenizer in every command, read from tokenizer.json as the
models read it, or (vocab files only) around the pipeline transformers' converters build. Everything the commands
ask of it equals transformers' AutoTokenizer on MiniLM's WordPiece, a GPT-2 byte-level BPE and a vocab-only BERT:
ids of texts and sentence pairs padded on either side, token types, segments, special tokens, the mask token,
token strings and decoding."""

import shutil

import pytest
import torch
import transformers

from scratch_models import Tokenizer
from scratch_models_cli.cli import main
from scratch_models_cli.common import open_model

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Paris is the [MASK] of France.", "Time flies like an arrow; fruit flies like a banana.", "",
         "  Héllo wörld — ünïcode ☃ and 😀, don't stop: 12345!", "<|endoftext|> as text"]
PAIRS = ["It purred.", "", "Fruit flies.", "ünïcode", "x"]


@pytest.fixture(scope="module")
def vocab_only_gpt2(tmp_path_factory, tiny_gpt2):
    """The tiny GPT-2's byte-level BPE as vocab.json + merges.txt beside its config, without tokenizer.json."""
    directory = tmp_path_factory.mktemp("vocab-only-gpt2")
    _, fast, _ = tiny_gpt2
    fast.backend_tokenizer.model.save(str(directory))
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_gpt2[0] / name, directory)
    return directory


def checkpoints(small, vocab_only_gpt2) -> dict:
    return {"minilm": "minilm", "gpt2": small["gpt2"], "bert vocab.txt": small["vocab_only"],
            "gpt2 vocab.json": str(vocab_only_gpt2)}


@pytest.mark.parametrize("name", ["minilm", "gpt2", "bert vocab.txt", "gpt2 vocab.json"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_the_cli_tokenizer_gives_what_transformers_gives(small, vocab_only_gpt2, name, side):
    opened = open_model(checkpoints(small, vocab_only_gpt2)[name])
    ours = opened.tokenizer
    assert type(ours) is Tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(opened.checkpoint.directory, padding_side=side)
    if theirs.pad_token is None:  # GPT-2 pads with its end-of-text token; the mask marks padding either way
        theirs.pad_token = theirs.eos_token
    pairs = PAIRS if opened.family.pairs else None
    expected = theirs(TEXTS, pairs, padding=True, return_tensors="pt")
    batch = ours(TEXTS, pairs, padding_side=side)
    assert set(batch) == set(expected) & {"input_ids", "attention_mask", "token_type_ids"}
    for key in batch:
        assert torch.equal(batch[key], expected[key]), key
    for i, text in enumerate(TEXTS):
        pair = pairs[i] if pairs else None
        assert ours.sequence_ids(text, pair) == theirs(text, pair).sequence_ids(0)
        ids = theirs(text, pair)["input_ids"]
        assert ours.str_tokens(ids) == [theirs.decode([i]) for i in ids]
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.encode(text, add_special_tokens=False) == theirs(text, add_special_tokens=False)["input_ids"]
    assert set(ours.all_special_tokens) == set(theirs.all_special_tokens)
    named = {role: getattr(theirs, f"{role}_token") for role in ours.special_tokens}
    # config.json may name more (the tiny GPT-2's bos_token_id), never others
    assert {role: token for role, token in ours.special_tokens.items() if named[role]} == {
        role: token for role, token in named.items() if token}
    assert {role: ours.special_ids[role] for role in named if named[role]} == {
        role: theirs.convert_tokens_to_ids(token) for role, token in named.items() if token}
    if opened.family.pairs:  # the masked LMs: the mask token the commands look for
        assert opened.mask_token() == (theirs.mask_token_id, theirs.mask_token)


def test_a_tokenizer_json_checkpoint_never_reaches_transformers_tokenizers(small, monkeypatch, tmp_path, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("a command built transformers' tokenizer")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    mlm, gpt2 = small["mlm"], small["gpt2"]
    for argv in (["verify", "--text", "Hi."], ["fill-mask", mlm, "a [MASK] b"], ["classify", small["classifier"], "x"],
                 ["generate", gpt2, "Once", "--max-new-tokens", "2"], ["inspect", gpt2, "x y", "--out", str(tmp_path)],
                 ["lens", mlm, "a [MASK]", "--out", str(tmp_path)],
                 ["heads", mlm, "the [MASK] sat", "--out", str(tmp_path)],
                 ["patch", gpt2, "--clean", "The meaning of life", "--corrupted", "Once upon a time", "--out",
                  str(tmp_path)]):
        assert main(argv) == 0, capsys.readouterr().err


def test_a_vocab_only_checkpoint_reads_text_in_every_command_as_with_tokenizer_json(small, tmp_path, capsys):
    """The vocab-only BERT is the mlm checkpoint without tokenizer.json: each command prints the same."""
    for argv in (["fill-mask", "{}", "Paris is the [MASK] of France."],
                 ["lens", "{}", "Paris is the [MASK] of France.", "--out", str(tmp_path / "lens")],
                 ["inspect", "{}", "time flies", "--pair", "like an arrow", "--out", str(tmp_path / "inspect")]):
        printed = []
        for checkpoint in (small["mlm"], small["vocab_only"]):
            assert main([arg.format(checkpoint) for arg in argv]) == 0
            printed.append(capsys.readouterr().out.replace(checkpoint, "CHECKPOINT").splitlines())
        if argv[0] == "inspect":  # the timing differs
            printed = [lines[:-1] for lines in printed]
        assert printed[0] == printed[1], argv[0]
    assert main(["verify", small["vocab_only"], "--text", "Time flies.", "--pair", "Fruit flies."]) == 0
    assert "1 sentence pair:" in capsys.readouterr().out


def test_texts_without_tokens_come_back_as_long_ids_the_model_refuses_by_name(small):
    """Before: a batch of texts that give no tokens came back as float32, and the model refused its dtype."""
    from scratch_models import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(small["gpt2"])
    batch = model.tokenizer(["", ""])
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.long
    assert batch["input_ids"].shape == (2, 0)
    with pytest.raises(ValueError, match=r"input_ids is empty \(shape \(2, 0\)\): give at least one token"):
        model(**batch)


def test_an_empty_pair_of_one_text_is_no_pair_as_in_transformers():
    """transformers reads a single text's pair by its truth value; in a batch an empty pair is a segment."""
    ours = open_model("minilm").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(open_model("minilm").checkpoint.directory)
    assert ours("x", "")["input_ids"].tolist() == [theirs("x", "")["input_ids"]] == [[101, 1060, 102]]
    assert ours.encode("x", "") == theirs.encode("x", "") and ours.sequence_ids("x", "") == [None, 0, None]
    assert ours(["x"], [""])["input_ids"].tolist() == theirs(["x"], [""])["input_ids"] == [[101, 1060, 102, 102]]


def test_a_tokenizer_around_a_backend_checks_its_special_tokens(small):
    backend = open_model(small["mlm"]).tokenizer.backend
    with pytest.raises(ValueError, match="special_ids: unknown role\\(s\\) masque; the roles are bos, eos"):
        Tokenizer.from_backend(backend, {"masque": 103}, token_type_ids=True, source="here")
    with pytest.raises(ValueError, match="here: the mask token's id 40000 is outside the vocabulary 0..30521"):
        Tokenizer.from_backend(backend, {"mask": 40000}, token_type_ids=True, source="here")
    tokenizer = Tokenizer.from_backend(backend, {"mask": 103, "pad": 0}, token_type_ids=False, source="here")
    assert tokenizer.special_tokens == {"mask": "[MASK]", "pad": "[PAD]"}
    assert set(tokenizer("a [MASK]")) == {"input_ids", "attention_mask"}


def test_one_id_decodes_as_in_transformers_whose_streamer_passes_one(small):
    """TextStreamer (generate's) decodes its last token alone, as an int, after a newline."""
    from transformers import TextStreamer

    tokenizer = open_model(small["gpt2"]).tokenizer
    newline = tokenizer.encode("a\nb")
    assert tokenizer.decode(newline[1]) == tokenizer.decode([newline[1]]) == tokenizer.decode(torch.tensor(newline[1]))
    printed = []
    streamer = TextStreamer(tokenizer)
    streamer.on_finalized_text = lambda text, stream_end=False: printed.append(text)
    for i in newline:
        streamer.put(torch.tensor([i]))
    streamer.end()
    assert "".join(printed) == "a\nb"
