"""Our model -> a checkpoint: the mapping table run backwards, and a writer that never leaves half a checkpoint.

The layout is the one transformers 5 writes with `save_pretrained`: modern names, the base prefix only for a
model with a head, no buffers, and no tied tensors (a tied MLM decoder or lm_head is the embeddings; an untied one
is a tensor of the model's own, written as any other). `legacy=True` writes the original release's layout instead
(bert-base-uncased: `bert.` everywhere, gamma/beta, the decoder weight stored).
"""

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path

import torch

from .locks import DirectoryLock
from .readers import CheckpointError
from .table import MappingTable

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def checkpoint_state(table: MappingTable, state: dict[str, torch.Tensor], num_layers: int, *, prefixed: bool,
                     legacy: bool = False, num_experts: int = 0) -> dict[str, torch.Tensor]:
    """Checkpoint key -> tensor for our state dict `state`.

    `prefixed`: base-model keys get the table's base_prefix, as transformers names a model with a head; with
    `legacy`, the table's legacy_prefixed decides instead. `num_experts`: how many experts each of the table's
    "{e}" rows stands for (a mixture's: one key per expert's tensor, as the released files hold them). Tensors are
    passed through, except legacy copies, which are clones (safetensors refuses tensors that share storage). Raises
    CheckpointError naming any tensor of ours that no row of the table holds.
    """
    rows = {f"{row.ours}.{leaf}": (row, leaf) for row in table.expand(num_layers, num_experts)
            for leaf in row.tensors}
    unknown = [name for name in state if name not in rows]
    if unknown:
        raise CheckpointError(f"no row of the {table.family} mapping table holds our tensor(s) {', '.join(unknown)}")
    if legacy:
        prefixed = table.legacy_prefixed
    old_leaf = {new: old for old, new in table.legacy_leaf_names.items()}
    out = {}
    written = {}  # checkpoint name (current spelling, no prefix) -> the key it is written under
    for name, tensor in state.items():
        row, leaf = rows[name]
        key = f"{table.checkpoint_module(row, prefixed)}.{old_leaf[leaf] if legacy and row.legacy else leaf}"
        out[key] = tensor
        written[f"{row.checkpoint}.{leaf}"] = key
    heads = {row.checkpoint for row, _ in map(rows.get, state) if row.head}
    for alias in table.legacy_copies if legacy else ():
        # the head it belongs to is written, and ties it (an untied head wrote a tensor of its own above)
        if any(alias.startswith(f"{module}.") for module in heads) and alias not in written:
            out[alias] = out[written[table.aliases[alias]]].clone()  # a head key: outside the base prefix
    return out


def write_checkpoint(directory, config: dict, tensors: dict[str, torch.Tensor], *, json_files: dict | None = None,
                     copies=()) -> list[Path]:
    """Write `config` as config.json and `tensors` as model.safetensors into `directory` (created if need be; `~`
    is expanded), with each of `json_files` (name -> a dict: generation_config.json) and a copy of each file of
    `copies` (the tokenizer's and the other files beside the checkpoint the model came from), whole or not at all
    (see `staged`). Returns the files written. A failed write (a full or read-only disk) raises OSError naming
    `directory`."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    directory = Path(directory).expanduser()
    json_files = {CONFIG_FILE: config} | dict(json_files or {})
    names = [*json_files, WEIGHTS_FILE, *(Path(file).name for file in copies)]
    check_replaceable(directory, names)  # before the work, which `staged` checks after
    with staged(directory) as staging:
        try:
            # safetensors wants dense CPU tensors; metadata as transformers writes it (it checks "format")
            save_file({key: t.detach().to("cpu").contiguous() for key, t in tensors.items()},
                      str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
            for name, value in json_files.items():
                (staging / name).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            for file in copies:
                shutil.copyfile(file, staging / Path(file).name)
        except (OSError, SafetensorError) as e:  # safetensors reports a full disk as its own error type
            raise OSError(f"{directory}: cannot write the checkpoint ({e})") from None
    return [directory / CONFIG_FILE, directory / WEIGHTS_FILE, *(directory / name for name in names
                                                                 if name not in (CONFIG_FILE, WEIGHTS_FILE))]


@contextlib.contextmanager
def staged(target):
    """A new hidden directory inside `target` (created if need be; `~` is expanded) to write into. When the block
    completes, its files move into `target`, replacing those of the same names; other files are left alone. The
    block runs holding `target`'s DirectoryLock: a second writer there is refused at once (DirectoryBusy).

    Staging inside `target` keeps every move on one file system (`target` may be a mount point) and never writes
    to its parent (which may be read-only when `target` exists). If the block fails, the staging directory, and
    `target` itself if this call created it, are removed: `target` is as it was. If a move fails, the moves done
    are undone; a directory of a new file's name is never replaced (IsADirectoryError, nothing moved). The moves
    take the old config.json out first and put the new one in last, so a config.json in `target` always sits
    beside the files written with it: a save cut short between moves (power lost, process killed) leaves `target`
    without config.json, which loading refuses ("config.json not found", or "no weights file" while the weights
    are moved too), and the old files in a hidden `.*.replaced` directory inside `target`.
    """
    target = Path(target).expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target}: exists and is not a directory")
    with DirectoryLock(target, "save"):  # makes `target` and the parents it lacks, and removes them if left empty
        staging = target / f".{secrets.token_hex(4)}.partial"
        try:
            staging.mkdir()
            yield staging
            _move_in(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        staging.rmdir()


def check_replaceable(target: Path, names) -> None:
    """An IsADirectoryError when `target` holds a directory under one of `names`: replacing it with a file would
    delete everything in it."""
    for name in names:
        path = Path(target).expanduser() / name
        if path.is_dir() and not path.is_symlink():  # a link is replaced, and what it points to left alone
            raise IsADirectoryError(f"{path}: is a directory; writing the file {name} there would replace it and "
                                    "delete what it holds: move it away, or write elsewhere")


def _move_in(staging: Path, target: Path) -> None:
    """Move the files of `staging` into `target`: the old ones of the same names aside (config.json first), then
    the new ones in (config.json last). On an error, what was moved goes back, and the error is raised. A directory
    in `target` of a new file's name is an error before anything moves (see check_replaceable)."""
    new = sorted(staging.iterdir(), key=lambda file: file.name == CONFIG_FILE)
    check_replaceable(target, [file.name for file in new])
    old = [file.name for file in reversed(new) if os.path.lexists(target / file.name)]
    aside = staging.with_suffix(".replaced")
    if old:
        aside.mkdir()
    moved_aside, moved_in = [], []
    try:
        for name in old:
            os.replace(target / name, aside / name)
            moved_aside.append(name)
        for file in new:
            os.replace(file, target / file.name)
            moved_in.append(file.name)
    except BaseException:
        for name in moved_in:
            os.replace(target / name, staging / name)
        for name in reversed(moved_aside):
            os.replace(aside / name, target / name)
        if old:
            aside.rmdir()
        raise
    if old:
        shutil.rmtree(aside)
