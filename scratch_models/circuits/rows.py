"""Attribution rows on disk, a batch per file in the order `attribute` computes them: what lets it hold one batch of
rows at a time on a long prompt (the rows of max_feature_nodes targets over every active feature are circuit-tracer's
out-of-memory), and continue a killed run.

    DIRECTORY/
      rows.json                the manifest, written whole (then renamed) before any batch: the settings that decide
                               the rows and a digest of the forward pass's numbers
      batch-000000.nodes.npy   the node index of each row of batch 0 (int64 [k])
      batch-000000.npy         its rows (float32 [k, width]); a batch is there when this file is: each file is written
                               as FILE.partial and renamed once whole, and a start removes what a kill left half-written

A rerun with the same settings reads the batches there instead of computing them again (they are the same bits: the
same batches of the same forward pass); other settings are refused, naming each that differs, its value there and
now. The rows are the same whatever the grouping, so a resumed graph is the uninterrupted one, bitwise.
"""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch

MANIFEST = "rows.json"
FORMAT = "scratch-models attribution rows 1"


class RowsError(ValueError):
    """A directory of rows that this run cannot continue (other settings, files not its own)."""


def digest(*tensors: torch.Tensor) -> str:
    """A short hash of the tensors' bytes: the same numbers give the same string."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:20]


class RowStore:
    """Batches of attribution rows in `directory` (made if need be). `settings`: what decides the rows (JSON values);
    a manifest there with other settings is refused (a RowsError naming each that differs)."""

    def __init__(self, directory, settings: dict):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for partial in self.directory.glob("*.partial"):  # what a kill left half-written
            partial.unlink()
        manifest = self.directory / MANIFEST
        settings = json.loads(json.dumps(settings))  # as they read back (tuples are lists)
        if manifest.is_file() and not any(self.directory.glob("batch-*")):  # a start with nothing computed
            manifest.unlink()
        if manifest.is_file():
            try:
                there = json.loads(manifest.read_text())
            except ValueError as e:
                raise RowsError(f"{manifest}: not a JSON manifest ({e}): delete {self.directory} to start again") \
                    from None
            if there.get("format") != FORMAT:
                raise RowsError(f"{manifest}: not {FORMAT!r}: delete {self.directory} to start again")
            if there["settings"] != settings:
                raise RowsError(_other_settings(self.directory, there["settings"], settings))
        else:
            strangers = sorted(p.name for p in self.directory.iterdir())
            if strangers:
                raise RowsError(f"{self.directory}: holds {', '.join(strangers[:5])} and no {MANIFEST}: not the rows "
                                "of an attribution; give a new or empty directory")
            _write_whole(manifest, lambda path: path.write_text(json.dumps({"format": FORMAT, "settings": settings},
                                                                           indent=2) + "\n"))
        self.count = 0  # batches there: they are written in order, so the first missing one ends them
        while (self._path(self.count)).is_file():
            self.count += 1

    def _path(self, batch: int, what: str = "") -> Path:
        return self.directory / f"batch-{batch:06d}{what}.npy"

    def __len__(self) -> int:
        return self.count

    def append(self, nodes: torch.Tensor, rows: torch.Tensor) -> None:
        """Batch len(self): the rows [k, width] (float32) of the nodes [k]; the nodes first, the rows last."""
        batch = self.count
        _write_whole(self._path(batch, ".nodes"), lambda path: _save(path, nodes.cpu().numpy()))
        _write_whole(self._path(batch), lambda path: _save(path, rows.cpu().numpy()))
        self.count += 1

    def nodes(self, batch: int) -> torch.Tensor:
        return self._load(self._path(batch, ".nodes"))

    def rows(self, batch: int) -> torch.Tensor:
        return self._load(self._path(batch))

    def _load(self, path: Path) -> torch.Tensor:
        try:
            return torch.from_numpy(np.load(path))
        except (OSError, ValueError, EOFError) as e:  # a file cut short by a crash of the machine (no fsync here)
            raise RowsError(f"{path}: unreadable ({e}): delete {self.directory} to start again") from None

    def blocks(self, batches: int):
        """A callable giving (nodes, rows) for the first `batches` batches, one batch read at a time (wanted(nodes)
        False: the rows are not read), as graph.influence_over_rows reads them."""
        def read(wanted=None):
            for batch in range(batches):
                nodes = self.nodes(batch)
                if wanted is None or wanted(nodes):
                    yield nodes, self.rows(batch)
        return read


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)


def _write_whole(path: Path, write) -> None:
    """write(partial path), then the rename: a reader (or a rerun after a kill) sees the whole file or none."""
    partial = path.with_name(path.name + ".partial")
    write(partial)
    os.replace(partial, path)


def _other_settings(directory: Path, there: dict, now: dict) -> str:
    def short(value):
        text = json.dumps(value)
        return text if len(text) <= 80 else text[:77] + "..."

    changed = [f"{key}: {short(there.get(key))} there, {short(now.get(key))} now"
               for key in sorted(set(there) | set(now)) if there.get(key) != now.get(key)]
    return (f"{directory} holds the rows of an attribution with other settings ({'; '.join(changed)}): rerun with "
            f"the same ones to continue it, or delete {directory} to start again")
