"""Checks on forward arguments: a bad argument is a ValueError that names it and the limit it broke.

Without these, an id past the vocabulary is a bare IndexError on CPU and an asynchronous device assert on
CUDA, and a mask of the wrong shape may silently broadcast.
"""

import torch

_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_ids(name: str, ids, limit: int, limit_name: str, shapes: tuple[tuple[int, ...], ...] | None = None):
    """`ids` is an integer tensor of one of `shapes` (any 2-D shape if None) with 0 <= ids < limit."""
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype not in _INTEGER:
        raise ValueError(f"{name} must hold integers (torch.long), got dtype {ids.dtype}")
    if shapes is None:
        if ids.dim() != 2:
            raise ValueError(f"{name} must be 2-D [batch, seq], got shape {tuple(ids.shape)}")
        if ids.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(ids.shape)}): give at least one token")
    elif tuple(ids.shape) not in shapes:
        raise ValueError(f"{name} has shape {tuple(ids.shape)}, expected {' or '.join(map(str, shapes))}")
    bad = (ids < 0) | (ids >= limit)
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}{list(where)} = {int(ids[where])} is out of range: "
                         f"must be 0 <= id < {limit_name} = {limit}")


def check_same_shape(name: str, tensor, shape: tuple[int, ...]):
    """`tensor` is None or has exactly `shape`."""
    if tensor is None:
        return
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
