"""A dictionary spliced into the model at the hook point it was trained on, as hook points of its own.

    model.attach(sae)                       # at sae.cfg.hook_name, read through the family's tables
    out, cache = model.run_with_cache(**batch)
    cache["layers.8.out.sae.acts"]          # [b, s, d_sae] the feature activations
    model.detach(sae)                       # the model exactly as before

Attached at `layers.8.out`, a dictionary adds, under `layers.8.out.sae`:

    input      [b, s, d_in]   what it reads (in its dtype; a hook_z dictionary's heads side by side)
    pre_acts   [b, s, d_sae]  its pre-activations
    acts       [b, s, d_sae]  its feature activations
    recons     [b, s, d_in]   its reconstruction, decode(acts), in the input's scale
    error      [b, s, d_in]   input - the reconstruction of the unedited input (with the error term)

and `layers.8.out` itself then holds what goes on into the model: with the error term (the default), recons +
error, which is the model's own tensor, bitwise, while no listener edits the dictionary's points (the tensor itself
goes on); with `error_term=False`, the reconstruction. Edit `acts` (ablate, steer, patch a feature) and the edit
reaches the output through recons, while the error stays that of the unedited input, so an ablated feature is gone
and nothing else moves. Gradients: the model's own, as if nothing were spliced (the error term carries the
gradient of everything the dictionary misses), up to rounding: below the dictionary autograd sums g + gJ - gJ (J
its Jacobian), which is g within a few float32 rounding errors of |g| + |gJ|, not bitwise; and the features' through
the decoder, so attribution reads d metric / d acts at `acts`. SAELens computes its error under no_grad instead, so
there a gradient of the stream below the dictionary flows through the encoder alone.

The hook the dictionary names is read through the model's family: one of our hook names, a TransformerLens name
of the family's table (`blocks.8.hook_resid_pre` is our `layers.7.out`; `blocks.8.attn.hook_z` our
`layers.8.attn.context` with heads and positions swapped, its heads side by side as SAELens' hook_z dictionaries
read them), or a transformers module of its mapping table whose output a compared row names (sparsify's `h.8`,
`layers.8.mlp`). TL names work for the dictionary's points too: `blocks.8.hook_resid_pre.hook_sae_acts_post`, and
`hook_sae_input`, `hook_sae_acts_pre`, `hook_sae_recons`, `hook_sae_error`, `hook_sae_output` (SAELens'
hook_sae_recons is before an input normalisation is undone, ours after).

SAELens' HookedSAETransformer calls work as they are: `add_sae(sae, use_error_term=None)`, `reset_saes`,
`with model.saes(saes=[...])`, `run_with_saes`, `run_with_cache_with_saes`, `run_with_hooks_with_saes`,
`acts_to_saes`; as in SAELens, their error term follows `sae.use_error_term` (False, the reconstruction) unless
`use_error_term` says otherwise. Several dictionaries at once, each at its own hook point; attaching one where
another is replaces it (as SAELens does).
"""

import contextlib
import logging
from typing import Iterable

import torch
from torch import nn

from ..lens.forks import Fork
from ..lens.names import HEADS, SAME, Alias, Layout, NormStatistic, Resolved
from ..parts.hook_point import HookPoint
from .sae import SAE, DictionaryError

logger = logging.getLogger("scratch_models")

# our point -> TransformerLens' name under the TL name of the point the dictionary is spliced into (SAELens')
LENS_SUFFIXES = {"input": "hook_sae_input", "pre_acts": "hook_sae_acts_pre", "acts": "hook_sae_acts_post",
                 "recons": "hook_sae_recons", "error": "hook_sae_error"}


class Site:
    """Where a dictionary reads, in this model: our hook point `name`, the `layout` its tensor is read in (TL's, when
    the dictionary named a TL hook: heads and positions swapped for hook_z), and the name as the dictionary gave
    it."""

    def __init__(self, name: str, layout: Layout, given: str):
        self.name, self.layout, self.given = name, layout, given

    def __repr__(self) -> str:
        return f"Site({self.name!r}, given as {self.given!r})"


def resolve_hook(model, hook_name: str, source: str = "the dictionary") -> Site:
    """The Site of `hook_name` (ours, TransformerLens', or a transformers module of the family's mapping table) on
    `model`; a DictionaryError names a hook the model lacks, with the closest of its names."""
    import difflib

    points = model.hook_points()
    if hook_name in points:
        return Site(hook_name, SAME, hook_name)
    lens = model.lens_names()
    if hook_name in lens:
        resolved = lens[hook_name]
        if resolved.source is None:
            raise DictionaryError(f"{source} reads TransformerLens' {hook_name}, which {type(model).__name__} has "
                                  f"no counterpart for: {resolved.entry.why(resolved.layer)}")
        if isinstance(resolved.entry, Fork):
            raise DictionaryError(f"{source} reads TransformerLens' {hook_name}, a copy of the stream (our "
                                  f"{resolved.source}) that TL's {resolved.entry.flag} switch makes to feed "
                                  f"{'the MLP' if resolved.entry.mlp_input else 'the attention'} alone; splicing into "
                                  "such a copy is not implemented (a dictionary at the stream itself would change "
                                  "every reader of it)")
        if not isinstance(resolved.entry, (Alias, NormStatistic)):
            raise DictionaryError(f"{source} reads TransformerLens' {hook_name}, which TL computes from other "
                                  f"tensors here ({type(resolved.entry).__name__}): a dictionary splices into a hook "
                                  "point of the model")
        # an opt-in point (a norm's hook_normalized, hook_result) is computed while a dictionary is spliced in
        return Site(resolved.source, resolved.entry.layout, hook_name)
    module = _module_output(model, hook_name)
    if module is not None:
        return Site(module, SAME, hook_name)
    close = difflib.get_close_matches(hook_name, [*points, *lens], n=4, cutoff=0.5)
    family = model.family
    raise DictionaryError(f"{source} reads {hook_name!r}, which the {family.title} family's {type(model).__name__} "
                          f"has not: it is none of our hook names, TransformerLens' names "
                          f"(scratch_models/{family.name}/transformer_lens.py) or transformers modules of its mapping "
                          f"table" + (f"; closest: {', '.join(close)}" if close else ""))


def _module_output(model, name: str) -> str | None:
    """Our hook point holding the output of transformers' module `name` (with or without the base prefix), where
    the family's mapping table compares one (its first output, or its only one)."""
    table = model.family.table
    name = table.normalize(f"{name}.x").removesuffix(".x")  # the prefix and other writers' names, as for keys
    layers = len(getattr(model, "layers", ()))
    name = next((parent.format(i=i) for child, parent in table.same_output.items() for i in range(layers)
                 if name == child.format(i=i)), name)
    for row in table.compared(layers, with_heads=True):
        if row.checkpoint == name and row.pick in (None, 0) and row.ours in model.hook_points():
            return row.ours
    return None


class Splice(nn.Module):
    """`sae` spliced into a hook point at `site` (see the module's doc). The dictionary is held, not registered as a
    submodule: the model's parameters and state_dict stay its own, and moving the model leaves the dictionary where
    it is."""

    def __init__(self, sae: SAE, site: Site, lead: tuple[str, ...], widths: tuple[int, ...], error_term: bool):
        super().__init__()
        self.__dict__["sae"] = sae
        self.site, self.error_term = site, error_term
        self.widths = widths  # the last axes of the site's tensor (as the dictionary reads it): one input vector
        lead = ", ".join(lead)
        self.input = HookPoint(f"{lead}, i", "what the dictionary reads (i = its d_in), in its dtype",
                               lens=LENS_SUFFIXES["input"])
        self.pre_acts = HookPoint(f"{lead}, f", "the dictionary's pre-activations (f = its d_sae features)",
                                  lens=LENS_SUFFIXES["pre_acts"])
        self.acts = HookPoint(f"{lead}, f", "the feature activations (0 where a feature does not fire)",
                              lens=LENS_SUFFIXES["acts"])
        self.recons = HookPoint(f"{lead}, i", "the reconstruction decode(acts), in the input's scale",
                                lens=LENS_SUFFIXES["recons"])
        self.error = HookPoint(f"{lead}, i", "input minus the reconstruction of the unedited input (with the error "
                               "term only): what goes on is recons + error", lens=LENS_SUFFIXES["error"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sae = self.sae
        if x.device != sae.device:
            raise DictionaryError(f"the dictionary at {self.site.name} is on {sae.device} and the model's tensor on "
                                  f"{x.device}: move it with sae.to({str(x.device)!r})")
        flat = self._read(x).to(sae.dtype)
        inp = _Tracked(flat.clone() if self.input.active else flat, self.input)  # an edit in place stays its own
        sae_in, norm = sae.sae_in(inp.tensor)
        pre = _Tracked(sae.hidden_pre(sae_in), self.pre_acts)
        acts = _Tracked(sae.activation(pre.tensor, sae_in), self.acts)
        recons = _Tracked(sae.decode(acts.tensor, norm), self.recons)
        if not self.error_term:
            return self._write(recons.tensor, x)
        graph = torch.is_grad_enabled() and flat.requires_grad  # the error's gradient must reach the input
        if all(t.untouched for t in (inp, pre, acts, recons)) and not graph:
            clean = recons.given
        else:  # the reconstruction of the unedited input, no hook point listening
            with torch.set_grad_enabled(graph):
                clean = sae(flat)
        error = _Tracked(flat - clean, self.error)
        total = recons.tensor + error.tensor
        if recons.holds(clean) and error.holds(error.given):
            # nothing edited: the model's own tensor goes on, bitwise; gradients take the splice's path
            return x if not total.requires_grad else _ValueOf.apply(x, self._write(total, x))
        return self._write(total, x)

    def _read(self, x: torch.Tensor) -> torch.Tensor:
        """The site's tensor as the dictionary reads it: in the layout it named, its last axes (`widths`) one."""
        shown = self.site.layout.show(x, None)
        return shown.flatten(-len(self.widths)) if len(self.widths) > 1 else shown

    def _write(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`y` [..., d_in] back in the layout and dtype of the site's tensor `x`."""
        if len(self.widths) > 1:
            y = y.unflatten(-1, self.widths)
        return self.site.layout.take(y, x).to(x.dtype)

    def lens_names(self, resolved: Resolved) -> dict[str, Resolved]:
        """TransformerLens' names of this splice's points under `resolved`, a TL name of the point it is in; its
        hook_sae_output is that point itself, which holds what goes on."""
        names = {f"{resolved.name}.hook_sae_output": Resolved(f"{resolved.name}.hook_sae_output", resolved.entry,
                                                              resolved.source, resolved.layer)}
        if resolved.entry.layout is not self.site.layout:
            return names
        for point, suffix in LENS_SUFFIXES.items():
            name, ours = f"{resolved.name}.{suffix}", f"{resolved.source}.sae.{point}"
            # SAELens' hook_sae_error of a hook_z dictionary has the heads apart again, as the output
            layout = _Unflattened(self.widths) if point == "error" and len(self.widths) > 1 else SAME
            names[name] = Resolved(name, Alias(ours, layout), ours, resolved.layer)
        return names

    def extra_repr(self) -> str:
        return f"{self.sae.architecture} d_sae={self.sae.cfg.d_sae} at {self.site.given}, error_term={self.error_term}"


class _Unflattened(Layout):
    """TL's view of a flat [.., i] tensor with its last axis split into `widths` (a hook_z dictionary's heads)."""

    note = "the last axis split per head"

    def __init__(self, widths: tuple[int, ...]):
        self.widths = widths

    def show(self, x, batch):
        return x.unflatten(-1, self.widths)

    def take(self, y, x):
        return y.flatten(-len(self.widths))


class _Tracked:
    """A tensor through a hook point: `given` what the point was handed, `tensor` what it gave back, `untouched`
    whether it gave back the same tensor unedited (not replaced, not changed in place)."""

    def __init__(self, tensor: torch.Tensor, point: HookPoint):
        version = tensor._version
        self.given, self.tensor = tensor, point(tensor)
        self.untouched = self.tensor is tensor and tensor._version == version

    def holds(self, values: torch.Tensor) -> bool:
        """Whether the tensor that goes on holds `values` exactly (a cache's stand-in for a gradient does); one
        edited in place is taken to differ."""
        if self.untouched and self.given is values:
            return True
        return not (self.tensor is self.given and not self.untouched) and torch.equal(self.tensor, values)


class _ValueOf(torch.autograd.Function):
    """The values of `x`, with the gradient going to `through` (which equals x in value): the splice's output while
    nothing is edited."""

    @staticmethod
    def forward(ctx, x, through):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None, grad


# ---- the model's side ----------------------------------------------------------------------------------------------


class DictionaryMixin:
    """Splicing dictionaries into a model built of hook points (mixed into PretrainedModel): ours, `attach` /
    `detach` / `attached`, and SAELens' HookedSAETransformer calls on top of them."""

    @property
    def dictionaries(self) -> dict[str, SAE]:
        """Our hook name -> the dictionary spliced in there, in forward order."""
        return {name: point.spliced.sae for name, point in self.hook_points().items()
                if isinstance(point.spliced, Splice)}

    def attach(self, sae: SAE, *, error_term: bool = True) -> str:
        """Splice `sae` in at the hook point it reads (sae.cfg.hook_name, through the family's tables) and return
        that point's name. `error_term`: add back what the dictionary misses, so the model's output is unchanged
        until a feature is edited (default); False: the reconstruction goes on instead. A dictionary already there
        is replaced. Refused, naming both sides, where the hook is not the model's or its width is not d_in."""
        if not isinstance(sae, SAE):
            raise TypeError(f"attach takes a scratch_models.dictionaries.SAE, got {type(sae).__name__}")
        site = resolve_hook(self, sae.cfg.hook_name, _described(sae))
        lead, widths = _check_width(self, sae, site)
        point = self.hook_points()[site.name]
        if isinstance(point.spliced, Splice):
            logger.warning("replacing the dictionary at %s (%s) with %s", site.name, _described(point.spliced.sae),
                           _described(sae))
        point.splice(Splice(sae, site, lead, widths, error_term))
        self.splices_changed()
        return site.name

    def detach(self, which: "SAE | str | None" = None) -> None:
        """Take out one dictionary (the SAE itself, our hook name or the hook name it gives) or, with None, all of
        them; the model is then exactly as it was."""
        points = self.hook_points()
        attached = {name: point.spliced for name, point in points.items() if isinstance(point.spliced, Splice)}
        if which is None:
            chosen = list(attached)
        else:
            chosen = [name for name, splice in attached.items()
                      if which is splice.sae or which in (name, splice.site.given)]
            if not chosen:
                asked = "as that SAE" if isinstance(which, SAE) else f"at {which!r}"
                raise ValueError(f"no dictionary attached {asked}; attached: {', '.join(attached) or 'none'}")
        for name in chosen:
            points[name].splice(None)
        self.splices_changed()

    @contextlib.contextmanager
    def attached(self, saes: "SAE | Iterable[SAE]", *, error_term: bool = True):
        """`attach` each of `saes` for the `with` block; afterwards whatever was spliced at their points before
        is back."""
        with self._spliced([saes] if isinstance(saes, SAE) else list(saes), lambda sae: error_term, True):
            yield self

    @contextlib.contextmanager
    def _spliced(self, saes: list[SAE], error_term, restore: bool):
        points = self.hook_points()
        before = {}
        try:
            for sae in saes:
                site = resolve_hook(self, sae.cfg.hook_name, _described(sae))
                before.setdefault(site.name, points[site.name].spliced)
                self.attach(sae, error_term=error_term(sae))
            yield
        finally:
            if restore:
                for name, splice in before.items():
                    points[name].splice(splice)
                self.splices_changed()

    # ---- SAELens' HookedSAETransformer ----------------------------------------------------------------------------

    @property
    def acts_to_saes(self) -> dict[str, SAE]:
        """SAELens' name: the dictionaries attached, by the hook name each one gives."""
        return {sae.cfg.hook_name: sae for sae in self.dictionaries.values()}

    def add_sae(self, sae: SAE, use_error_term: bool | None = None) -> None:
        """SAELens' add_sae: attach `sae`, adding the error term where `use_error_term` says so (None: as
        `sae.use_error_term` says, False unless set)."""
        self.attach(sae, error_term=sae.use_error_term if use_error_term is None else use_error_term)

    def reset_saes(self, act_names: str | list[str] | None = None) -> None:
        """SAELens' reset_saes: detach the dictionaries at `act_names` (their hook names), or all of them."""
        for name in [None] if act_names is None else [act_names] if isinstance(act_names, str) else act_names:
            self.detach(name)

    @contextlib.contextmanager
    def saes(self, saes: "SAE | list[SAE]" = (), reset_saes_end: bool = True, use_error_term: bool | None = None):
        """SAELens' context manager: `saes` attached as add_sae would, and with `reset_saes_end` taken out at the end,
        the dictionaries there before put back."""
        saes = [saes] if isinstance(saes, SAE) else list(saes)
        with self._spliced(saes, lambda sae: sae.use_error_term if use_error_term is None else use_error_term,
                           reset_saes_end):
            yield self

    def run_with_saes(self, *args, saes: "SAE | list[SAE]" = (), reset_saes_end: bool = True,
                      use_error_term: bool | None = None, **kwargs):
        """SAELens' run_with_saes: a call with `saes` attached."""
        with self.saes(saes, reset_saes_end, use_error_term):
            return self(*args, **kwargs)

    def run_with_cache_with_saes(self, *args, saes: "SAE | list[SAE]" = (), reset_saes_end: bool = True,
                                 use_error_term: bool | None = None, return_cache_object: bool = True, **kwargs):
        """SAELens' run_with_cache_with_saes: run_with_cache with `saes` attached; the cache answers the
        dictionaries' names (ours and TL's) after they are taken out."""
        with self.saes(saes, reset_saes_end, use_error_term):
            output, cache = self.run_with_cache(*args, **kwargs)
        return output, cache if return_cache_object else dict(cache)

    def run_with_hooks_with_saes(self, *args, saes: "SAE | list[SAE]" = (), reset_saes_end: bool = True,
                                 use_error_term: bool | None = None, **kwargs):
        """SAELens' run_with_hooks_with_saes: run_with_hooks (fwd_hooks, bwd_hooks, ...) with `saes` attached."""
        kwargs.pop("clear_contexts", None)  # TL's LensHook contexts live as long as the hook
        with self.saes(saes, reset_saes_end, use_error_term):
            return self.run_with_hooks(*args, **kwargs)


def _described(sae: SAE) -> str:
    return f"the dictionary {sae.cfg.source or ''}".rstrip() + f" ({sae.architecture}, d_in {sae.cfg.d_in})"


def _check_width(model, sae: SAE, site: Site) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(the axes before the input vector, the sizes of the last axes that make it) of the site's tensor as the
    dictionary reads it; refused unless those hold d_in numbers. The widths come from one forward pass on two tokens,
    once per hook point."""
    point = model.hook_points()[site.name]
    dims = list(point.dims)
    if site.layout is HEADS:  # TL's heads layout: [.., n, s, d] read as [.., s, n, d]
        dims[-3], dims[-2] = dims[-2], dims[-3]
    token = dims.index("s") if "s" in dims else 0
    if any("p" in axis or axis == "s" for axis in dims[token + 1:]) or (
            site.layout is not HEADS and "n" in dims[:token]):
        raise DictionaryError(f"{_described(sae)} reads {site.given}: our {site.name} [{', '.join(point.dims)}] has "
                              "no single vector per token to read" + (
                                  "; name TransformerLens' hook (its heads side by side per token)"
                                  if "n" in dims[:token] else ""))
    widths = model.__dict__.setdefault("_site_widths", {})
    if (site.name, site.layout) not in widths:
        shape = _probe(model, site)
        widths[site.name, site.layout] = shape[token + 1:]
    trailing_shape = widths[site.name, site.layout]
    width = int(torch.tensor(trailing_shape).prod()) if trailing_shape else 1
    if width != sae.cfg.d_in:
        raise DictionaryError(f"{_described(sae)} reads {site.given} with d_in {sae.cfg.d_in}; this "
                              f"{type(model).__name__}'s {site.name} holds {width} numbers per token "
                              f"({' x '.join(map(str, trailing_shape)) or 1}): a dictionary for another model size")
    return tuple(dims[:token + 1]), tuple(trailing_shape) or (1,)


def _probe(model, site: Site) -> tuple[int, ...]:
    """The shape of the site's tensor, as the dictionary reads it, on one sequence of two tokens."""
    shapes = []

    def record(x, _):
        shapes.append(tuple(site.layout.show(x, None).shape))

    ids = torch.zeros(1, 2, dtype=torch.long, device=next(model.parameters()).device)
    with torch.no_grad():
        model.run_with_hooks(ids, hooks=[(site.name, record)], return_type="output")
    return shapes[0]
