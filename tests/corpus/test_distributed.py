"""torchrun: two CPU processes (gloo) split the shards and write what one process writes."""

import json
import os
import subprocess
import sys

import datasets
import pytest
import torch

from corpus_data import SENTENCES, write_jsonl


@pytest.mark.slow
def test_two_processes_write_the_rows_of_one(tmp_path, tiny_gpt2):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": f"{s} ({i})"} for i in range(6) for s in SENTENCES])

    def harvest(out, *launcher):
        arguments = [*launcher, "-m", "scratch_models", "harvest", str(tiny_gpt2[0]), str(data), "--names",
                     "layers.*.out", "--out", str(out), "--context", "16", "--shard-size", "0.02", "--quiet"]
        # one thread each, as torchrun gives its processes: the same kernels, so the same bits
        done = subprocess.run(arguments, capture_output=True, text=True, timeout=600,
                              env=os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    printed = harvest(tmp_path / "two", sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc_per_node", "2")
    harvest(tmp_path / "one", sys.executable)
    assert printed.count("harvest:") == 1  # rank 0 alone prints the summary
    shards = {path.name: json.loads(path.read_text()) for path in (tmp_path / "two").glob("data-*.json")}
    assert len(shards) > 3 and {c["rank"] for c in shards.values()} == {0, 1}
    assert all(c["rank"] == c["block"] % 2 for c in shards.values())
    one, two = (datasets.load_from_disk(str(tmp_path / d)).with_format("torch")[:] for d in ("one", "two"))
    for key in one:
        assert torch.equal(one[key], two[key]), key
    manifest = json.loads((tmp_path / "two" / "harvest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["status"] == "complete"
