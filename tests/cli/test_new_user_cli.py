"""The command line's edges a new user and an adversarial run found (issue 23, items 2 and 3), and their
neighbours in the other commands: a checkpoint given to inspect without its text, empty texts, mistyped flags,
commands and choices, outputs that cannot be written (found before the work, not after it), directories in the way
of a file, and the model named one way everywhere."""

import json

import pytest

from scratch_models.registry.families import FAMILIES
from scratch_models.registry.pretrained import PretrainedModel
from scratch_models_cli.cli import main
from helpers import fake_hub_cache
from weight_mapping import embedded_checkpoint

MINILM = embedded_checkpoint()

pytestmark = pytest.mark.usefixtures("one_thread")


def error_of(capsys, argv) -> str:
    """The one error line of a refused command (exit status 2, no traceback)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test: what is refused must be refused before the work."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(PretrainedModel, "from_pretrained", classmethod(refuse))


# ------------------------------------------------------------------------ inspect, a checkpoint without its text


def test_inspect_given_a_checkpoint_and_no_text_refuses_instead_of_reading_the_path_as_text(
        small, tmp_path, capsys, monkeypatch, no_loading):
    """Before: `inspect CHECKPOINT --out d` ran minilm on the path as its text."""
    import huggingface_hub

    fake_hub_cache(tmp_path / "hub", "cached-model", {"config.json": MINILM / "config.json"})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "out"
    for given in (small["gpt2"], f"{small['gpt2']}/model.safetensors", "minilm", "MiniLM", "org/some-model",
                  "cached-model"):
        err = error_of(capsys, ["inspect", given, "--out", str(out)])
        assert err == (f"scratch-models inspect: error: {given!r} names a checkpoint, and no text follows it: give the "
                       f"text too (inspect {given} TEXT); to inspect {given!r} as a text, name the model before it "
                       f"(inspect minilm {given!r})")
        assert not out.exists()


def test_inspect_still_reads_one_word_or_a_sentence_as_the_text_of_minilm(tmp_path, capsys):
    for text in ("flies", "time flies like an arrow", "and/or not"):
        assert main(["inspect", text, "--out", str(tmp_path)]) == 0
        assert capsys.readouterr().out.startswith("inspect minilm: ")


# ----------------------------------------------------------------------------------------------- empty texts


def empty_text_cases(small):
    gpt2, mlm = small["gpt2"], small["mlm"]
    return [
        (["verify", gpt2, "--text", ""], "--text '' gives no tokens: give a text that does"),
        (["verify", gpt2, "--text", "fine", "--text", ""], "--text '' gives no tokens"),
        (["lens", gpt2, "", "--out", "{out}"], "the text gives no tokens: give a text that does"),
        (["inspect", gpt2, "", "--out", "{out}"], "the text gives no tokens"),
        (["generate", gpt2, ""], "the prompt gives no tokens"),
        (["heads", gpt2, "a text", "", "--out", "{out}"], "the text 2 gives no tokens"),
        (["patch", gpt2, "--clean", "", "--corrupted", "x", "--out", "{out}"], "--clean gives no tokens"),
        (["fill-mask", mlm, ""], "the text holds no mask token '[MASK]': ''"),  # BERT: '' is [CLS] [SEP]
    ]


@pytest.mark.parametrize("case", range(8))
def test_an_empty_text_is_one_line_naming_it_in_every_command(small, tmp_path, capsys, case):
    """Before: verify printed a 40-line traceback from transformers, lens a dtype error, heads a bare IndexError,
    inspect '--token 0 is out of range 0..-1'."""
    argv, message = empty_text_cases(small)[case]
    out = tmp_path / "out"
    err = error_of(capsys, [arg.format(out=out) for arg in argv])
    assert err.startswith(f"scratch-models {argv[0]}: error: {message}"), err
    assert not out.exists()


def test_an_empty_text_is_a_text_for_bert_as_in_transformers(capsys):
    """'' tokenizes to [CLS] [SEP]: a real input, compared like any other."""
    assert main(["verify", "--text", ""]) == 0
    assert "1. '' (2 tokens)" in capsys.readouterr().out


def test_an_empty_pair_of_one_text_is_none_as_in_transformers(tmp_path, capsys):
    """inspect once read an empty --pair as a segment of its own, and then looked for its start ('1 is not in
    list'); transformers reads one text's empty pair as none, and so do the commands."""
    assert main(["inspect", "minilm", "time flies", "--pair", "", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("inspect minilm: 4 tokens: '[CLS]' 'time' 'flies' '[SEP]'\n")


# ------------------------------------------------------------------------------------ mistyped flags and names


@pytest.mark.parametrize("argv, message", [
    (["verify", "--txt", "hi"], "scratch-models verify: error: unrecognized arguments: --txt (did you mean --text?)"),
    (["generate", "gpt2", "x", "--max-new-tokns=3"], "unrecognized arguments: --max-new-tokns=3 (did you mean "
                                                     "--max-new-tokens?)"),
    (["heads", "minilm", "x", "--out", "o", "--bach-size", "2"], "unrecognized arguments: --bach-size 2 (did you "
                                                                 "mean --batch-size?; quote a text that has spaces)"),
    (["lens", "minilm", "The", "Eiffel", "--out", "o"], "scratch-models lens: error: unrecognized arguments: Eiffel "
                                                        "(quote a text that has spaces)"),
    (["verfy"], "argument command: invalid choice: 'verfy' (choose from 'verify', 'fill-mask', 'classify', "
                "'generate', 'inspect', 'lens', 'heads', 'patch', 'convert', 'tiny', 'harvest', 'features', "
                "'attribute'); did you mean 'verify'?"),
    (["verify", "--dtype", "flaot16"], "argument --dtype: invalid choice: 'flaot16' (choose from 'float32', "
                                       "'float16', 'bfloat16'); did you mean 'float16'?"),
    (["heads", "minilm", "x", "--out", "o", "--target", "nxt"], "did you mean 'next'?"),
    (["verify", "--zzz"], "scratch-models verify: error: unrecognized arguments: --zzz\n"),
    (["inspect", "x", "--ot", "d"], "scratch-models inspect: error: the following arguments are required: --out "
                                    "(--ot: did you mean --out?)\n"),
    (["patch", "minilm", "--clen", "a", "--corrupted", "b", "--out", "d"],
     "the following arguments are required: --clean (--clen: did you mean --clean?)\n"),
    (["verify", "--hlp"], "unrecognized arguments: --hlp (did you mean --help?)"),
])
def test_a_typo_gets_the_close_flag_command_or_choice(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------- outputs checked before the work


@pytest.mark.parametrize("where", ["under a file", "a directory", "missing directory"])
def test_verify_json_that_cannot_be_written_is_refused_before_the_report(tmp_path, capsys, no_loading, where):
    """Before: the whole comparison ran, its report printed, then the write failed."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    path, message = {"under a file": (tmp_path / "file" / "r.json", f"{tmp_path / 'file'} is not a directory"),
                     "a directory": (tmp_path / "dir", "is a directory"),
                     "missing directory": (tmp_path / "no" / "r.json", f"{tmp_path / 'no'} does not exist")}[where]
    err = error_of(capsys, ["verify", "--json", str(path)])
    assert err == f"scratch-models verify: error: --json {path}: {message}"


def test_verify_json_over_an_existing_file_is_checked_and_left_until_the_report(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text("old")
    assert main(["verify", "--text", "Hi.", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["passed"] is True


@pytest.mark.parametrize("argv", [["inspect", "x", "--out", "{out}"], ["lens", "{gpt2}", "x", "--out", "{out}"],
                                  ["heads", "minilm", "x", "--out", "{out}"],
                                  ["patch", "minilm", "--clean", "a", "--corrupted", "b", "--out", "{out}"],
                                  ["convert", "minilm", "{out}"]])
def test_an_output_directory_that_cannot_be_made_is_refused_before_the_work(small, tmp_path, capsys, no_loading,
                                                                             argv):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    flag = "destination" if argv[0] == "convert" else "--out"
    err = error_of(capsys, [arg.format(out=out, gpt2=small["gpt2"]) for arg in argv])
    assert err == f"scratch-models {argv[0]}: error: {flag} {out}: {tmp_path / 'file'} is a file, not a directory"


def test_a_directory_in_the_way_of_an_output_file_is_left_alone(tmp_path, capsys):
    """The neighbour of save_pretrained's: every command writes through the same staging."""
    (tmp_path / "attention.html").mkdir()
    (tmp_path / "attention.html" / "mine.txt").write_text("mine")
    err = error_of(capsys, ["inspect", "x", "--out", str(tmp_path)])
    assert err == (f"scratch-models inspect: error: {tmp_path / 'attention.html'}: is a directory; writing the file "
                   "attention.html there would replace it and delete what it holds: move it away, or write elsewhere")
    assert (tmp_path / "attention.html" / "mine.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.html"]


# ---------------------------------------------------------------------------------- the model named one way


def test_the_model_is_named_as_given_everywhere(tmp_path, capsys, small):
    """Left out, it is `minilm` (before: 'all-MiniLM-L6-v2 (embedded: minilm)' in inspect, `minilm` elsewhere)."""
    assert main(["inspect", "time flies", "--out", str(tmp_path / "i")]) == 0
    assert capsys.readouterr().out.startswith("inspect minilm: 4 tokens")
    assert json.loads((tmp_path / "i" / "summary.json").read_text())["model"] == "minilm"
    assert (tmp_path / "i" / "summary.txt").read_text().startswith("minilm\n")
    assert main(["verify", "--text", "Hi."]) == 0
    assert capsys.readouterr().out.startswith("verify minilm: ")
    given = small["gpt2"] + "/"  # as typed, trailing slash and all
    assert main(["lens", given, "The cat", "--out", str(tmp_path / "l")]) == 0
    assert capsys.readouterr().out.startswith(f"logit lens of {given}: ")
    assert error_of(capsys, ["fill-mask", given, "x"]).startswith(f"scratch-models fill-mask: error: {given}: ")
    assert error_of(capsys, ["heads", given, "a", "--out", str(tmp_path / "h"), "--target", "mlm"]).startswith(
        f"scratch-models heads: error: --target mlm: {given} has the head GPT2LMHeadModel")


# ------------------------------------------------------------------------------------------ what --help offers


def help_of(capsys, command) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["generate", "fill-mask", "lens", "classify"])
def test_help_offers_minilm_only_to_commands_that_work_on_it(capsys, command):
    """MiniLM is a BERT without a head: it cannot generate, fill masks, read a lens or classify."""
    assert "minilm" not in help_of(capsys, command)


def test_generate_help_names_the_causal_families_and_others_offer_minilm(capsys):
    causal = " or ".join(family.title for family in FAMILIES.values() if family.causal)  # GPT-2 or GPT-NeoX
    assert f"model a {causal} checkpoint (a hub id," in help_of(capsys, "generate")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"continue a prompt with a causal language model ({causal})" in " ".join(capsys.readouterr().out.split())
    for command in ("verify", "inspect", "heads", "patch", "convert"):
        assert "`minilm`" in help_of(capsys, command), command
