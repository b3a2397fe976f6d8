"""harvest at its seams: a kill between any file's write and its rename, a second command on the same directory, a
resume that would compute rows otherwise, a full disk inside a shard, a shard or record cut short, Ctrl-C twice."""

import errno
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from corpus_data import SENTENCES, write_jsonl
from helpers import rewrite_same_size
from locking import held_elsewhere
from scratch_models.corpus import DiskFull, HarvestError, harvest, run_harvest, storage
from test_resume import command, held, same_bytes, same_rows, wait_for
from weight_mapping import DirectoryBusy
from weight_mapping.locks import LOCK_FILE

ARGUMENTS = dict(names=["layers.1.out"], context=8, shard_bytes=3000, progress=False)


def snapshots_at_each_rename(monkeypatch, directory, root):
    """Patch os.replace so that, before each rename inside `directory` of a kind not seen yet (the shards' numbers
    aside; the manifest's every time), a copy of `directory` is taken into `root`: exactly what a kill at that
    moment leaves on disk (the new file written under its temporary name, not yet renamed). Returns the list the
    (copy, name renamed) are appended to."""
    copies, seen = [], set()
    replace = os.replace

    def snapshot_then_replace(source, target, *args, **kwargs):
        kind = re.sub(r"\d+", "N", os.path.basename(source))
        if str(source).startswith(str(directory)) and (kind not in seen or kind.startswith("harvest.json")):
            seen.add(kind)
            copy = root / f"kill-{len(copies):03d}"
            shutil.copytree(directory, copy)
            copies.append((copy, os.path.basename(source)))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", snapshot_then_replace)
    return copies


def test_a_kill_before_any_rename_leaves_what_the_same_command_and_overwrite_take(tmp_path, tiny_gpt2_model,
                                                                                  monkeypatch):
    """Every rename of a harvest (the manifest's at the start and the end, each shard's counts and shard, what is
    kept of one, state.json, dataset_info.json): the directory as a kill just before it leaves it is taken by the
    same call, which finishes with the rows of an uninterrupted run; the first one is also taken by --overwrite
    (before, a lone harvest.json.partial made the directory 'not empty' to both)."""
    monkeypatch.setattr(storage, "KEEP_SECONDS", 0.0)  # kept records too
    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 2, **ARGUMENTS, threads=1)
    harvest(**arguments, out=tmp_path / "reference")
    copies = snapshots_at_each_rename(monkeypatch, tmp_path / "out", tmp_path / "kills")
    harvest(**arguments, out=tmp_path / "out")
    monkeypatch.undo()
    renamed = {name.split(".")[0] if name.startswith("data-") else name for _, name in copies}
    assert {"harvest.json.partial", "state.json.partial", "dataset_info.json.partial", "data-00000"} <= renamed
    first = copies[0][0]
    assert sorted(p.name for p in first.iterdir()) == sorted([LOCK_FILE, "harvest.json.partial"])
    for copy, name in copies:
        harvest(**arguments, out=copy)
        same_rows(copy, tmp_path / "reference")
        assert not list(copy.glob("*.partial")) and not list(copy.glob("*.kept*")), name
    cut = tmp_path / "cut"  # the first state, its manifest cut short as well: --overwrite takes it too
    cut.mkdir()
    (cut / "harvest.json.partial").write_text('{"format": "scratch-models harv')
    harvest(**arguments, out=cut, overwrite=True)
    same_rows(cut, tmp_path / "reference")


def test_a_second_command_is_refused_before_the_model_is_loaded(tmp_path, tiny_gpt2, monkeypatch):
    """Whatever command holds the directory (features here), a harvest there refuses at once, naming it, before it
    loads or hashes the model (before, under load a second harvest ran 46 s before it was refused)."""
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the lock was taken")

    monkeypatch.setattr(importlib.import_module("scratch_models.corpus.harvest"), "load_model", no_loading)
    out = tmp_path / "out"
    with held_elsewhere(out, "features"):
        with pytest.raises(DirectoryBusy, match=rf"{out}: another features is running there \(pid {os.getpid()} "):
            harvest(str(tiny_gpt2[0]), SENTENCES, ["layers.0.out"], out, progress=False)
    assert not out.exists()  # the lock made it; nothing was written, so it is gone again


def test_a_resume_that_would_compute_rows_otherwise_is_refused(tmp_path, tiny_gpt2_model):
    """compile (eager and compiled rows differ by up to ~1e-5), the device and the torch threads a forward pass
    runs on are settings of the harvest: a resume that changes one is refused, naming it with both values."""
    out = tmp_path / "out"
    harvest(tiny_gpt2_model, SENTENCES, out=out, **ARGUMENTS, threads=1)
    settings = json.loads((out / "harvest.json").read_text())["settings"]
    assert settings["compile"] is False and settings["torch_threads"] == 1 and settings["model_dtype"] == "float32"
    assert settings["device"].startswith("cpu (")
    with pytest.raises(HarvestError, match=r"other settings \(compile: false there, true now\): run the same"):
        harvest(tiny_gpt2_model, SENTENCES, out=out, **ARGUMENTS, threads=1, compile=True)


def test_a_full_disk_inside_a_shard_keeps_the_batches_that_reached_it(tmp_path, tiny_gpt2_model, monkeypatch):
    """ENOSPC at the sixth batch of the only shard: the five written before stay kept (before, the shard and its
    kept record were deleted: up to a whole shard redone), the message says so, and the resume runs only the
    batches after them, to the bytes of an uninterrupted run."""
    from datasets.arrow_writer import ArrowWriter

    from scratch_models.corpus.activations import Runner

    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 6, names=["layers.1.out"], context=8, batch_size=1,
                     progress=False, threads=1)
    _, whole = run_harvest(**arguments, out=tmp_path / "reference")
    assert whole.shards == 1
    write, calls = ArrowWriter.write_batch, []

    def full(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, *args, **kwargs)

    monkeypatch.setattr(ArrowWriter, "write_batch", full)
    out = tmp_path / "out"
    with pytest.raises(DiskFull, match=r"the 0 shards finished are intact, and 5 batches of shard 0 \(.* KB\); free"):
        harvest(**arguments, out=out)
    monkeypatch.setattr(ArrowWriter, "write_batch", write)
    run, ran = Runner.run, []
    monkeypatch.setattr(Runner, "run", lambda self, batch: (ran.append(1), run(self, batch))[1])
    _, summary = run_harvest(**arguments, out=out)
    assert summary.tokens == whole.tokens - 5 * 8
    same_bytes(out, tmp_path / "reference")


@pytest.fixture
def finished(tmp_path, tiny_gpt2_model):
    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 2, **ARGUMENTS)
    harvest(**arguments, out=tmp_path / "reference")
    shutil.copytree(tmp_path / "reference", tmp_path / "out")
    return arguments, tmp_path / "out", tmp_path / "reference"


def test_a_shard_cut_short_is_named_with_its_recorded_length(finished):
    arguments, out, reference = finished
    shard = out / "data-00001.arrow"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(HarvestError, match=rf"{shard}: {size - 100} bytes, where data-00001.json records {size}: "
                                           r"the shard was cut short or changed since it was written; delete it and "
                                           r"data-00001.arrow, and run the same command again"):
        harvest(**arguments, out=out)
    shard.unlink()
    (out / "data-00001.json").unlink()
    harvest(**arguments, out=out)  # as the message says: that shard is redone
    same_rows(out, reference)


def test_a_garbled_shard_or_record_is_named(finished):
    arguments, out, reference = finished
    counts = out / "data-00000.json"
    counts.write_text(counts.read_text()[:20])
    with pytest.raises(HarvestError, match=rf"{counts}: not valid JSON \(.*\): the file was cut short or changed; "
                                           "delete it and data-00000.arrow"):
        harvest(**arguments, out=out)
    shutil.copy(reference / counts.name, counts)
    shard = out / "data-00002.arrow"
    garbled = bytearray(shard.read_bytes())
    garbled[:16] = b"\x13" * 16  # the stream's first message: its marker and length
    shard.write_bytes(garbled)
    with pytest.raises(HarvestError, match=rf"{shard}: not a readable Arrow stream \(.*\): the shard was changed "
                                           "since it was written; delete it and data-00002.json"):
        harvest(**arguments, out=out)
    manifest = out / "harvest.json"
    manifest.write_text("{")
    with pytest.raises(HarvestError, match=rf"{manifest}: not valid JSON .* pass --overwrite"):
        harvest(**arguments, out=out)


@pytest.mark.slow
def test_ctrl_c_twice_300_ms_apart_exits_130_with_one_line(tiny_gpt2, tmp_path):
    """The second Ctrl-C comes while the first is handled (the forward threads still in their passes): before, it
    aborted with a traceback from threading and `terminate called` (rc -6)."""
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": f"{s} ({i})"} for i in range(8) for s in SENTENCES])
    out, release = tmp_path / "out", tmp_path / "release"
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(held(tiny_gpt2[0], data, out, release, shards=1), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list(out.glob("data-*.arrow"))) >= 1, process)
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    time.sleep(1)
    release.touch()
    assert process.wait(timeout=60) == 130
    said = process.stderr.read()
    assert said.count("\n") == 1 and said.startswith("scratch-models harvest: interrupted: "), said
    done = subprocess.run(command(tiny_gpt2[0], data, out), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_rerun_trusts_the_recorded_weights_hash_only_while_the_files_are_unchanged(tmp_path, tiny_gpt2,
                                                                                      monkeypatch):
    """A rerun from the same checkpoint files (size, times, inode as recorded) takes the weights' hash from the
    manifest instead of reading every tensor again (before, each rerun of a GPT-2 124M harvest hashed 500 MB); a
    weight file rewritten to the same size with its modification time set back is still refused, naming the
    weights' hash, as it was when every rerun hashed."""
    plan = importlib.import_module("scratch_models.corpus.plan")
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_gpt2[0], checkpoint)
    out = tmp_path / "out"
    arguments = dict(model=str(checkpoint), data=SENTENCES, out=out, **ARGUMENTS, threads=1)
    harvest(**arguments)
    manifest = json.loads((out / "harvest.json").read_text())
    assert manifest["weights"]["sha256"] == manifest["settings"]["weights_sha256"]
    assert [Path(f[0]).name for f in manifest["weights"]["identity"]["files"]] == ["config.json", "model.safetensors"]

    def no_hashing(state):
        raise AssertionError("the weights were hashed again")

    with monkeypatch.context() as patched:
        patched.setattr(plan, "_digest", no_hashing)
        _, summary = run_harvest(**arguments)
    assert summary.tokens == 0 and summary.resumed_shards == summary.shards
    rewrite_same_size(checkpoint / "model.safetensors")
    with pytest.raises(HarvestError, match=r"other settings \(weights_sha256: "):
        harvest(**arguments)


def test_the_weights_identity_is_none_once_a_tensor_or_a_file_changed(tmp_path, tiny_gpt2):
    """Only a model as from_pretrained read it, from files as they were then, has a cheap identity: a tensor changed
    in place or a weight file touched since makes every run hash the tensors again."""
    from scratch_models import GPT2Model
    from scratch_models.corpus.plan import weights_identity

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_gpt2[0], checkpoint)
    model = GPT2Model.from_pretrained(checkpoint)
    assert weights_identity(model) is not None
    with torch.no_grad():
        model.layers[0].norm_1.weight.add_(1.0)
    assert weights_identity(model) is None
    model = GPT2Model.from_pretrained(checkpoint)
    os.utime(checkpoint / "model.safetensors")
    assert weights_identity(model) is None
    assert weights_identity(GPT2Model(model.config)) is None  # built, not read


def test_choosing_the_class_to_load_runs_no_initialiser(tiny_gpt2, monkeypatch):
    """The classes load_model and missing_head_tensors build for their names (shapes only) run no initialiser: on
    the meta device torch's first normal_ imports its decomposition library, 1.5 s of every harvest and features
    run before (measured on the random GPT-2 124M)."""
    from scratch_models.corpus.plan import load_model

    def no_init(*args, **kwargs):
        raise AssertionError("an initialiser ran on a model built for its shapes")

    monkeypatch.setattr(torch.Tensor, "normal_", no_init)
    monkeypatch.setattr(torch.Tensor, "uniform_", no_init)
    model = load_model(str(tiny_gpt2[0]), ["layers.1.out", "logits"])
    assert type(model).__name__ == "GPT2LMHeadModel"


def test_a_rerun_of_a_complete_harvest_does_not_read_the_corpus_again(tmp_path, tiny_gpt2_model, monkeypatch):
    """Every shard of a complete harvest there: the same call neither reads nor tokenizes the corpus again (before,
    it read it all only to count its blocks) and reports and records what it did before; a shard deleted since is
    written again, as before."""
    plan = importlib.import_module("scratch_models.corpus.plan")
    out, reference = tmp_path / "out", tmp_path / "reference"
    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 2 + [""], **ARGUMENTS, threads=1)
    _, first = run_harvest(**arguments, out=out)
    assert first.shards >= 3 and first.empty_documents == 1
    shutil.copytree(out, reference)
    manifest = json.loads((out / "harvest.json").read_text())

    def no_reading(self, rows_per_block):
        raise AssertionError("the corpus was read again")

    with monkeypatch.context() as patched:
        patched.setattr(plan.Plan, "blocks", no_reading)
        _, again = run_harvest(**arguments, out=out)
    assert (again.shards, again.resumed_shards, again.tokens, again.rows, again.empty_documents) == (
        first.shards, first.shards, 0, first.rows, 1)
    assert json.loads((out / "harvest.json").read_text()) == manifest
    same_rows(out, reference)
    (out / "data-00001.arrow").unlink()
    (out / "data-00001.json").unlink()
    _, redone = run_harvest(**arguments, out=out)
    assert redone.resumed_shards == first.shards - 1 and redone.tokens > 0
    same_rows(out, reference)
