"""features at its seams: a kill between any file's write and its rename (or between the manifest and parts/), a
start that failed, a second command on the same directory, files cut short, and Ctrl-C."""

import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dictionary_data import random_sae
from helpers import rewrite_same_size
from locking import held_elsewhere
from scratch_models.dictionaries import DictionaryError
from scratch_models.dictionaries.features import run_features
from test_features import same_features
from weight_mapping import DirectoryBusy
from weight_mapping.locks import LOCK_FILE

SENTENCES = ["The meaning of life is to learn.", "Once upon a time there lived a cat.", "The cat sat on the mat.",
             "It purred.", "A man is playing a guitar."]
CORPUS = [f"{s} {i}" for i in range(3) for s in SENTENCES]
SETTINGS = dict(top_k=3, samples=4, window=(2, 1), block_tokens=40, progress=False, pages=False, context=16,
                batch_size=3)
features_module = importlib.import_module("scratch_models.dictionaries.features")


@pytest.fixture(scope="module")
def lm(tiny_gpt2):
    from scratch_models import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(tiny_gpt2[0])


@pytest.fixture(scope="module")
def sae():
    return random_sae("jumprelu", 48, 24, hook_name="blocks.1.hook_resid_pre", seed=5)


@pytest.fixture(scope="module")
def reference(lm, sae, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    run_features(lm, sae, CORPUS, out, **SETTINGS)
    return out


def test_a_kill_before_any_rename_leaves_what_the_same_call_takes(lm, sae, reference, tmp_path, monkeypatch):
    """Before each kind of rename (the manifest's at the start and the end, a part file's, the dataset's
    state.json and dataset_info.json), the directory as a kill then leaves it; and the one a kill between the
    manifest and parts/ leaves: the same call finishes each, with the result of an uninterrupted run."""
    copies, seen = [], set()
    replace = os.replace
    out = tmp_path / "out"

    def snapshot_then_replace(source, target, *args, **kwargs):
        kind = re.sub(r"^part-.*\.", "part.", os.path.basename(source))
        if str(source).startswith(str(out)) and (kind not in seen or kind.startswith("features.json")):
            seen.add(kind)
            copies.append(tmp_path / f"kill-{len(copies)}")
            shutil.copytree(out, copies[-1])
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", snapshot_then_replace)
    run_features(lm, sae, CORPUS, out, **SETTINGS, save_seconds=0)
    monkeypatch.undo()
    assert {"features.json.partial", "part.partial", "state.json.partial", "dataset_info.json.partial"} <= seen
    assert sorted(p.name for p in copies[0].iterdir()) == sorted([LOCK_FILE, "features.json.partial"])
    before_parts = tmp_path / "before-parts"  # the manifest written, parts/ not yet made
    shutil.copytree(copies[0], before_parts)
    (before_parts / "features.json.partial").rename(before_parts / "features.json")
    for copy in [*copies, before_parts]:
        run_features(lm, sae, CORPUS, copy, **SETTINGS)
        same_features(copy, reference)
        assert not list(copy.rglob("*.partial")), copy


def test_a_start_that_failed_leaves_nothing_that_refuses_the_fixed_command(lm, sae, reference, tmp_path):
    """A document too long stops the pass before anything is counted: the fixed command (other data, so other
    settings) then starts again rather than being refused, as harvest does."""
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["short", " ".join(["word"] * 100)]))
    settings = SETTINGS | dict(batching="document")
    del settings["context"]
    with pytest.raises(ValueError, match=r"row 1: \d+ tokens, longer than the 64"):
        run_features(lm, sae, data, tmp_path / "out", **settings)
    assert json.loads((tmp_path / "out" / "features.json").read_text())["status"] == "running"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    _, summary = run_features(lm, sae, data, tmp_path / "out", **settings)
    assert summary.tokens > 0


def test_a_second_command_is_refused_before_the_model_is_loaded(tiny_gpt2, sae, tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the lock was taken")

    monkeypatch.setattr(features_module, "_model", no_loading)
    out = tmp_path / "out"
    out.mkdir()
    with held_elsewhere(out, "harvest"):
        with pytest.raises(DirectoryBusy, match=rf"{out}: another harvest is running there \(pid {os.getpid()} on "):
            run_features(str(tiny_gpt2[0]), sae, CORPUS, out, **SETTINGS)


def test_files_cut_short_are_named(lm, sae, reference, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    (part,) = (out / "parts").glob("part-*.pt")
    part.write_bytes(part.read_bytes()[:200])
    with pytest.raises(DictionaryError, match=rf"{part}: cannot be read \(.*\): the file was cut short or changed; "
                                              r"delete it and run the same command again"):
        run_features(lm, sae, CORPUS, out, **SETTINGS)
    part.unlink()
    run_features(lm, sae, CORPUS, out, **SETTINGS)  # as the message says: its blocks are counted again
    same_features(out, reference)
    manifest = out / "features.json"
    manifest.write_text(manifest.read_text()[:30])
    with pytest.raises(DictionaryError, match=rf"{manifest}: not valid JSON .*; pass --overwrite"):
        run_features(lm, sae, CORPUS, out, **SETTINGS)


HELD = """
import sys, time
from pathlib import Path
from scratch_models.corpus.activations import Runner
release = Path(sys.argv.pop(1))
run = Runner.run
def held(self, batch):  # each forward pass waits for the test's signal (at most 300 s)
    for _ in range(3000):
        if release.exists():
            break
        time.sleep(0.1)
    return run(self, batch)
Runner.run = held
sys.argv[0] = "scratch-models"
from scratch_models_cli.cli import main
raise SystemExit(main())
"""


@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line_and_the_same_command_resumes(tiny_gpt2, sae, reference, tmp_path):
    """Before, one Ctrl-C printed a whole traceback (rc -2) where harvest said one line and exited 130."""
    sae.save_pretrained(tmp_path / "sae")
    data = tmp_path / "c.txt"
    data.write_text("\n".join(CORPUS))
    out, release = tmp_path / "out", tmp_path / "release"
    command = ["features", str(tiny_gpt2[0]), str(tmp_path / "sae"), str(data), "--out", str(out), "--quiet",
               "--no-pages", "--top-k", "3", "--samples", "4", "--window", "2", "1", "--context", "16",
               "--batch-size", "3"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen([sys.executable, "-c", HELD, str(release), *command], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    while not (out / "parts").is_dir():  # the pass has begun, its first forward pass held
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() - start < 120
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    time.sleep(1)
    release.touch()
    assert process.wait(timeout=60) == 130
    said = process.stderr.read()
    assert said == ("scratch-models features: interrupted: 0 blocks of the corpus counted and saved; the same command "
                    "resumes (what this run counted since it last saved, at most 60 s of it, is counted again)\n"), said
    done = subprocess.run([sys.executable, "-m", "scratch_models", *command], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_run_with_nothing_left_to_count_reports_no_pass_it_did_not_make(lm, sae, reference, tmp_path):
    """features once reported "pass 17.0 s" for 0 tokens: the model, the dictionary's hash and the plan were
    counted as the pass. The setting up is its own time; a run with nothing left to count reports 0 tokens in a
    pass of next to nothing."""
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    _, summary = run_features(lm, sae, CORPUS, out, **SETTINGS)
    assert summary.tokens_this_run == 0
    setup, passed = summary.timings["setting up (model, dictionary, plan)"], summary.timings.get("pass", 0.0)
    assert passed <= setup and passed <= 0.5 * summary.seconds, summary.format()
    assert "0 tokens this run" in summary.format()


def test_a_rerun_trusts_the_recorded_weights_hash_only_while_the_files_are_unchanged(tiny_gpt2, sae, tmp_path,
                                                                                      monkeypatch):
    """As harvest: a rerun from unchanged checkpoint files takes the weights' hash from features.json instead of
    reading every tensor again; a weight file rewritten to the same size with its modification time set back is
    still refused, naming the weights' hash."""
    plan = importlib.import_module("scratch_models.corpus.plan")
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_gpt2[0], checkpoint)
    out = tmp_path / "out"
    run_features(str(checkpoint), sae, CORPUS, out, **SETTINGS)
    manifest = json.loads((out / "features.json").read_text())
    assert manifest["weights"]["sha256"] == manifest["settings"]["weights_sha256"]

    def no_hashing(state):
        raise AssertionError("the weights were hashed again")

    with monkeypatch.context() as patched:
        patched.setattr(plan, "_digest", no_hashing)
        _, summary = run_features(str(checkpoint), sae, CORPUS, out, **SETTINGS)
    assert summary.tokens_this_run == 0
    rewrite_same_size(checkpoint / "model.safetensors")
    with pytest.raises(DictionaryError, match=r"other settings \(weights_sha256: "):
        run_features(str(checkpoint), sae, CORPUS, out, **SETTINGS)


def test_a_rerun_of_a_complete_run_writes_nothing_again_unless_something_is_missing(lm, sae, reference, tmp_path,
                                                                                    monkeypatch):
    """A complete run whose dataset (and pages, where asked for) are there: the same command merges, computes the
    logit effects and writes nothing again (before, every rerun rewrote the dataset and pages and multiplied the
    unembedding by the decoder), and reports what features.json says. Pages asked for where the run wrote none, or
    a dataset deleted, are written as before."""
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    def no_effects(*args, **kwargs):
        raise AssertionError("the logit effects were computed again")

    with monkeypatch.context() as patched:
        patched.setattr(features_module, "logit_effects", no_effects)
        dataset, summary = run_features(lm, sae, CORPUS, out, **SETTINGS)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != LOCK_FILE} == {
        p: t for p, t in before.items() if p.name != LOCK_FILE}
    manifest = json.loads((out / "features.json").read_text())
    assert (summary.tokens, summary.alive, summary.tokens_this_run) == (manifest["tokens"], manifest["alive"], 0)
    assert summary.l0 == manifest["l0"] and len(dataset) == manifest["features"]
    same_features(out, reference)
    run_features(lm, sae, CORPUS, out, **(SETTINGS | {"pages": True}))  # none were written: now they are
    assert (out / "index.html").is_file()
    shutil.rmtree(out / "dataset")
    run_features(lm, sae, CORPUS, out, **(SETTINGS | {"pages": True}))
    same_features(out, reference)


def test_a_complete_run_writing_its_outputs_again_is_not_complete_until_they_are(lm, sae, reference, tmp_path,
                                                                                 monkeypatch):
    """Pages asked for on a complete run rewrite its dataset: a kill in the middle left features.json saying
    complete beside a dataset/ half-written (or gone), which a reader of the run took for finished. Now the
    manifest says running until the outputs are whole, and the same command finishes the run."""
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    write = features_module.FeatureReport.write

    def killed_while_writing(self, directory, pages):
        shutil.rmtree(directory / "dataset")  # what the write does first
        raise KeyboardInterrupt  # stands for the kill

    with monkeypatch.context() as patched:
        patched.setattr(features_module.FeatureReport, "write", killed_while_writing)
        with pytest.raises(KeyboardInterrupt):
            run_features(lm, sae, CORPUS, out, **(SETTINGS | {"pages": True}))
    assert json.loads((out / "features.json").read_text())["status"] == "running"
    assert features_module.FeatureReport.write is write
    run_features(lm, sae, CORPUS, out, **(SETTINGS | {"pages": True}))
    assert json.loads((out / "features.json").read_text())["status"] == "complete"
    assert (out / "index.html").is_file()
    same_features(out, reference)
