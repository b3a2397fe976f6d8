"""Named hook points: read any intermediate tensor by name, or replace it.

A hook point's name is its path in the module tree (`layers.3.attn.probs`; a pure container such as BertEncoder is
left out), so names are stable and need no second list. `HookedModel` runs a model with listeners on them:
`run_with_hooks` edits, `run_with_cache` records into an `ActivationCache`.

TransformerLens' conventions work beside ours (scratch_models/lens/names.py): its hook names wherever a name is
taken (`blocks.3.attn.hook_z`, giving TL's tensor in TL's layout), `fwd_hooks` / `bwd_hooks` whose functions take
`(tensor, hook)` with `hook.name` and `hook.layer()`, `names_filter`, `add_hook` / `reset_hooks` and
`reset_hooks_end`. A predicate given TL's way (in `fwd_hooks`, `names_filter`, `add_hook`) is asked about TL's
names, one given our way (`hooks`, `names`) about ours.
"""

import contextlib
import difflib
import inspect
from typing import Callable, Iterable, NamedTuple

import torch
from torch import nn

from ..lens.api import LensHook
from ..lens.forks import Fork, fork_run, lens_names
from ..lens.names import NormStatistic, Resolved, layer_of
from ..parts.hook_point import HookPoint
from .activation_cache import ActivationCache, glob

HookFn = Callable[[torch.Tensor, str], "torch.Tensor | None"]
Target = tuple[str, Callable]  # (our hook point, fn(tensor, point name) -> replacement or None)


class _Attached(NamedTuple):
    """A listener on our hook point `point`: `name` is what it was attached by (a name or a predicate), `direction`
    "fwd" or "bwd"; `run` the run or `with` block it ends with, None for one that stays until reset_hooks()."""

    point: str
    fn: Callable
    name: object
    direction: str
    permanent: bool = False
    run: object = None


# TransformerLens' switches (model.set_use_attn_result(True), ...) of the opt-in hook points they turn on for TL's
# filters: TL name ending -> switch. (The switched-on copies of the stream, scratch_models.lens.forks, name theirs.)
OPT_IN_SWITCHES = {"attn.hook_result": "use_attn_result"}


class HookedModel(nn.Module):
    """Adds `hook_names`, `run_with_cache`, `run_with_hooks` and `hooks` to a model built of HookPoints."""

    def hook_points(self) -> dict[str, HookPoint]:
        """Hook name -> HookPoint, in forward order. A name is the point's path in the module tree, less the
        path segment of any container that sets `hook_names_skip_me` (BertEncoder), so names stay short and read
        alike in both families: `layers.3.attn.probs`."""
        return {name: m for name, m in self.short_named_modules().items() if isinstance(m, HookPoint)}

    def short_named_modules(self) -> dict[str, nn.Module]:
        """Every module under its path, shortened as hook names are (see hook_points)."""
        modules = dict(self.named_modules())
        # read from the class: a missing attribute on the instance goes through nn.Module.__getattr__, which is slow
        skipped = [name for name, m in modules.items() if getattr(type(m), "hook_names_skip_me", False)]

        def short(name):
            for container in skipped:
                if name.startswith(f"{container}."):
                    parent = container.rpartition(".")[0]
                    name = (f"{parent}." if parent else "") + name[len(container) + 1:]
            return name

        return {short(name): m for name, m in modules.items()}

    def hook_names(self) -> list[str]:
        """Every hook point's name, in the order the forward pass reaches them."""
        return list(self.hook_points())

    def hook_docs(self) -> dict[str, str]:
        """Hook name -> what the tensor is, with its shape in front."""
        return {name: point.described for name, point in self.hook_points().items()}

    def hook_dims(self) -> dict[str, tuple[str, ...]]:
        """Hook name -> the tensor's axes, e.g. ("b", "n", "s", "p + s")."""
        return {name: point.dims for name, point in self.hook_points().items()}

    def lens_names(self) -> dict[str, Resolved]:
        """TransformerLens' hook name -> what it is in this model (scratch_models.lens.names), in forward order;
        then those of modules spliced into hook points (a dictionary's `blocks.8.hook_resid_pre.hook_sae_acts_post`)."""
        structure = (len(getattr(self, "layers", ())), self.__dict__.get("_splices", 0))
        known = self.__dict__.get("_lens_names")
        if known is None or known[0] != structure:  # computed once per structure: cache lookups ask it often
            known = (structure, _with_spliced(lens_names(self), self.hook_points()))
            self.__dict__["_lens_names"] = known
        return known[1]

    def lens_flag(self, flag: str) -> bool:
        """Whether TransformerLens' switch `flag` ("use_attn_result", "use_split_qkv_input", "use_attn_in",
        "use_hook_mlp_in") is on: model.set_use_attn_result(True) and its kin turn them on."""
        return self.__dict__.get("_lens_flags", {}).get(flag, False)

    @property
    def hook_dict(self) -> dict[str, LensHook]:
        """Hook name -> its hook (TransformerLens' HookedRootModule.hook_dict: `hook_dict[name].add_hook(fn)`),
        in forward order: TL's names for a model loaded with transformer_lens=True (those TL would call now: the
        switched-off ones left out), ours otherwise."""
        if getattr(self, "transformer_lens", False):
            points, names = self.hook_points(), self.lens_names()
            return {name: LensHook(self, name) for name, resolved in names.items()
                    if self.lens_offers(resolved, points)}
        return {name: LensHook(self, name) for name in self.hook_points()}

    @property
    def mod_dict(self) -> dict:
        """Module name (shortened as hook names are) -> module, and every name of `hook_dict` -> its hook
        (HookedRootModule.mod_dict)."""
        return {name: module for name, module in self.short_named_modules().items() if name} | self.hook_dict

    def splices_changed(self) -> None:
        """Say that a module was spliced into a hook point or taken out (HookPoint.splice), so the TL names are
        read again."""
        self.__dict__["_splices"] = self.__dict__.get("_splices", 0) + 1

    @contextlib.contextmanager
    def hooks(self, hooks: Iterable[tuple[str, HookFn]] = (), *, fwd_hooks=(), bwd_hooks=(),
              reset_hooks_end: bool = True):
        """Attach `(name, fn)` pairs for the duration of a `with` block.

        `fn(tensor, name)` returns a replacement tensor of the same shape, dtype and device (anything else is an
        error naming the hook point), or None to leave the tensor as it is. A name is ours or TransformerLens'
        (the tensor then comes in TL's layout, and goes back in ours); a predicate on our names attaches `fn`
        wherever it holds. TransformerLens' way too: `fwd_hooks` / `bwd_hooks` as in `run_with_hooks`
        (a backward hook fires on a backward pass run inside the block). Hooks attached before (`add_hook`) stay
        as they are; `reset_hooks_end=False` leaves this block's hooks attached after it, as `add_hook` would,
        until `reset_hooks()` (TransformerLens' semantics).
        """
        with self._attached(self._call_hooks(hooks, fwd_hooks, bwd_hooks),
                            kept=None if reset_hooks_end else lambda: self._call_hooks(hooks, fwd_hooks, bwd_hooks)):
            yield self

    def run_with_hooks(self, *args, hooks: Iterable[tuple[str, HookFn]] = (), fwd_hooks=(), bwd_hooks=(),
                       reset_hooks_end: bool = True, **kwargs):
        """Run forward with `hooks` attached (see `hooks`). TransformerLens' way too: `fwd_hooks` [(name or
        predicate on TL's names, fn(tensor, hook))], `bwd_hooks` the same on each tensor's gradient, called
        during a later backward pass. Hooks attached before (`add_hook`) run first and stay;
        `reset_hooks_end=False` leaves this call's hooks attached after it, until `reset_hooks()`."""
        args, kwargs = self.call_inputs(args, kwargs)
        attached = self._call_hooks(hooks, fwd_hooks, bwd_hooks, self.batch_size(args, kwargs))
        # hooks kept are made again without this call's batch size: they show each later call's (_batch)
        with self._attached(attached, kept=None if reset_hooks_end else lambda: self._call_hooks(hooks, fwd_hooks,
                                                                                                 bwd_hooks)):
            return self(*args, **kwargs)

    def run_with_cache(self, *args, names=None, names_filter=None, hooks: Iterable[tuple[str, HookFn]] = (),
                       fwd_hooks=(), bwd_hooks=(), incl_bwd: bool = False, metric: Callable | None = None,
                       remove_batch_dim: bool = False, reset_hooks_end: bool = True, **kwargs):
        """Run forward and return `(output, cache)`: an `ActivationCache` (scratch_models.analysis), a read-only
        mapping of hook name -> detached tensor in forward order, with helpers that stack, decompose and read out
        the residual stream. It remembers this model and the run's `attention_mask` and `input_ids`, and answers
        TransformerLens' names too (`cache["blocks.0.attn.hook_z"]`, `cache["pattern", 0]`).

        `names`: None for every hook point but the opt-in ones (`layers.{i}.attn.result`, computed only for a
        listener), a name (ours, TL's, or a pattern where `*` stands for any run of characters within one part of
        a name, as in `cache.stack`), a list of them, or a predicate on our names. `names_filter`: the same
        TransformerLens' way, a predicate asked about TL's names, which leaves out the opt-in ones as TL leaves
        out hook_result (name it to have it). `hooks` / `fwd_hooks` / `bwd_hooks` edit the run
        as in `run_with_hooks`; the cache holds the edited tensors. `remove_batch_dim`: the cache of a batch of
        one, without its batch axis (cache.remove_batch_dim()).

        `incl_bwd=True` with `metric`, a function of what the call returns (the output, or the logits with
        return_type="logits") that gives a scalar tensor (a logit, a loss, a logit difference), also caches the
        gradient of the metric with respect to each cached tensor, as `"{name}_grad"` (0 where the metric does
        not depend on it). The forward then runs with autograd on, even inside torch.no_grad(); gradients are
        taken with torch.autograd.grad, so no parameter's `.grad` is touched. A cached tensor that would not
        require grad (frozen weights) is made a leaf that does, which changes no value.
        """
        if incl_bwd != (metric is not None):
            raise ValueError("incl_bwd=True needs metric=fn(output) -> scalar tensor to differentiate, and metric is "
                             "used only with incl_bwd=True")
        if incl_bwd and torch.is_inference_mode_enabled():
            raise ValueError("incl_bwd=True cannot run inside torch.inference_mode(), which switches autograd off "
                             "for good; torch.no_grad() is fine")
        start = []  # TL's start_at_layer: the given residual put in at block k's input, nothing before it cached
        if "start_at_layer" in kwargs:
            args, kwargs, target = self.start_inputs(args, kwargs)
            start = [target]
        args, kwargs = self.call_inputs(args, kwargs)
        wanted = names_to_cache(self, names, names_filter)
        if start:
            order = {name: i for i, name in enumerate(self.hook_points())}
            wanted = [name for name in wanted if order.get(name, len(order)) >= order[start[0][0]]]
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

        # the user's hooks first (after start_at_layer's residual), so the cache holds the tensors they edited
        users = self._call_hooks(hooks, fwd_hooks, bwd_hooks, self.batch_size(args, kwargs))
        kept = None if reset_hooks_end else lambda: self._call_hooks(hooks, fwd_hooks, bwd_hooks)
        with torch.set_grad_enabled(incl_bwd or torch.is_grad_enabled()), self._attached(start + users, kept), \
                self._attached([(name, store) for name in wanted]):
            output = self(*args, **kwargs)
            if incl_bwd:
                cache |= _gradients(metric, output, live)
        activations = activation_cache(self, cache, args, kwargs, lens_keys=lens_chosen(self, names_filter))
        return output, activations.remove_batch_dim() if remove_batch_dim else activations

    def call_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments of a call as the forward pass takes them (PretrainedModel turns text into token ids)."""
        return args, kwargs

    def batch_size(self, args: tuple, kwargs: dict) -> int | None:
        """How many sequences a call's input_ids (or inputs_embeds) hold, choices of an example counted apart; None
        when neither is a tensor of a batch."""
        arguments = inspect.signature(self.forward).bind_partial(*args, **_forward_arguments(self, kwargs)).arguments
        for name, trailing in (("input_ids", 1), ("inputs_embeds", 2)):
            tokens = arguments.get(name)
            if isinstance(tokens, torch.Tensor) and tokens.dim() > trailing:
                return tokens.shape[:-trailing].numel()
        return None

    # ---- TransformerLens' hooks that stay attached ----------------------------------------------------------------

    def add_hook(self, name, hook, dir: str = "fwd", is_permanent: bool = False) -> None:
        """Attach `hook(tensor, hook)` TransformerLens' way until `reset_hooks()`, through any number of calls,
        run_with_hooks and run_with_cache included (their `reset_hooks_end` removes only the hooks they attached
        themselves, as in TL): `name` is a hook name, ours or TL's, or a predicate on TL's names; `dir` "fwd" or
        "bwd" (on the gradient). `is_permanent` hooks survive reset_hooks() unless it says
        including_permanent=True. Hooks run in the order they were attached, before a run's own."""
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        added = [_Attached(point, fn, name, dir, is_permanent)
                 for point, fn in self._targets([(name, hook)], lens=True, backward=dir == "bwd")]
        self._registry().extend(added)
        self._relisten(added)

    def reset_hooks(self, *, including_permanent: bool = False, direction: str = "both",
                    names: Iterable[str] | None = None) -> None:
        """Remove hooks (all, or those attached by one of `names`; in `direction` "fwd", "bwd" or "both"), keeping
        permanent ones unless `including_permanent`: those `add_hook` attached and a run's kept with
        `reset_hooks_end=False`, and, called inside a `hooks()` block or a hook, the block's or run's own too, as in
        TransformerLens. Keyword-only: TL's first positional argument is clear_contexts."""
        if direction not in ("fwd", "bwd", "both"):
            raise ValueError(f"direction must be 'fwd', 'bwd' or 'both', got {direction!r}")
        names = None if names is None else set(names)
        registry = self._registry()
        removed = [entry for entry in registry if (including_permanent or not entry.permanent)
                   and (names is None or entry.name in names) and direction in ("both", entry.direction)]
        gone = {id(entry) for entry in removed}
        registry[:] = [entry for entry in registry if id(entry) not in gone]
        self._relisten(removed)

    # ---- plumbing -------------------------------------------------------------------------------------------------

    def _registry(self) -> list[_Attached]:
        """Every listener attached now, in the order attached (the order they run in at a point)."""
        return self.__dict__.setdefault("_attached_hooks", [])

    def _call_hooks(self, hooks, fwd_hooks, bwd_hooks, batch: int | None = None) -> list[_Attached]:
        """A run's hooks, ours and TransformerLens' (see run_with_hooks), as listeners to attach."""
        attached = []
        for pairs, lens, direction in ((hooks, False, "fwd"), (fwd_hooks, True, "fwd"), (bwd_hooks, True, "bwd")):
            for name, fn in pairs:
                attached += [_Attached(point, listener, name, direction) for point, listener in
                             self._targets([(name, fn)], lens=lens, backward=direction == "bwd", batch=batch)]
        return attached

    @contextlib.contextmanager
    def _attached(self, targets: list, kept: Callable[[], list[_Attached]] | None = None):
        """`targets` (_Attached, or (point, fn) pairs) listen, after what is attached already, until the block
        ends; then what `kept()` gives stays attached until reset_hooks()."""
        run = object()
        attached = [(entry if isinstance(entry, _Attached) else _Attached(*entry, name=entry[0], direction="fwd"))
                    ._replace(run=run) for entry in targets]
        registry = self._registry()
        registry.extend(attached)
        self._relisten(attached)
        try:
            yield self
        finally:
            registry[:] = [entry for entry in registry if entry.run is not run]
            staying = kept() if kept is not None else []
            registry.extend(staying)
            self._relisten(attached + staying)

    def _relisten(self, changed: Iterable[_Attached]) -> None:
        """Set the listener of each point in `changed` from what is attached to it now, in the order attached."""
        names = dict.fromkeys(entry.point for entry in changed)
        if not names:
            return
        points, by_point = self.hook_points(), {}
        for entry in self._registry():
            if entry.point in names:
                by_point.setdefault(entry.point, []).append(entry.fn)
        for name in names:
            fns = by_point.get(name)
            points[name].listen(_chain(name, fns) if fns else None)

    def _targets(self, pairs, lens: bool, backward: bool = False, batch: int | None = None) -> list[Target]:
        """(name or predicate, fn) pairs -> (our hook point, fn(tensor, point name)) to attach. `lens`: TL's
        calling convention, fn(tensor, hook), and predicates asked about TL's names. `batch`: the run's, for TL's
        layouts that show one row per sequence where ours may hold one for all (unknown: shown as ours)."""
        points, names = self.hook_points(), self.lens_names()
        targets = []
        for name, fn in pairs:
            if callable(name):
                chosen = [n for n in (names if lens else points) if name(n)]
                if lens:  # as TL's filters: names TL would call now, each with a tensor here
                    chosen = [n for n in chosen if self.lens_offers(names[n], points)]
                if not chosen:
                    some = ", ".join(list(names if lens else points)[:4])
                    raise ValueError(f"the hook filter {getattr(name, '__name__', name)!r} holds for no hook point "
                                     f"(it is asked about {'TransformerLens' if lens else 'our'} names: {some}, ...)")
            else:
                chosen = [name]
            for n in chosen:
                targets += _target(self, n, fn, lens, backward, points, names, batch)
        return targets

    def lens_offers(self, resolved: Resolved, points: dict) -> bool:
        """Whether a TL filter sees `resolved` now, as TransformerLens calls its hooks: a name with a tensor here;
        a switched-on copy of the stream or an opt-in point (hook_result) only while its switch is on; a norm's
        hook_scale and hook_normalized always, as TL's norms have them (opt-in points here, computed when listened
        to; a cache computes them from the stream)."""
        if resolved.source is None:
            return False
        if isinstance(resolved.entry, Fork):
            return self.lens_flag(resolved.entry.flag)
        if not points[resolved.source].opt_in or isinstance(resolved.entry, NormStatistic):
            return True
        switch = next((flag for end, flag in OPT_IN_SWITCHES.items() if resolved.name.endswith(end)), None)
        return switch is not None and self.lens_flag(switch)


def _with_spliced(names: dict[str, Resolved], points: dict[str, HookPoint]) -> dict[str, Resolved]:
    """`names` and, for each TL name of a hook point with a module spliced in, the TL names that module answers
    under it (its `lens_names(resolved)`); TL's switched-on copies of a stream (forks) have none."""
    spliced = {}
    for resolved in names.values():
        module = points[resolved.source].spliced if resolved.source is not None else None
        if module is not None and not isinstance(resolved.entry, Fork):
            spliced |= module.lens_names(resolved)
    return names | spliced


def _target(model, name: str, fn, lens: bool, backward: bool, points, names, batch: int | None) -> list[Target]:
    """`fn` attached by `name` (ours or TL's) as a listener of our hook point: the tensor shown in the layout the
    name stands for, and fn's replacement taken back into ours."""
    if not isinstance(name, str):
        raise ValueError(f"a hook is attached by a name or a predicate on names, got {name!r}")
    resolved = None if name in points else _lens_entry(name, points, names)
    source = name if resolved is None else resolved.source
    hook = LensHook(model, name) if lens else name
    if resolved is not None and isinstance(resolved.entry, Fork):
        return _fork_targets(model, resolved, fn, hook, backward, names)
    if backward:
        return [(source, _backward(model, fn, hook, resolved, batch))]
    if resolved is None:
        return [(source, (lambda x, _: fn(x, hook)) if lens else fn)]

    def run(x, _):
        shown = resolved.show(x, model, _batch(model, batch))
        replaced = fn(shown, hook)
        layout = resolved.entry.layout
        if replaced is None:
            return None if layout.view else layout.take(shown, x)
        _check_replacement(name, fn, shown, replaced)
        return layout.take(replaced, x)

    return [(source, run)]


def _fork_targets(model, resolved: Resolved, fn, hook, backward: bool, names: dict) -> list[Target]:
    """`fn` on TransformerLens' copy of a stream (scratch_models.lens.forks): at the stream's hook point the copy
    is made and shown to `fn` (its gradient, for a backward hook); at each target's hook point, the target is
    recomputed from the copy when that is needed."""
    fork = resolved.entry
    if not model.lens_flag(fork.flag):
        raise ValueError(f"{resolved.name} fires only once TransformerLens' switch is on: call "
                         f"model.set_{fork.flag}(True) first")
    run = fork_run(model, resolved)

    def listen(x, _):
        copy = run.capture(x)
        if backward:
            if copy.requires_grad:
                run.grad_wanted = True
                copy.register_hook(_backward_fn(fn, hook, None))
            return None
        replaced = fn(copy, hook)
        if replaced is not None:
            _check_replacement(resolved.name, fn, copy, replaced)
        run.replaced(replaced)
        return None

    targets = [(resolved.source, listen)]
    for index, (target, _, _) in enumerate(fork.targets):
        aimed = names[target.format(i=resolved.layer)]
        targets.append((aimed.source, lambda y, _, index=index, layout=aimed.entry.layout: run.target(index, y,
                                                                                                       layout)))
    return targets


def _backward(model, fn, hook, resolved, batch: int | None):
    """A forward listener that hooks the gradient of its tensor: fn(gradient as the name shows it, hook). Where
    TL's layout has a row per sequence and ours one for the batch (hook_pos_embed), the tensor goes on widened to a
    row per sequence (the same values), so each row has a gradient of its own, as in TL."""
    on_gradient = _backward_fn(fn, hook, resolved)

    def listen(x, _):
        if not x.requires_grad:
            return None
        rows = _batch(model, batch)
        widened = x if resolved is None or rows is None else resolved.entry.layout.widened(x, rows)
        widened.register_hook(on_gradient)
        return None if widened is x else widened

    listen.widens = True  # its replacement has more rows (the same values): _chain lets it through
    return listen


def _batch(model, batch: int | None) -> int | None:
    """The run's batch size: given, or the one of the call going on (TransformerLensMixin.__call__ notes it)."""
    return batch if batch is not None else model.__dict__.get("_call_batch")


def _backward_fn(fn, hook, resolved):
    """A tensor hook calling fn(gradient as the name shows it, hook), its replacement taken back into ours."""
    def on_gradient(grad):
        shown = grad if resolved is None else resolved.entry.layout.show(grad, None)
        replaced = fn(shown, hook)
        if replaced is None:
            return None
        _check_replacement(getattr(hook, "name", hook), fn, shown, replaced)
        return replaced if resolved is None else resolved.entry.layout.take(replaced, grad)

    return on_gradient


def _lens_entry(name: str, points: dict, names: dict) -> Resolved:
    if name not in names:
        raise ValueError(_unknown_name_message(name, points, names))
    resolved = names[name]
    if resolved.source is None:
        raise ValueError(f"TransformerLens' {name} has no counterpart here: {resolved.entry.why(resolved.layer)}")
    return resolved


def names_to_cache(model: HookedModel, names, names_filter=None) -> list[str]:
    """Our hook names that `run_with_cache(names=..., names_filter=...)` caches: None for every point but the
    opt-in ones; a predicate (on our names for `names`, on TL's for `names_filter`); a name, ours, TL's or a
    pattern with `*`; or a list of them. An unknown name, or a pattern that matches none, is an error naming it."""
    points = model.hook_points()
    if names is not None and names_filter is not None:
        raise ValueError("give names (ours) or names_filter (TransformerLens' way), not both")
    tl_way = names_filter is not None
    names = names_filter if tl_way else names
    lens = model.lens_names()
    if names is None:  # every point but the opt-in ones, unless TL's switch turns one on (set_use_attn_result)
        switched = {lens[n].source for n in lens if lens[n].source and points[lens[n].source].opt_in
                    and not isinstance(lens[n].entry, NormStatistic) and model.lens_offers(lens[n], points)}
        return [name for name, point in points.items() if not point.opt_in or name in switched]
    if callable(names):
        if not tl_way:
            return [n for n in points if names(n)]
        return list(dict.fromkeys(lens[n].cached_from for n in lens if model.lens_offers(lens[n], points)
                                   and names(n)))
    wanted = []
    for name in [names] if isinstance(names, str) else list(names):
        if name in points:
            wanted.append(name)
        elif "*" in name:
            matched = [n for n in points if glob(name).fullmatch(n)]
            if not matched:
                raise ValueError(f"the pattern {name!r} matches no hook point; see model.hook_names()")
            wanted += matched
        else:
            wanted.append(_lens_entry(name, points, lens).source)
    return list(dict.fromkeys(wanted))


def lens_chosen(model: HookedModel, names_filter) -> list[str] | None:
    """The TransformerLens names `names_filter` picks (a TL-style cache is keyed by them; our names in it stand for
    every TL name of theirs), or None where no filter was given."""
    if names_filter is None:
        return None
    points, lens = model.hook_points(), model.lens_names()
    if callable(names_filter):
        return [n for n in lens if model.lens_offers(lens[n], points) and names_filter(n)]
    chosen = []
    for name in [names_filter] if isinstance(names_filter, str) else names_filter:
        if name in lens:
            chosen.append(name)
        else:
            ours = {n for n in points if n == name or "*" in name and glob(name).fullmatch(n)}
            chosen += [n for n in lens if lens[n].source in ours and model.lens_offers(lens[n], points)]
    return list(dict.fromkeys(chosen))


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


def activation_cache(model: nn.Module, cache: dict[str, torch.Tensor], args, kwargs,
                     lens_keys: list[str] | None = None):
    """`cache` as the ActivationCache of `model`'s run on `args`, `kwargs`: it remembers the run's input_ids and
    attention_mask, found by the forward's own argument names (and the TL names it was asked for, `lens_keys`)."""
    bound = inspect.signature(model.forward).bind_partial(*args, **_forward_arguments(model, kwargs)).arguments
    return ActivationCache(cache, model, input_ids=bound.get("input_ids"), attention_mask=bound.get("attention_mask"),
                           lens_keys=lens_keys)


def _forward_arguments(model, kwargs: dict) -> dict:
    """kwargs less those the call takes beside the forward's (return_type, ...)."""
    taken = inspect.signature(model.forward).parameters
    return {name: value for name, value in kwargs.items() if name in taken}


def _chain(name: str, fns: list[HookFn]):
    def run(x):
        for fn in fns:
            replaced = fn(x, name)
            if replaced is not None:
                if not getattr(fn, "widens", False):
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


def _unknown_name_message(name: str, points: dict, lens: dict | None = None) -> str:
    """An unknown name, with the closest of ours and, for a name in TransformerLens' style, of TL's."""
    tl_style = name.startswith(("blocks.", "hook_", "ln_final.", "embed.", "embed_ln.", "pos_embed.", "unembed.")) \
        or ".hook_" in name
    known = list(lens or {}) if tl_style else list(points)
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if tl_style and not lens:
        return f"unknown hook point {name!r}: this model's family declares no TransformerLens names; see " \
               "model.hook_names()"
    hint = f"; did you mean {', '.join(close)}?" if close else \
        f"; see {'model.lens_names()' if tl_style else 'model.hook_names()'}"
    return f"unknown hook point {name!r}{hint}"
