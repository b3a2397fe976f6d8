"""`harvest`: activations over a corpus, written to disk as Arrow shards; `iter_activations`: the same rows as
batches in memory.

    from scratch_models.corpus import harvest, iter_activations
    dataset = harvest("gpt2", "corpus.jsonl", names=["layers.5.out"], out="acts/")   # a datasets.Dataset
    for rows in iter_activations(model, "corpus.txt", names=["layers.*.out"]):       # nothing on disk
        rows["layers.5.out"], rows["token_id"], rows["document"], rows["position"]

Several processes: run under `torchrun --nproc_per_node N` (each process sees RANK and WORLD_SIZE; gloo on CPU,
nccl on CUDA). Shard k goes to rank k mod N: the shards depend on the data and the settings alone, so the union
is what one process writes, and a run resumes under any number of processes. Every rank reads and tokenizes the
whole corpus (to know where each shard begins), and runs the model on its own shards only; rank 0 writes the
manifest once all have finished.
"""

import collections
import contextlib
import dataclasses
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import torch

from weight_mapping import DirectoryLock

from .plan import WINDOW_ROWS, Options, Plan, load_model, peek, recorded_weights, weights_record
from .storage import (FORMAT, MANIFEST, STORAGE_DTYPES, HarvestError, ShardWriter, check_out, check_space,
                      done_blocks, features, finish, human_bytes, kept_parts, read_record, row_bytes, to_numpy,
                      write_json_atomic)

DEFAULT_SHARD_BYTES = 256 * 2**20


@dataclasses.dataclass
class Summary:
    """What a harvest did, for the command's closing lines and harvest.json."""

    out: str
    names: list[str]
    shards: int
    resumed_shards: int  # complete before this run started
    rows: int
    tokens: int  # run through the model by this run (all ranks)
    bytes: int  # of the shards
    seconds: float
    empty_documents: int
    dropped_tokens: int  # the SAELens layout's short last sequence
    padding: float  # share of the forward batches' positions that were padding
    timings: dict  # where this process's time went, in seconds
    threads: str = ""  # the threads it ran on, in words

    def format(self) -> str:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        lines = [f"harvest: {self.shards} shard{'s' * (self.shards != 1)}, {self.rows} rows of {', '.join(self.names)}, "
                 f"{human_bytes(self.bytes)} in {self.out}",
                 f"  {self.tokens} tokens in {self.seconds:.1f} s ({rate:,.0f} tokens/s)"
                 + (f"; {self.resumed_shards} of the shards {'was' if self.resumed_shards == 1 else 'were'} there "
                    "already" if self.resumed_shards else ""),
                 f"  padding {100 * self.padding:.1f}% of the batches' positions"]
        if self.empty_documents:
            lines.append(f"  {self.empty_documents} empty documents skipped (no token)")
        if self.dropped_tokens:
            lines.append(f"  {self.dropped_tokens} tokens of the last, short sequence left out (SAELens layout: every "
                         "row a full context)")
        spent = ", ".join(f"{what} {seconds:.1f} s" for what, seconds in self.timings.items())
        lines.append(f"  time (this process): {spent}")
        if self.threads:
            lines.append(f"  threads (this process): {self.threads}")
        return "\n".join(lines)


def harvest(model, data, names, out, *, overwrite: bool = False, compile: bool = False, device=None,
            model_dtype=None, shard_bytes: int = DEFAULT_SHARD_BYTES, space_check: bool = True,
            progress: bool = True, threads: int | None = None, **options) -> "datasets.Dataset":  # noqa: F821
    """Run `model` over every document of `data` and write the tensors of the hook points `names` (ours or
    TransformerLens', or globs where `*` is one part of a name, `layers.*.out`; each stored under the name given) to
    `out`, one row per token kept; return them as a datasets.Dataset (memory-mapped).

    `model`: one of our models (with its tokenizer), or a checkpoint (a name from_pretrained takes), loaded as the
    narrowest class that has the names, on `device` in `model_dtype`. `data`: a .txt / .jsonl / .csv / .parquet
    file, a directory `datasets` saved, a list of texts or a datasets.Dataset (see scratch_models.corpus.reading).
    `options` (see Options): batching ("pack", "document"), context, positions ("all", "first", "last", "mean"),
    drop_special (true: every special token; a list: the tokens of those ids; SAELens' name exclude_special_tokens
    works too), prepend_bos, batch_size, text_column, pair_column, ids_column, layout ("rows", "saelens"), dtype
    (storage: "float32", "float16", "bfloat16").

    Run again with the same arguments, it resumes from the shards on disk (after a crash, a kill or Ctrl-C, which
    raises `Interrupted`); other settings are refused unless `overwrite`, and a second harvest into `out` while one
    runs is refused. `shard_bytes`: about how large a shard grows; what is written of one is made to survive a kill
    every 30 s, so a kill costs at most that much work. `compile`: run the model through compile_model (one graph
    per batch shape). `threads`: the CPU threads to run on (default: the cores this process may use, shared among
    the processes of a torchrun on this machine, at most OMP_NUM_THREADS when set); each runs forward passes of its
    own on one torch thread, so a busy core slows only its own thread (see `Threads`)."""
    return run_harvest(model, data, names, out, overwrite=overwrite, compile=compile, device=device,
                       model_dtype=model_dtype, shard_bytes=shard_bytes, space_check=space_check, progress=progress,
                       threads=threads, **options)[0]


def iter_activations(model, data, names, *, compile: bool = False, device=None, model_dtype=None,
                     **options) -> Iterator[dict[str, torch.Tensor]]:
    """The rows `harvest` would write, a forward batch at a time, without disk: hook name -> [rows, *row_shape] on
    the model's device (in `dtype` when given, else the model's), and "token_id", "document", "position" -> [rows]
    on the CPU. For training on the fly (an SAE, a probe) as sparsify and dictionary_learning read activations.
    The forward passes run in the caller's thread on torch's threads as they are set (harvest runs each on one
    torch thread: the same bits as here under torch.set_num_threads(1); other thread counts may round otherwise)."""
    plan = _plan(model, data, names, Options(**options), compile, device, model_dtype)
    dtype = plan.options.dtype
    for block in plan.blocks(WINDOW_ROWS):
        for batch in plan.batches(block):
            with plan.runner.listening():  # not across a yield: the caller may run the model meanwhile
                rows = plan.runner.run(batch)
            if dtype is not None:
                rows = {k: v.to(STORAGE_DTYPES[dtype]) if k in plan.names else v for k, v in rows.items()}
            yield rows


def _plan(model, data, names, options: Options, compile: bool, device, model_dtype) -> Plan:
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, names, device=device, dtype=model_dtype)
    elif device is not None or model_dtype is not None:
        raise ValueError("device and model_dtype are for a checkpoint harvest loads; move or cast a model you "
                         "pass yourself")
    return Plan(model, data, names, options, compile=compile)


class Interrupted(KeyboardInterrupt):
    """A harvest stopped by Ctrl-C: its message says what is kept (the same call resumes)."""


def run_harvest(model, data, names, out, *, overwrite=False, compile=False, device=None, model_dtype=None,
                shard_bytes=DEFAULT_SHARD_BYTES, space_check=True, progress=True, threads=None, **options):
    """`harvest`, returning (dataset, Summary)."""
    start = time.perf_counter()
    out = Path(out).expanduser().resolve()
    with _distributed(device) as (rank, world, device), contextlib.ExitStack() as held:
        # rank 0 holds the directory's lock for all, taken before the model is loaded and hashed: a second command
        # there refuses at once
        _agree(rank, world, lambda: held.enter_context(DirectoryLock(out, "harvest")))
        options = Options(**options)
        options.dtype = options.dtype or "float32"
        plan = _plan(model, data, names, options, compile, device, model_dtype)
        chosen = held.enter_context(Threads.chosen(threads, plan.runner.device, compile))
        # where a shard ends depends on its size: a resume with another size would skip or repeat rows
        # the weights' hash is taken from the manifest where their files are unchanged (weights_identity)
        settings = (plan.settings(recorded_weights(out / MANIFEST)) | {"shard_bytes": shard_bytes}
                    | plan.computation(compile, chosen.torch))
        weights = weights_record(plan.model)
        _agree(rank, world, lambda: _prepare(out, settings, weights, overwrite))
        layouts = plan.layouts
        saelens_context = plan.options.context if plan.options.layout == "saelens" else None
        shard_features = features(layouts, plan.options.dtype, saelens_context)
        per_row = row_bytes(layouts, plan.options.dtype)
        rows_per_block = max(1, shard_bytes // per_row)
        done, kept = done_blocks(out), kept_parts(out)
        finished = _finished(out, plan, done, kept) if world == 1 else None
        if finished is None:
            first, blocks = peek(plan.blocks(rows_per_block))
            estimate = _estimate(plan, first, per_row)
        else:  # every shard is there: the corpus is not read and tokenized again only to count its blocks
            blocks, estimate = iter(()), None
        if space_check and estimate is not None and rank == 0:
            written = sum(counts["bytes"] for counts in done.values()) + sum(k["bytes"] for k in kept.values())
            check_space(out, max(0, estimate["bytes"] - written), estimate["basis"])
        state = _Run(plan, out, shard_features, rank, world, progress, estimate, done, kept, chosen)
        # the time before the first batch (the lock, the model's hash, the plan, the probe, the threads), so the
        # summary's times add up to the whole run and a run with nothing left to do shows where its seconds went
        setup = time.perf_counter() - start
        try:
            with plan.runner.listening():
                counted = state.run(blocks)
        except BaseException as e:
            state.stop()
            if isinstance(e, KeyboardInterrupt):
                raise Interrupted(_interrupted(out, estimate, rows_per_block * per_row)) from None
            raise
        state.close_bar()
        total = counted if finished is None else finished
        tokens = _all_ranks(state.tokens, world)
        _barrier(world)  # every shard is on disk
        summary = _summary(plan, out, state, total, tokens, time.perf_counter() - start, setup)
        if rank == 0:
            dataset = finish(out, total, shard_features)
            write_json_atomic(out / MANIFEST, _manifest(settings, weights, summary, plan, world))
        _barrier(world)  # the manifest is written
        if rank != 0:
            import datasets

            dataset = datasets.load_from_disk(str(out))
    return dataset, summary


def _prepare(out: Path, settings: dict, weights: dict | None, overwrite: bool) -> None:
    manifest = check_out(out, settings, overwrite)
    if manifest is None:
        write_json_atomic(out / MANIFEST, {"format": FORMAT, "version": 1, "status": "running",
                                           "settings": settings, "weights": weights})


def _finished(out: Path, plan: Plan, done: dict, kept: dict) -> int | None:
    """The number of shards of a complete harvest in `out` (whose settings _prepare found equal) when every one of
    them is there, done; None otherwise (a shard deleted since is written again, as before)."""
    manifest = read_record(out / MANIFEST, "pass --overwrite (overwrite=True) to start again")
    shards = manifest.get("shards")
    if manifest.get("status") != "complete" or not isinstance(shards, int) or kept or set(done) != set(range(shards)):
        return None
    plan.counts["empty"] = manifest.get("empty_documents", 0)  # what reading the corpus found, for the summary
    return shards


def _interrupted(out: Path, estimate: dict | None, shard_bytes: int) -> str:
    done, kept = done_blocks(out), kept_parts(out)
    total = f" of about {max(len(done), -(-estimate['bytes'] // shard_bytes))}" if estimate else ""
    part = f", and {human_bytes(sum(k['bytes'] for k in kept.values()))} of unfinished ones" if kept else ""
    return f"interrupted: {len(done)}{total} shards kept{part}; the same command resumes"


@dataclasses.dataclass(frozen=True)
class Threads:
    """The CPU threads a harvest runs on: `forward` threads each running forward passes of their own (batch after
    batch, in order of the corpus when written), each on `torch` intra-op threads; the tokenizer and the writer
    one thread each. Forward passes side by side rather than one forward pass over all cores: on a core that
    another process also uses, a thread that waits for the others at every operation (torch's intra-op threads)
    slows them all (issue 29 measured 74-91 tokens/s against 535-783 on one thread), while a thread of its own
    slows only itself. The rows are the same whatever the forward threads (each batch runs on one of them); the torch
    threads each forward pass runs on (1 up to 8 cores, more beyond or compiled) are a setting a resume must match
    (Plan.computation)."""

    forward: int
    torch: int

    MAX_FORWARD = 8  # beyond, each forward thread takes several torch threads (memory: a batch in flight each)

    @classmethod
    @contextlib.contextmanager
    def chosen(cls, threads: int | None, device: torch.device, compile: bool):
        """The threads for `threads` CPU threads (None: see harvest), torch's set for the block and set back."""
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be at least 1, got {threads!r}")
        if device.type != "cpu":
            chosen = cls(1, torch.get_num_threads())
        else:
            cores = threads or _cpu_threads()
            forward = 1 if compile else min(cores, cls.MAX_FORWARD)  # a compiled model runs one call at a time
            chosen = cls(forward, max(1, cores // forward))
        before = torch.get_num_threads()
        torch.set_num_threads(chosen.torch)
        try:
            yield chosen
        finally:
            torch.set_num_threads(before)

    def __str__(self) -> str:
        return (f"{self.forward} forward thread{'s' * (self.forward != 1)} on {self.torch} torch thread"
                f"{'s' * (self.torch != 1)} each")


def _cpu_threads() -> int:
    """The cores this process may use, shared among torchrun's processes on this machine; at most OMP_NUM_THREADS
    when it is set (torchrun sets it to 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return min(cores, int(limit)) if limit.isdigit() and int(limit) > 0 else cores


class _Run:
    """One process's share of a harvest: the blocks it owns and has not done, through the model (forward threads
    side by side) and the writer, in order."""

    def __init__(self, plan: Plan, out: Path, shard_features, rank: int, world: int, progress: bool,
                 estimate: dict | None, done: dict, kept: dict, threads: Threads):
        self.plan, self.out, self.rank, self.world = plan, out, rank, world
        self.done, self.kept, self.threads = done, kept, threads
        self.writer = ShardWriter(out, shard_features)
        self.pool = ThreadPoolExecutor(threads.forward, thread_name_prefix="harvest-forward")
        self.timings = {"reading and tokenizing": 0.0, "forward (all threads)": 0.0, "rows to numpy": 0.0}
        self.tokens = self.positions = self.padded = self.dropped = 0
        self.bar = None
        if progress and rank == 0:
            from tqdm.auto import tqdm

            # the ETA is for this rank's share; the others run alongside
            total = estimate["tokens"] // world if estimate else None
            mine = [c for b, c in done.items() if b % world == rank] + [
                k["counts"] for b, k in kept.items() if b % world == rank]
            self.bar = tqdm(total=total, unit="tok", unit_scale=True, desc="harvest", dynamic_ncols=True,
                            initial=sum(c["tokens"] for c in mine))

    def run(self, blocks) -> int:
        """Run this rank's blocks; the number of blocks in the corpus."""
        count = 0
        clock = time.perf_counter()
        for index, block in enumerate(blocks):
            count = index + 1
            self.timings["reading and tokenizing"] += time.perf_counter() - clock
            if index % self.world == self.rank and index not in self.done:
                self._block(index, block)
            clock = time.perf_counter()
        self.pool.shutdown()
        self.writer.close()
        self.timings["writing (thread)"] = self.writer.write_seconds
        self.timings["waiting for the writer"] = self.writer.wait_seconds
        return count

    def stop(self) -> None:
        """After an interrupt or an error: no more forward passes, what is written kept, the bar left as it is."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.writer.stop()
        if self.bar is not None:
            self._show_written()
            self.bar.close()

    def _block(self, index: int, block) -> None:
        plan = self.plan
        saelens = plan.options.layout == "saelens"
        kept = self.kept.get(index)
        counts = dict(kept["counts"]) if kept else {
            "block": index, "rank": self.rank, "rows": 0, "tokens": 0, "sequences": 0, "dropped_tokens": 0,
            "documents": [block[0].document[0], block[-1].document[-1]]}
        counts["rank"] = self.rank
        self.writer.begin(index, kept)
        pending = collections.deque()  # (batch number, batch, its rows to come, tokens left out), in order
        for number, batch in enumerate(plan.batches(block)):
            if kept and number < kept["batches"]:
                continue
            dropped = 0
            if saelens:
                dropped = sum(len(s) for s in batch if len(s) != plan.options.context)
                batch = [s for s in batch if len(s) == plan.options.context]
            pending.append((number, batch, self.pool.submit(self._compute, batch) if batch else None, dropped))
            if len(pending) > 2 * self.threads.forward:
                self._write(*pending.popleft(), counts)
        while pending:
            self._write(*pending.popleft(), counts)
        self.writer.end(counts)

    def _compute(self, batch) -> tuple[dict, float, float]:
        """In a forward thread: the batch's columns, and the seconds of its forward pass and of its rows."""
        clock = time.perf_counter()
        rows = self.plan.runner.run(batch)
        if self.plan.runner.device.type == "cuda":
            torch.cuda.synchronize(self.plan.runner.device)
        middle = time.perf_counter()
        columns = self._columns(rows, batch, self.plan.options.layout == "saelens", self.plan.options.dtype)
        return columns, middle - clock, time.perf_counter() - middle

    def _write(self, number: int, batch, future, dropped: int, counts: dict) -> None:
        counts["dropped_tokens"] += dropped
        self.dropped += dropped
        if future is None:
            return
        columns, forward, numpy = future.result()
        self.timings["forward (all threads)"] += forward
        self.timings["rows to numpy"] += numpy
        tokens = sum(len(s) for s in batch)
        counts["rows"] += len(next(iter(columns.values())))
        counts["tokens"] += tokens
        counts["sequences"] += len(batch)
        self.writer.write(columns, {"batches": number + 1, "counts": dict(counts)})
        self.tokens += tokens
        self.positions += len(batch) * max(len(s) for s in batch)
        if self.bar is not None:
            self.bar.update(tokens)
            self._show_written()

    def _show_written(self) -> None:
        self.bar.set_postfix_str(f"{human_bytes(self.writer.bytes_written)} written", refresh=False)

    def _columns(self, rows, batch, saelens: bool, dtype: str) -> dict:
        plan = self.plan
        if saelens:
            (name,) = plan.names
            context = plan.options.context
            return {name: to_numpy(rows[name].reshape(len(batch), context, -1), dtype),
                    "token_ids": rows["token_id"].reshape(len(batch), context).to(torch.int32).numpy()}
        columns = {name: to_numpy(rows[name], dtype) for name in plan.names}
        return columns | {"token_id": rows["token_id"].to(torch.int32).numpy(),
                          "document": rows["document"].numpy(),
                          "position": rows["position"].to(torch.int32).numpy()}

    def close_bar(self) -> None:
        """The bar's last line once finished: what was done (the estimate is replaced by it) and every byte
        written."""
        if self.bar is not None:
            self.bar.total = self.bar.n
            self._show_written()
            self.bar.close()


def _estimate(plan: Plan, first, per_row: int) -> dict | None:
    """The harvest's size in tokens and bytes, from its first block: scaled by the corpus's rows when known, else by
    its files' bytes against the first block's text (an overestimate for JSON and CSV, whose markup counts)."""
    if first is None:
        return None
    tokens = sum(len(s) for s in first)
    rows = sum(plan.rows_of(s) for s in first)
    documents = {d for s in first for d in s.document}
    total_rows = plan.corpus.num_rows()
    if total_rows:
        scale, basis = total_rows / len(documents), f"{total_rows} documents like the first {len(documents)}"
    else:
        size = plan.corpus.size_bytes()
        text = _text_bytes(plan, documents)
        if not size or not text:
            return None
        scale, basis = max(1.0, size / text), (f"the data's {human_bytes(size)} like the first {len(documents)} "
                                               "documents' text")
    return {"tokens": int(tokens * scale), "bytes": int(rows * scale * per_row), "basis": basis}


def _text_bytes(plan: Plan, documents: set) -> int:
    """The UTF-8 bytes of the texts (or 4 per token id) of the first documents, read again."""
    if not documents:
        return 0
    last, total = max(documents), 0
    for doc in plan.corpus:
        if doc.index > last:
            break
        if doc.ids is not None:
            total += 4 * len(doc.ids)
        else:
            total += len(doc.text.encode()) + len((doc.pair or "").encode())
    return total


def _summary(plan: Plan, out: Path, state: _Run, blocks: int, tokens: int, seconds: float, setup: float) -> Summary:
    done = done_blocks(out)
    return Summary(out=str(out), names=plan.names, shards=blocks, resumed_shards=len(state.done),
                   rows=sum(c["rows"] for c in done.values()), tokens=tokens,
                   bytes=sum(c["bytes"] for c in done.values()), seconds=seconds,
                   empty_documents=plan.counts.get("empty", 0),
                   dropped_tokens=sum(c["dropped_tokens"] for c in done.values()),
                   padding=1 - state.tokens / state.positions if state.positions else 0.0,
                   timings={k: round(v, 3) for k, v in {"setting up (model, plan, probe)": setup,
                                                        **state.timings}.items()},
                   threads=f"{state.threads}, the tokenizer and the writer one each")


def _manifest(settings: dict, weights: dict | None, summary: Summary, plan: Plan, world: int) -> dict:
    from importlib import metadata

    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    done = done_blocks(Path(summary.out))
    return {"format": FORMAT, "version": 1, "status": "complete", "settings": settings, "weights": weights,
            "shards": summary.shards, "rows": summary.rows,
            "tokens": sum(c["tokens"] for c in done.values()), "sequences": sum(c["sequences"] for c in done.values()),
            "bytes": summary.bytes, "empty_documents": summary.empty_documents,
            "dropped_tokens": summary.dropped_tokens, "world_size": world, "device": str(plan.runner.device),
            "model_dtype": str(next(plan.model.parameters()).dtype).removeprefix("torch."),
            "versions": {"scratch-models": version("scratch-models"), "torch": torch.__version__,
                         "datasets": version("datasets"), "pyarrow": version("pyarrow"),
                         "python": platform.python_version()}}


# ---- several processes (torchrun) ----


@contextlib.contextmanager
def _distributed(device):
    """(rank, world size, device) of this process. Under torchrun (WORLD_SIZE > 1) a process group is started if
    none is (gloo on CPU, nccl on CUDA, each rank on the GPU of its LOCAL_RANK) and ended afterwards."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not (dist.is_available() and dist.is_initialized()):
        yield 0, 1, device
        return
    started = not dist.is_initialized()
    cuda = device is not None and str(device).startswith("cuda")
    if cuda:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    if started:
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        yield dist.get_rank(), dist.get_world_size(), device
    finally:
        if started:
            dist.destroy_process_group()


def _agree(rank: int, world: int, fn) -> None:
    """Run `fn` on rank 0; every rank raises the error it raised (so none goes on alone)."""
    error = None
    if rank == 0:
        try:
            fn()
        except (HarvestError, OSError, ValueError) as e:
            error = e
    if world > 1:
        import torch.distributed as dist

        shared = [str(error) if error is not None else None]
        dist.broadcast_object_list(shared, src=0)
        if shared[0] is not None and error is None:
            error = HarvestError(shared[0])
    if error is not None:
        raise error


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def _all_ranks(value: int, world: int) -> int:
    if world == 1:
        return value
    import torch.distributed as dist

    total = torch.tensor([value], dtype=torch.long)
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total)
    return int(total.item())
