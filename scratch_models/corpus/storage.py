"""A harvest on disk: Arrow shards written by `datasets`, a manifest, and what makes a run resumable.

    out/
      harvest.json              the manifest: settings (model, weights hash, names, dtype, data, batching, ...),
                                then the counts and versions once complete
      data-00000.arrow          one shard per block of the corpus (see batching.blocks), written by datasets'
      data-00000.json           ArrowWriter, with its counts beside it
      ...
      state.json, dataset_info.json   written last: `datasets.load_from_disk(out)` memory-maps the shards
      .scratch-models.lock      while a harvest runs: who runs it (pid, host, start), locked (flock) by that process
                                (weight_mapping.DirectoryLock: any two commands writing one directory refuse)

A shard is written under a temporary name and renamed once complete (its counts first), so a shard file that
exists is whole: a run killed at any moment resumes from the shards there. Arrow has no bfloat16: bfloat16 rows
are stored as their 16-bit patterns (uint16), which `as_bfloat16` reads back as bfloat16.
"""

import contextlib
import dataclasses
import errno
import json
import os
import queue
import threading
import time
from pathlib import Path

import numpy as np
import torch

from weight_mapping.locks import LOCK_FILE

MANIFEST = "harvest.json"
FORMAT = "scratch-models harvest"
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_ARROW_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}
# and data-*.arrow, data-*.json (counts, kept parts), data-*.arrow.partial and .partial.kept
_OURS = (MANIFEST, "state.json", "dataset_info.json")


class HarvestError(ValueError):
    """A harvest that cannot start or resume: the message says why and what to do."""


class DiskFull(OSError):
    """The disk filled while a shard was written; the shards finished before it are intact."""


def features(layouts: dict, dtype: str, saelens_context: int | None):
    """The `datasets` Features of a shard: one column per hook point (its rows' shape), then token_id, document
    and position; or SAELens' layout (one hook point, Array2D(context, d) per sequence, token_ids)."""
    import datasets

    value = _ARROW_DTYPES[dtype]
    if saelens_context is not None:
        (name, layout), = layouts.items()
        return datasets.Features({name: datasets.Array2D(shape=(saelens_context, *layout.row_shape), dtype=value),
                                  "token_ids": datasets.List(datasets.Value("int32"), length=saelens_context)})
    columns = {name: _feature(layout.row_shape, value) for name, layout in layouts.items()}
    return datasets.Features(columns | {"token_id": datasets.Value("int32"), "document": datasets.Value("int64"),
                                        "position": datasets.Value("int32")})


def _feature(shape: tuple[int, ...], value: str):
    import datasets

    if not shape:
        return datasets.Value(value)
    if len(shape) == 1:
        return datasets.List(datasets.Value(value), length=shape[0])
    kinds = {2: datasets.Array2D, 3: datasets.Array3D, 4: datasets.Array4D, 5: datasets.Array5D}
    return kinds[len(shape)](shape=shape, dtype=value)


def row_bytes(layouts: dict, dtype: str) -> int:
    """Bytes one row takes on disk, its token id, document and position included."""
    size = STORAGE_DTYPES[dtype].itemsize
    return sum(size * int(np.prod(layout.row_shape)) for layout in layouts.values()) + 4 + 8 + 4


def to_numpy(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    """A tensor in the storage dtype as numpy (bfloat16 as its bit patterns, uint16)."""
    tensor = tensor.to(STORAGE_DTYPES[dtype])
    if dtype == "bfloat16":
        return tensor.view(torch.int16).cpu().numpy().view(np.uint16)
    return tensor.cpu().numpy()


def shard_name(block: int) -> str:
    return f"data-{block:05d}.arrow"


def kept_name(block: int) -> str:
    """What of a shard's `.partial` file is kept after a kill: its length then, and the counts of its batches."""
    return f"data-{block:05d}.kept.json"


def done_blocks(out: Path) -> dict[int, dict]:
    """Block index -> the counts of each complete shard in `out`. A shard whose length is not the one its counts
    record (a copy cut short, a file changed) is refused, naming both files. No checksum: the length finds a
    truncation for free, while a checksum would read every shard again at each resume (a 100 GB harvest: minutes)
    to find a changed byte, which the disk's and the file system's own checks already guard against."""
    done = {}
    for arrow in out.glob("data-*.arrow"):
        path = arrow.with_suffix(".json")
        if path.is_file():
            advice = f"delete it and {arrow.name}, and run the same command again: that shard is redone"
            counts = read_record(path, advice)
            size = arrow.stat().st_size
            if size != counts.get("bytes", size):
                raise HarvestError(f"{arrow}: {size} bytes, where {path.name} records {counts['bytes']}: the shard "
                                   f"was cut short or changed since it was written; {advice}")
            done[int(arrow.stem.removeprefix("data-"))] = counts
    return done


def read_record(path: Path, advice: str) -> dict:
    """A JSON object harvest wrote (a manifest, a shard's counts, a kept record); a HarvestError naming the file,
    what is wrong and `advice` when it is cut short or garbled."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise HarvestError(f"{path}: not valid JSON ({e}): the file was cut short or changed; {advice}") from None
    if not isinstance(value, dict):
        raise HarvestError(f"{path}: expected a JSON object, got {type(value).__name__}; {advice}")
    return value


def kept_parts(out: Path) -> dict[int, dict]:
    """Block index -> what is kept of an unfinished shard (see ShardWriter): {"batches": forward batches written,
    "bytes": the length of the .partial file that holds them, "counts": the shard's counts so far}."""
    kept = {}
    for path in out.glob("data-*.kept.json"):
        block = int(path.name.removeprefix("data-").removesuffix(".kept.json"))
        partial = out / f"{shard_name(block)}.partial"
        source = _aside(partial) if _aside(partial).is_file() else partial  # a resume killed while it copied
        record = read_record(path, f"delete it and {partial.name}, and run the same command again: that shard is "
                                   "redone from its start")
        if source.is_file() and source.stat().st_size >= record["bytes"]:
            kept[block] = record
    return kept


KEEP_SECONDS = 30.0  # how often the writer makes what it wrote of a shard survive a kill


class ShardWriter:
    """Writes shards in a thread of its own, so the forward passes go on while rows reach the disk.

    `begin(block, kept)`, `write(columns, progress)` (numpy arrays, rows first; the shard's counts after this batch,
    with "batches" written), `end(counts)`: one shard. Every KEEP_SECONDS the shard's `.partial` file is flushed
    to disk and its length and counts recorded (`data-NNNNN.kept.json`), so a kill costs at most that much work:
    `begin` with that record copies the batches it covers into a new `.partial` (the same bytes) and the caller
    goes on from the next batch. `stop()` records what is written before it closes (an interrupt). At most `depth`
    batches wait in the queue, so memory stays bounded whatever the writer's pace. An error in the thread (a full
    disk) is raised by the next call. `bytes_written`: the shards' bytes so far, the unfinished one's included."""

    def __init__(self, out: Path, features, depth: int = 2):
        self.out, self.features = out, features
        self.queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.bytes_written = 0
        self.write_seconds = 0.0
        self.wait_seconds = 0.0  # the caller's time blocked on a full queue
        self.thread = threading.Thread(target=self._work, name="harvest-writer", daemon=True)
        self.thread.start()

    def begin(self, block: int, kept: dict | None = None) -> None:
        self._put(("begin", (block, kept)))

    def write(self, columns: dict[str, np.ndarray], progress: dict) -> None:
        self._put(("rows", (columns, progress)))

    def end(self, counts: dict) -> None:
        self._put(("end", counts))

    def close(self) -> None:
        """Wait until every queued shard is on disk; raise the thread's error if there was one."""
        self._put(None)
        self.thread.join()
        self._raise()

    def stop(self) -> None:
        """Keep what is written of the unfinished shard, and close (after an interrupt or an error: no error of
        the thread's is raised)."""
        with contextlib.suppress(BaseException):
            self._put(("keep", None))
            self._put(None)
            self.thread.join()

    def _put(self, item) -> None:
        self._raise()
        start = time.perf_counter()
        while True:
            try:
                self.queue.put(item, timeout=0.1)
                break
            except queue.Full:
                self._raise()
                if not self.thread.is_alive():
                    raise RuntimeError("the harvest's writer thread stopped without saying why")
        self.wait_seconds += time.perf_counter() - start

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _work(self) -> None:
        from datasets.arrow_writer import ArrowWriter

        writer, partial, block, progress, committed, flushed = None, None, None, None, 0, None
        kept_at = time.monotonic()
        while True:
            item = self.queue.get()
            if item is None:
                if writer is not None:
                    writer.close()
                return
            kind, value = item
            start = time.perf_counter()
            try:
                if kind == "begin":
                    (block, kept), progress = value, None
                    partial = self.out / f"{shard_name(block)}.partial"
                    if kept is not None:
                        _set_aside(partial)
                    writer, flushed = ArrowWriter(features=self.features, path=str(partial)), None
                    if kept is not None:
                        _write_kept(writer, _aside(partial), kept["bytes"])
                        progress, flushed = kept, (kept, kept["bytes"])
                elif kind == "rows":
                    columns, progress = value
                    writer.write_batch(columns)
                    writer.stream.flush()
                    flushed = (progress, writer.stream.tell())  # whole batches, up to here
                    if time.monotonic() - kept_at >= KEEP_SECONDS:
                        self._keep(writer, block, progress)
                        kept_at = time.monotonic()
                elif kind == "keep":
                    if writer is not None and progress is not None:
                        self._keep(writer, block, progress)
                else:
                    writer.finalize()
                    writer.close()
                    writer = None
                    committed += self._commit(block, partial, value)
                    flushed = None
                if writer is not None:
                    writer.stream.flush()
                self.bytes_written = committed + (writer.stream.tell() if writer is not None else 0)
            except BaseException as e:  # kept for the caller; this thread takes nothing more
                if writer is not None:
                    with contextlib.suppress(OSError):  # closing flushes, and a full disk refuses that too
                        writer.close()
                if flushed is not None and partial.is_file():
                    # the whole batches that reached the file survive: the resume goes on after them (a full
                    # disk may refuse even this small record; the last one kept then stands)
                    with contextlib.suppress(OSError):
                        _fsync(partial)
                        write_json_atomic(self.out / kept_name(block), flushed[0] | {"bytes": flushed[1]})
                self.error = _disk_error(e, self.out, block)
                self._drain()
                return
            self.write_seconds += time.perf_counter() - start

    def _keep(self, writer, block: int, progress: dict) -> None:
        """The batches written so far survive a kill: the file on disk up to here, and a record of it."""
        writer.stream.flush()
        os.fsync(writer.stream.fileno())
        write_json_atomic(self.out / kept_name(block), progress | {"bytes": writer.stream.tell()})

    def _commit(self, block: int, partial: Path, counts: dict) -> int:
        """Counts first, then the shard under its own name: a shard file that exists is complete."""
        _fsync(partial)
        arrow = self.out / shard_name(block)
        counts = counts | {"bytes": partial.stat().st_size}
        write_json_atomic(arrow.with_suffix(".json"), counts)
        os.replace(partial, arrow)
        (self.out / kept_name(block)).unlink(missing_ok=True)
        _fsync_directory(self.out)
        return counts["bytes"]

    def _drain(self) -> None:
        """Take what the caller still queues, so it never blocks on a thread that has stopped."""
        while True:
            try:
                if self.queue.get(timeout=0.5) is None:
                    return
            except queue.Empty:
                return


def _aside(partial: Path) -> Path:
    return partial.with_name(partial.name + ".kept")


def _set_aside(partial: Path) -> None:
    """Set a killed run's .partial aside (as .partial.kept) before a new one is written from the part kept; a
    .partial.kept already there is the original, from a resume killed while it copied."""
    if not _aside(partial).exists():
        os.replace(partial, _aside(partial))


def _write_kept(writer, aside: Path, length: int) -> None:
    """The record batches of the first `length` bytes of `aside` (a stream `writer`'s kind wrote), written again:
    the same batches give the same bytes."""
    import pyarrow as pa

    with pa.memory_map(str(aside)) as source:
        for batch in pa.ipc.open_stream(pa.BufferReader(source.read_buffer(length))):
            writer.write_table(pa.Table.from_batches([batch]))
    writer.stream.flush()
    if writer.stream.tell() != length:
        raise HarvestError(f"{aside}: its first {length} bytes, written again, take {writer.stream.tell()}: "
                           "pass --overwrite (overwrite=True) to start again")
    aside.unlink()


def _disk_error(e: BaseException, out: Path, block: int | None) -> BaseException:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            done, kept = len(done_blocks(out)), kept_parts(out).get(block)
        except HarvestError:  # a record garbled as well: the next run names it
            done, kept = "other", None
        part = f", and {kept['batches']} batches of shard {block} ({human_bytes(kept['bytes'])})" if kept else ""
        return DiskFull(e.errno, f"the disk holding {out} is full (writing shard {block}): the {done} shards "
                                 f"finished are intact{part}; free some space and run the same command again to "
                                 "resume")
    return e


def write_json_atomic(path: Path, value) -> None:
    """Write JSON under a temporary name, flush it to disk, then rename: a reader sees the old file or the new."""
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    _fsync(partial)
    os.replace(partial, path)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_harvest(out: Path) -> None:
    """Delete a harvest's own files from `out` (--overwrite); anything else there is left alone."""
    for path in out.iterdir():
        if path.name in _OURS or path.name.startswith("data-") and path.suffix in (".arrow", ".json", ".partial",
                                                                                    ".kept"):
            path.unlink()


def check_out(out: Path, settings: dict, overwrite: bool) -> dict | None:
    """Make `out` ready: a new or empty directory, or one holding a harvest with these `settings` (to resume;
    its manifest is returned). Other settings, or files that are not a harvest's, are refused."""
    manifest_path = out / MANIFEST
    if out.exists() and not out.is_dir():
        raise HarvestError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for name in _OURS:  # a kill between a JSON file's write and its rename: the old file, or none, is the one
        (out / f"{name}.partial").unlink(missing_ok=True)
    manifest = read_record(manifest_path, "pass --overwrite (overwrite=True) to start again") \
        if manifest_path.is_file() else None
    if manifest is None:
        strangers = [p.name for p in out.iterdir() if p.name != LOCK_FILE]
        if strangers:
            raise HarvestError(f"{out}: not empty ({', '.join(sorted(strangers)[:5])}"
                               f"{', ...' if len(strangers) > 5 else ''}) and holds no {MANIFEST}: harvest into a new "
                               "or empty directory")
        return None
    if overwrite or manifest.get("status") == "running" and not _started(out):
        remove_harvest(out)  # a start that failed (a document too long, ...) left nothing worth keeping
        return None
    if manifest.get("format") != FORMAT:
        raise HarvestError(f"{manifest_path}: not a scratch-models harvest manifest")
    if manifest["settings"] != settings:
        raise HarvestError(other_settings(out, "a harvest", manifest["settings"], settings))
    if settings["data"]["source"] is None:
        raise HarvestError(f"{out} holds a harvest of data that cannot be told apart from other data (an "
                           "IterableDataset made in Python): pass --overwrite (overwrite=True) to start again")
    return manifest


def _started(out: Path) -> bool:
    """Whether a harvest in `out` has done any work to keep: a shard, or part of one."""
    return any(out.glob("data-*.arrow")) or bool(kept_parts(out))


def other_settings(out: Path, what: str, there: dict, now: dict) -> str:
    """The refusal of a resume with other settings (harvest's and features'): each key that differs, with its value
    there and now, and what to do."""
    changed = [f"{key}: {_short(there.get(key))} there, {_short(now.get(key))} now"
               for key in sorted(set(now) | set(there)) if there.get(key) != now.get(key)]
    return (f"{out} holds {what} made with other settings ({'; '.join(changed)}): run the same command to resume it, "
            "or pass --overwrite (overwrite=True) to start again")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_space(out: Path, needed: int, basis: str) -> None:
    """A HarvestError when the file system of `out` has less free space than `needed` bytes."""
    import shutil

    free = shutil.disk_usage(out).free
    if needed > free:
        raise HarvestError(f"{out}: {human_bytes(free)} free, and this harvest needs about {human_bytes(needed)} ({basis}): "
                           "free some space, harvest fewer hook points or a smaller dtype, or pass "
                           "--no-space-check (space_check=False) if the estimate is wrong")


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB'."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000


def finish(out: Path, blocks: int, features) -> "datasets.Dataset":  # noqa: F821
    """Write state.json and dataset_info.json for the shards of blocks 0..blocks-1 (as Dataset.save_to_disk writes
    them, so datasets.load_from_disk memory-maps them), and return the dataset."""
    import datasets

    for stale in [*out.glob("*.partial"), *out.glob("*.partial.kept"), *out.glob("data-*.kept.json")]:
        stale.unlink()  # a killed run's unfinished shard, never finished since
    files = [shard_name(block) for block in range(blocks)]
    missing = [name for name in files if not (out / name).is_file()]
    if missing:
        raise HarvestError(f"{out}: shards missing before the harvest can be closed: {', '.join(missing[:5])}")
    dataset = datasets.concatenate_datasets([_open_shard(out / name) for name in files]) \
        if files else datasets.Dataset.from_dict({name: [] for name in features}, features=features)
    state = {"_data_files": [{"filename": name} for name in files], "_fingerprint": dataset._fingerprint,
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": None}
    info = dataclasses.asdict(datasets.DatasetInfo(features=features))
    write_json_atomic(out / "dataset_info.json", {key: info[key] for key in sorted(info)})
    write_json_atomic(out / "state.json", state)
    return dataset


def _open_shard(path: Path) -> "datasets.Dataset":  # noqa: F821
    """A shard, memory-mapped; a HarvestError naming it when Arrow cannot read it."""
    import datasets
    import pyarrow as pa

    try:
        return datasets.Dataset.from_file(str(path))
    except (pa.ArrowException, OSError) as e:
        raise HarvestError(f"{path}: not a readable Arrow stream ({e}): the shard was changed since it was written; "
                           f"delete it and {path.with_suffix('.json').name}, and run the same command again: that "
                           "shard is redone") from None


def as_bfloat16(column) -> torch.Tensor:
    """A bfloat16 harvest's column as bfloat16: Arrow has no bfloat16, so the rows hold its 16-bit patterns as uint16,
    which datasets' torch and numpy formats hand back widened (int64). Takes that tensor or array, or the uint16
    array itself."""
    bits = torch.as_tensor(np.asarray(column)).to(torch.int32)
    if bool(((bits < 0) | (bits > 0xFFFF)).any()):
        raise ValueError("as_bfloat16 takes 16-bit patterns (0..65535): this column holds other numbers")
    return torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.bfloat16)
