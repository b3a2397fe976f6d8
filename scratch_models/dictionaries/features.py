"""What each feature of a dictionary does over a corpus: one pass, as harvest makes it, and a page per feature.

    from scratch_models.dictionaries.features import features
    dataset = features("gpt2", "path/to/sae", "corpus.jsonl", out="features/")   # a datasets.Dataset, a row a feature
    # features/index.html (every feature, sortable, searchable), features/features/123.html, features.json

The corpus is read, tokenized, packed and run exactly as `harvest` runs it (scratch_models.corpus: the same readers,
batching and Runner, which stops each forward pass after the dictionary's hook point); each batch's activations go
through the dictionary's encoder and into a FeatureStats (feature_stats.py), whose memory does not grow with the
corpus. Kept per feature: how often it fires, its largest and mean activation and quantiles, a histogram, the
top_k tokens where it is largest with their context (every token's activation), a uniform sample of its firings
(split by quantile into bands on the page), and its logit effects: its decoder direction read out through the
unembedding (W_dec[i] @ W_U; a hook_z dictionary's through W_O first), the tokens it raises and lowers most.

Resumable: every processed block of the corpus (BLOCK_TOKENS tokens) is counted in a part file of this process, saved
every SAVE_SECONDS, so a run killed at any moment, even by kill -9, redoes at most that much; the same command
resumes it (other settings are refused unless `overwrite`). Under torchrun each rank takes every world-th block, as
harvest does; rank 0 merges the parts and writes the outputs. The result does not depend on how the corpus was split
among processes or runs (ties and the sample are decided by each token's place in the corpus). As harvest: the
directory's lock (weight_mapping.DirectoryLock) is taken before the model loads, a resume with other settings is
refused naming each with its old and new value, and Ctrl-C raises `Interrupted` saying what is kept.

    out/
      features.json          settings, then the counts and timings once complete
      parts/part-*.pt        the passes' statistics (each lists its blocks)
      dataset/               a datasets.Dataset, one row per feature (load_from_disk memory-maps it)
      index.html, features/{i}.html, assets/     the pages (offline: plain files, no network)
"""

import collections
import contextlib
import dataclasses
import json
import os
import platform
import secrets
import time
from pathlib import Path

import torch

from weight_mapping import DirectoryLock
from weight_mapping.locks import LOCK_FILE

from ..corpus.storage import _fsync
from ..lens.names import SAME
from .feature_stats import BINS, BatchPlaces, FeatureStats, bin_edges
from .sae import SAE, DictionaryError
from .splice import Splice, _check_width, resolve_hook

FORMAT = "scratch-models features"
MANIFEST = "features.json"
BLOCK_TOKENS = 1 << 14  # tokens of the corpus per block: the unit a resumed run skips
SAVE_SECONDS = 60.0  # how often a process writes its part file: what a kill can cost
QUANTILES = (0.5, 0.9, 0.99)
LOGIT_TOKENS = 10  # tokens a feature raises (and lowers) most, on its page
OPTION_NAMES = ("batching", "context", "prepend_bos", "batch_size", "text_column", "pair_column", "ids_column",
                "drop_special", "exclude_special_tokens")


@dataclasses.dataclass
class FeatureSummary:
    """What a features run did: its closing lines and features.json's counts."""

    out: str
    hook: str
    features: int
    alive: int  # features that fired at least once
    tokens: int  # counted (all runs)
    tokens_this_run: int
    l0: float  # features firing per token, on average
    resumed_blocks: int
    seconds: float
    timings: dict  # where this process's time went, in seconds
    logit_effects: str  # how they were read, or why there are none
    threads: str = ""  # the threads it ran on, in words

    def format(self) -> str:
        passed = self.timings.get("pass", self.seconds)
        rate = self.tokens_this_run / passed if passed else 0.0
        return "\n".join([
            f"features: {self.features} features of the dictionary at {self.hook}, {self.alive} fired over "
            f"{self.tokens} tokens ({self.l0:.1f} a token); pages and dataset in {self.out}",
            f"  {self.tokens_this_run} tokens this run in {self.seconds:.1f} s ({rate:,.0f} tokens/s over the corpus)"
            + (f"; {self.resumed_blocks} block{' was' if self.resumed_blocks == 1 else 's were'} counted before"
               if self.resumed_blocks else ""),
            f"  logit effects: {self.logit_effects}"]
            + ([f"  threads (this process): {self.threads}"] if self.threads else [])
            + ["  time (this process): " + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items())])


def features(model, dictionary, data, out, **kwargs) -> "datasets.Dataset":  # noqa: F821
    """Run `model` over `data` once, read the features of `dictionary` at its hook point, and write the dataset and
    pages into `out` (see the module's doc and `run_features` for the arguments); return the dataset."""
    return run_features(model, dictionary, data, out, **kwargs)[0]


def run_features(model, dictionary, data, out, *, overwrite: bool = False, device=None, model_dtype=None,
                 top_k: int = 20, samples: int = 20, window: tuple[int, int] = (12, 4), pages: bool = True,
                 block_tokens: int = BLOCK_TOKENS, save_seconds: float = SAVE_SECONDS, progress: bool = True,
                 threads: int | None = None, **options):
    """`features`, returning (dataset, FeatureSummary).

    `model`: one of our models, or a checkpoint (loaded on `device` in `model_dtype`, as its LM class when the file
    has the head, for the logit effects). `dictionary`: an SAE, or what SAE.from_pretrained takes. `data`: what
    harvest reads. `options`: harvest's batching, context, prepend_bos, batch_size, text_column, pair_column,
    ids_column and drop_special (special tokens, or the tokens of a list of ids, then count for no feature, and show
    without an activation; SAELens' exclude_special_tokens is the same option).
    `top_k`: examples kept per feature; `samples`: tokens sampled per feature for the quantile bands; `window`:
    (tokens before, tokens after) each example shows. `pages`: write the HTML pages. `block_tokens`: the corpus's
    unit of resuming (part of the settings); `save_seconds`: how often each process saves its part file.
    `threads`: the CPU threads, as harvest's (forward passes and the encoder side by side, a torch thread each)."""
    from ..corpus.harvest import Interrupted, Threads, _agree, _barrier, _distributed
    from ..corpus.plan import Options, Plan, recorded_weights, weights_record

    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise TypeError(f"unknown option {', '.join(sorted(unknown))}; features takes {', '.join(OPTION_NAMES)}")
    _check_counts(top_k, samples, window, block_tokens)
    start = time.perf_counter()
    out = Path(out).expanduser().resolve()
    with _distributed(device) as (rank, world, device), contextlib.ExitStack() as held:
        # rank 0 holds the directory's lock for all, before the model is loaded: a second command there refuses at once
        _agree(rank, world, lambda: held.enter_context(DirectoryLock(out, "features")))
        model = _model(model, device, model_dtype)
        sae = dictionary if isinstance(dictionary, SAE) else SAE.from_pretrained(dictionary)
        sae = sae.to(next(model.parameters()).device)
        site = resolve_hook(model, sae.cfg.hook_name, f"the dictionary {sae.cfg.source}".rstrip())
        _check_width(model, sae, site)
        spliced = model.hook_points()[site.name].spliced
        if isinstance(spliced, Splice) and not spliced.error_term:  # the point then holds a reconstruction
            raise DictionaryError(f"a dictionary ({spliced.extra_repr()}) is attached at {site.name} without the "
                                  "error term, so that point holds its reconstruction, not the model's activations: "
                                  "detach it (model.detach()) or attach it with error_term=True")
        plan = Plan(model, data, [site.name], Options(**options))
        chosen = held.enter_context(Threads.chosen(threads, plan.runner.device, compile=False))
        # the weights' hash is taken from the manifest where their files are unchanged (weights_identity)
        settings = (plan.settings(recorded_weights(out / MANIFEST))
                    | {"dictionary": sae.cfg.source, "dictionary_sha256": _sae_hash(sae), "hook": site.name,
                       "top_k": top_k, "samples": samples, "window": list(window), "block_tokens": block_tokens}
                    | plan.computation(False, chosen.torch))
        weights = weights_record(plan.model)
        _agree(rank, world, lambda: _prepare(out, settings, weights, overwrite))
        finished = _finished(out, pages) if world == 1 else None
        if finished is not None:  # nothing to count, and the dataset and pages are there: nothing to write again
            return finished, _finished_summary(out, site, start)
        done = _done_blocks(out)
        run = _Pass(plan, sae, site, out, rank, world, done, FeatureStats(
            sae.cfg.d_sae, top_k=top_k, samples=samples, before=window[0], after=window[1]), progress, chosen)
        # the time before the first block (the lock, the model, the dictionary's hash, the plan, the threads), apart
        # from the pass itself, so a run with nothing left to count does not report seconds of a pass it never made
        setup = time.perf_counter() - start
        try:
            run.run(block_tokens, save_seconds)
        except KeyboardInterrupt:  # Ctrl-C: say what is kept (the command line prints it and exits 130)
            if run.bar is not None:
                run.bar.close()
            kept = len(done) + run.saved
            raise Interrupted(f"interrupted: {kept} block{'s' * (kept != 1)} of the corpus counted and saved; the same "
                              f"command resumes (what this run counted since it last saved, at most "
                              f"{save_seconds:g} s of it, is counted again)") from None
        finally:
            run.pool.shutdown(cancel_futures=True)
        run.timings = {"setting up (model, dictionary, plan)": setup,
                       "pass": time.perf_counter() - start - setup,  # what grows with the corpus
                       **run.timings}
        _barrier(world)
        summary = dataset = None
        if rank == 0:
            dataset, summary = _finish(out, plan, sae, site, settings, weights, run, pages, start, world)
        _barrier(world)
        if rank != 0:
            import datasets

            dataset = datasets.load_from_disk(str(out / "dataset"))
    return dataset, summary


def _finished(out: Path, pages: bool) -> "datasets.Dataset | None":  # noqa: F821
    """The dataset of a complete run in `out` (whose settings _prepare has found equal) when what it wrote is all
    there (the dataset, and the pages where asked for): a rerun then counts, merges and writes nothing again (the
    logit effects alone were a [vocabulary, d_in] @ [d_in, d_sae] product). None otherwise."""
    manifest = _read_json(out / MANIFEST)
    written = (out / "dataset" / "state.json").is_file() and (
        not pages or manifest.get("pages") is True and (out / "index.html").is_file())
    # the part files as the run left them (a part deleted or cut short since is counted again or named, as before)
    if manifest.get("status") != "complete" or manifest.get("parts") != _parts_identity(out) or not written:
        return None  # (a manifest of an earlier version, without parts, l0 and pages, is finished again as before)
    import datasets

    return datasets.load_from_disk(str(out / "dataset"))


def _parts_identity(out: Path) -> list[list]:
    """[name, size, modification time in ns] of each part file."""
    return [[part.name, part.stat().st_size, part.stat().st_mtime_ns] for part in _part_files(out)]


def _finished_summary(out: Path, site, start: float) -> "FeatureSummary":
    manifest = _read_json(out / MANIFEST)
    seconds = time.perf_counter() - start
    return FeatureSummary(out=str(out), hook=site.given, features=manifest["features"], alive=manifest["alive"],
                          tokens=manifest["tokens"], tokens_this_run=0, l0=manifest["l0"],
                          resumed_blocks=manifest["blocks"], seconds=seconds,
                          timings={"setting up (model, dictionary, plan)": round(seconds, 3)},
                          logit_effects=manifest["logit_effects"],
                          threads="none (the run was complete: nothing counted or written again)")


def _check_counts(top_k, samples, window, block_tokens) -> None:
    for name, value in (("top_k", top_k), ("samples", samples), ("block_tokens", block_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(isinstance(w, int) and w >= 0
                                                                           for w in window)):
        raise ValueError(f"window is (tokens before, tokens after), two ints >= 0; got {window!r}")


def _model(model, device, dtype):
    """A model given, or the checkpoint's LM class where its file has the head (the logit effects read it), else
    its base class."""
    if not isinstance(model, (str, os.PathLike)):
        if device is not None or dtype is not None:
            raise ValueError("device and model_dtype are for a checkpoint features loads; move or cast a model you "
                             "pass yourself")
        return model
    from weight_mapping import open_checkpoint

    from ..registry.families import family_of

    checkpoint = open_checkpoint(model)
    family = family_of(checkpoint)
    config = family.config_of(checkpoint)
    cls = family.lm if not family.missing_head_tensors(checkpoint, config, family.lm) else family.base
    return cls.from_pretrained(checkpoint, config=config, device=device, dtype=dtype)


def _sae_hash(sae: SAE) -> str:
    import hashlib

    digest = hashlib.sha256(json.dumps(dataclasses.asdict(sae.cfg), sort_keys=True, default=str).encode())
    for name, tensor in sae.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ---- the pass -------------------------------------------------------------------------------------------------------


def _prepare(out: Path, settings: dict, weights: dict | None, overwrite: bool) -> None:
    """A new or empty `out`, or one holding a features run of these settings (to resume). Whatever a kill at any
    moment leaves is taken by the same command: the manifest is written before parts/ is made, a manifest's
    temporary file (a kill before its rename) and a part file's are removed, and a run that counted nothing yet (a
    start that failed, on a document too long say, or a kill before the first save) is started again, whatever
    its settings were."""
    from ..corpus.storage import other_settings

    manifest = out / MANIFEST
    if out.exists() and not out.is_dir():
        raise DictionaryError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{MANIFEST}.partial").unlink(missing_ok=True)
    for partial in (out / "parts").glob("*.partial"):
        partial.unlink()
    if manifest.is_file():
        known = _read_json(manifest)
        if known.get("format") != FORMAT and not overwrite:
            raise DictionaryError(f"{manifest}: not a features run's manifest")
        if overwrite or known.get("status") == "running" and not _part_files(out):
            _remove_run(out)
        elif known["settings"] != settings:
            raise DictionaryError(other_settings(out, "a features run", known["settings"], settings))
        else:
            return
    else:
        # an empty parts/: a kill between its making and the manifest's (as versions before this one made them)
        strangers = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE
                           and not (p.name == "parts" and p.is_dir() and not any(p.iterdir())))
        if strangers:
            listed = ", ".join(strangers[:5]) + (", ..." if len(strangers) > 5 else "")
            raise DictionaryError(f"{out}: not empty ({listed}) and holds no {MANIFEST}: write features into a new or "
                                  "empty directory")
    _write_json(out / MANIFEST, {"format": FORMAT, "version": 1, "status": "running", "settings": settings,
                                 "weights": weights})
    (out / "parts").mkdir(exist_ok=True)


def _remove_run(out: Path) -> None:
    """Delete a features run's own files from `out` (--overwrite); anything else there is left alone."""
    import shutil

    for name in ("parts", "dataset", "features", "assets"):
        shutil.rmtree(out / name, ignore_errors=True)
    for name in (MANIFEST, "index.html"):
        (out / name).unlink(missing_ok=True)


def _read_json(path: Path) -> dict:
    """A JSON object this module wrote; a DictionaryError naming the file when it is cut short or garbled."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DictionaryError(f"{path}: not valid JSON ({e}): the file was cut short or changed; pass --overwrite "
                              "(overwrite=True) to start again") from None
    if not isinstance(value, dict):
        raise DictionaryError(f"{path}: expected a JSON object, got {type(value).__name__}; pass --overwrite "
                              "(overwrite=True) to start again")
    return value


def _part_files(out: Path) -> list[Path]:
    return sorted((out / "parts").glob("part-*.pt"))


def _done_blocks(out: Path) -> set[int]:
    done = set()
    for part in _part_files(out):
        done |= set(_load_part(part)["blocks"])
    return done


def _load_part(part: Path) -> dict:
    """A part file's statistics; a DictionaryError naming it when torch cannot read it (cut short, or changed)."""
    try:
        state = torch.load(part, weights_only=True)
        if not isinstance(state, dict) or "blocks" not in state:
            raise ValueError("not a features part file")
    except Exception as e:  # torch raises RuntimeError, pickle's and zipfile's errors alike
        reason = str(e).splitlines()[0][:100] if str(e) else ""
        raise DictionaryError(f"{part}: cannot be read ({type(e).__name__}: {reason}): the file was "
                              "cut short or changed; delete it and run the same command again (its blocks are "
                              "counted again)") from None
    return state


class _Pass:
    """One process's share: the blocks it owns and no part file counts yet, through the model and the dictionary."""

    def __init__(self, plan, sae: SAE, site, out: Path, rank: int, world: int, done: set, stats: FeatureStats,
                 progress: bool, threads):
        from concurrent.futures import ThreadPoolExecutor

        self.plan, self.sae, self.site, self.out = plan, sae, site, out
        self.rank, self.world, self.done, self.stats = rank, world, done, stats
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads.forward, thread_name_prefix="features-forward")
        self.part = out / "parts" / f"part-{secrets.token_hex(6)}-rank{rank}.pt"
        self.blocks: list[int] = []
        self.saved = 0  # of `blocks`, in the part file
        self.tokens = 0
        self.timings = {"reading and tokenizing": 0.0, "forward (all threads)": 0.0, "encoder (all threads)": 0.0,
                        "counting": 0.0, "saving": 0.0}
        self.bar = None
        if progress and rank == 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(unit="tok", unit_scale=True, desc="features", dynamic_ncols=True)

    def run(self, block_tokens: int, save_seconds: float) -> None:
        with self.plan.runner.listening():  # the Runner's recorders, attached for the whole pass over the corpus
            self._run(block_tokens, save_seconds)

    def _run(self, block_tokens: int, save_seconds: float) -> None:
        offset, saved, clock = 0, time.perf_counter(), time.perf_counter()
        for index, block in enumerate(self.plan.blocks(block_tokens)):
            self.timings["reading and tokenizing"] += time.perf_counter() - clock
            if index % self.world == self.rank and index not in self.done:
                self._block(block, offset)
                self.blocks.append(index)
                if time.perf_counter() - saved >= save_seconds:
                    self._save()
                    saved = time.perf_counter()
            offset += sum(len(sequence) for sequence in block)
            clock = time.perf_counter()
        if self.blocks:
            self._save()
        if self.bar is not None:
            self.bar.close()

    def _block(self, block, offset: int) -> None:
        starts, at = {}, offset
        for sequence in block:  # each sequence's first token's place in the corpus
            starts[id(sequence)] = at
            at += len(sequence)
        # batches through the model and the encoder on the forward threads, counted here in the corpus's order; at
        # most one batch waiting per thread (each holds its feature activations)
        pending = collections.deque()
        for batch in self.plan.batches(block):
            pending.append((batch, self.pool.submit(self._encode, batch, starts)))
            if len(pending) > self.threads.forward:
                self._count(*pending.popleft())
        while pending:
            self._count(*pending.popleft())

    def _encode(self, batch, starts: dict) -> tuple[torch.Tensor, BatchPlaces, float, float]:
        """In a forward thread: the batch's feature activations, where its rows sit, and the seconds of the
        forward pass and of the encoder."""
        clock = time.perf_counter()
        rows = self.plan.runner.run(batch)
        middle = time.perf_counter()
        with torch.no_grad():
            acts = self.sae.encode(rows[self.site.name].flatten(1))
        return acts, _places(self.plan.runner, batch, rows, starts), middle - clock, time.perf_counter() - middle

    def _count(self, batch, future) -> None:
        acts, places, forward, encoder = future.result()
        clock = time.perf_counter()
        self.stats.add(acts, places)
        self.timings["forward (all threads)"] += forward
        self.timings["encoder (all threads)"] += encoder
        self.timings["counting"] += time.perf_counter() - clock
        tokens = sum(len(sequence) for sequence in batch)
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(tokens)

    def _save(self) -> None:
        clock = time.perf_counter()
        partial = self.part.with_suffix(".partial")
        torch.save(self.stats.state() | {"blocks": self.blocks}, partial)
        _fsync(partial)  # on the disk before its name says it is whole (a power cut, not only a kill)
        os.replace(partial, self.part)
        self.saved = len(self.blocks)
        self.timings["saving"] += time.perf_counter() - clock


def _places(runner, batch, rows: dict, starts: dict) -> BatchPlaces:
    """Where each row of a batch sits (BatchPlaces), from the Runner's own columns of the batch."""
    columns = runner.tensors(batch)
    keep = columns["keep"]
    sequence, at = keep.nonzero(as_tuple=True)  # the rows, in the order Runner.run returns them
    row_at = torch.full(keep.shape, -1, dtype=torch.int64)
    row_at[sequence, at] = torch.arange(len(sequence))
    first = torch.tensor([starts[id(s)] for s in batch], dtype=torch.int64)
    ids = torch.where(columns["attention_mask"].bool(), columns["input_ids"], -1)
    return BatchPlaces(first[sequence] + at, rows["document"], rows["position"], ids, row_at, sequence, at)


# ---- the outputs ----------------------------------------------------------------------------------------------------


def _finish(out: Path, plan, sae: SAE, site, settings: dict, weights: dict | None, run: _Pass, pages: bool,
            start: float, world: int):
    clock = time.perf_counter()
    parts = _part_files(out)
    stats = None
    counted = set()
    for part in parts:
        state = _load_part(part)
        counted |= set(state["blocks"])
        loaded = FeatureStats.from_state(state)
        if stats is None:
            stats = loaded
        else:
            stats.merge(loaded)
    if stats is None:  # an empty corpus
        stats = run.stats
    timings = dict(run.timings)
    timings["merging"] = time.perf_counter() - clock
    clock = time.perf_counter()
    effects, reason = logit_effects(plan.model, sae, site)
    timings["logit effects"] = time.perf_counter() - clock
    clock = time.perf_counter()
    report = FeatureReport(stats, sae, site, plan, effects, reason)
    if _read_json(out / MANIFEST).get("status") == "complete":
        # a complete run writing its dataset or pages again (asked for now, or deleted): not complete until they
        # are, so a kill meanwhile leaves a run the same command finishes, not a "complete" one without its dataset
        _write_json(out / MANIFEST, {"format": FORMAT, "version": 1, "status": "running", "settings": settings,
                                     "weights": weights})
    dataset = report.write(out, pages)
    timings["dataset and pages" if pages else "dataset"] = time.perf_counter() - clock
    seconds = time.perf_counter() - start
    summary = FeatureSummary(out=str(out), hook=site.given, features=sae.cfg.d_sae, alive=int((stats.fired > 0).sum()),
                             tokens=stats.tokens, tokens_this_run=run.tokens,
                             l0=float(stats.fired.sum()) / max(stats.tokens, 1), resumed_blocks=len(run.done),
                             seconds=seconds, timings={k: round(v, 3) for k, v in timings.items()},
                             logit_effects=reason,
                             threads=f"{run.threads} (the model and the encoder), counting in the main one")
    _write_json(out / MANIFEST, {"format": FORMAT, "version": 1, "status": "complete", "settings": settings,
                                 "weights": weights, "tokens": stats.tokens, "blocks": len(counted),
                                 "features": sae.cfg.d_sae, "l0": summary.l0, "pages": pages,
                                 "parts": _parts_identity(out),
                                 "alive": summary.alive, "quantiles": list(QUANTILES), "logit_effects": reason,
                                 "world_size": world, "timings": summary.timings, "versions": _versions()})
    return dataset, summary


def logit_effects(model, sae: SAE, site) -> tuple[tuple[torch.Tensor, ...] | None, str]:
    """((top ids, top values, bottom ids, bottom values) [d_sae, LOGIT_TOKENS] each, how they were read), or (None,
    why not): each feature's decoder direction in the residual stream times the unembedding (the final norm left
    out, as SAEDashboard and Neuronpedia read it)."""
    from ..lens.names import layer_of

    stream = model.family.stream(model)
    try:
        unembedding = stream.unembedding()  # [V, h]
    except ValueError as e:
        return None, f"none: {e}"
    point = model.hook_points()[site.name]
    directions = sae.W_dec.detach()
    if site.name.endswith(".attn.context") and site.layout is not SAME:  # TL's z: the heads side by side
        directions = directions.to(unembedding.dtype) @ stream.out_weight(layer_of(site.name)).detach()
        how = "W_dec @ W_O @ W_U (the heads' outputs through the attention's output projection)"
    elif point.dims[-1] == "h" and directions.shape[1] == unembedding.shape[1]:
        how = "W_dec @ W_U"
    else:
        return None, f"none: the dictionary reads {site.name} [{', '.join(point.dims)}], not the residual stream"
    count = min(LOGIT_TOKENS, unembedding.shape[0])
    found = [[], [], [], []]
    with torch.no_grad():
        for chunk in directions.split(256):
            effect = chunk.to(unembedding.dtype) @ unembedding.detach().T  # [chunk, V]
            top, bottom = effect.topk(count, dim=-1), effect.topk(count, dim=-1, largest=False)
            for store, value in zip(found, (top.indices, top.values, bottom.indices, bottom.values)):
                store.append(value.cpu())
    return tuple(torch.cat(values) for values in found), how


class FeatureReport:
    """The finished statistics of every feature, read a chunk of features at a time (`chunks`), columnar: what the
    dataset stores and the pages show."""

    CHUNK = 1024  # features per chunk: bounds the memory the outputs take

    def __init__(self, stats: FeatureStats, sae: SAE, site, plan, effects, effects_reason: str):
        stats.flush()
        self.stats, self.sae, self.site, self.effects, self.effects_reason = stats, sae, site, effects, effects_reason
        self.tokenizer = plan.tokenizer
        self.source = str(getattr(plan.tokenizer, "source", "") or "")
        self.quantile_levels = list(QUANTILES)
        self.quantiles = stats.quantiles(torch.tensor(QUANTILES))
        self.mean = stats.total / stats.fired.clamp(min=1)
        self.frequency = stats.fired.double() / max(stats.tokens, 1)
        self.max = torch.where(stats.fired > 0, stats.top.value[:, 0], 0.0)
        self.edges = bin_edges().tolist()  # what hist_start and hist_counts index
        filled = stats.hist > 0
        self.hist_start = filled.int().argmax(1)
        self.hist_end = torch.where(filled.any(1), BINS - filled.flip(1).int().argmax(1), self.hist_start)
        self._strings: dict[int, str] = {}

    def strings(self, ids) -> list[str]:
        """Each token id as text (the tokenizer's, each id alone, a piece of a character as its bytes: Tokenizer.
        shown_tokens; "[id]" without one)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        missing = sorted({i for i in ids if i not in self._strings})
        if missing:
            texts = self.tokenizer.shown_tokens(missing) if self.tokenizer is not None else [f"[{i}]" for i in missing]
            self._strings.update(zip(missing, texts))
        return [self._strings[i] for i in ids]

    def chunks(self):
        """Per CHUNK features, a dict of tensors: the counts, and for "top" and "sample" the examples of each feature
        in the order shown (largest activation first) with a mask of those that exist, their windows, and for the
        sample the quantile band of each (0 the lowest quarter of its firings)."""
        stats = self.stats
        for start in range(0, self.sae.cfg.d_sae, self.CHUNK):
            part = slice(start, min(start + self.CHUNK, self.sae.cfg.d_sae))
            chunk = {"feature": torch.arange(part.start, part.stop)}
            for name, keep in (("top", stats.top), ("sample", stats.sample)):
                filled = keep.key[part] >= 0
                order = torch.argsort(torch.where(filled, keep.value[part], -1.0), dim=1, descending=True,
                                      stable=True)
                slot = keep.slot[part].gather(1, order)
                shown = filled.gather(1, order)
                ids, acts = stats.windows.at(slot)
                chunk[name] = {"filled": shown, "value": keep.value[part].gather(1, order),
                               "document": keep.document[part].gather(1, order),
                               "position": keep.position[part].gather(1, order), "ids": ids, "acts": acts}
            count = chunk["sample"]["filled"].sum(1, keepdim=True)
            rank = torch.arange(chunk["sample"]["filled"].shape[1])[None]
            chunk["sample"]["band"] = (3 - (rank * 4) // count.clamp(min=1)).to(torch.int8)
            yield part, chunk

    def write(self, out: Path, pages: bool) -> "datasets.Dataset":  # noqa: F821
        """The dataset (out/dataset) and, with `pages`, the pages: one pass over the features, a chunk at a time."""
        import shutil

        from datasets.arrow_writer import ArrowWriter

        from ..corpus.storage import finish
        from ..views import feature_pages

        directory = out / "dataset"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        if pages:
            shutil.rmtree(out / "features", ignore_errors=True)
            feature_pages.write_assets(out)
        schema = dataset_features()
        writer = ArrowWriter(features=schema, path=str(directory / "data-00000.arrow"))
        index = []
        for part, chunk in self.chunks():
            writer.write_table(self._table(part, chunk, schema))
            if pages:
                for i in range(len(chunk["feature"])):
                    page = feature_pages.feature_data(self, part.start + i, chunk, i)
                    feature_pages.write_feature(out, self, page)
                    index.append(feature_pages.index_row(self, page))
        writer.finalize()
        writer.close()
        if pages:
            feature_pages.write_index(out, self, index)
        return finish(directory, 1, schema)

    def _table(self, part: slice, chunk: dict, schema):
        """The dataset's rows of one chunk, as a pyarrow table built from the tensors' buffers."""
        import pyarrow as pa

        columns = {"feature": chunk["feature"].numpy(), "fired": self.stats.fired[part].numpy(),
                   "frequency": self.frequency[part].numpy(), "max": self.max[part].numpy(),
                   "mean": self.mean[part].numpy(),
                   "quantiles": _lists(self.quantiles[part], torch.ones_like(self.quantiles[part], dtype=torch.bool)),
                   "hist_start": self.hist_start[part].int().numpy()}
        width = torch.arange(BINS)[None]
        in_range = (width >= self.hist_start[part, None]) & (width < self.hist_end[part, None])
        columns["hist_counts"] = _lists(self.stats.hist[part], in_range)
        for name in ("top", "sample"):
            examples = chunk[name]
            for field in ("value", "document", "position"):
                columns[f"{name}_{field}"] = _lists(examples[field], examples["filled"])
            for field in ("ids", "acts"):
                columns[f"{name}_{field}"] = _lists(examples[field], examples["filled"])
        columns["sample_band"] = _lists(chunk["sample"]["band"], chunk["sample"]["filled"])
        effects = self.effects or tuple(torch.zeros(len(chunk["feature"]), 0) for _ in range(4))
        every = torch.ones(len(chunk["feature"]), effects[0].shape[1], dtype=torch.bool)
        for name, values in zip(("logit_top_ids", "logit_top_values", "logit_bottom_ids", "logit_bottom_values"),
                                effects):
            columns[name] = _lists(values[part] if self.effects else values, every)
        return pa.table({name: columns[name] for name in schema}).cast(schema.arrow_schema)


def _lists(values: torch.Tensor, keep: torch.Tensor):
    """A pyarrow list column: row r holds values[r][keep[r]] (each a vector where `values` has a third axis)."""
    import pyarrow as pa

    counts = keep.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).int().numpy()
    chosen = values[keep]
    flat = pa.array(chosen.flatten().numpy())
    if chosen.dim() > 1:  # each kept entry a vector of chosen.shape[1]: an inner list
        flat = pa.ListArray.from_arrays(pa.array(torch.arange(0, chosen.numel() + 1, chosen.shape[1]).int().numpy()),
                                        flat)
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


def dataset_features():
    """The dataset's columns: one row per feature."""
    import datasets

    floats, ints = datasets.List(datasets.Value("float32")), datasets.List(datasets.Value("int64"))
    examples = {f"{prefix}_{name}": kind for prefix in ("top", "sample") for name, kind in (
        ("value", floats), ("document", ints), ("position", ints),
        ("ids", datasets.List(datasets.List(datasets.Value("int32")))),
        ("acts", datasets.List(datasets.List(datasets.Value("float32")))))}
    return datasets.Features({
        "feature": datasets.Value("int64"), "fired": datasets.Value("int64"), "frequency": datasets.Value("float64"),
        "max": datasets.Value("float32"), "mean": datasets.Value("float64"),
        "quantiles": datasets.List(datasets.Value("float64")), "hist_start": datasets.Value("int32"),
        "hist_counts": ints, **examples, "sample_band": datasets.List(datasets.Value("int8")),
        "logit_top_ids": ints, "logit_top_values": floats, "logit_bottom_ids": ints, "logit_bottom_values": floats})


def _write_json(path: Path, value) -> None:
    from ..corpus.storage import write_json_atomic

    write_json_atomic(path, value)


def _versions() -> dict:
    from importlib import metadata

    def version(package):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    return {"scratch-models": version("scratch-models"), "torch": torch.__version__,
            "datasets": version("datasets"), "python": platform.python_version()}


__all__ = ["FeatureReport", "FeatureSummary", "features", "logit_effects", "run_features"]
