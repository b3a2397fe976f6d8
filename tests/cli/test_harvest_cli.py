"""`scratch-models harvest` and `scratch-models verify --corpus` as a user runs them."""

import json
import re

import pytest
import torch

pytest.importorskip("datasets", reason="harvest needs Hugging Face datasets (pip install -e '.[test]')")

from scratch_models import BertModel  # noqa: E402
from scratch_models_cli.cli import main  # noqa: E402

TEXTS = ["The cat sat on the warm mat.", "Fruit flies like a banana.", "Time flies like an arrow.",
         "It purred.", "A man is playing a guitar."]


def corpus(tmp_path, rows):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_harvest_writes_prints_and_resumes(tmp_path, capsys):
    import datasets

    data, out = corpus(tmp_path, [{"text": t} for t in TEXTS]), tmp_path / "acts"
    arguments = ["harvest", "minilm", str(data), "--names", "layers.3.out", "pooler.out", "--positions", "first",
                 "--out", str(out), "--quiet"]
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    assert f"harvest: 1 shard, {len(TEXTS)} rows of layers.3.out, pooler.out" in printed
    assert "tokens/s" in printed and "time (this process): setting up (model, plan, probe)" in printed
    assert "reading and tokenizing" in printed
    assert "threads (this process): " in printed and "on 1 torch thread each" in printed
    rows = datasets.load_from_disk(str(out)).with_format("torch")[:]
    assert sorted(rows["document"].tolist()) == list(range(len(TEXTS))) and (rows["position"] == 0).all()
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    assert "1 of the shards was there already" in printed
    # a run with nothing left to do says where its seconds went: the setting up is nearly all of them
    seconds = float(re.search(r"tokens in ([\d.]+) s", printed).group(1))
    setup = float(re.search(r"setting up \(model, plan, probe\) ([\d.]+) s", printed).group(1))
    assert setup <= seconds and setup >= 0.5 * seconds, printed


@pytest.mark.parametrize("flags, message", [
    (["--names", "layers.9.out"], "unknown hook point 'layers.9.out'"),
    (["--names", "layers.0.out", "--batch-size", "0"], "--batch-size must be at least 1"),
    (["--names", "layers.0.out", "--shard-size", "0"], "--shard-size must be more than 0 MB"),
    (["--names", "layers.0.out", "--threads", "0"], "--threads must be at least 1"),
    (["--names", "layers.0.out", "--text-column", "body"], r"corpus.jsonl: no column 'body'"),
    (["--names", "layers.0.out", "--batching", "pack"], "batching 'pack'"),
])
def test_harvest_errors_name_the_problem_and_exit_2(tmp_path, capsys, flags, message):
    data = corpus(tmp_path, [{"text": t} for t in TEXTS])
    assert main(["harvest", "minilm", str(data), "--out", str(tmp_path / "acts"), "--quiet", *flags]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_harvest_names_the_row_that_is_not_text(tmp_path, capsys):
    data = corpus(tmp_path, [{"text": "fine"}, {"text": "fine"}, {"text": 7}])
    assert main(["harvest", "minilm", str(data), "--names", "layers.0.out", "--out", str(tmp_path / "a"),
                 "--quiet"]) == 2
    assert f"{data}, row 2: column 'text' holds int 7, not text" in capsys.readouterr().err


def test_verify_corpus_passes_on_the_real_minilm(tmp_path, capsys):
    data = corpus(tmp_path, [{"a": t, "b": TEXTS[-1 - i]} for i, t in enumerate(TEXTS)])
    report_path = tmp_path / "report.json"
    assert main(["verify", "--corpus", str(data), "--text-column", "a", "--pair-column", "b", "--limit", "4",
                 "--json", str(report_path)]) == 0
    printed = capsys.readouterr().out
    assert "verify minilm over" in printed and "4 texts, each alone" in printed
    assert "median" in printed and "p99" in printed and "26/26 tensors within tolerance on every text" in printed
    report = json.loads(report_path.read_text())
    assert report["passed"] and report["texts"] == 4 and all(len(r["diffs"]) == 4 for r in report["rows"])


def test_verify_corpus_finds_the_one_text_a_wrong_weight_touches(tmp_path, capsys, monkeypatch):
    """Our model's embedding of "banana" is nudged: only the text that holds it fails, and it is the worst text of
    every failing row; the command exits 1."""
    original = BertModel.from_pretrained.__func__

    def corrupted(cls, *args, **kwargs):
        model = original(cls, *args, **kwargs)
        with torch.no_grad():
            row = model.embeddings.word_embeddings.weight[model.tokenizer.backend.token_to_id("banana")]
            row += torch.linspace(-0.05, 0.05, len(row))  # not a constant, which the LayerNorm would take away
        return model

    monkeypatch.setattr(BertModel, "from_pretrained", classmethod(corrupted))
    data = corpus(tmp_path, [{"text": t} for t in TEXTS])
    assert main(["verify", "--corpus", str(data)]) == 1
    printed = capsys.readouterr().out
    failing = [line for line in printed.splitlines() if "FAIL (" in line]
    assert failing and all("FAIL (1 text)" in line and "row 1" in line for line in failing)
    assert "row 1: 'Fruit flies like a banana.'" in printed and "FAILED" in printed


@pytest.mark.parametrize("flags, message", [
    (["--limit", "3"], "--limit go with --corpus"),
    (["--corpus", "{data}", "--text", "x"], "leave out --text"),
    (["--corpus", "{data}", "--limit", "0"], "--limit must be at least 1"),
])
def test_verify_corpus_flag_mistakes(tmp_path, capsys, flags, message):
    data = corpus(tmp_path, [{"text": t} for t in TEXTS])
    assert main(["verify", *[f.format(data=data) for f in flags]]) == 2
    assert message in capsys.readouterr().err


def test_verify_corpus_names_a_text_too_long(tmp_path, capsys):
    data = corpus(tmp_path, [{"text": "short"}, {"text": " ".join(["word"] * 600)}])
    assert main(["verify", "--corpus", str(data)]) == 2
    assert f"{data}, row 1 is 602 tokens long; this model reads at most 512" in capsys.readouterr().err


def test_harvest_shows_a_progress_bar(tmp_path, capsys):
    data = corpus(tmp_path, [{"text": t} for t in TEXTS])
    assert main(["harvest", "minilm", str(data), "--names", "layers.0.out", "--out", str(tmp_path / "acts")]) == 0
    bar = capsys.readouterr().err
    last = bar.split("\r")[-1]
    assert "harvest: 100%" in last and "tok/s" in last and "KB written" in last, bar  # the rate, the bytes
