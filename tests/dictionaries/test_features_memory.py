"""Memory stays flat however large the corpus: the peak anonymous memory of a features run over a corpus four times
larger grows by a small share of the feature activations the extra tokens make (2048 features a token): nothing
per token is kept, only per feature (counts, histograms, examples) and a bounded buffer of candidates."""

import json
import os
import subprocess
import sys

import pytest

from helpers import STEADY_MALLOC

CHILD = """
import sys, threading, time
import torch
sys.path.insert(0, sys.argv[4])
from dictionary_data import random_sae
from scratch_models import GPT2LMHeadModel
from scratch_models.dictionaries.features import run_features
peak = 0
def watch():  # the anonymous memory (heap, tensors); mapped files are the page cache's to drop
    global peak
    while True:
        with open("/proc/self/status") as f:
            peak = max(peak, next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) // 1024)
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
sae = random_sae("standard", 48, 2048, hook_name="layers.1.out", seed=1)
run_features(GPT2LMHeadModel.from_pretrained(sys.argv[1]), sae, sys.argv[2], sys.argv[3], context=32, batch_size=8,
             pages=False, progress=False)
time.sleep(0.1)
print(peak)
"""


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path, tiny_gpt2):
    sentences = ["The meaning of life is to learn.", "Once upon a time there lived a cat.", "It purred.",
                 "The cat sat on the mat, and the dog sat on the log."]
    peaks, tokens = {}, {}
    for copies in (1, 4):
        data = tmp_path / f"c{copies}.txt"
        data.write_text("\n".join(f"{s} {i}" for i in range(200 * copies) for s in sentences))
        done = subprocess.run([sys.executable, "-c", CHILD, str(tiny_gpt2[0]), str(data), str(tmp_path / f"o{copies}"),
                               os.path.dirname(__file__)], capture_output=True, text=True, timeout=1800,
                              env=os.environ | {"HF_HUB_OFFLINE": "1"} | STEADY_MALLOC)
        assert done.returncode == 0, done.stderr
        peaks[copies] = int(done.stdout.split()[-1])
        tokens[copies] = json.loads((tmp_path / f"o{copies}" / "features.json").read_text())["tokens"]
    assert tokens[4] > 3.9 * tokens[1] > 25_000
    activations = (tokens[4] - tokens[1]) * 2048 * 4 / 2**20  # MB of feature activations the extra tokens made
    assert peaks[4] - peaks[1] < 0.05 * activations, (peaks, activations)
