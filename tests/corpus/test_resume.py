"""Nothing lost, nothing twice: a harvest killed with SIGKILL at any moment resumes to the rows an uninterrupted
run writes; a full disk stops it with the finished shards intact; too little free space refuses to start."""

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
import torch

from corpus_data import SENTENCES, write_jsonl
from scratch_models.corpus import DiskFull, HarvestError, harvest, run_harvest
from scratch_models.corpus import storage
from weight_mapping import DirectoryBusy
from locking import held_elsewhere
from weight_mapping.locks import LOCK_FILE


def command(model_dir, data, out):
    # rows of 48 + 3x16 floats; shards of about 4 KB, so a small corpus makes a few hundred
    return [sys.executable, "-m", "scratch_models", "harvest", str(model_dir), str(data), "--names", "layers.1.out",
            "layers.0.attn.q", "--out", str(out), "--context", "16", "--shard-size", "0.004", "--quiet"]


def held(model_dir, data, out, release: Path, shards: int = 0) -> list[str]:
    """`command` run so that, once `shards` shards are on disk, each forward pass waits until `release` exists (at
    most 300 s): a harvest caught in the middle whatever the machine's speed, for a signal or a second command."""
    code = ("import sys, time; from pathlib import Path; from scratch_models.corpus.activations import Runner; "
            "run, release, out = Runner.run, Path(sys.argv.pop(1)), Path(sys.argv.pop(1)); "
            "shards = int(sys.argv.pop(1)); "
            "waiting = lambda: len(list(out.glob('data-*.arrow'))) >= shards and not release.exists(); "
            "hold = lambda: next((True for _ in range(3000) if not waiting() or time.sleep(0.1)), True); "
            "Runner.run = lambda self, batch: (hold(), run(self, batch))[1]; "
            "sys.argv[0] = 'scratch-models'; from importlib.metadata import entry_points; "
            "(cli,) = entry_points(group='console_scripts', name='scratch-models'); raise SystemExit(cli.load()())")
    return [sys.executable, "-c", code, str(release), str(out), str(shards), *command(model_dir, data, out)[3:]]


def same_rows(out, reference):
    ours, theirs = (datasets.load_from_disk(str(d)).with_format("torch")[:] for d in (out, reference))
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    manifests = [json.loads((d / "harvest.json").read_text()) for d in (out, reference)]
    assert [(m["status"], m["shards"], m["rows"], m["tokens"]) for m in manifests[:1]] == \
        [(m["status"], m["shards"], m["rows"], m["tokens"]) for m in manifests[1:]]


def wait_for(condition, process, timeout=120):
    start = time.monotonic()
    while not condition():
        assert process.poll() is None, f"the harvest ended before it could be killed:\n{process.stderr.read()}"
        assert time.monotonic() - start < timeout, "timed out waiting for the harvest"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_gpt2):
    """(a corpus of some sixty small shards, its uninterrupted harvest, the env), made once for the module."""
    directory = tmp_path_factory.mktemp("many-shards")
    data = write_jsonl(directory / "c.jsonl", [{"text": f"{s} ({i})"} for i in range(36) for s in SENTENCES])
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    subprocess.run(command(tiny_gpt2[0], data, directory / "reference"), check=True, env=env, capture_output=True)
    return data, directory / "reference", env


@pytest.fixture
def many_shards(uninterrupted, tmp_path):
    """(the corpus, its uninterrupted harvest, where to harvest it again, the env)."""
    data, reference, env = uninterrupted
    return data, reference, tmp_path / "out", env


@pytest.mark.slow
def test_kill_9_at_any_moment_then_the_same_command_resumes_to_the_same_rows(tiny_gpt2, many_shards):
    data, reference, out, env = many_shards
    assert len(list(reference.glob("data-*.arrow"))) > 50

    def shards():
        return len(list(out.glob("data-*.arrow")))

    total = len(list(reference.glob("data-*.arrow")))
    kills = [lambda p: wait_for(lambda: shards() >= 1, p),  # after a shard
             lambda p: wait_for(lambda: any(out.glob("data-*.arrow.partial")) and shards() > total // 10, p),
             lambda p: time.sleep(2.5),  # wherever it is then (most likely still starting)
             lambda p: wait_for(lambda: any(out.glob("data-*.arrow.partial")) and shards() > total // 3, p)]
    before = 0
    for kill_when in kills:
        process = subprocess.Popen(command(tiny_gpt2[0], data, out), env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        kill_when(process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert shards() >= before  # finished shards stay finished
        before = shards()
        assert not (out / "state.json").exists()
        for counts in out.glob("data-*.json"):  # every counts file is whole JSON
            json.loads(counts.read_text())
    assert 0 < before < total
    done = subprocess.run(command(tiny_gpt2[0], data, out), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"{before} of the shards {'was' if before == 1 else 'were'} there already" in done.stdout
    same_rows(out, reference)
    assert not list(out.glob("*.partial"))


def test_a_disk_full_while_writing_keeps_the_finished_shards_and_resumes(tmp_path, tiny_gpt2_model, monkeypatch):
    """ENOSPC on the fifth write: a DiskFull naming the directory, the shards finished before intact; the same call
    afterwards gives the rows of an uninterrupted run."""
    from datasets.arrow_writer import ArrowWriter

    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 4, names=["layers.1.out"], context=8,
                     shard_bytes=3000, progress=False)
    harvest(**arguments, out=tmp_path / "reference")
    write = ArrowWriter.write_batch
    calls = []

    def full(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, *args, **kwargs)

    monkeypatch.setattr(ArrowWriter, "write_batch", full)
    out = tmp_path / "out"
    with pytest.raises(DiskFull, match=rf"the disk holding {out} is full \(writing shard \d+\): the \d+ shards "
                                       "finished are intact; free some space"):
        harvest(**arguments, out=out)
    # the unfinished shard's .partial stays, with what of it was flushed (test_seams checks the resume goes on there)
    assert list(out.glob("data-*.arrow")) and not (out / "state.json").exists()
    monkeypatch.setattr(ArrowWriter, "write_batch", write)
    harvest(**arguments, out=out)
    same_rows(out, tmp_path / "reference")


@pytest.fixture
def small_disk(tmp_path):
    """A real 300 KB file system (tmpfs; needs root, as CI here has): skip where it cannot be mounted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.decode().strip() or 'not root'})")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_real_full_disk_then_more_space_resumes(tmp_path, tiny_gpt2_model, small_disk):
    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 12, names=["layers.0.out", "layers.1.out"], context=8,
                     shard_bytes=20_000, progress=False)
    harvest(**arguments, out=tmp_path / "reference")
    reference_bytes = sum(f.stat().st_size for f in (tmp_path / "reference").glob("data-*.arrow"))
    assert reference_bytes > 300_000
    out = small_disk / "acts"
    with pytest.raises(HarvestError, match=r"KB free, and this harvest needs about .* \(.*documents"):
        harvest(**arguments, out=out)  # refused before it starts
    assert not list(out.glob("data-*"))
    with pytest.raises(DiskFull, match="is full"):
        harvest(**arguments, out=out, space_check=False)
    assert sorted(out.glob("data-*.arrow"))
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    harvest(**arguments, out=out)
    same_rows(out, tmp_path / "reference")


def test_the_space_check_compares_the_estimate_with_what_is_free(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(HarvestError, match=r"1.0 KB free, and this harvest needs about 2.0 KB \(the basis\).*space_check=False"):
        storage.check_space(tmp_path, 2000, "the basis")
    storage.check_space(tmp_path, 1000, "the basis")


BASE = dict(data=SENTENCES * 5, names=["layers.1.out"], context=8, shard_bytes=3000, progress=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_gpt2_model):
    out = tmp_path_factory.mktemp("reference")
    dataset = harvest(tiny_gpt2_model, **BASE, out=out)
    assert len(list(out.glob("data-*.arrow"))) > 3
    return out, dataset.num_rows


# the shard size (issue 29's loss) in the quick suite, the settings that were already saved in the slow one
@pytest.mark.parametrize("changed", [dict(shard_bytes=1500), dict(shard_bytes=6000)] + [pytest.param(
    changed, marks=pytest.mark.slow) for changed in (
    dict(names=["layers.0.out"]), dict(dtype="float16"), dict(context=9), dict(prepend_bos=False),
    dict(drop_special=True), dict(batch_size=3), dict(batching="document", context=None), dict(layout="saelens"),
    dict(data=SENTENCES * 5 + ["The end."]))],
    ids=lambda changed: ",".join(f"{k}={v}" for k, v in changed.items() if k != "context" or len(changed) == 1))
@pytest.mark.parametrize("stopped", ["finished", "crashed"])
def test_a_resume_with_any_setting_that_moves_rows_between_shards_is_refused(tmp_path, tiny_gpt2_model, monkeypatch,
                                                                             reference, changed, stopped):
    """Each setting that changes which rows a shard holds (the shard size too): a resume with another value, of a
    finished harvest or of one stopped after two shards, is refused, and the same call then completes it with every
    row once, the manifest counting them."""
    out = tmp_path / "out"
    if stopped == "crashed":
        commit, commits = storage.ShardWriter._commit, []

        def fail_third(self, *args):
            commits.append(1)
            if len(commits) == 3:
                raise OSError(errno.EIO, "Input/output error")
            return commit(self, *args)

        monkeypatch.setattr(storage.ShardWriter, "_commit", fail_third)
        with pytest.raises(OSError, match="Input/output error"):
            harvest(tiny_gpt2_model, **BASE, out=out)
        monkeypatch.setattr(storage.ShardWriter, "_commit", commit)
        assert len(list(out.glob("data-*.arrow"))) == 2
    else:
        harvest(tiny_gpt2_model, **BASE, out=out)
    key = next(k for k in changed if k != "context" or len(changed) == 1)
    with pytest.raises(HarvestError, match=rf"other settings \(.*{key}: .* there, .* now"):
        harvest(tiny_gpt2_model, **BASE | changed, out=out)
    again = harvest(tiny_gpt2_model, **BASE, out=out)
    same_rows(out, reference[0])  # row for row: none lost, none twice
    manifest = json.loads((out / "harvest.json").read_text())
    assert manifest["rows"] == again.num_rows == reference[1]


def test_a_second_harvest_on_the_same_out_refuses_at_once_naming_the_first(tmp_path, tiny_gpt2_model):
    import socket

    arguments = dict(model=tiny_gpt2_model, data=SENTENCES, names=["layers.0.out"], out=tmp_path / "out", context=8,
                     progress=False)
    with held_elsewhere(tmp_path / "out", "harvest"):
        for overwrite in (False, True):  # --overwrite neither: the first harvest's files are its own
            with pytest.raises(DirectoryBusy, match=rf"another harvest is running there \(pid {os.getpid()} on "
                                                    rf"{socket.gethostname()}, started 20\d\d-.*\): wait for it"):
                harvest(**arguments, overwrite=overwrite)
    harvest(**arguments)
    assert not (tmp_path / "out" / LOCK_FILE).exists()  # let go at the end


def test_the_lock_of_a_process_that_is_gone_is_taken_over(tmp_path, tiny_gpt2_model):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "host": "here", "started": "then"}))
    rows = harvest(tiny_gpt2_model, SENTENCES, ["layers.0.out"], out, context=8, progress=False)
    assert rows.num_rows > 0 and not (out / LOCK_FILE).exists()


@pytest.mark.slow
def test_two_identical_commands_at_once_the_second_refuses_naming_the_first(tmp_path, tiny_gpt2):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": f"{s} ({i})"} for i in range(4) for s in SENTENCES])
    out = tmp_path / "out"
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    # the first one holds its first forward pass until the second has run, however long either takes to start
    release = tmp_path / "release"
    first = subprocess.Popen(held(tiny_gpt2[0], data, out, release), env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (out / LOCK_FILE).is_file() and (out / LOCK_FILE).read_text(), first)
    second = subprocess.run(command(tiny_gpt2[0], data, out), env=env, capture_output=True, text=True)
    release.touch()
    assert second.returncode == 2
    assert f"another harvest is running there (pid {first.pid} on " in second.stderr
    assert first.wait() == 0, first.stderr.read()
    assert json.loads((out / "harvest.json").read_text())["status"] == "complete"


def test_a_start_that_failed_on_the_corpus_leaves_nothing_that_refuses_the_fixed_command(tmp_path, tiny_gpt2_model):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "short"}, {"text": " ".join(["word"] * 100)}])
    arguments = dict(model=tiny_gpt2_model, data=data, names=["layers.0.out"], out=tmp_path / "out",
                     batching="document", progress=False)
    with pytest.raises(ValueError, match=r"row 1: \d+ tokens, longer than the 64"):
        harvest(**arguments)
    write_jsonl(data, [{"text": "short"}, {"text": "not so long"}])
    assert harvest(**arguments).num_rows > 0


def test_the_same_files_given_relative_or_absolute_are_the_same_settings(tmp_path, tiny_gpt2, tiny_gpt2_model,
                                                                         monkeypatch):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": s} for s in SENTENCES])
    monkeypatch.chdir(tmp_path)
    relative = dict(model=os.path.relpath(tiny_gpt2[0]), data="c.jsonl", out="out")
    absolute = dict(model=str(tiny_gpt2[0]), data=str(data), out=str(tmp_path / "out"))
    harvest(**relative, names=["layers.0.out"], context=8, progress=False)
    again = harvest(**absolute, names=["layers.0.out"], context=8, progress=False)  # resumes: nothing to do
    assert again.num_rows > 0 and json.loads((tmp_path / "out" / "harvest.json").read_text())["status"] == "complete"


def same_bytes(out, reference):
    names = sorted(p.name for p in reference.glob("data-*.arrow"))
    assert names == sorted(p.name for p in out.glob("data-*.arrow"))
    for name in names:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


def test_a_stop_inside_a_shard_keeps_what_is_written_and_the_resume_goes_on_from_there(tmp_path, tiny_gpt2_model,
                                                                                      monkeypatch):
    """One shard of many batches, what is written kept after each (KEEP_SECONDS 0): a run stopped at its sixth
    forward pass resumes from the kept part, runs only the batches after it, and writes the bytes of an
    uninterrupted run."""
    from scratch_models.corpus.activations import Runner

    monkeypatch.setattr(storage, "KEEP_SECONDS", 0.0)
    arguments = dict(model=tiny_gpt2_model, data=SENTENCES * 6, names=["layers.1.out"], context=8, batch_size=1,
                     progress=False)
    reference, whole = run_harvest(**arguments, out=tmp_path / "reference")
    assert whole.shards == 1
    run, calls = Runner.run, []

    def stopped(self, batch):
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("stopped")
        return run(self, batch)

    monkeypatch.setattr(Runner, "run", stopped)
    with pytest.raises(RuntimeError, match="stopped"):
        harvest(**arguments, out=tmp_path / "out", threads=1)
    monkeypatch.setattr(Runner, "run", run)
    kept = json.loads((tmp_path / "out" / "data-00000.kept.json").read_text())
    assert kept["batches"] == 5 and kept["counts"]["sequences"] == 5 and not list((tmp_path / "out").glob("*.arrow"))
    _, summary = run_harvest(**arguments, out=tmp_path / "out")
    assert summary.tokens == whole.tokens - 5 * 8
    same_bytes(tmp_path / "out", tmp_path / "reference")
    same_rows(tmp_path / "out", tmp_path / "reference")
    assert not list((tmp_path / "out").glob("*.kept*")) and not list((tmp_path / "out").glob("*.partial"))


CHILD = """
import sys
from scratch_models.corpus import harvest, storage
storage.KEEP_SECONDS = float(sys.argv[4])
harvest(sys.argv[1], sys.argv[2], ["layers.1.out"], sys.argv[3], context=8, batch_size=1, progress=False)
"""


@pytest.mark.slow
def test_kill_9_inside_the_only_shard_costs_only_what_was_not_yet_kept(tmp_path, tiny_gpt2):
    """A shard far larger than the corpus: SIGKILL once part of it is kept, and the same command resumes from
    that part (twice over) to the bytes of an uninterrupted run."""
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": f"{s} ({i})"} for i in range(40) for s in SENTENCES])
    env = os.environ | {"HF_HUB_OFFLINE": "1"}

    def child(out, keep):
        return [sys.executable, "-c", CHILD, str(tiny_gpt2[0]), str(data), str(out), str(keep)]

    subprocess.run(child(tmp_path / "reference", 30), check=True, env=env, capture_output=True)
    out, kept = tmp_path / "out", tmp_path / "out" / "data-00000.kept.json"
    batches = []
    for _ in range(2):
        process = subprocess.Popen(child(out, 0), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: kept.is_file() and json.loads(kept.read_text())["batches"] > 20 + (batches or [0])[-1],
                 process)
        process.send_signal(signal.SIGKILL)
        process.wait()
        batches.append(json.loads(kept.read_text())["batches"])
    assert batches[1] > batches[0] and not list(out.glob("data-*.arrow"))
    subprocess.run(child(out, 30), check=True, env=env, capture_output=True)
    same_bytes(out, tmp_path / "reference")


@pytest.mark.slow
def test_ctrl_c_says_what_is_kept_exits_130_and_the_same_command_resumes(tiny_gpt2, many_shards):
    data, reference, out, env = many_shards
    # held once 3 shards are written (the signal comes mid-run however fast the machine), with its bar; released
    # right after the signal, so the forward passes on harvest's threads finish and it can stop
    release = out.parent / "release"  # the test's own directory
    shown = [word for word in held(tiny_gpt2[0], data, out, release, shards=3) if word != "--quiet"]
    process = subprocess.Popen(shown, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list(out.glob("data-*.arrow"))) >= 3, process)
    process.send_signal(signal.SIGINT)
    time.sleep(3)  # the interrupt handled first; then the held passes return and harvest stops
    release.touch()
    assert process.wait(timeout=60) == 130
    said = process.stderr.read()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    kept = len(list(out.glob("data-*.arrow")))
    assert re.search(rf"scratch-models harvest: interrupted: {kept} of about \d+ shards kept.*; the same command "
                     "resumes\n$", said), said
    assert "100%" not in said.split("\r")[-1], said  # the bar does not claim to have finished
    done = subprocess.run(command(tiny_gpt2[0], data, out), env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    same_rows(out, reference)


def test_the_writer_counts_bytes_as_it_writes_them(tmp_path):
    import numpy as np

    features = datasets.Features({"x": datasets.Value("float32")})
    writer = storage.ShardWriter(tmp_path, features)
    writer.begin(0)
    writer.write({"x": np.zeros(1000, np.float32)}, {"batches": 1, "counts": {}})
    start = time.monotonic()
    while writer.bytes_written < 4000:  # the shard is not finished, and its bytes already count
        assert time.monotonic() - start < 30, writer.bytes_written
        time.sleep(0.01)
    assert not (tmp_path / "data-00000.arrow").exists()
    writer.end({"rows": 1000})
    writer.close()
    assert writer.bytes_written == (tmp_path / "data-00000.arrow").stat().st_size
