"""Named hook points: read any intermediate tensor by name, or replace it.

A hook point's name is its path in the module tree (`layers.3.attn.probs`; a pure container such as BertEncoder is
left out), so names are stable and need no second list. `HookedModel` runs a model with listeners on them:
`run_with_hooks` edits, `run_with_cache` records into an `ActivationCache`.
"""

import contextlib
import difflib
import inspect
from typing import Callable, Iterable

import torch
from torch import nn

from .activation_cache import ActivationCache
from .hook_point import HookPoint

HookFn = Callable[[torch.Tensor, str], "torch.Tensor | None"]


class HookedModel(nn.Module):
    """Adds `hook_names`, `run_with_cache`, `run_with_hooks` and `hooks` to a model built of HookPoints."""

    def hook_points(self) -> dict[str, HookPoint]:
        """Hook name -> HookPoint, in forward order. A name is the point's path in the module tree, less the
        path segment of any container that sets `hook_names_skip_me` (BertEncoder), so names stay short and read
        alike in both families: `layers.3.attn.probs`."""
        modules = dict(self.named_modules())
        # read from the class: a missing attribute on the instance goes through nn.Module.__getattr__, which is slow
        skipped = [name for name, m in modules.items() if getattr(type(m), "hook_names_skip_me", False)]

        def short(name):
            for container in skipped:
                if name.startswith(f"{container}."):
                    parent = container.rpartition(".")[0]
                    name = (f"{parent}." if parent else "") + name[len(container) + 1:]
            return name

        return {short(name): m for name, m in modules.items() if isinstance(m, HookPoint)}

    def hook_names(self) -> list[str]:
        """Every hook point's name, in the order the forward pass reaches them."""
        return list(self.hook_points())

    def hook_docs(self) -> dict[str, str]:
        """Hook name -> what the tensor is, with its shape in front."""
        return {name: point.described for name, point in self.hook_points().items()}

    def hook_dims(self) -> dict[str, tuple[str, ...]]:
        """Hook name -> the tensor's axes, e.g. ("b", "n", "s", "p + s")."""
        return {name: point.dims for name, point in self.hook_points().items()}

    @contextlib.contextmanager
    def hooks(self, hooks: Iterable[tuple[str, HookFn]]):
        """Attach `(name, fn)` pairs for the duration of a `with` block.

        `fn(tensor, name)` returns a replacement tensor of the same shape, dtype and device (anything else is an
        error naming the hook point), or None to leave the tensor as it is.
        """
        points = self.hook_points()
        by_name: dict[str, list[HookFn]] = {}
        for name, fn in hooks:
            if name not in points:
                raise ValueError(_unknown_name_message(name, points))
            by_name.setdefault(name, []).append(fn)
        saved = {name: points[name].fn for name in by_name}
        try:
            for name, fns in by_name.items():
                points[name].listen(_chain(name, ([saved[name]] if saved[name] else []), fns))
            yield self
        finally:
            for name, fn in saved.items():
                points[name].listen(fn)

    def run_with_hooks(self, *args, hooks: Iterable[tuple[str, HookFn]] = (), **kwargs):
        with self.hooks(hooks):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names=None, hooks: Iterable[tuple[str, HookFn]] = (), incl_bwd: bool = False,
                       metric: Callable | None = None, **kwargs):
        """Run forward and return `(output, cache)`: an `ActivationCache` (scratch_models.analysis), a read-only
        mapping of hook name -> detached tensor in forward order, with helpers that stack, decompose and read out
        the residual stream. It remembers this model and the run's `attention_mask` and `input_ids`.

        `names`: None for every hook point but the opt-in ones (`layers.{i}.attn.result`, computed only for a
        listener), a name, a list of names, or a predicate on the name. `hooks` edit the run as in
        `run_with_hooks`; the cache holds the edited tensors.

        `incl_bwd=True` with `metric`, a function of the output that returns a scalar tensor (a logit, a loss, a
        logit difference), also caches the gradient of the metric with respect to each cached tensor, as
        `"{name}_grad"` (0 where the metric does not depend on it). The forward then runs with autograd on, even
        inside torch.no_grad(); gradients are taken with torch.autograd.grad, so no parameter's `.grad` is touched.
        A cached tensor that would not require grad (frozen weights) is made a leaf that does, which changes no
        value.
        """
        if incl_bwd != (metric is not None):
            raise ValueError("incl_bwd=True needs metric=fn(output) -> scalar tensor to differentiate, and metric is "
                             "used only with incl_bwd=True")
        if incl_bwd and torch.is_inference_mode_enabled():
            raise ValueError("incl_bwd=True cannot run inside torch.inference_mode(), which switches autograd off "
                             "for good; torch.no_grad() is fine")
        wanted = names_to_cache(self.hook_points(), names)
        cache: dict[str, torch.Tensor] = {}
        live: dict[str, torch.Tensor] = {}  # with incl_bwd: the tensors the forward pass went on with

        def store(tensor, name):
            replacement = None
            if incl_bwd:
                if not tensor.requires_grad:  # a leaf of its own, or no gradient could reach it
                    tensor = replacement = tensor.detach().requires_grad_()
                live[name] = tensor
            cache[name] = tensor.detach()
            return replacement

        with torch.set_grad_enabled(incl_bwd or torch.is_grad_enabled()):
            output = self.run_with_hooks(*args, hooks=[*hooks, *((n, store) for n in wanted)], **kwargs)
            if incl_bwd:
                cache |= _gradients(metric, output, live)
        return output, activation_cache(self, cache, args, kwargs)


def names_to_cache(points: dict[str, HookPoint], names) -> list[str]:
    """The hook names `run_with_cache(names=...)` caches: None for every point but the opt-in ones, a predicate on
    the name, a name, or a list of names (an unknown one is an error naming it)."""
    if names is None:
        return [name for name, point in points.items() if not point.opt_in]
    if callable(names):
        return [name for name in points if names(name)]
    names = [names] if isinstance(names, str) else list(names)
    for name in names:
        if name not in points:
            raise ValueError(_unknown_name_message(name, points))
    return names


def _gradients(metric: Callable, output, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`"{name}_grad"` -> d metric(output) / d tensor, for each tensor of `live`."""
    value = metric(output)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        described = f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"metric must return a scalar tensor (one element) to differentiate, got {described}")
    if not value.requires_grad:
        raise ValueError("metric's value does not depend on the model's tensors (it does not require grad): "
                         "compute it from the output without detaching or torch.no_grad()")
    names = list(live)
    grads = torch.autograd.grad(value.reshape(()), [live[n] for n in names], allow_unused=True)
    return {f"{name}_grad": torch.zeros_like(live[name]) if grad is None else grad
            for name, grad in zip(names, grads)}


def activation_cache(model: nn.Module, cache: dict[str, torch.Tensor], args, kwargs):
    """`cache` as the ActivationCache of `model`'s run on `args`, `kwargs`: it remembers the run's input_ids and
    attention_mask, found by the forward's own argument names."""
    bound = inspect.signature(model.forward).bind_partial(*args, **kwargs).arguments
    return ActivationCache(cache, model, input_ids=bound.get("input_ids"), attention_mask=bound.get("attention_mask"))


def _chain(name: str, before: list, fns: list[HookFn]):
    def run(x):
        for fn in before:
            x = fn(x)
        for fn in fns:
            replaced = fn(x, name)
            if replaced is not None:
                _check_replacement(name, fn, x, replaced)
                x = replaced
        return x

    return run


def _check_replacement(name: str, fn, given: torch.Tensor, replaced) -> None:
    """A hook's replacement must be a tensor like the one it was given: another shape would silently reach the
    output through broadcasting, another dtype or device would fail far from the hook, or compute in another
    precision."""
    def described(t):
        return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"

    if not isinstance(replaced, torch.Tensor):
        raise TypeError(f"hook {getattr(fn, '__name__', fn)!r} on {name!r} returned {type(replaced).__name__}; "
                        "a hook returns a tensor like the one it was given, or None to leave it as it is")
    if (replaced.shape, replaced.dtype, replaced.device) != (given.shape, given.dtype, given.device):
        raise ValueError(f"hook {getattr(fn, '__name__', fn)!r} on {name!r} returned a tensor of "
                         f"{described(replaced)}; {name} holds {described(given)}. A hook returns a tensor of the "
                         "same shape, dtype and device (or None to leave it as it is)")


def _unknown_name_message(name: str, points: dict) -> str:
    close = difflib.get_close_matches(name, list(points), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see model.hook_names()"
    return f"unknown hook point {name!r}{hint}"
