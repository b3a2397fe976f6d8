"""Checks on forward arguments: a bad argument is a ValueError that names it and the limit it broke.

Without these, an id past the vocabulary is a bare IndexError on CPU and an asynchronous device assert on
CUDA, a mask of the wrong shape may silently broadcast, and an additive mask (0 / -10000) is silently read as
its opposite. Each range check is one reduction and one host sync, taken before the embedding lookup. A traced,
exported or compiled graph keeps the checks on types and shapes but not those on values, which would need a
Python branch on the input (see tracing.py); compile_model's wrapper makes those first, eagerly
(PretrainedModel.check_input_values).
"""

import torch

from .tracing import is_tracing

_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_ids(name: str, ids, limit: int, limit_name: str, shapes: tuple[tuple[int, ...], ...] | None = None,
              ignore: int | None = None):
    """`ids` is an integer tensor of one of `shapes` (any non-empty 2-D shape if None) with 0 <= ids < limit,
    except entries equal to `ignore` (the -100 of labels that are not scored)."""
    _check_tensor(name, ids)
    if ids.dtype not in _INTEGER:
        raise ValueError(f"{name} must hold integers (torch.long), got dtype {ids.dtype}")
    if shapes is None:
        if ids.dim() != 2:
            raise ValueError(f"{name} must be 2-D [batch, seq], got shape {tuple(ids.shape)}")
        if ids.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(ids.shape)}): give at least one token")
    elif tuple(ids.shape) not in shapes:
        raise ValueError(f"{name} has shape {tuple(ids.shape)}, expected {' or '.join(map(str, shapes))}")
    check_range(name, ids, limit, limit_name, ignore)


def check_tokens(input_ids, inputs_embeds, embeddings: torch.Tensor, vocab: tuple[int, str]) -> tuple[int, int]:
    """Exactly one of input_ids [b, s] (ids within `vocab`, (size, its name)) and inputs_embeds [b, s, h] (see
    check_embeds; `embeddings` is the token embedding matrix [V, h]), as transformers takes them: (b, s)."""
    check_one_of(input_ids, inputs_embeds)
    if input_ids is not None:
        check_ids("input_ids", input_ids, *vocab)
        return tuple(input_ids.shape)
    return check_embeds(inputs_embeds, embeddings)


def check_one_of(input_ids, inputs_embeds) -> None:
    if (input_ids is None) == (inputs_embeds is None):
        given = "both were given" if input_ids is not None else "neither was given"
        raise ValueError(f"give exactly one of input_ids or inputs_embeds ({given}), as transformers takes them")


def check_embeds(inputs_embeds, embeddings: torch.Tensor, axes: tuple[str, ...] = ("batch", "seq")) -> tuple:
    """inputs_embeds [*axes, h]: what the token embedding matrix `embeddings` [V, h] gives for token ids, in its
    dtype, holding at least one token. Returns the shape of the tokens, [*axes]."""
    _check_tensor("inputs_embeds", inputs_embeds)
    width = embeddings.shape[1]
    wanted = f"[{', '.join(axes)}, {width}]"
    if not inputs_embeds.is_floating_point():
        raise ValueError(f"inputs_embeds must be floating point {wanted}, got dtype {inputs_embeds.dtype}")
    if inputs_embeds.dim() != len(axes) + 1 or inputs_embeds.shape[-1] != width:
        raise ValueError(f"inputs_embeds must be {wanted} (the width of the token embeddings), got shape "
                         f"{tuple(inputs_embeds.shape)}")
    if inputs_embeds.numel() == 0:
        raise ValueError(f"inputs_embeds is empty (shape {tuple(inputs_embeds.shape)}): give at least one token")
    if inputs_embeds.dtype != embeddings.dtype:
        raise ValueError(f"inputs_embeds is {inputs_embeds.dtype} and the model's embeddings are "
                         f"{embeddings.dtype}: cast it (inputs_embeds.to({embeddings.dtype}))")
    return tuple(inputs_embeds.shape[:-1])


def check_range(name: str, ids: torch.Tensor, limit: int, limit_name: str, ignore: int | None = None):
    """0 <= ids < limit, except entries equal to `ignore`; nothing while a graph is captured."""
    if is_tracing(ids):
        return
    bad = (ids < 0) | (ids >= limit)
    if ignore is not None:
        bad &= ids != ignore
    if bool(bad.any()):
        _raise_at(name, ids, bad, f"is out of range: must be 0 <= id < {limit_name} = {limit}"
                  + (f" (or {ignore}: not scored)" if ignore is not None else ""))


def check_mask(name: str, mask, shape: tuple[int, ...]):
    """`mask` is None, or a bool, integer or float tensor of exactly `shape` holding only 1 (attend) and 0 (pad)."""
    if mask is None:
        return
    _check_tensor(name, mask)
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {shape}")
    if not (mask.dtype == torch.bool or mask.dtype in _INTEGER or mask.is_floating_point()):
        raise ValueError(f"{name} must be bool, integer or floating point, got dtype {mask.dtype}")
    check_mask_values(name, mask)


def check_mask_values(name: str, mask: torch.Tensor):
    """Every entry of `mask` is 1 or 0; nothing while a graph is captured."""
    if mask.dtype != torch.bool and not is_tracing(mask):
        bad = (mask != 0) & (mask != 1)
        if bool(bad.any()):
            _raise_at(name, mask, bad, "is not 1 (attend) or 0 (padding); an additive mask (0 / -inf) "
                                       "is not accepted")


def check_values(arguments: dict, tables: dict[str, tuple[int, str]]):
    """The checks on values alone, for a forward call's `arguments` (name -> value): each integer tensor named in
    `tables` (name -> (size, the size's name)) indexes within its table, and the attention mask holds 1 and 0."""
    for name, (limit, limit_name) in tables.items():
        ids = arguments.get(name)
        if isinstance(ids, torch.Tensor) and ids.dtype in _INTEGER:
            check_range(name, ids, limit, limit_name)
    if isinstance(arguments.get("attention_mask"), torch.Tensor):
        check_mask_values("attention_mask", arguments["attention_mask"])


def _check_tensor(name: str, value):
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def _raise_at(name: str, tensor: torch.Tensor, bad: torch.Tensor, why: str):
    """A ValueError naming the first bad entry of `tensor`, its index and its value."""
    where = tuple(int(i) for i in bad.nonzero()[0])
    raise ValueError(f"{name}{list(where)} = {tensor[where].item()} {why}")
