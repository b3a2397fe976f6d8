"""Our model -> a checkpoint: the mapping table run backwards, and a writer that never leaves half a checkpoint.

The layout is the one transformers 5 writes with `save_pretrained`: modern names, the base prefix only for a
model with a head, no buffers, and no tied tensors (the MLM decoder and GPT-2's lm_head are the embeddings).
`legacy=True` writes the original release's layout instead (bert-base-uncased: `bert.` everywhere, gamma/beta,
the decoder weight stored).
"""

import contextlib
import json
import os
import secrets
import shutil
from pathlib import Path

import torch

from .readers import CheckpointError
from .table import MappingTable

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


def checkpoint_state(table: MappingTable, state: dict[str, torch.Tensor], num_layers: int, *, prefixed: bool,
                     legacy: bool = False) -> dict[str, torch.Tensor]:
    """Checkpoint key -> tensor for our state dict `state`.

    `prefixed`: base-model keys get the table's base_prefix, as transformers names a model with a head; with
    `legacy`, the table's legacy_prefixed decides instead. Tensors are passed through, except legacy copies,
    which are clones (safetensors refuses tensors that share storage). Raises CheckpointError naming any tensor
    of ours that no row of the table holds.
    """
    rows = {f"{row.ours}.{leaf}": (row, leaf) for row in table.expand(num_layers) for leaf in row.tensors}
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
        if any(alias.startswith(f"{module}.") for module in heads):  # the head it belongs to is written
            out[alias] = out[written[table.aliases[alias]]].clone()  # a head key: outside the base prefix
    return out


def write_checkpoint(directory, config: dict, tensors: dict[str, torch.Tensor]) -> list[Path]:
    """Write `config` as config.json and `tensors` as model.safetensors into `directory` (created if need be),
    whole or not at all (see `staged`). Returns the two files."""
    from safetensors.torch import save_file

    with staged(directory) as staging:
        # safetensors wants dense CPU tensors; metadata as transformers writes it (it checks "format")
        save_file({key: t.detach().to("cpu").contiguous() for key, t in tensors.items()},
                  str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [Path(directory) / CONFIG_FILE, Path(directory) / WEIGHTS_FILE]


@contextlib.contextmanager
def staged(target):
    """A new directory beside `target` to write into. When the block completes, it becomes `target`; if `target`
    already exists, its files replace theirs one by one (each move atomic, other files left alone). If the block
    fails, it is removed and `target` is untouched."""
    target = Path(target).resolve()
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target}: exists and is not a directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()
    try:
        yield staging
        if target.exists():
            for file in staging.iterdir():
                os.replace(file, target / file.name)
            staging.rmdir()
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
