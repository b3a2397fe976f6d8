"""Benchmarks against transformers and against the machine's limits: runs interleaved, medians, ratios, rooflines.

    python scripts/benchmark.py [--case NAME ...] [--repeats N] [--device cpu|cuda] [--json FILE] [--saelens-python PY]
                                [--dtype float32|bfloat16 ...] [--circuit-tracer-python PY] [--memory-cap-gb GiB]

`ratio` is transformers' time / ours (above 1: we are faster), transformers run eagerly in the row's dtype;
`vs_default` is transformers' default (eager float32) time / ours. Weights are random, written in the real
checkpoint layouts by transformers itself: speed does not depend on their values. Cases:
  limits     the machine's limits, measured first: GEMM peak per dtype (a large torch.matmul) and memory read
             bandwidth (a reduction over a buffer far larger than the caches); on CPU also the rate at which the
             packed bfloat16 linear layers alone read BERT-base's weights at b1xs16
  forward    BERT-base b8 x s128 and b1 x s16; GPT-2 124M b4 x s128 and b1 x s16 (transformers: SDPA)
  generate   GPT-2 124M greedy, batch 1, 64 new tokens after a 16-token prompt
  peers      TransformerLens' TransformerBridge and nnsight on the same GPT-2 weights, when installed (the
             optional extra `peers`): forward, forward caching every activation, generation
  load       a bert-base model.safetensors, each loader alone in a fresh process: seconds and peak RSS
  load_llama a 1B Llama (Llama 3.2 1B's config, random weights written by transformers in bfloat16, sharded), each
             loader alone in a fresh process: seconds, and peak RSS against the files' size, while loading and
             once every weight has been read
  load_moe   one Qwen3-30B-A3B layer (128 experts of width 768, random weights written by transformers in bfloat16,
             1.3 GB) loaded as stored and run on 1 and on 4 tokens, in a fresh process each, and by transformers on 1:
             the peak RSS the load and the forward pass added, and the file's pages the process read
             (`file_pages_mb`), against the file's size and against what the tokens need (all but the experts, and
             the experts they are routed to): a forward pass reads only the experts its tokens go to
  cold       a fresh process from nothing to the first output: import, load bert-base, one forward
  hooks      what idle hook points cost a forward pass
  harvest    GPT-2 124M activations of a middle and of the last layer over a corpus to Arrow shards
             (scratch_models.corpus.harvest), float32 and bfloat16, against loops that stop after the layer and write
             the same shards (a transformers forward hook, nnsight's tracer.stop(), TransformerBridge), and SAELens'
             CacheActivationsRunner with --saelens-python
  patching   a GPT-2 124M residual patching sweep, batched against one forward per patch (ratio: one at a time /
             batched), and against TransformerLens' patching module when it is installed
  features   a 16384-feature dictionary's statistics over a corpus at GPT-2 124M's last residual stream
             (scratch_models.dictionaries.features) against harvest of the same hook over the same corpus
  attribution attribution graphs (scratch_models.circuits.attribute) against circuit-tracer 0.5.0 in its own venv
             (--circuit-tracer-python), a random Gemma-2-shaped model (8 layers, hidden 512) with per-layer JumpReLU
             transcoders of 4096 features, prompts of 64 and 512 tokens, each run a fresh process under a memory cap:
             seconds and peak RSS, the two graphs checked equal; then 2048 tokens, each side once (3 runs by default)

forward and generate run each model in every mode (eager and compiled, float32 and bfloat16; float16 too on
CUDA). `roofline_ms` is the least time the machine's limits allow: the case's FLOPs at the GEMM peak of its dtype
or the bytes it must read at the memory bandwidth, whichever takes longer (`bound` says which). Bytes are the
weights, each read once per forward pass or decoding step (an embedding table only by the rows it looks up; GPT-2's
head reads wte in full), plus the KV cache; FLOPs are the matrix multiplies and attention. `of_roofline` is
roofline_ms / ours_ms. `compile_s` is what a compiled mode's first call took, compilation included; `max_diff` is
its largest |difference| from transformers in the same dtype (last hidden state or logits), `same_tokens` whether
its greedy tokens are transformers' in that dtype.

How idle hook points are measured: the model cannot run without its hook points, so their cost is measured
directly. Each forward calls every hook point on its path once (counted by patching the class for one run);
one idle call is timed on its own, many times over; overhead = calls x cost of one call / forward time.
For comparison the table also gives what the same calls would cost through nn.Module's `__call__` (an
nn.Identity), which is what HookPoint's own `__call__` skips.
"""

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

import torch
from torch import nn

from scratch_models import BertModel, GPT2LMHeadModel
from scratch_models.decoding.compiled import compile_model
from scratch_models.hooking.hooked_model import HookPoint

BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
GPT2_SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
# Llama 3.2 1B's config.json (1.24 billion parameters, the embeddings tied to the LM head)
LLAMA_32_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                   num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                   rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
                   eos_token_id=128001, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 8192})
# one layer of Qwen3-30B-A3B (its config.json's attention and its 128 experts of width 768, each token routed to 8),
# a small vocabulary so the experts are nearly all of the file: 1.3 GB in bfloat16
QWEN3_MOE_LAYER = dict(vocab_size=4096, hidden_size=2048, intermediate_size=6144, num_hidden_layers=1,
                       num_attention_heads=32, num_key_value_heads=4, head_dim=128, moe_intermediate_size=768,
                       num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=40960,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)


def interleaved(fns: dict, repeats: int, sync=lambda: None) -> dict:
    """Median seconds of each callable, timed in turn (ours, theirs, ours, ...) so drifts in machine load hit
    both alike."""
    for fn in fns.values():  # warm-up: first-call allocations and kernel selection
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def ratio_row(case: str, seconds: dict, unit: float = 1e3) -> dict:
    return {"case": case, "ours_ms": seconds["ours"] * unit, "transformers_ms": seconds["transformers"] * unit,
            "ratio": seconds["transformers"] / seconds["ours"]}


class Checkpoints:
    """bert-base and GPT-2 124M with random weights, saved by transformers in their real layouts, once, when a case
    first asks for them."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="scratch-models-bench-"))

    @functools.cached_property
    def bert(self) -> Path:
        import transformers

        torch.manual_seed(0)
        transformers.BertModel(transformers.BertConfig(**BERT_BASE)).save_pretrained(self.root / "bert-base")
        return self.root / "bert-base"

    @functools.cached_property
    def gpt2(self) -> Path:
        import transformers

        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_SMALL)).save_pretrained(self.root / "gpt2")
        return self.root / "gpt2"

    @functools.cached_property
    def llama_1b(self) -> Path:
        """Llama 3.2 1B's config with random weights, built and written by transformers in bfloat16 as shards of at
        most 1 GB with their index (the size a hub upload of a larger model is cut in), on first use only."""
        import transformers

        path = self.root / "llama-3.2-1b"
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**LLAMA_32_1B),
                                                           dtype=torch.bfloat16)
        model.save_pretrained(path, max_shard_size="1GB")
        return path

    @functools.cached_property
    def qwen3_moe_layer(self) -> Path:
        """One Qwen3-30B-A3B layer with random weights (QWEN3_MOE_LAYER), built and written by transformers in
        bfloat16 (its experts one key per expert's matrix, as the released files hold them), on first use only."""
        import transformers

        path = self.root / "qwen3-moe-layer"
        torch.manual_seed(0)
        model = transformers.Qwen3MoeForCausalLM._from_config(transformers.Qwen3MoeConfig(**QWEN3_MOE_LAYER),
                                                              dtype=torch.bfloat16)
        model.save_pretrained(path)
        return path


def _sync(device: str):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _dtypes(device: str) -> list[torch.dtype]:
    """float32 (the default), bfloat16 (AMX on recent x86 CPUs), and float16 on CUDA."""
    return [torch.float32, torch.bfloat16] + ([torch.float16] if device == "cuda" else [])


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


# ------------------------------------------------------------------------------------------- the roofline


@functools.cache
def machine_limits(device: str) -> dict:
    """The machine's limits, measured once per run: GEMM peak per dtype (FLOP/s) from a 4096^3 torch.matmul, and
    memory read bandwidth (bytes/s) from summing 1 GiB of float32, far more than any cache holds. Each is the
    best of several runs: a limit is what the machine can do, not what it did on average."""
    sync = _sync(device)

    def best(fn, repeats):
        fn()
        sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    n = 4096
    gemm = {}
    for dtype in _dtypes(device):
        a, b = (torch.randn(n, n, generator=torch.Generator().manual_seed(i)).to(device, dtype) for i in (0, 1))
        gemm[dtype] = 2 * n**3 / best(lambda: torch.matmul(a, b), 5)
        del a, b
    buffer = torch.ones(2**28, device=device)
    read = buffer.nbytes / best(buffer.sum, 10)
    return {"gemm": gemm, "read": read}


def limits(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    measured = machine_limits(device)
    rows = ([{"limit": f"GEMM peak {_dtype_name(d)}", "value": f / 1e9, "unit": "GFLOP/s"}
             for d, f in measured["gemm"].items()]
            + [{"limit": "memory read bandwidth", "value": measured["read"] / 1e9, "unit": "GB/s"}])
    if device == "cpu":
        stream = linear_stream()
        rows.append({"limit": "BERT-base b1xs16 bf16 linear layers alone, read at", "value": stream / 1e9,
                     "unit": f"GB/s ({100 * stream / measured['read']:.0f}% of the read bandwidth)"})
    return rows


def linear_stream() -> float:
    """Bytes/s at which the CPU's packed bfloat16 linear layers (oneDNN, what a frozen compiled model calls) read
    BERT-base's layer weights at 16 tokens, q/k/v as one matrix, with the caches flushed before each pass as a
    forward pass finds them: the most a b1xs16 row can reach before any other work. Best of 10."""
    generator = torch.Generator().manual_seed(0)
    h, m = BERT_BASE["hidden_size"], BERT_BASE["intermediate_size"]
    shapes = [(3 * h, h), (h, h), (m, h), (h, m)] * BERT_BASE["num_hidden_layers"]  # (out, in)
    weights = [torch.randn(shape, generator=generator).bfloat16() for shape in shapes]
    layers = [(torch.ops.mkldnn._reorder_linear_weight(w, 16), torch.zeros(w.shape[0], dtype=torch.bfloat16),
               torch.randn(16, w.shape[1], generator=generator).bfloat16()) for w in weights]
    flush = torch.ones(2**28)
    times = []
    for _ in range(11):
        flush.add_(1)  # 1 GiB written: none of the weights is left in a cache
        start = time.perf_counter()
        for packed, bias, x in layers:
            torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        times.append(time.perf_counter() - start)
    return sum(w.nbytes for w in weights) / min(times[1:])


@dataclasses.dataclass
class Work:
    """What one forward pass or decoding step must do at least: FLOPs in matrix multiplies and attention, and
    bytes read from memory."""

    flops: float
    bytes: float


def roofline(steps: list[Work], dtype: torch.dtype, device: str) -> tuple[float, str]:
    """The least time the machine's limits allow for `steps` run one after another, each at the limit that binds
    it (its FLOPs at the GEMM peak of `dtype`, or its bytes at the read bandwidth), and the limit that binds most
    of that time."""
    measured = machine_limits(device)
    per_bound = {"FLOPs": 0.0, "bytes": 0.0}
    for step in steps:
        compute, memory = step.flops / measured["gemm"][dtype], step.bytes / measured["read"]
        per_bound["FLOPs" if compute >= memory else "bytes"] += max(compute, memory)
    return sum(per_bound.values()), max(per_bound, key=per_bound.get)


def read_in_full(model) -> int:
    """Bytes of the weights a forward pass reads in full: all but the embedding tables, which it only indexes by
    token and position, and a causal LM's head, which scores the whole vocabulary (against wte when tied)."""
    tables = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    head = model.output_embeddings.numel() if hasattr(model, "generate") and model.config.tie_word_embeddings else 0
    return (sum(p.numel() for p in model.parameters()) - tables + head) * _itemsize(model)


def _itemsize(model) -> int:
    return next(model.parameters()).dtype.itemsize


def bert_work(model, batch: int, seq: int) -> Work:
    """BertModel over batch x seq tokens: per layer the six projections and attention (QKᵀ and PV over every
    key), then the pooler."""
    c = model.config
    h, tokens = c.hidden_size, batch * seq
    per_token = 4 * h * h + 2 * h * c.intermediate_size
    flops = c.num_hidden_layers * (2 * tokens * per_token + 4 * tokens * seq * h) + 2 * batch * h * h
    return Work(flops, read_in_full(model))


def gpt2_work(model, batch: int, new: int, past: int, scored: int) -> Work:
    """GPT2LMHeadModel on `new` tokens after `past` cached ones, scoring `scored` positions: per layer the four
    projections and causal attention (each new token over the keys up to it, cached ones included), the head;
    the bytes add the KV cache read (and written) by every layer."""
    c = model.config
    h, layers = c.n_embd, c.n_layer
    keys = new * past + new * (new + 1) // 2  # per row, over the new tokens
    flops = (layers * (2 * batch * new * (4 * h * h + 2 * h * c.inner_dim) + 4 * batch * keys * h)
             + 2 * batch * scored * h * c.vocab_size)
    cache = 2 * layers * batch * (past + new) * h
    return Work(flops, read_in_full(model) + cache * _itemsize(model))


# ---------------------------------------------------------------------------------- forward and generate


@dataclasses.dataclass(frozen=True)
class Mode:
    """How our model runs: eagerly (the default, exact path) or compiled (compile_model, weights frozen)."""

    dtype: torch.dtype
    compiled: bool

    @property
    def name(self) -> str:
        return f"{'compiled' if self.compiled else 'eager'} {_dtype_name(self.dtype)}"


def _modes(device: str) -> list[Mode]:
    return [Mode(dtype, compiled) for compiled in (False, True) for dtype in _dtypes(device)]


class Family:
    """One model family's models, each loaded once per dtype: ours (eager, and compiled for a compiled mode) and
    transformers' (eager, SDPA attention)."""

    def __init__(self, kind: str, ckpt: Checkpoints, device: str):
        self.kind, self.device = kind, device
        self.path = ckpt.bert if kind == "bert" else ckpt.gpt2
        self._ours, self._theirs, self._compiled = {}, {}, {}

    def ours(self, dtype: torch.dtype):
        if dtype not in self._ours:
            cls = BertModel if self.kind == "bert" else GPT2LMHeadModel
            self._ours[dtype] = cls.from_pretrained(self.path, dtype=dtype, device=self.device)
        return self._ours[dtype]

    def run(self, mode: Mode):
        """Our model as `mode` runs it."""
        if not mode.compiled:
            return self.ours(mode.dtype)
        if mode.dtype not in self._compiled:
            self._compiled[mode.dtype] = compile_model(self.ours(mode.dtype), freeze=True)
        return self._compiled[mode.dtype]

    def theirs(self, dtype: torch.dtype):
        import transformers

        if dtype not in self._theirs:
            cls = transformers.BertModel if self.kind == "bert" else transformers.GPT2LMHeadModel
            self._theirs[dtype] = cls.from_pretrained(self.path, dtype=dtype, attn_implementation="sdpa"
                                                      ).to(self.device).eval()
        return self._theirs[dtype]


def compare_modes(case: str, family: Family, runs: tuple, work, repeats: int, device: str, parity) -> list[dict]:
    """Time our model in every mode and transformers' in every dtype, interleaved, and give one row per mode.

    `runs`: (run ours, run transformers'), each taking the model and returning its output; `work(model)`: the
    case's forward passes or steps, as a list of Work; `parity(ours, theirs)`: how alike two outputs are, as
    columns."""
    run_ours, run_theirs = runs
    modes = _modes(device)
    compile_s, outputs, fns = {}, {}, {}
    for dtype in _dtypes(device):
        fns[dtype] = functools.partial(run_theirs, family.theirs(dtype))
        outputs[dtype] = fns[dtype]()
    for mode in modes:
        fns[mode] = functools.partial(run_ours, family.run(mode))
        start = time.perf_counter()
        outputs[mode] = fns[mode]()  # a compiled mode compiles here, once for this shape
        compile_s[mode] = time.perf_counter() - start if mode.compiled else None
    seconds = interleaved(fns, repeats, _sync(device))
    rows = []
    for mode in modes:
        ours, theirs = seconds[mode], seconds[mode.dtype]
        least, bound = roofline(work(family.ours(mode.dtype)), mode.dtype, device)
        rows.append({"case": case, "mode": mode.name, "ours_ms": ours * 1e3, "transformers_ms": theirs * 1e3,
                     "ratio": theirs / ours, "vs_default": seconds[torch.float32] / ours,
                     "roofline_ms": least * 1e3, "bound": bound, "of_roofline": f"{100 * least / ours:.0f}%",
                     "compile_s": compile_s[mode], **parity(outputs[mode], outputs[mode.dtype])})
    return rows


def _max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    return {"max_diff": float((ours.float() - theirs.float()).abs().max())}


def forward(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    rows = []
    for kind, name, shapes in (("bert", "BERT-base", ((8, 128), (1, 16))),
                               ("gpt2", "GPT-2 124M", ((4, 128), (1, 16)))):
        family = Family(kind, ckpt, device)
        for batch, seq in shapes:
            ids = torch.randint(1000, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)
            mask = torch.ones_like(ids)

            def run(model):
                out = model(ids, attention_mask=mask)
                return out.last_hidden_state if kind == "bert" else out.logits

            def work(model):
                return [bert_work(model, batch, seq) if kind == "bert" else gpt2_work(model, batch, seq, 0, seq)]

            rows += compare_modes(f"{name} forward b{batch}xs{seq}", family, (run, run), work, repeats, device,
                                  _max_diff)
    return rows


def generate(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    family = Family("gpt2", ckpt, device)
    prompt, new = 16, 64
    ids = torch.randint(1000, (1, prompt), generator=torch.Generator().manual_seed(2)).to(device)

    def run_ours(model):
        return model.generate(ids, max_new_tokens=new, eos_token_id=None)

    def run_theirs(model):  # it stops only at the length too: no end-of-text token; its top-k is off for greedy
        return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=None)

    def work(model):  # the prompt, then every generated token but the last, one step each
        return [gpt2_work(model, 1, prompt, 0, 1)] + [gpt2_work(model, 1, 1, prompt + i, 1) for i in range(new - 1)]

    def parity(ours, theirs):
        return {"same_tokens": bool(torch.equal(ours, theirs))}

    return compare_modes(f"GPT-2 124M greedy b1, {new} new tokens", family, (run_ours, run_theirs), work,
                         max(3, repeats // 4), device, parity)


def peers(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    """Libraries that also let a person look inside a transformer, on the same GPT-2 weights, for inference (under
    torch.no_grad()): TransformerLens' TransformerBridge (transformers' model with TransformerLens' hook points
    around it) and nnsight (transformers' model traced), each eager as it is used. `ratio` is the peer's time /
    ours. Ours runs eagerly (its default) and, for a forward pass caching every activation, compiled too
    (compile_model, frozen), which neither peer offers for caching; each row runs both sides in one dtype, float32
    (the default) or bfloat16. A peer that is not installed gives one row saying so."""
    import transformers

    prompt, new = 16, 64
    fp32, bf16 = torch.float32, torch.bfloat16
    ids = torch.randint(1000, (1, prompt), generator=torch.Generator().manual_seed(3)).to(device)
    ours = {dtype: GPT2LMHeadModel.from_pretrained(ckpt.gpt2, dtype=dtype, device=device) for dtype in (fp32, bf16)}
    fast = {dtype: compile_model(model, freeze=True) for dtype, model in ours.items()}
    with torch.no_grad():
        cached = len(fast[fp32].run_with_cache(ids)[1])  # compiles, once per dtype
        fast[bf16].run_with_cache(ids)
    hf = {dtype: transformers.GPT2LMHeadModel.from_pretrained(ckpt.gpt2, dtype=dtype).to(device).eval()
          for dtype in (fp32, bf16)}
    caching, greedy = "forward b1xs16 caching every activation", f"greedy, {new} new tokens"
    tasks = [  # (task, our mode, dtype, what ours caches, our run)
        ("forward b1xs16", "eager", fp32, "nothing", lambda: ours[fp32](ids).logits),
        (caching, "eager", fp32, f"{cached} hook points", lambda: ours[fp32].run_with_cache(ids)),
        (caching, "compiled", fp32, f"{cached} hook points", lambda: fast[fp32].run_with_cache(ids)),
        (caching, "compiled", bf16, f"{cached} hook points", lambda: fast[bf16].run_with_cache(ids)),
        (greedy, "eager", fp32, "nothing", lambda: ours[fp32].generate(ids, max_new_tokens=new, eos_token_id=None)),
    ]
    rows = []
    for peer, build in (("TransformerBridge", _transformer_bridge), ("nnsight", _nnsight)):
        try:
            with torch.no_grad():
                runs = {dtype: build(hf[dtype], ids, new, ckpt) for dtype in (fp32, bf16)}
        except ImportError as error:
            rows.append({"case": f"{peer}: skipped", "peer_caches": f"not installed ({error.name}); "
                         "pip install -e '.[peers]'"})
            continue
        for task, mode, dtype, ours_caches, ours_run in tasks:
            peer_caches, peer_run = runs[dtype][task]
            with torch.no_grad():
                seconds = interleaved({"ours": ours_run, "peer": peer_run}, repeats if task != greedy
                                      else max(3, repeats // 4), _sync(device))
            rows.append({"case": f"{peer}: {task}", "ours_mode": f"{mode} {_dtype_name(dtype)}",
                         "peer_mode": f"eager {_dtype_name(dtype)}", "ours_ms": seconds["ours"] * 1e3,
                         "peer_ms": seconds["peer"] * 1e3, "ratio": seconds["peer"] / seconds["ours"],
                         "ours_caches": ours_caches, "peer_caches": peer_caches})
    return rows


def _transformer_bridge(hf, ids, new: int, ckpt: Checkpoints) -> dict:
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(ckpt.gpt2), hf_model=hf)
    _, cache = bridge.run_with_cache(ids)
    return {"forward b1xs16": ("nothing", lambda: bridge(ids)),
            "forward b1xs16 caching every activation": (f"{len(cache)} hook points",
                                                        lambda: bridge.run_with_cache(ids)),
            f"greedy, {new} new tokens": ("nothing", lambda: bridge.generate(ids, max_new_tokens=new,
                                                                             do_sample=False, verbose=False))}


def _nnsight(hf, ids, new: int, ckpt: Checkpoints) -> dict:
    from nnsight.modeling.transformers import TransformersModel

    model = TransformersModel(hf, task="text-generation", tokenizer=_ids_tokenizer(hf.config.vocab_size))
    finished = []  # modules in the order their outputs appear: nnsight serves them only in that order
    handles = [m.register_forward_hook(lambda *_, name=name: finished.append(name))
               for name, m in hf.named_modules() if name]
    hf(ids)
    for handle in handles:
        handle.remove()

    def envoy(name):
        node = model
        for part in name.split("."):
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        return node

    def forward():
        with model.trace(ids):
            logits = model.output.logits.save()
        return logits

    def cache_all():
        saved = []
        with model.trace(ids):
            for name in finished:
                saved.append(envoy(name).output.save())
        return saved

    def generate():
        with model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                            eos_token_id=None) as tracer:
            tokens = tracer.result.save()
        return tokens

    return {"forward b1xs16": ("nothing", forward),
            "forward b1xs16 caching every activation": (f"{len(finished)} module outputs", cache_all),
            f"greedy, {new} new tokens": ("nothing", generate)}


def _ids_tokenizer(vocab_size: int):
    """A tokenizer whose tokens are the ids themselves: nnsight's TransformersModel requires one, and the
    benchmark's random GPT-2 has none (the inputs are ids already)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token="0"))
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="0", pad_token="0")


# Each loader runs alone in a fresh process, so neither sees the other's imports, caches or freed memory.
_LOAD_CHILD = """
import json, sys, time
import torch
which, path, ours, theirs, dtype = sys.argv[1:6]
dtype = None if dtype == "stored" else getattr(torch, dtype)
def status_mb(field):  # VmHWM (peak RSS) is this process's own: unlike ru_maxrss it does not survive exec
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024
if which == "ours":
    import scratch_models
    Model = getattr(scratch_models, ours)
else:
    import transformers
    Model = getattr(transformers, theirs)
before = status_mb("VmRSS")
start = time.perf_counter()
model = Model.from_pretrained(path, **({} if dtype is None else {"dtype": dtype}))
seconds = time.perf_counter() - start
loaded = status_mb("VmHWM")
with torch.no_grad():  # every weight read once (a memory-mapped one is paged in): what a first forward pass costs
    for parameter in model.parameters():
        parameter.sum()
print(json.dumps({"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": loaded,
                  "peak_rss_read_mb": status_mb("VmHWM")}))
"""

_COLD_CHILD = """
import sys, torch
which, path = sys.argv[1], sys.argv[2]
if which == "ours":
    from scratch_models import BertModel as Model
else:
    from transformers import AutoModel as Model
model = Model.from_pretrained(path)
with torch.no_grad():
    model(torch.arange(100, 116)[None]).last_hidden_state.sum().item()
"""


def _child(script: str, which: str, path: Path, *more: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, which, str(path), *more], capture_output=True, text=True,
                          timeout=600, env=os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
    if done.returncode != 0:
        raise RuntimeError(f"{which} child failed:\n{done.stderr}")
    return time.perf_counter() - start, done.stdout


def _load_runs(path: Path, runs: int, *classes_and_dtype: str) -> dict:
    """Each loader's medians over `runs` fresh processes, taken in turn: seconds, RSS before, peak RSS (MB)."""
    out = {"ours": [], "transformers": []}
    for _ in range(runs):
        for which in out:
            out[which].append(json.loads(_child(_LOAD_CHILD, which, path, *classes_and_dtype)[1]))
    return {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in out.items()}


def load(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    med = _load_runs(ckpt.bert, max(3, repeats // 4), "BertModel", "AutoModel", "stored")
    size_mb = (ckpt.bert / "model.safetensors").stat().st_size / 2**20
    row = ratio_row("load bert-base safetensors", {w: m["seconds"] for w, m in med.items()})
    return [row | {"checkpoint_mb": size_mb,
                   "ours_load_rss_mb": med["ours"]["peak_rss_mb"] - med["ours"]["rss_before_mb"],
                   "transformers_load_rss_mb": med["transformers"]["peak_rss_mb"]
                   - med["transformers"]["rss_before_mb"],
                   "ours_peak_rss_mb": med["ours"]["peak_rss_mb"],
                   "transformers_peak_rss_mb": med["transformers"]["peak_rss_mb"]}]


def load_llama(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    """The 1B Llama's shards loaded in bfloat16, as stored, by LlamaForCausalLM and transformers'; `*_x_files`: the
    RSS a load added, over the files' size, at its peak while loading and once every weight has been read."""
    path = ckpt.llama_1b
    size_mb = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
    med = _load_runs(path, 3, "LlamaForCausalLM", "LlamaForCausalLM", "bfloat16")

    def over_files(which: str, peak: str) -> float:
        return (med[which][peak] - med[which]["rss_before_mb"]) / size_mb

    row = ratio_row(f"load Llama 3.2 1B config, bf16, {len(list(path.glob('*.safetensors')))} shards",
                    {w: m["seconds"] for w, m in med.items()})
    return [row | {"files_mb": size_mb, "ours_load_x_files": over_files("ours", "peak_rss_mb"),
                   "transformers_load_x_files": over_files("transformers", "peak_rss_mb"),
                   "ours_read_x_files": over_files("ours", "peak_rss_read_mb"),
                   "transformers_read_x_files": over_files("transformers", "peak_rss_read_mb")}]


# A mixture's load and a short forward pass in a fresh process: the RSS each added, the part of it that maps the file
# (RssFile: the pages of the memory-mapped file this process has read), and which experts the tokens went to.
_MOE_CHILD = """
import json, sys
import torch
which, path, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
def status_mb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024
if which == "ours":
    import scratch_models
    Model = scratch_models.Qwen3MoeForCausalLM
else:
    import transformers
    Model = transformers.Qwen3MoeForCausalLM
before, file_before = status_mb("VmRSS"), status_mb("RssFile")
model = Model.from_pretrained(path)
loaded = status_mb("VmHWM")
routed = {}
def record(chosen, name):
    routed[name] = sorted(set(chosen.flatten().tolist()))
ids = torch.arange(1, tokens + 1)[None] * 7 % model.config.vocab_size
with torch.no_grad():
    if which == "ours":
        with model.hooks([(lambda name: name.endswith(".mlp.chosen"), record)]):
            model(ids)
    else:
        model(ids)
print(json.dumps({"rss_before_mb": before, "peak_rss_load_mb": loaded, "peak_rss_forward_mb": status_mb("VmHWM"),
                  "file_rss_mb": status_mb("RssFile") - file_before, "routed": routed,
                  "dtype": str(next(model.parameters()).dtype)}))
"""


def load_moe(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    """One Qwen3-30B-A3B layer (128 experts, bfloat16) loaded as stored and run on a few tokens, each in a fresh
    process, by Qwen3MoeForCausalLM and (on one token) by transformers': the RSS the load and the forward pass added
    at their peak, and the part of the file the process mapped in, against the file's size and against what those
    tokens need: every weight outside the experts and the experts they were routed to. What the process holds of
    the file beyond that, it read without need."""
    path = ckpt.qwen3_moe_layer
    size_mb = sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**20
    config = QWEN3_MOE_LAYER
    expert_mb = 3 * config["hidden_size"] * config["moe_intermediate_size"] * 2 / 2**20  # gate, up, down in bf16
    experts_mb = config["num_experts"] * config["num_hidden_layers"] * expert_mb
    rows = []
    for which, tokens in (("ours", 1), ("ours", 4), ("transformers", 1)):
        runs = [json.loads(_child(_MOE_CHILD, which, path, str(tokens))[1]) for _ in range(3)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_mb")}
        routed = sum(len(experts) for experts in runs[0]["routed"].values()) if which == "ours" else None
        needed_mb = None if routed is None else size_mb - experts_mb + routed * expert_mb
        forward_mb = med["peak_rss_forward_mb"] - med["rss_before_mb"]
        rows.append({"case": f"Qwen3-MoE layer, {config['num_experts']} experts, {tokens} token(s)", "loader": which,
                     "file_mb": size_mb, "dtype": runs[0]["dtype"], "experts_routed": routed, "needed_mb": needed_mb,
                     "load_rss_mb": med["peak_rss_load_mb"] - med["rss_before_mb"], "forward_rss_mb": forward_mb,
                     "file_pages_mb": med["file_rss_mb"], "forward_x_file": forward_mb / size_mb,
                     "forward_x_needed": None if needed_mb is None else forward_mb / needed_mb})
    return rows


def cold(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    seconds = {"ours": [], "transformers": []}
    for _ in range(max(3, repeats // 4)):
        for which in seconds:
            seconds[which].append(_child(_COLD_CHILD, which, ckpt.bert)[0])
    return [ratio_row("cold start: import + load bert-base + forward",
                      {w: statistics.median(s) for w, s in seconds.items()})]


def seconds_per_call(module, x, number: int = 200_000) -> float:
    """Median over 5 rounds of `number` calls each."""
    return statistics.median(timeit.repeat(lambda: module(x), number=number, repeat=5)) / number


def hook_calls_per_forward(model, inputs) -> int:
    calls = 0
    original = HookPoint.__call__

    def counting(self, x):
        nonlocal calls
        calls += 1
        return original(self, x)

    HookPoint.__call__ = counting
    try:
        model(**inputs)
    finally:
        HookPoint.__call__ = original
    return calls


def hooks(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    x = torch.zeros(8, 128, 768)
    idle = seconds_per_call(HookPoint("x", "benchmark"), x)
    module_call = seconds_per_call(nn.Identity(), x)
    rows = []
    for name, model, batch, seq in (("BERT-base", BertModel.from_pretrained(ckpt.bert), 8, 128),
                                    ("BERT-base", BertModel.from_pretrained(ckpt.bert), 1, 16),
                                    ("GPT-2 124M", GPT2LMHeadModel.from_pretrained(ckpt.gpt2), 1, 16)):
        inputs = {"input_ids": torch.randint(1000, (batch, seq))}
        calls = hook_calls_per_forward(model, inputs)
        forward_s = interleaved({"ours": lambda: model(**inputs)}, repeats)["ours"]
        rows.append({"case": f"idle hooks, {name} b{batch}xs{seq}", "forward_ms": forward_s * 1e3,
                     "hook_calls": calls, "idle_call_ns": idle * 1e9, "overhead_pct": 100 * calls * idle / forward_s,
                     "as_nn_module_pct": 100 * calls * module_call / forward_s})
    return rows


def patching(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    """GPT-2 124M, residual stream patching, 12 layers x 20 positions: our batched sweep against the same sweep
    one forward per patch (a plain loop on our model, as TransformerLens' `patching` runs it), and against
    TransformerLens' own when it is installed. Two corrupted prompts: one token changed at position 0 (every patch
    is run) and at position 10 (the patches before it write what is already there and are not run)."""
    import importlib.util

    from scratch_models.analysis.metrics import LogitDiff
    from scratch_models.analysis.patching import DEFAULT_BATCH_SIZE, get_act_patch_resid_pre

    layers, seq = GPT2_SMALL["n_layer"], 20
    model = GPT2LMHeadModel.from_pretrained(ckpt.gpt2, device=device)
    clean = torch.randint(1000, (1, seq), generator=torch.Generator().manual_seed(3)).to(device)
    metric = LogitDiff(11, 12, positions=-1)
    names = ["embeddings.out"] + [f"layers.{layer}.out" for layer in range(layers - 1)]  # each layer's input
    _, clean_cache = model.run_with_cache(clean, names=names)
    rows = []
    for changed in (0, 10):
        corrupted = clean.clone()
        corrupted[0, changed] = (corrupted[0, changed] + 1) % 1000

        def one_at_a_time():
            out = torch.zeros(layers, seq)
            for layer, name in enumerate(names):
                for position in range(seq):
                    def patch(x, _, name=name, position=position):
                        x = x.clone()
                        x[:, position] = clean_cache[name][:, position]
                        return x
                    out[layer, position] = metric(model.run_with_hooks(corrupted, hooks=[(name, patch)])).mean()
            return out

        batched = get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
        worst = float((batched.float() - one_at_a_time()).abs().max())
        fns = {"batched": lambda: get_act_patch_resid_pre(model, corrupted, clean_cache, metric),
               "one_at_a_time": one_at_a_time}
        if importlib.util.find_spec("transformer_lens") is not None:
            fns["transformer_lens"] = _transformer_lens_sweep(ckpt, clean, corrupted, device)
        seconds = interleaved(fns, max(1, repeats // 10), _sync(device))
        rows.append({"case": f"GPT-2 124M resid_pre sweep {layers}x{seq}, token {changed} changed",
                     "batched_ms": seconds["batched"] * 1e3, "one_at_a_time_ms": seconds["one_at_a_time"] * 1e3,
                     "ratio": seconds["one_at_a_time"] / seconds["batched"],
                     "transformer_lens_ms": seconds["transformer_lens"] * 1e3 if "transformer_lens" in seconds else None,
                     "ratio_transformer_lens": (seconds["transformer_lens"] / seconds["batched"]
                                                if "transformer_lens" in seconds else None),
                     "batch_size": DEFAULT_BATCH_SIZE, "max_abs_diff": worst})
    return rows


def _transformer_lens_sweep(ckpt: Checkpoints, clean: torch.Tensor, corrupted: torch.Tensor, device: str):
    """TransformerLens' get_act_patch_resid_pre on its TransformerBridge of the same GPT-2 weights (TransformerLens
    4 has no HookedTransformer; its patching module runs on the bridge)."""
    import transformers
    from transformer_lens import patching as tl_patching
    from transformer_lens.model_bridge import TransformerBridge

    hf = transformers.GPT2LMHeadModel.from_pretrained(ckpt.gpt2).to(device).eval()
    bridge = TransformerBridge.boot_transformers(str(ckpt.gpt2), hf_model=hf)
    _, clean_cache = bridge.run_with_cache(clean)

    def sweep():
        with contextlib.redirect_stderr(io.StringIO()):  # its progress bar, 240 patches long, on every run
            return tl_patching.get_act_patch_resid_pre(bridge, corrupted, clean_cache,
                                                       lambda logits: (logits[:, -1, 11] - logits[:, -1, 12]).mean())

    return sweep


# SAELens' CacheActivationsRunner in a Python of its own (sae-lens needs transformer-lens < 4): a server that builds
# a HookedTransformer of GPT-2 124M's shape per dtype (random weights: the runner's load_model would fetch gpt2 from
# the hub) and, per line "LAYER DTYPE OUT", caches that layer's hook_resid_post of the corpus into OUT; it answers
# "done" or the error.
_SAELENS_SERVER = """
import shutil, sys, torch, traceback
import pyarrow.parquet as pq
from datasets import Dataset
import sae_lens.cache_activations_runner as runner
from sae_lens.config import CacheActivationsRunnerConfig
from transformer_lens import HookedTransformer, HookedTransformerConfig
torch.set_grad_enabled(False)
ids = pq.read_table(sys.argv[1]).column("input_ids").to_pylist()
rows = Dataset.from_dict({"input_ids": [[int(sys.argv[2])] + row for row in ids]})
models = {}
for line in sys.stdin:
    layer, dtype, out = line.split()
    try:
        if dtype not in models:
            models[dtype] = HookedTransformer(HookedTransformerConfig(
                n_layers=12, d_model=768, n_ctx=1024, d_head=64, n_heads=12, d_mlp=3072, act_fn="gelu_new",
                d_vocab=50257, normalization_type="LN", positional_embedding_type="standard",
                dtype=getattr(torch, dtype))).eval()
        runner.load_model = lambda **_: models[dtype]
        tokens = len(rows) * len(rows[0]["input_ids"])
        shutil.rmtree(out, ignore_errors=True)
        runner.CacheActivationsRunner(CacheActivationsRunnerConfig(
            dataset_path="given", model_name="gpt2", model_batch_size=int(sys.argv[3]),
            hook_name=f"blocks.{layer}.hook_resid_post", d_in=768, training_tokens=tokens,
            context_size=len(rows[0]["input_ids"]), new_cached_activations_path=out, shuffle=False, dtype="float32",
            device="cpu", prepend_bos=False, streaming=False, buffer_size_gb=tokens * 768 * 4 / 1e9),
            override_dataset=rows).run()
        print("done", flush=True)
    except Exception:
        print(traceback.format_exc().replace(chr(10), " | "), flush=True)
"""


def harvest(ckpt: Checkpoints, repeats: int, device: str, saelens_python: str | None = None,
            dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)) -> list[dict]:
    """GPT-2 124M over a corpus, keeping one layer's output (layers.5.out, a middle one, and layers.11.out, the last
    block's: only ln_f and the head lie above it) for every token of 16 packed sequences of 128 tokens in batches of
    8, in float32 and bfloat16, each side writing the rows as float32 Arrow shards. `ours`: scratch_models.corpus
    .harvest end to end as a user runs it (reading and packing the corpus, forward passes stopped after the layer on
    the threads it picks, writing in a thread of its own). The peers, each told to stop after the layer: a
    transformers hook loop (a forward hook on transformer.h[L] that raises once it has the output), nnsight
    (tracer.stop() after saving h[L]'s output), TransformerBridge (run_with_cache(stop_at_layer=L + 1)), each
    writing the same shard with datasets' ArrowWriter; and SAELens' CacheActivationsRunner (its own layout, with
    `--saelens-python` naming a Python that has sae-lens). `ratio`: the other side's time / ours, medians of
    interleaved runs; `vs best peer`: the fastest peer's time / ours. The corpus is pre-tokenized (the benchmark's
    random weights have no tokenizer): 16 documents of 127 ids, each packed after its BOS."""
    import importlib.util

    import transformers
    from datasets import Dataset
    from datasets.arrow_writer import ArrowWriter

    from scratch_models import GPT2Model
    from scratch_models.corpus import run_harvest
    from scratch_models.corpus.activations import Layout
    from scratch_models.corpus.storage import features

    bos, context, batch, documents, width = 50256, 128, 8, 16, GPT2_SMALL["n_embd"]
    generator = torch.Generator().manual_seed(4)
    docs = torch.randint(1000, (documents, context - 1), generator=generator)
    root = Path(tempfile.mkdtemp(prefix="scratch-models-harvest-"))
    corpus = root / "corpus.parquet"
    Dataset.from_dict({"input_ids": docs.tolist()}).to_parquet(corpus)
    ids = torch.cat([torch.full((documents, 1), bos), docs], 1).to(device)  # the packed sequences
    batches = list(ids.split(batch))
    document = torch.arange(documents)[:, None].expand(-1, context).reshape(-1).numpy()
    position = torch.arange(-1, context - 1)[None].expand(documents, -1).reshape(-1).to(torch.int32).numpy()
    runs = iter(range(10**6))
    server = None
    if saelens_python is not None and device == "cpu":
        server = subprocess.Popen([saelens_python, "-c", _SAELENS_SERVER, str(corpus), str(bos), str(batch)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def saelens(layer: int, dtype: torch.dtype):
        def run():
            server.stdin.write(f"{layer} {str(dtype).removeprefix('torch.')} {root / f'sae-{next(runs)}'}\n")
            server.stdin.flush()
            answer = server.stdout.readline().strip()
            if answer != "done":
                raise RuntimeError(f"SAELens' CacheActivationsRunner failed: {answer}")
        return run

    rows, summaries = [], {}
    for dtype in dtypes:
        model = GPT2Model.from_pretrained(ckpt.gpt2, device=device, dtype=dtype)
        hf = transformers.GPT2LMHeadModel.from_pretrained(ckpt.gpt2, dtype=dtype).to(device).eval()
        for layer in (5, 11):
            name = f"layers.{layer}.out"
            shard = features({name: Layout(1, (width,), name)}, "float32", None)

            def ours():
                out = root / f"ours-{next(runs)}"
                summaries[name, dtype] = run_harvest(model, corpus, [name], out, batch_size=batch, context=context,
                                                     progress=False)[1]

            def written(activations_of):
                """A loop that gets each batch's [b, s, h] activations from `activations_of` and writes the shard."""
                def run():
                    writer = ArrowWriter(features=shard, path=str(root / f"peer-{next(runs)}.arrow"))
                    for i, chunk in enumerate(batches):
                        acts = activations_of(chunk).reshape(-1, width).float().cpu().numpy()
                        at = slice(i * batch * context, i * batch * context + len(acts))
                        writer.write_batch({name: acts, "token_id": chunk.reshape(-1).to(torch.int32).cpu().numpy(),
                                            "document": document[at], "position": position[at]})
                    writer.finalize()
                    writer.close()
                return run

            fns = {"ours": ours, "transformers hook, stopped": written(functools.partial(_hf_stopped, hf, layer))}
            if importlib.util.find_spec("nnsight") is not None:
                from nnsight.modeling.transformers import TransformersModel

                traced = TransformersModel(hf, task="text-generation",
                                           tokenizer=_ids_tokenizer(hf.config.vocab_size))
                fns["nnsight, tracer.stop()"] = written(functools.partial(_nnsight_stopped, traced, layer))
            if importlib.util.find_spec("transformer_lens") is not None:
                from transformer_lens.model_bridge import TransformerBridge

                bridge = TransformerBridge.boot_transformers(str(ckpt.gpt2), hf_model=hf)
                hook = f"blocks.{layer}.hook_resid_post"
                fns["TransformerBridge, stop_at_layer"] = written(lambda chunk: bridge.run_with_cache(
                    chunk, names_filter=hook, stop_at_layer=layer + 1)[1][hook])
            if server is not None:
                fns["SAELens CacheActivationsRunner"] = saelens(layer, dtype)
            seconds = interleaved(fns, max(2, repeats // 5), _sync(device))
            case = f"GPT-2 124M harvest {name}, {documents}x{context} tokens, b{batch}, {_dtype_name(dtype)}"
            peers = [k for k in fns if k != "ours"]
            for other in peers:
                rows.append({"case": case, "other": other, "ours_ms": seconds["ours"] * 1e3,
                             "other_ms": seconds[other] * 1e3, "ratio": seconds[other] / seconds["ours"],
                             "ours_tokens_per_s": documents * context / seconds["ours"],
                             "other_tokens_per_s": documents * context / seconds[other]})
            best = min(peers, key=seconds.get)
            rows.append({"case": case, "other": f"vs best peer ({best})",
                         "ratio": seconds[best] / seconds["ours"]})
    summary = summaries["layers.11.out", dtypes[0]]
    rows.append({"case": f"ours, threads: {summary.threads}"})
    rows.append({"case": f"where our time went (last {_dtype_name(dtypes[0])} run at layers.11.out, s)",
                 **summary.timings})
    if saelens_python is None:
        rows.append({"case": "SAELens CacheActivationsRunner: skipped", "other": "--saelens-python PYTHON (a venv with "
                     "sae-lens, which needs transformer-lens < 4) to run it"})
    if server is not None:
        server.stdin.close()
        server.wait()
    return rows


class _Stopped(Exception):
    """Raised by a forward hook once it has what it came for: the layers above are not run."""


def _hf_stopped(hf, layer: int, chunk: torch.Tensor) -> torch.Tensor:
    """transformers' GPT-2 run up to block `layer`: its output, taken by a forward hook that then stops the pass."""
    taken = {}

    def take(module, args, output):
        taken["x"] = output[0] if isinstance(output, tuple) else output
        raise _Stopped

    handle = hf.transformer.h[layer].register_forward_hook(take)
    try:
        hf.transformer(chunk)
    except _Stopped:
        pass
    finally:
        handle.remove()
    return taken["x"]


def _nnsight_stopped(traced, layer: int, chunk: torch.Tensor) -> torch.Tensor:
    with traced.trace(chunk) as tracer:
        saved = traced.transformer.h[layer].output.save()
        tracer.stop()
    return saved[0] if isinstance(saved, tuple) else saved


def features(ckpt: Checkpoints, repeats: int, device: str) -> list[dict]:
    """A dictionary of 16384 features at GPT-2 124M's layers.11.out (random weights written locally in SAELens'
    layout: unit decoder rows, the encoder their transpose, each feature's encoder bias set so it fires on about
    0.3% of this corpus's tokens, some 49 a token), over 256 packed sequences of 128 tokens in batches of 8, float32
    (a corpus of 32k tokens: in the first few thousand nearly every firing enters a feature's top or sample, a cost
    per run that a smaller corpus would show as the pass's speed).
    `ours`: scratch_models.dictionaries.features' pass over the corpus (reading, packing, forward passes stopped
    after the hook, the encoder, the counting), from its own timings; against `harvest`: scratch_models.corpus.harvest
    of the same hook over the same corpus, end to end (the shards written). `ratio`: harvest's time / ours, so at
    least 0.8 is the goal. The fixed costs after the pass (the logit effects of 16384 directions through the
    50257-token unembedding, the dataset, a page per feature) are a row of their own: they do not grow with the
    corpus. The corpus is pre-tokenized, as in the harvest case."""
    from datasets import Dataset

    from scratch_models import GPT2LMHeadModel
    from scratch_models.corpus import run_harvest
    from scratch_models.dictionaries import SAE, SAEConfig, build
    from scratch_models.dictionaries.features import run_features

    name, bos, context, batch, documents, d_sae = "layers.11.out", 50256, 128, 8, 256, 16384
    generator = torch.Generator().manual_seed(5)
    docs = torch.randint(1000, (documents, context - 1), generator=generator)
    root = Path(tempfile.mkdtemp(prefix="scratch-models-features-"))
    Dataset.from_dict({"input_ids": docs.tolist()}).to_parquet(root / "corpus.parquet")
    model = GPT2LMHeadModel.from_pretrained(ckpt.gpt2, device=device)
    _, cache = model.run_with_cache(torch.cat([torch.full((documents, 1), bos), docs], 1)[:16].to(device),
                                    names=[name])
    stream = cache[name].flatten(0, 1).float()
    sae = build(SAEConfig(architecture="standard", d_in=GPT2_SMALL["n_embd"], d_sae=d_sae, hook_name=name))
    with torch.no_grad():
        directions = torch.randn(d_sae, GPT2_SMALL["n_embd"], generator=generator)
        sae.W_dec.copy_(directions / directions.norm(dim=1, keepdim=True))
        sae.W_enc.copy_(sae.W_dec.T)
        sae.b_dec.copy_(stream.mean(0).cpu())
        sae.b_enc.copy_(-torch.quantile(((stream - stream.mean(0)) @ sae.W_enc.to(device)).cpu(), 0.997, dim=0))
    sae.save_pretrained(root / "sae")
    dictionary = SAE.from_pretrained(root / "sae").to(device)
    runs = iter(range(10**6))
    summaries = []

    def ours(pages: bool):
        def run():
            summaries.append(run_features(model, dictionary, root / "corpus.parquet", root / f"ours-{next(runs)}",
                                          batch_size=batch, context=context, pages=pages, progress=False)[1])
        return run

    def harvest():
        run_harvest(model, root / "corpus.parquet", [name], root / f"harvest-{next(runs)}", batch_size=batch,
                    context=context, progress=False)

    ours(pages=True)()  # a warm-up, and the fixed costs of one whole run
    whole = summaries.pop()
    seconds = interleaved({"ours": ours(pages=False), "harvest": harvest}, max(2, repeats // 5), _sync(device))
    passes = statistics.median(summary.timings["pass"] for summary in summaries)
    tokens = documents * context
    fixed = {k: v for k, v in whole.timings.items() if k in ("merging", "logit effects", "dataset and pages")}
    return [{"case": f"GPT-2 124M {name}, {d_sae} features, {documents}x{context} tokens, b{batch}, fp32",
             "other": "harvest of the same hook", "ours_ms": passes * 1e3, "other_ms": seconds["harvest"] * 1e3,
             "ratio": seconds["harvest"] / passes, "ours_tokens_per_s": tokens / passes,
             "other_tokens_per_s": tokens / seconds["harvest"], "l0": round(whole.l0, 1)},
            {"case": "ours: where the pass went (median run, s)", **_median_timings(summaries)},
            {"case": "ours: fixed costs after the pass (s)", **fixed,
             "note": "do not grow with the corpus: once per run"}]


def _median_timings(summaries) -> dict:
    keys = [k for k in summaries[0].timings if k not in ("merging", "logit effects", "dataset", "dataset and pages")]
    return {k: round(statistics.median(s.timings[k] for s in summaries), 3) for k in keys}


# ------------------------------------------------------------------------------------------- attribution

# Gemma 2's architecture at a size two shared cores can trace (Gemma 2 2B: 26 layers, hidden 2304, 8 heads of 256,
# 4 KV heads, MLP 9216, 256000 tokens); the vocabulary is cut to 16384 so the embedding does not dominate the RSS
ATTRIBUTION_MODEL = dict(vocab=16384, hidden=512, heads=8, kv_heads=4, head_dim=64, mlp=2048, layers=8, context=4096)
ATTRIBUTION_FEATURES = 4096  # per layer (Gemma Scope's smallest transcoders: 16384)
ACTIVE_PER_TOKEN = 48  # the L0 a layer is calibrated for (_calibrated); the traced prompts fire some 32 (the rows'
# active_per_token_layer), within the 30-64 of published sets
ATTRIBUTION_SETTINGS = dict(max_feature_nodes=128, batch_size=32, max_n_logits=10, desired_logit_prob=0.95)
ATTRIBUTION_LENGTHS = (64, 512)
CALIBRATION_LENGTH = 512  # the random prompt the thresholds are set on
LONG_PROMPT = 2048  # 4x the longer length: ours alone unless circuit-tracer holds it under the memory cap
TRACER_TESTS = Path(__file__).resolve().parents[1] / "tests" / "circuits"

# One attribution in a fresh process: seconds, RSS before it (model and transcoders loaded) and peak RSS; with a
# fourth argument, the graph's arrays saved there for the agreement check.
_ATTRIBUTION_CHILD = """
import json, sys, time
from pathlib import Path
import torch
which, root, length, tests = sys.argv[1:5]
root, keep = Path(root), sys.argv[5] if len(sys.argv) > 5 else None
def status_mb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024
setup = json.loads((root / "setup.json").read_text())
ids = torch.tensor(setup["prompts"][length])
if which == "ours":
    from scratch_models import FAMILIES
    from scratch_models.circuits import attribute, load_transcoders
    model = FAMILIES["gemma2"].lm.from_pretrained(root / "model")
    transcoders = load_transcoders(root / "transcoders")
    run = lambda: attribute(model, transcoders, ids, **setup["settings"])
else:
    import gc, logging, transformers
    sys.path.insert(0, tests)
    import circuit_tracer_side as side
    from circuit_tracer import attribute
    logging.disable(logging.WARNING)
    sizes = side.Sizes(**setup["sizes"])
    hf = transformers.Gemma2ForCausalLM.from_pretrained(root / "model")
    model = side.their_model("gemma2", hf, side.their_transcoders(root / "transcoders", "transcoder_set",
                                                                  sizes.layers), sizes)
    del hf
    gc.collect()
    run = lambda: attribute(ids, model, verbose=False, **setup["settings"])
before = status_mb("VmRSS")
start = time.perf_counter()
graph = run()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": status_mb("VmHWM"),
                  "active": len(graph.active_features), "nodes": graph.adjacency_matrix.shape[0],
                  "logits": len(graph.logit_targets)}))
if keep:
    torch.save({"adjacency": graph.adjacency_matrix, "active_features": graph.active_features,
                "activation_values": graph.activation_values, "selected_features": graph.selected_features,
                "logits": [int(getattr(t, "vocab_idx", t[1] if isinstance(t, tuple) else t)) for t in
                           graph.logit_targets]}, keep)
"""


def _attribution_setup(root: Path) -> dict:
    """The random Gemma-2-shaped checkpoint (written by transformers, as the parity tests write theirs), its PLT set
    in circuit-tracer's layout (thresholds: _calibrated), and the prompts; what the children read, in
    root/setup.json."""
    sys.path.insert(0, str(TRACER_TESTS))
    import circuit_tracer_side as side
    from circuit_data import random_transcoders

    from scratch_models import FAMILIES
    from scratch_models.circuits import save_transcoders

    sizes = side.Sizes(**ATTRIBUTION_MODEL)
    # weights N(0, 1/hidden): unit-scale activations after each norm, and next-token probabilities spread enough
    # that max_n_logits, not desired_logit_prob, sets the logit targets
    side.hf_checkpoint("gemma2", root / "model", sizes, scale=sizes.hidden ** -0.5)
    generator = torch.Generator().manual_seed(7)

    def prompt(n):  # a BOS, then random ids past the special ones
        return [1] + torch.randint(3, sizes.vocab, (n - 1,), generator=generator).tolist()

    transcoders = random_transcoders(sizes.layers, sizes.hidden, ATTRIBUTION_FEATURES, jumprelu=True,
                                     hooks=("ln2.hook_normalized", "hook_mlp_out"))
    model = FAMILIES["gemma2"].lm.from_pretrained(root / "model")
    _calibrated(model, transcoders, torch.tensor(prompt(CALIBRATION_LENGTH)))
    prompts = {str(n): prompt(n) for n in (*ATTRIBUTION_LENGTHS, LONG_PROMPT)}
    margin = _clear_of_ties(model, transcoders, [torch.tensor(prompts[str(n)]) for n in ATTRIBUTION_LENGTHS])
    save_transcoders(transcoders, root / "transcoders")
    setup = {"sizes": ATTRIBUTION_MODEL, "settings": ATTRIBUTION_SETTINGS, "prompts": prompts, "margin": margin}
    (root / "setup.json").write_text(json.dumps(setup))
    return setup


def _calibrated(model, transcoders, ids: torch.Tensor) -> None:
    """Sets each layer's JumpReLU thresholds (one for all its features) to the quantile of its pre-activations over
    a calibration prompt (random, not the one traced) that leaves ACTIVE_PER_TOKEN of its features active per token
    on average, within the 30-64 that published transcoder sets fire (their L0). Random thresholds would fire half
    of every layer, a graph of another kind. Per-feature quantiles do not carry over to another prompt: each
    feature's mean pre-activation moves from prompt to prompt (its std over prompts is some 0.6 of its std over
    positions), and thresholds set per feature on one prompt fired 200-300 features per token and layer on another;
    a layer's count over 4096 features averages that out (the rows' active_per_token_layer: what the traced
    prompts fire)."""
    inputs, _ = transcoders.sites(model)
    _, cache = model.run_with_cache(ids[None], names=inputs)
    keep = 1 - ACTIVE_PER_TOKEN / ATTRIBUTION_FEATURES
    with torch.no_grad():
        for layer, name in enumerate(inputs):
            pre = transcoders.pre_acts(layer, cache[name][0, 1:])  # [n - 1, f], the BOS has no features
            transcoders.threshold[layer].fill_(torch.quantile(pre.flatten(), keep).clamp(min=0))


def _clear_of_ties(model, transcoders, prompts: list[torch.Tensor]) -> float:
    """Moves each layer's threshold into the widest gap between the pre-activations the compared prompts give it,
    among the 1% of them nearest the threshold, so that no feature of theirs sits within rounding of it: two
    implementations' pre-activations differ by some 1e-6, and one feature active on one side only makes two graphs
    of different nodes (it happened at 64 tokens). Returns the smallest distance left between a threshold and a
    pre-activation."""
    inputs, _ = transcoders.sites(model)
    caches = [model.run_with_cache(ids[None], names=inputs)[1] for ids in prompts]
    margins = []
    with torch.no_grad():
        for layer, name in enumerate(inputs):
            pre = torch.cat([transcoders.pre_acts(layer, cache[name][0, 1:]).flatten() for cache in caches]).sort()[0]
            at = int(torch.searchsorted(pre, transcoders.threshold[layer][0]))
            window = pre[max(at - len(pre) // 200, 0):at + len(pre) // 200]
            gaps = window.diff()
            widest = int(gaps.argmax())
            transcoders.threshold[layer].fill_((window[widest] + window[widest + 1]) / 2)
            margins.append(float(gaps[widest] / 2))
    return min(margins)


def _attribution_child(python: str, which: str, root: Path, length: int, cap: int, keep: Path | None = None):
    """One attribution in a fresh process under an address-space cap of `cap` bytes (prlimit --as): its JSON, or the
    last line of its error when it failed (the whole of it in root/failed-WHICH-LENGTH.log)."""
    command = ["prlimit", f"--as={cap}", "--", python, "-c", _ATTRIBUTION_CHILD, which, str(root), str(length),
               str(TRACER_TESTS), *([str(keep)] if keep else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600,
                          env=os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
                                            "PYTHONPATH": str(TRACER_TESTS.parents[1])})
    if done.returncode != 0:
        (root / f"failed-{which}-{length}.log").write_text(done.stderr)
        # the error itself, not what a destructor raised after it at exit
        lines = [line for line in done.stderr.split("Exception ignored in")[0].splitlines() if line.strip()]
        return {"failed": lines[-1] if lines else f"exit status {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _same_graph(root: Path, length: int) -> float:
    """The two saved graphs of the prompt agree: the same active features, selected features and logit targets,
    activations and adjacency within 1e-5 of their largest entry (float32 sums of 512 terms in other orders). The largest difference over that entry, or a
    RuntimeError naming what differs: the benchmark never times two different computations."""
    ours, theirs = (torch.load(root / f"graph-{side}-{length}.pt") for side in ("ours", "theirs"))
    for key in ("active_features", "selected_features", "logits"):
        a, b = ours[key], theirs[key]
        if not (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b):
            raise RuntimeError(f"attribution at {length} tokens: {key} differ from circuit-tracer's")
    a, b = ours["activation_values"], theirs["activation_values"]
    if (a - b).abs().max() > 1e-5 * b.abs().max():
        raise RuntimeError(f"attribution at {length} tokens: activations differ from circuit-tracer's by "
                           f"{float((a - b).abs().max() / b.abs().max()):.3g} of the largest (more than 1e-5)")
    a, b = ours["adjacency"], theirs["adjacency"]
    if a.shape != b.shape:
        raise RuntimeError(f"attribution at {length} tokens: adjacency {list(a.shape)}, circuit-tracer's "
                           f"{list(b.shape)}")
    off = float((a - b).abs().max() / b.abs().max())
    if off > 1e-5:
        raise RuntimeError(f"attribution at {length} tokens: adjacency differs from circuit-tracer's by {off:.3g} "
                           "of its largest entry (more than 1e-5)")
    return off


def attribution(ckpt: Checkpoints, repeats: int, device: str, circuit_tracer_python: str | None = None,
                memory_cap_gb: float = 16.0) -> list[dict]:
    """Attribution graphs (scratch_models.circuits.attribute) against circuit-tracer 0.5.0's `attribute`
    (`--circuit-tracer-python`: a Python with circuit-tracer, which needs transformers <= 4.57 and transformer-lens
    < 4; tests/circuits/test_circuit_tracer_parity.py says how to make one) on the same random Gemma-2-shaped
    checkpoint (8 layers, hidden 512) and per-layer JumpReLU transcoders of 4096 features (30-50 active per
    token and layer), prompts of 64 and 512 tokens, the same settings both sides. Each attribution runs in a fresh
    process (the sides in turn, `repeats` times: medians), under an address-space cap of --memory-cap-gb (prlimit
    --as) so that one that does not fit fails alone; `peak_rss_mb` is the child's VmHWM (the model and transcoders
    loaded, then the graph), `added_mb` what the attribution added to the RSS it started from. The first run of
    each length saves both graphs and checks that they agree (adjacency within 1e-5 of its largest entry). Then a
    prompt of 2048 tokens: ours once, and circuit-tracer once under the same cap."""
    if device != "cpu":
        return [{"case": "attribution: CPU only here (circuit-tracer's child runs on the CPU)"}]
    root = Path(tempfile.mkdtemp(prefix="scratch-models-attribution-"))
    setup = _attribution_setup(root)
    cap = int(memory_cap_gb * 2**30)
    pythons = {"ours": sys.executable}
    if circuit_tracer_python is not None:
        pythons["theirs"] = circuit_tracer_python
    settings = ", ".join(f"{k}={v}" for k, v in ATTRIBUTION_SETTINGS.items())
    rows = []
    for length in ATTRIBUTION_LENGTHS:
        runs = {which: [] for which in pythons}
        for i in range(repeats):
            for which, python in pythons.items():
                keep = root / f"graph-{which}-{length}.pt" if i == 0 else None
                runs[which].append(_attribution_child(python, which, root, length, cap, keep))
                if "failed" in runs[which][-1]:
                    raise RuntimeError(f"{which} at {length} tokens failed: {runs[which][-1]['failed']}")
        agree = _same_graph(root, length) if "theirs" in runs else None
        med = {w: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()}
        row = {"case": f"{length} tokens", "active": int(med["ours"]["active"]),
               "active_per_token_layer": med["ours"]["active"] / ((length - 1) * ATTRIBUTION_MODEL["layers"]),
               "nodes": int(med["ours"]["nodes"]), "ours_s": med["ours"]["seconds"],
               "ours_peak_rss_mb": med["ours"]["peak_rss_mb"],
               "ours_added_mb": med["ours"]["peak_rss_mb"] - med["ours"]["rss_before_mb"]}
        if "theirs" in med:
            row |= {"circuit_tracer_s": med["theirs"]["seconds"], "ratio": med["theirs"]["seconds"] /
                    med["ours"]["seconds"], "circuit_tracer_peak_rss_mb": med["theirs"]["peak_rss_mb"],
                    "circuit_tracer_added_mb": med["theirs"]["peak_rss_mb"] - med["theirs"]["rss_before_mb"],
                    "rss_ratio": med["theirs"]["peak_rss_mb"] / med["ours"]["peak_rss_mb"],
                    "adjacency_off": agree}
        rows.append(row)
    for which, python in pythons.items():
        got = _attribution_child(python, which, root, LONG_PROMPT, cap)
        side = "ours" if which == "ours" else "circuit_tracer"
        row = {"case": f"{LONG_PROMPT} tokens, {side.replace('_', '-')} once"}
        if "failed" in got:
            row["note"] = f"failed: {got['failed']}"
        else:
            row |= {"active": got["active"], "nodes": got["nodes"], f"{side}_s": got["seconds"],
                    f"{side}_peak_rss_mb": got["peak_rss_mb"],
                    f"{side}_added_mb": got["peak_rss_mb"] - got["rss_before_mb"]}
        rows.append(row)
    if circuit_tracer_python is None:
        rows.append({"case": "circuit-tracer: skipped", "note": "--circuit-tracer-python PYTHON (a venv with "
                     "circuit-tracer 0.5.0) to run it"})
    rows.append({"case": "settings", "note": f"Gemma-2-shaped {ATTRIBUTION_MODEL}, {ATTRIBUTION_FEATURES} features "
                 f"a layer; {settings}; each run capped at {memory_cap_gb:g} GiB; thresholds at least "
                 f"{setup['margin']:.2g} from any pre-activation of the compared prompts"})
    return rows


CASES = {"limits": limits, "forward": forward, "generate": generate, "peers": peers, "load": load,
         "load_llama": load_llama, "load_moe": load_moe, "cold": cold, "hooks": hooks, "patching": patching,
         "harvest": harvest, "features": features, "attribution": attribution}
# cases whose runs take minutes: their own number of runs when --repeats is not given
DEFAULT_REPEATS = {"attribution": 3}


def format_table(rows: list[dict]) -> str:
    header = list(dict.fromkeys(k for row in rows for k in row))
    body = [[_cell(row.get(k)) for k in header] for row in rows]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in [header, *body])


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}" if value >= 0.1 else f"{value:.3g}"
    return str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=list(CASES), help="run only these (default: all)")
    parser.add_argument("--repeats", type=int, help="timed runs of each side per measurement (default: 20; "
                                                    f"{DEFAULT_REPEATS} for those cases)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--saelens-python", metavar="PYTHON", help="harvest: a Python with sae-lens installed (it "
                                                                   "needs transformer-lens < 4), to time SAELens' "
                                                                   "CacheActivationsRunner too")
    parser.add_argument("--circuit-tracer-python", metavar="PYTHON", help="attribution: a Python with "
                        "circuit-tracer 0.5.0 installed, to compare with")
    parser.add_argument("--memory-cap-gb", type=float, default=16.0,
                        help="attribution: each attribution's address-space cap (prlimit --as), GiB")
    parser.add_argument("--dtype", action="append", choices=("float32", "bfloat16"),
                        help="harvest: only these (default: both; bfloat16 is emulated on a CPU without AVX-512 BF16 "
                             "or AMX, some minutes a run)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # its save/load bars would bury the tables
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.device}, "
          f"{torch.get_num_threads()} threads; ratio = transformers time / ours")
    ckpt = Checkpoints()
    results = {}
    for case in args.case or list(CASES):
        extra = {}
        if case == "harvest":
            extra["saelens_python"] = args.saelens_python
            if args.dtype:
                extra["dtypes"] = tuple(getattr(torch, name) for name in dict.fromkeys(args.dtype))
        if case == "attribution":
            extra = {"circuit_tracer_python": args.circuit_tracer_python, "memory_cap_gb": args.memory_cap_gb}
        repeats = args.repeats if args.repeats is not None else DEFAULT_REPEATS.get(case, 20)
        results[case] = CASES[case](ckpt, repeats, args.device, **extra)
        print(f"\n{case}\n{format_table(results[case])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
