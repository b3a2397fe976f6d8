"""Memory stays flat however large the corpus: the peak anonymous memory of a harvest over a corpus four times
larger, of many shards each, grows by less than a tenth of the extra bytes written (rows stream from the forward
pass through a bounded queue to the writer, the corpus is read in chunks, only one shard's sequences are held)."""

import json
import os
import subprocess
import sys

import pytest

from corpus_data import SENTENCES
from helpers import STEADY_MALLOC

CHILD = """
import sys, threading, time
from scratch_models.corpus import harvest
peak = 0
def watch():  # the anonymous memory (heap, tensors); the shards' mapped pages (RssFile) are the page cache's to drop
    global peak
    while True:
        with open("/proc/self/status") as f:
            peak = max(peak, next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) // 1024)
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
harvest(sys.argv[1], sys.argv[2], ["layers.*.mlp.post_act"], sys.argv[3], context=32, shard_bytes=2_000_000,
        progress=False)
time.sleep(0.1)
print(peak)
"""


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path, tiny_gpt2):
    peaks, written = {}, {}
    for copies in (1, 4):
        data = tmp_path / f"c{copies}.jsonl"
        data.write_text("".join(json.dumps({"text": f"{s} {i}"}) + "\n"
                                for i in range(300 * copies) for s in SENTENCES))
        out = tmp_path / f"out{copies}"
        done = subprocess.run([sys.executable, "-c", CHILD, str(tiny_gpt2[0]), str(data), str(out)],
                              capture_output=True, text=True, timeout=900,
                              env=os.environ | {"HF_HUB_OFFLINE": "1"} | STEADY_MALLOC)
        assert done.returncode == 0, done.stderr
        peaks[copies] = int(done.stdout.split()[-1])
        written[copies] = sum(f.stat().st_size for f in out.glob("data-*.arrow")) / 2**20
    assert written[1] > 40 and written[4] > 4 * 0.95 * written[1]  # MB: far more than one shard (2 MB)
    assert peaks[4] - peaks[1] < 0.1 * (written[4] - written[1]), (peaks, written)
