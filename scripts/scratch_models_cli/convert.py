"""`scratch-models convert`: read any checkpoint we load, write it in the layout transformers saves, check it."""

from pathlib import Path

import torch

from weight_mapping import CheckpointError, DirectoryLock, staged
from weight_mapping.locks import LOCK_FILE

from .common import check_writable_directory, open_model


def convert(source: str, destination, *, dtype: str | None = None, legacy: bool = False) -> str:
    """Load `source` with our model (with its head when the checkpoint has one), save it into `destination`
    (new or empty), load that again and require every tensor to be bitwise what was loaded from `source`.
    `dtype` casts while loading. The files beside the source's config.json travel with it (save_pretrained: the
    tokenizer's, chat template, generation_config.json, README, ...; config.json is written anew). Nothing is left in
    `destination` unless the round trip holds, and a `destination` this call created is removed again. The
    destination is locked (DirectoryLock) before the model is loaded. Returns a summary of what was read, renamed,
    dropped and written."""
    destination = Path(destination).expanduser()
    if destination.exists() and not destination.is_dir():
        raise ValueError(f"{destination}: exists and is not an empty directory; convert writes a new one")
    check_writable_directory("destination", destination)
    with DirectoryLock(destination, "convert"):
        if any(path.name != LOCK_FILE for path in destination.iterdir()):
            raise ValueError(f"{destination}: exists and is not an empty directory; convert writes a new one")
        opened = open_model(source)
        checkpoint = opened.checkpoint
        model_class = opened.widest_model()
        model = opened.load(model_class, dtype=dtype)
        with staged(destination) as staging:
            files = model.save_pretrained(staging, legacy=legacy)
            _check_round_trip(model, model_class.from_pretrained(staging), destination)
    state = model.state_dict()
    dtypes = ", ".join(sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}))
    copied = {file.name for file in model.source_files}
    lines = [f"convert {opened.source} -> {destination} as {model_class.__name__}"
             f"{' (legacy layout)' if legacy else ''}"]
    lines += [f"  {line}" for line in model.loading_info.summary().splitlines()]
    lines += [f"  wrote {destination / file.name}" for file in files if file.name not in copied]
    lines.append(f"  copied from {checkpoint.directory}: {', '.join(sorted(copied))}" if copied
                 else f"  no other files beside {checkpoint.directory}: none copied")
    lines.append(f"  round trip: all {len(state)} tensors ({dtypes}) read back bitwise equal")
    return "\n".join(lines)


def _check_round_trip(model, reloaded, destination: Path) -> None:
    ours, back = model.state_dict(), reloaded.state_dict()
    if ours.keys() != back.keys():
        raise CheckpointError(f"{destination}: read back, it holds other tensors than were converted (differing: "
                              f"{', '.join(sorted(back.keys() ^ ours.keys()))}); nothing was written")
    for name, tensor in ours.items():
        if back[name].dtype != tensor.dtype or not torch.equal(back[name], tensor):
            raise CheckpointError(f"{destination}: tensor {name!r} does not read back as it was converted "
                                  f"({tensor.dtype} -> {back[name].dtype}); nothing was written")
