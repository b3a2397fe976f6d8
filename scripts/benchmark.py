"""Benchmarks, printed as tables: medians of interleaved runs in one process.

    python scripts/benchmark.py [--case NAME ...] [--repeats N] [--json FILE]

Cases:
  hooks    what idle hook points cost a forward pass (BERT-base b1 x s16 and b8 x s128, GPT-2 124M b1 x s16).

How idle hook points are measured: the model cannot run without its hook points, so their cost is measured
directly. Each forward calls every hook point on its path once (counted by patching the class for one run);
one idle call is timed on its own, many times over; overhead = calls x cost of one call / forward time.
For comparison the table also gives what the same calls would cost through nn.Module's `__call__` (an
nn.Identity), which is what HookPoint's own `__call__` skips. Weights are random: speed does not depend on them.
"""

import argparse
import json
import statistics
import sys
import time
import timeit

import torch
from torch import nn

from scratch_models import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel
from scratch_models.hooks import HookPoint

BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
GPT2_SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel selection
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hook_calls_per_forward(model, inputs) -> int:
    calls = 0
    original = HookPoint.__call__

    def counting(self, x):
        nonlocal calls
        calls += 1
        return original(self, x)

    HookPoint.__call__ = counting
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        HookPoint.__call__ = original
    return calls


def seconds_per_call(module, x, number: int = 200_000) -> float:
    """Median over 5 rounds of `number` calls each."""
    return statistics.median(timeit.repeat(lambda: module(x), number=number, repeat=5)) / number


def idle_hooks(repeats: int) -> list[dict]:
    torch.manual_seed(0)
    with torch.device("meta"):
        bert, gpt2 = BertModel(BertConfig(**BERT_BASE)), GPT2LMHeadModel(GPT2Config(**GPT2_SMALL))
    bert, gpt2 = (m.to_empty(device="cpu").eval() for m in (bert, gpt2))
    for m in (bert, gpt2):
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, 0.02)
    cases = [("BERT-base", bert, 1, 16), ("BERT-base", bert, 8, 128), ("GPT-2 124M", gpt2, 1, 16)]
    x = torch.zeros(8, 128, 768)
    idle = seconds_per_call(HookPoint("benchmark"), x)
    module_call = seconds_per_call(nn.Identity(), x)
    rows = []
    for name, model, batch, seq in cases:
        inputs = {"input_ids": torch.randint(1000, (batch, seq))}
        calls = hook_calls_per_forward(model, inputs)
        with torch.no_grad():
            forward = median_seconds(lambda: model(**inputs), repeats)
        rows.append({"case": f"{name} b{batch}xs{seq}", "forward_ms": forward * 1e3, "hook_calls": calls,
                     "idle_call_ns": idle * 1e9, "overhead_pct": 100 * calls * idle / forward,
                     "as_nn_module_pct": 100 * calls * module_call / forward})
    return rows


CASES = {"hooks": idle_hooks}


def format_table(rows: list[dict]) -> str:
    header = list(rows[0])
    body = [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()] for row in rows]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in [header, *body])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only these (default: all)")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per measurement")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {sys.platform}")
    results = {}
    for case in args.case or list(CASES):
        results[case] = CASES[case](args.repeats)
        print(f"\n{case}\n{format_table(results[case])}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
