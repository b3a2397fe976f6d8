"""`ActivationCache`: what `run_with_cache` returns. A read-only mapping of hook name -> tensor, in forward order (so
`cache[name]`, `dict(cache)` and iteration work as on a dict), that also knows its model and the run's inputs, and
stacks, decomposes and trims what it holds.

`model.run_with_cache(...)` caches every hook point but the opt-in `layers.{i}.attn.result` unless `names` says
otherwise; with `incl_bwd=True, metric=fn` it also caches `"{name}_grad"`, the gradient of `fn(output)` (a scalar)
with respect to each cached tensor. `cache.remove_batch_dim(row, trim_padding=True)` keeps one sequence without
its padding, left or right.

The helpers keep TransformerLens' names, arguments and meanings (`accumulated_resid`, `decompose_resid`,
`stack_head_results`, `get_neuron_results`, `stack_neuron_results`, `get_full_resid_decomposition`,
`apply_ln_to_stack`, `logit_lens`, `logit_attrs`, `remove_batch_dim`, labels such as `0_pre`, `3_attn_out`, `L2H5`,
`L1N7`), so code carries over; the tensors are ours (`layers.3.attn.probs` is [b, n, s, s], TL's `hook_pattern`).

GPT-2 is pre-LN: the residual stream is a running sum, so the embeddings and every attention and MLP output add up
to it exactly, up to any layer. BERT is post-LN: each sublayer's sum is renormalised at once, so no sum of
per-layer parts reaches past one LayerNorm. For BERT the helpers mean:

    accumulated_resid   embeddings.out, then each layer's output (`{l}_mid`: its attention block's output, after
                        LayerNorm); these are transformers' hidden_states. apply_ln has nothing to apply: refused.
    decompose_resid     the sum under one LayerNorm only: the stream a layer read plus what its sublayer wrote
                        (see `decompose_resid`); the embeddings' word + token type + position for layer 0.
    stack_head_results  each head's output in the residual basis; heads of several layers sum to no residual, so
                        incl_remainder and apply_ln are refused.
    logit_lens          the MLM head on each layer's output; logit_attrs is refused (the MLM head is not linear).

Every helper returns detached tensors computed without autograd.
"""

import difflib
import re
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..lens.forks import Fork
from ..lens.names import get_act_name
from ..parts.attention import head_results

# where a pos_slice is applied: None (all), an index (the axis goes), a slice (or a tuple, TL's way), a list /
# tensor of indices, or TL's Slice
PosSlice = int | slice | Sequence[int] | torch.Tensor | None


class ActivationCache(Mapping):
    """Hook name -> tensor, in forward order, from one run of `model` (gradients as `"{name}_grad"`).

    `input_ids` and `attention_mask` are the run's (None when not given); `has_batch_dim` is False after
    `remove_batch_dim`. The cache keeps a reference to the model, whose weights the helpers read: LayerNorms,
    output projections, the unembedding.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], model: nn.Module, *,
                 input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 has_batch_dim: bool = True, lens_keys: list[str] | None = None):
        self._tensors = dict(tensors)
        self.model = model
        self._asked = lens_keys  # the TransformerLens names a names_filter picked (None: every one held)
        self.input_ids = input_ids
        self.attention_mask = attention_mask
        self.has_batch_dim = has_batch_dim
        # recorded now, just after the run: dropout (training mode) breaks every sum the helpers rely on
        self.training = model.training
        # TransformerLens' names as they stood for this run: a module spliced in for it (a dictionary, see
        # scratch_models/dictionaries/splice.py) may be taken out before the cache is read
        self._lens_names = model.lens_names()
        # the points of the dictionaries spliced in for this run (they may be gone when the cache is read)
        self._spliced_points = {name for name in model.hook_points() if ".sae." in name}
        # TransformerLens' switches that offer copies of the stream (hook_q_input ...), as they stood for this run
        self._switches = {flag: model.lens_flag(flag) for flag in
                          {r.entry.flag for r in self._lens_names.values() if isinstance(r.entry, Fork)}}

    # ---- the mapping ----------------------------------------------------------------------------------------------

    def __getitem__(self, name) -> torch.Tensor:
        """The tensor cached under our hook name, or TransformerLens' tensor for a TL key: a full name
        (`blocks.0.attn.hook_z`, in TL's layout), a shorthand (`"embed"`, `"scale"`) or a tuple (`("pattern", 0,
        "attn")`, `("resid_post", -1)`), as TL's `utils.get_act_name` reads it; `_grad` after a name for its
        gradient."""
        if isinstance(name, str) and name in self._tensors:
            return self._tensors[name]
        lens_name = self._lens_name(name)
        resolved = self._lens_names.get(lens_name.removesuffix("_grad")) if lens_name else None
        if resolved is None:
            raise KeyError(self._missing(name if isinstance(name, str) else lens_name or repr(name))) from None
        if resolved.source is None:
            raise KeyError(f"TransformerLens' {resolved.name} has no counterpart here: "
                           f"{resolved.entry.why(resolved.layer)}")
        if isinstance(resolved.entry, Fork) and not self._switches[resolved.entry.flag]:
            # as in TL, whose cache holds such a copy only when the run made it
            flag = resolved.entry.flag
            raise KeyError(f"{lens_name} is not cached: TransformerLens' copy of the stream that "
                           f"model.set_{flag}(True) turns on, and {flag} was off for this run")
        batch = self._batch_size() if self.has_batch_dim else None
        if lens_name.endswith("_grad"):
            source = resolved.source + "_grad"
            if source not in self._tensors:
                raise KeyError(f"{lens_name} (our {source}) {self._why_missing(source)}")
            return resolved.show(self._tensors[source], self.model, batch)
        try:
            return resolved.read(self._tensors, self.model, batch)
        except KeyError as e:
            missing = e.args[0]
            raise KeyError(f"{lens_name} (our {missing}) {self._why_missing(missing)}")

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def _lens_name(self, key) -> str | None:
        """TL's full hook name for a key TL's way (a shorthand or a (name, layer, kind) tuple), negative layers
        counted from the end; None for a key that is neither."""
        if isinstance(key, str):
            return get_act_name(key)
        if not isinstance(key, tuple) or not 1 <= len(key) <= 3 or not isinstance(key[0], str):
            return None
        name, layer, *kind = (*key, None) if len(key) == 1 else key
        if isinstance(layer, int) and layer < 0:
            layer += self._stream().n_layers
        return get_act_name(name, layer, *kind)

    def __iter__(self):
        return iter(self._tensors if not self._lens_keys() else self._lens_keys())

    def __len__(self) -> int:
        return len(self._tensors if not self._lens_keys() else self._lens_keys())

    def hook_names(self) -> list[str]:
        """Our hook names of the cached tensors (gradients as `{name}_grad`), in forward order, whatever the keys."""
        return list(self._tensors)

    @property
    def cache_dict(self) -> dict[str, torch.Tensor]:
        """Key -> tensor, as a dict (TransformerLens' ActivationCache.cache_dict): a copy, in TL's names for a model
        loaded with transformer_lens=True."""
        return {name: self[name] for name in self}

    def _lens_keys(self) -> list[str] | None:
        """The keys in TransformerLens' names, for a model loaded with transformer_lens=True (None otherwise):
        each TL name whose tensor the cache holds, as TL would have called it (scratch_models.hooking.hooked_model),
        those a names_filter picked if one did, in forward order, then the gradients."""
        if not getattr(self.model, "transformer_lens", False):
            return None
        points, names = self.model.hook_points(), self.model.lens_names()
        held = [name for name, resolved in names.items() if resolved.cached_from in self._tensors
                and self._offered(resolved, points) and (self._asked is None or name in self._asked)]
        return held + [f"{name}_grad" for name in held if f"{names[name].source}_grad" in self._tensors]

    def _offered(self, resolved, points) -> bool:
        """Whether TL would have called `resolved` in this run: a copy of the stream as its switch stood then."""
        if isinstance(resolved.entry, Fork):
            return self._switches[resolved.entry.flag]
        return self.model.lens_offers(resolved, points)

    def __repr__(self) -> str:
        names = list(self._tensors)
        shown = ", ".join(names[:3]) + (f", ... {names[-1]}" if len(names) > 3 else "")
        return f"ActivationCache({len(names)} tensors from {type(self.model).__name__}: {shown})"

    def _missing(self, name: str) -> str:
        return f"{name!r} {self._why_missing(name)}"

    def _why_missing(self, name: str) -> str:
        """Why `name` has no tensor here, as the end of a sentence that names it."""
        points = self.model.hook_points()
        base = name.removesuffix("_grad")
        lens = self._lens_names
        if base in lens:
            base = lens[base].source
        if base in points:
            if base != name:
                return ("is not cached: gradients come from run_with_cache(..., incl_bwd=True, metric=fn), for the "
                        "names cached")
            why = " (an opt-in point: name it)" if points[base].opt_in else ""
            return f"is not cached: pass it in run_with_cache(names=[...]){why}"
        if base.endswith(".sae.error") and base in self._spliced_points:
            return ("is not cached: the dictionary spliced there ran without the error term (error_term=False, "
                    "SAELens' use_error_term=False), so it had no error")
        if base in self._spliced_points:
            return "is not cached: pass it in run_with_cache(names=[...]) while the dictionary is attached"
        close = difflib.get_close_matches(name, [*points, *lens], n=3, cutoff=0.5)
        return "is not a hook point" + (f"; did you mean {', '.join(close)}?" if close else "")

    # ---- stacking -------------------------------------------------------------------------------------------------

    def stack(self, pattern: str, return_labels: bool = False):
        """The cached tensors whose names match `pattern`, stacked on a new first axis in forward order. `*` stands
        for any run of characters within one part of a name: `layers.*.attn.probs` gives [layers, b, n, s, s]."""
        regex = glob(pattern)
        names = [name for name in self._tensors if regex.fullmatch(name)]
        if not names:
            raise KeyError(f"no cached tensor matches {pattern!r}; cached: {', '.join(list(self._tensors)[:8])} ...")
        stacked = _stack_named([(name, self._tensors[name]) for name in names])
        return (stacked, names) if return_labels else stacked

    def stack_activation(self, activation_name: str, layer: int | None = None,
                         sublayer_type: str | None = None) -> torch.Tensor:
        """`layers.{l}.{activation_name}` of every layer l < `layer` (None or -1: all), stacked on a new first axis,
        as TransformerLens' stack_activation: `stack_activation("attn.probs")`, or TL's way,
        `stack_activation("pattern")` (TL's tensors, named as `cache[name, l, sublayer_type]` names them)."""
        points = self.model.hook_points()
        names = [f"layers.{l}.{activation_name}" if f"layers.{l}.{activation_name}" in points
                 else (activation_name, l, sublayer_type) for l in range(self._layer(layer))]
        return _stack_named([(str(name), self[name]) for name in names])

    # ---- the residual stream --------------------------------------------------------------------------------------

    @torch.no_grad()
    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice: PosSlice = None, mlp_input: bool = False, return_labels: bool = False):
        """The residual stream as each layer reads it, [entries, (b), s, h]: `{l}_pre` for l = 0 .. layer - 1 (the
        embeddings, then each layer's output), then `{layer}_pre`, or `final_post` (the last layer's output) when
        `layer` is None, -1 or the number of layers. `incl_mid` adds `{l}_mid` (GPT-2: resid_mid, between attention
        and MLP; BERT: the attention block's output) for l < layer; `mlp_input` adds `{layer}_mid`.

        `apply_ln` (GPT-2): up to the last layer, ln_f applied to each entry with that entry's own statistics,
        exactly as the model applies it to its last residual (the logit lens: the last entry is the model's ln_f);
        up to an earlier layer, that layer's ln_1 (ln_2 with mlp_input) with its scale frozen at the residual it
        read, as in `apply_ln_to_stack`. For BERT these equal transformers' hidden_states and apply_ln is refused:
        the stream between BERT layers is already a LayerNorm's output.
        """
        stream = self._stream()
        layer = self._layer(layer)
        if mlp_input and layer == stream.n_layers:
            raise ValueError("mlp_input=True needs a layer below the number of layers (no MLP reads the final stream)")
        entries = []
        for l in range(layer + 1):
            if l == stream.n_layers:
                entries.append(("final_post", stream.resid_pre(l)))
                continue
            entries.append((f"{l}_pre", stream.resid_pre(l)))
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                entries.append((f"{l}_mid", stream.resid_mid(l)))
        stack = torch.stack([_pos(self[name], pos_slice, -2) for _, name in entries])
        if apply_ln:
            if stream.post_ln:
                raise ValueError("apply_ln: BERT is post-LN, so the stream between its layers is already the output "
                                 "of a LayerNorm; there is no LayerNorm left to apply (cache.logit_lens() runs the "
                                 "MLM head, LayerNorm included)")
            stack = (stream.final_norm(stack) if layer == stream.n_layers
                     else self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice))
        labels = [label for label, _ in entries]
        return (stack, labels) if return_labels else stack

    @torch.no_grad()
    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice: PosSlice = None, incl_embeds: bool = True,
                        return_labels: bool = False):
        """The residual stream that `layer` reads (None or -1: the final one; `mlp_input`: the one its MLP reads)
        as a stack of the parts that sum to it, [parts, (b), s, h].

        GPT-2: `embed`, `pos_embed`, then `{l}_attn_out` and `{l}_mlp_out` of every layer l < layer (and
        `{layer}_attn_out` with mlp_input). They sum to the residual within rounding.
        BERT: the sum under the LayerNorm that made that stream, each LayerNorm being the end of a decomposition:
        layer 0 reads the embeddings, whose parts are `embed`, `token_type_embed` and `pos_embed` (summing to
        `embeddings.sum`); layer l > 0 reads layer l - 1's output, made of `{l-1}_mid` (what its MLP read) and
        `{l-1}_mlp_out` (summing to `layers.{l-1}.mlp.resid`); with mlp_input, layer's MLP reads `{layer}_pre`
        plus `{layer}_attn_out` (summing to `layers.{layer}.attn.resid`).

        `mode`: "all", "attn" (leave out MLP outputs) or "mlp" (leave out attention outputs); `incl_embeds`: keep
        the embeddings. `apply_ln`: each part through `apply_ln_to_stack` (the LayerNorm that reads the sum, its
        scale frozen at the sum's), so the parts then sum to that LayerNorm's output less its bias.
        """
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        self._check_additive("decompose_resid")
        layer = self._layer(layer)
        parts, total, _ = self._stream().decomposition(layer, mlp_input)
        dropped = {"attn": "mlp", "mlp": "attn"}.get(mode)
        parts = [(label, name) for label, name, kind in parts
                 if kind != dropped and (incl_embeds or kind != "embed")]
        stack = self._stack_parts([name for _, name in parts], total, pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        labels = [label for label, _ in parts]
        return (stack, labels) if return_labels else stack

    @torch.no_grad()
    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice: PosSlice = None) -> torch.Tensor:
        """Parts of a residual stream (their last axis h) through the norm that reads that stream, its divisor
        frozen at the whole stream's: each part is treated as the norm treats the stream (centred by a LayerNorm,
        not by an RMSNorm), divided by the stream's divisor (sqrt(var + eps), or sqrt(mean(x²) + eps)) and
        multiplied by the norm's gain (its weight; Gemma's 1 + weight). A linear map, so parts that summed to the
        stream now sum to the norm's output less its bias, which no part writes. TransformerLens'
        apply_ln_to_stack, with the gain applied (TL folds it into the next matrix). The norm says how it
        normalises (scratch_models.parts.norms): nothing here assumes which.

        The norm is the one `decompose_resid(layer, mlp_input)` names: a pre-LN family's first norm of `layer`
        (its MLP's with mlp_input), or the final norm for the final stream (None or -1); BERT the LayerNorm that
        made the stream `layer` reads. `pos_slice`: the one the stack was taken with.
        """
        layer = self._layer(layer)
        _, total, norm = self._stream().decomposition(layer, mlp_input)
        return norm.frozen(residual_stack, _pos(norm.divisor(self[total]), pos_slice, -2))

    # ---- heads ----------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def compute_head_results(self) -> None:
        """Add `layers.{l}.attn.result` [b, s, n, h] (each head's output in the residual basis) for every layer
        that lacks it, from the cached `layers.{l}.attn.context` and the model's output projection."""
        for layer in range(self._stream().n_layers):
            self._head_result(layer)

    @torch.no_grad()
    def stack_head_results(self, layer: int | None = None, return_labels: bool = False,
                           incl_remainder: bool = False, pos_slice: PosSlice = None, apply_ln: bool = False):
        """Each head's part of the residual stream for every layer l < `layer` (None or -1: all), [l * n, (b), s,
        h], labelled `L{l}H{h}`: its output in the residual basis (`attn.result`, computed from `attn.context` where
        it was not cached), and in a family that normalises the attention's output on its way into the stream
        (Gemma 2's post-attention norm) that result through the norm with its divisor frozen at the whole output's,
        the map `apply_ln_to_stack` uses. Per layer they sum, plus the output projection's bias (through that
        norm), to what the attention adds to the stream (the stream's `attn_out`: `attn.proj`, or Gemma 2's
        `attn_out`).

        GPT-2: `incl_remainder` adds `remainder`, the residual stream `layer` reads less the heads' sum (the
        embeddings, the MLPs and the biases), so the stack sums to that stream; `apply_ln` as in
        `apply_ln_to_stack`. BERT refuses both: heads of several layers sum to no residual stream.
        """
        stream = self._stream()
        layer = self._layer(layer)
        if stream.post_ln and (incl_remainder or apply_ln):
            raise ValueError("incl_remainder and apply_ln decompose a residual stream, and BERT's heads of several "
                             "layers sum to none (post-LN: each layer's sum is renormalised); for one layer, "
                             "decompose_resid(layer, mlp_input=True) gives the stream plus its attention output")
        if incl_remainder:
            self._check_additive("stack_head_results(incl_remainder=True)")
        heads = stream.num_heads
        results = [_pos(self._head_part(l), pos_slice, -3) for l in range(layer)]
        labels = [f"L{l}H{h}" for l in range(layer) for h in range(heads)]
        if results:
            stack = torch.cat(results, dim=-2).movedim(-2, 0)
        else:
            stack = self._stack_parts([], stream.resid_pre(layer), pos_slice)
        if incl_remainder:
            remainder = _pos(self[stream.resid_pre(layer)], pos_slice, -2) - stack.sum(0)
            stack = torch.cat([stack, remainder[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _head_part(self, layer: int) -> torch.Tensor:
        """[b, s, n, h]: each head's part of the stream (see stack_head_results)."""
        return self._through_out_norm(self._head_result(layer), self._stream().attn_out_norm(layer), None, True)

    def _head_result(self, layer: int) -> torch.Tensor:
        name = f"layers.{layer}.attn.result"
        if name not in self._tensors:
            context = self[f"layers.{layer}.attn.context"]  # [b, n, s, d]
            self._tensors[name] = head_results(context.transpose(-3, -2), self._stream().out_weight(layer))
            self._tensors = {n: self._tensors[n] for n in sorted(self._tensors, key=self._order())}
        return self._tensors[name]

    # ---- neurons and the whole stream -----------------------------------------------------------------------------

    @torch.no_grad()
    def get_neuron_results(self, layer: int, neuron_slice: PosSlice = None, pos_slice: PosSlice = None,
                           project_output_onto: torch.Tensor | None = None) -> torch.Tensor:
        """Each neuron's part of what `layer`'s MLP adds to the stream, [(b), s, m, h]: its activation (TL's
        `mlp.hook_post`, what the output projection reads) times its row of W_out, and in a family that normalises
        the MLP's output on its way into the stream (Gemma 2) that through the norm with its divisor frozen at the
        whole output's. They sum, plus b_out (through that norm), to the MLP's `mlp_out`. `neuron_slice` and
        `pos_slice` as TransformerLens' Slice (an int drops the axis, a tuple is a slice's arguments, a list or
        tensor picks); `project_output_onto`: [h] or [h, k], the last axis projected on it (dropped for [h])."""
        acts = _pos(_pos(self[f"blocks.{layer}.mlp.hook_post"], pos_slice, -2), neuron_slice, -1)
        w_out = _pos(self.model.lens_attribute(f"blocks.{layer}.mlp.W_out"), neuron_slice, 0)
        results = self._through_out_norm(acts[..., None] * w_out, self._stream().mlp_out_norm(layer), pos_slice,
                                         per_part=not isinstance(neuron_slice, int))
        return _projected(results, project_output_onto)

    @torch.no_grad()
    def stack_neuron_results(self, layer: int | None = None, pos_slice: PosSlice = None,
                             neuron_slice: PosSlice = None, return_labels: bool = False,
                             incl_remainder: bool = False, apply_ln: bool = False,
                             project_output_onto: torch.Tensor | None = None, mlp_input: bool = False):
        """Every neuron's part of the stream (get_neuron_results) for each layer l < `layer` (None or -1: all),
        [l * m, (b), s, h], labelled `L{l}N{n}`; an int `neuron_slice` keeps that neuron's axis. `incl_remainder`
        adds `remainder`, the stream `decompose_resid(layer, mlp_input)` decomposes (the one layer's attention
        reads, or with mlp_input its MLP) less the neurons' sum, so the stack sums to it; `apply_ln` as in
        `apply_ln_to_stack` with that layer's norm; then `project_output_onto` as in get_neuron_results.
        TransformerLens' stack_neuron_results. BERT refuses incl_remainder and apply_ln, as stack_head_results."""
        stream = self._stream()
        layer = self._layer(layer)
        if stream.post_ln and (incl_remainder or apply_ln):
            raise ValueError("incl_remainder and apply_ln decompose a residual stream, and BERT's neurons of several "
                             "layers sum to none (post-LN: each layer's sum is renormalised)")
        if incl_remainder:
            self._check_additive("stack_neuron_results(incl_remainder=True)")
        if isinstance(neuron_slice, int):
            neuron_slice = [neuron_slice]  # the layers' neurons are stacked on that axis: it stays
        total = stream.decomposition(layer, mlp_input)[1]
        picked = _pos(torch.arange(self.model.lens_attribute("blocks.0.mlp.W_out").shape[0]), neuron_slice, 0)
        labels = [f"L{l}N{n}" for l in range(layer) for n in picked.tolist()]
        if layer:
            stack = torch.cat([self.get_neuron_results(l, neuron_slice, pos_slice) for l in range(layer)], dim=-2)
            stack = stack.movedim(-2, 0)
        else:
            stack = self._stack_parts([], total, pos_slice)
        if incl_remainder:
            stack = torch.cat([stack, (_pos(self[total], pos_slice, -2) - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        stack = _projected(stack, project_output_onto)
        return (stack, labels) if return_labels else stack

    @torch.no_grad()
    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                     expand_neurons: bool = True, apply_ln: bool = False, pos_slice: PosSlice = None,
                                     return_labels: bool = False, project_output_onto: torch.Tensor | None = None):
        """The stream `layer` reads (None or -1: the final one; `mlp_input`: the one its MLP reads) as the sum of
        every head's part (stack_head_results, `L{l}H{h}`), every neuron's (stack_neuron_results, `L{l}N{n}`; with
        `expand_neurons=False` each MLP's output, `{l}_mlp_out`), the embeddings (`embed`, and `pos_embed` where
        positions are learned) and `bias`, the output projections' biases of those layers (the MLPs' only with
        expand_neurons: an MLP's output holds its own), through the norms a family puts on the sublayers' outputs.
        [parts, (b), s, h]; `apply_ln` and `project_output_onto` as in stack_neuron_results. TransformerLens'
        get_full_resid_decomposition, as its Direct Logit Attribution demo uses it; the parts sum to the stream
        within rounding. BERT refuses: post-LN, no stream is a sum of parts of several layers. GPT-NeoX's parallel
        MLP reads the stream its attention reads, so with mlp_input its own layer's heads are not in the sum (TL
        puts them there)."""
        stream = self._stream()
        layer = self._layer(layer)
        if stream.post_ln:
            raise ValueError("get_full_resid_decomposition: BERT is post-LN, so no residual stream is a sum of parts "
                             "of several layers; decompose_resid gives the sum under one LayerNorm")
        self._check_additive("get_full_resid_decomposition")
        parts, total, _ = stream.decomposition(layer, mlp_input)
        attn = range(sum(kind == "attn" for _, _, kind in parts))  # the layers whose attention the stream holds
        mlps = [(label, name) for label, name, kind in parts if kind == "mlp"]
        stack, labels = self.stack_head_results(len(attn), pos_slice=pos_slice, return_labels=True)
        stacks = [stack]
        if mlps and expand_neurons:
            stack, neuron_labels = self.stack_neuron_results(len(mlps), pos_slice=pos_slice, return_labels=True)
            stacks.append(stack)
            labels += neuron_labels
        elif mlps:
            stacks.append(self._stack_parts([name for _, name in mlps], total, pos_slice))
            labels += [label for label, _ in mlps]
        reference = _pos(self[total], pos_slice, -2)
        embeds = [(label, name) for label, name, kind in parts if kind == "embed"]
        stacks.append(torch.stack([_pos(self[name], pos_slice, -2).expand_as(reference) for _, name in embeds]))
        labels += [label for label, _ in embeds]
        bias = torch.zeros_like(reference)
        for l in attn:
            bias += self._through_out_norm(self.model.lens_attribute(f"blocks.{l}.attn.b_O").expand_as(reference),
                                           stream.attn_out_norm(l), pos_slice, False)
        for l in range(len(mlps) if expand_neurons else 0):
            bias += self._through_out_norm(self.model.lens_attribute(f"blocks.{l}.mlp.b_out").expand_as(reference),
                                           stream.mlp_out_norm(l), pos_slice, False)
        stacks.append(bias[None])
        labels.append("bias")
        stack = torch.cat([part.to(reference.dtype) for part in stacks])
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice)
        stack = _projected(stack, project_output_onto)
        return (stack, labels) if return_labels else stack

    def _through_out_norm(self, parts: torch.Tensor, normalised: tuple[str, nn.Module] | None, pos_slice: PosSlice,
                          per_part: bool) -> torch.Tensor:
        """Parts of a sublayer's output [(b), s, (parts,) h] through the norm that `normalised` names (the stream's
        attn_out_norm or mlp_out_norm), its divisor frozen at the whole output's; as they are where there is none.
        `per_part`: the parts have their own axis before h."""
        if normalised is None:
            return parts
        read, norm = normalised
        divisor = _pos(norm.divisor(self[read]), pos_slice, -2)
        return norm.frozen(parts, divisor.unsqueeze(-2) if per_part else divisor)

    # ---- reading out ----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def logit_lens(self, incl_mid: bool = False, pos_slice: PosSlice = None, return_labels: bool = False):
        """[entries, (b), s, V]: each entry of `accumulated_resid(incl_mid=..., pos_slice=...)` read out as the
        model reads its last stream (GPT-2: ln_f with the entry's own statistics, then the unembedding; BERT: the
        MLM head), as the logit lens of nostalgebraist (2020) does: where a prediction forms. The last entry
        (`final_post`) is the model's logits. GPT-2's position t scores the token after t; BERT's scores the token
        at t (the masked-LM task)."""
        stack, labels = self.accumulated_resid(incl_mid=incl_mid, pos_slice=pos_slice, return_labels=True)
        logits = self._stream().read_out(stack)
        return (logits, labels) if return_labels else logits

    @torch.no_grad()
    def logit_attrs(self, residual_stack: torch.Tensor, tokens, incorrect_tokens=None,
                    pos_slice: PosSlice = None) -> torch.Tensor:
        """Direct logit attribution (GPT-2): each part of `residual_stack` through ln_f, its scale frozen at the
        final stream's (`apply_ln_to_stack`), dotted with the unembedding of `tokens`: [parts, (b), s].

        With ln_f's scale frozen the logit ln_f(stream) · W_U[token] is linear in the stream, so each part of a
        decomposition gets its share; the shares of a full decomposition sum to the logit less
        ln_f.bias · W_U[tokens], which no part writes (TransformerLens folds it into b_U). BERT's MLM head is not
        linear (an activation and a LayerNorm sit before the decoder): refused. A family that caps its logits
        softly after the unembedding (Gemma 2: cap · tanh(score / cap)) has its scores before the cap split, as
        TransformerLens does: the shares sum to the hook point its stream names as `attributed_logits`
        (`uncapped_logits`), not to the logits, which no sum of parts reaches.

        `residual_stack`: parts of the final residual stream, [parts, (b), s, h], such as `decompose_resid()` or
        `stack_head_results(incl_remainder=True)`; as in TransformerLens, before any LayerNorm.
        `tokens`: a token id, a string that is one token, or a tensor of ids: [b] one per sequence (for every
        position), [b, s] one per position, [1, s] one per position shared by the batch (without a batch axis:
        [s]). `incorrect_tokens` (same shape): attribute the logit difference tokens - incorrect_tokens instead.
        `pos_slice`: the one the stack was taken with.
        """
        matrix = self._stream().unembedding()
        directions = self._directions(matrix, tokens, "tokens")
        if incorrect_tokens is not None:
            wrong = self._directions(matrix, incorrect_tokens, "incorrect_tokens")
            if wrong.shape != directions.shape:
                raise ValueError(f"incorrect_tokens must have the shape of tokens: {tuple(wrong.shape[:-1])} against "
                                 f"{tuple(directions.shape[:-1])}")
            directions = directions - wrong
        scaled = self.apply_ln_to_stack(residual_stack, None, pos_slice=pos_slice)
        if self.has_batch_dim and directions.dim() == 2 and scaled.dim() == 4:
            directions = directions.unsqueeze(-2)  # one token per sequence, the same at every position
        part = scaled.shape[1:]
        try:
            fits = torch.broadcast_shapes(directions.shape, part) == part
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"tokens of shape {tuple(directions.shape[:-1])} do not fit a stack whose parts are "
                             f"{tuple(part)}: give one id, [batch], [batch, seq] or [1, seq]")
        return (scaled * directions).sum(-1)

    def _directions(self, matrix: torch.Tensor, tokens, what: str) -> torch.Tensor:
        """[*tokens.shape, h]: the unembedding's row of each token."""
        if isinstance(tokens, str):
            tokenizer = self.model.tokenizer
            ids = tokenizer.encode(tokens, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"{what} {tokens!r} is {len(ids)} tokens, not one: {tokenizer.str_tokens(ids)}")
            tokens = ids[0]
        ids = torch.as_tensor(tokens, device=matrix.device)
        if ids.dtype not in (torch.int64, torch.int32) or ids.dim() > 2:
            raise ValueError(f"{what} must be a token id, a string of one token or an integer tensor of at most 2 "
                             f"axes, got {tokens!r}")
        if bool(((ids < 0) | (ids >= matrix.shape[0])).any()):
            raise ValueError(f"{what} holds ids outside the vocabulary 0..{matrix.shape[0] - 1}")
        return matrix[ids.long()]

    def to(self, device, move_model: bool = False) -> "ActivationCache":
        """Move every cached tensor (and the run's input_ids and attention_mask) to `device`, in place; returns the
        cache, as TransformerLens' ActivationCache.to does. The helpers that read weights (apply_ln, the
        decompositions) need the model there too: `move_model=True` moves it with the cache."""
        self._tensors = {name: tensor.to(device) for name, tensor in self._tensors.items()}
        self.input_ids, self.attention_mask = (None if t is None else t.to(device)
                                               for t in (self.input_ids, self.attention_mask))
        if move_model:
            self.model.to(device)
        return self

    # ---- rows and padding -----------------------------------------------------------------------------------------

    def remove_batch_dim(self, row: int | None = None, trim_padding: bool = False) -> "ActivationCache":
        """Keep batch row `row` only (None: the batch must be one row, as in TransformerLens) and drop the batch
        axis of every tensor, in place; returns the cache.

        `trim_padding`: also drop the positions the run's attention_mask marks as padding (left or right, or
        anywhere for BERT), on every sequence axis (queries and keys alike), and from `input_ids` and
        `attention_mask`. Positions then count real tokens only. A row that is all padding is refused.
        """
        if not self.has_batch_dim:
            raise ValueError("remove_batch_dim: this cache has no batch axis any more")
        batch = self._batch_size()
        if row is None:
            if batch != 1:
                raise ValueError(f"the cache holds {batch} rows: name the one to keep, remove_batch_dim(row=...)")
            row = 0
        if not -batch <= row < batch:
            raise ValueError(f"row {row} is out of range for a batch of {batch}")
        row %= batch
        kept = self._kept_positions(row) if trim_padding else None
        dims = self._dims()
        tensors = {name: _one_row(name, t, row, batch, dims(name), kept) for name, t in self._tensors.items()}
        for name in ("input_ids", "attention_mask"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, _one_row(name, value, row, batch, ("b", "s"), kept))
        self._tensors, self.has_batch_dim = tensors, False
        return self

    def _kept_positions(self, row: int) -> tuple[torch.Tensor, int] | None:
        mask = self.attention_mask
        if mask is None:
            return None  # nothing was padded
        if mask.dim() != 2:
            raise ValueError(f"trim_padding needs the run's attention_mask as [batch, seq]; it is "
                             f"{tuple(mask.shape)}")
        kept = mask[row].nonzero().flatten()
        if kept.numel() == 0:
            raise ValueError(f"row {row} is all padding (its attention_mask is all 0): nothing is left to keep")
        return kept, mask.shape[1]

    def _batch_size(self) -> int:
        if self.input_ids is not None:
            return self.input_ids.shape[0]
        return max(t.shape[0] for t in self._tensors.values())

    def _dims(self):
        """name -> the axes its hook point declares, e.g. ("b", "n", "s", "p + s")."""
        dims = self.model.hook_dims()
        return lambda name: dims[name.removesuffix("_grad")]

    # ---- plumbing -------------------------------------------------------------------------------------------------

    def _stream(self):
        """The residual-stream layout the model's family declares (scratch_models.registry.family.ResidualStream)."""
        family = getattr(self.model, "family", None)
        if family is None:
            raise TypeError(f"the residual-stream helpers read a model family's declaration, and "
                            f"{type(self.model).__name__} belongs to no family of scratch_models.registry.families")
        return family.stream(self.model)

    def _layer(self, layer: int | None) -> int:
        """TransformerLens' convention: None and -1 mean all layers (the final stream)."""
        n = self._stream().n_layers
        if layer is None or layer == -1:
            return n
        if not isinstance(layer, int) or not 0 <= layer <= n:
            raise ValueError(f"layer must be in 0..{n} (or None / -1 for the final stream), got {layer!r}")
        return layer

    def _check_additive(self, helper: str) -> None:
        if self.training:
            raise ValueError(f"{helper}: the cache was recorded in training mode, where dropout keeps the parts from "
                             "summing to the residual stream; record it after model.eval()")

    def _stack_parts(self, names: list[str], total: str, pos_slice: PosSlice) -> torch.Tensor:
        """Parts of the stream `total` stacked, each broadcast to the others' shape (a position embedding may be
        [1, s, h]); an empty stack has the shape of `total`."""
        if not names:
            reference = _pos(self[total], pos_slice, -2)
            return reference.new_zeros((0, *reference.shape))
        tensors = [self[name] for name in names]
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        return torch.stack([_pos(t.expand(shape), pos_slice, -2) for t in tensors])

    def _order(self):
        """Sort key: forward order, each gradient after all forward tensors."""
        index = {name: i for i, name in enumerate(self.model.hook_names())}
        return lambda name: (name.endswith("_grad"), index.get(name.removesuffix("_grad"), len(index)))


def glob(pattern: str) -> re.Pattern:
    """`pattern` with `*` standing for any run of characters within one part of a dotted name."""
    return re.compile(re.escape(pattern).replace(r"\*", r"[^.]*"))


def _pos(tensor: torch.Tensor, pos_slice: PosSlice, dim: int) -> torch.Tensor:
    """`tensor` at the positions `pos_slice` picks on axis `dim`, as TransformerLens' Slice reads it: an int
    drops the axis, a tuple holds a slice's arguments ((k,) is :k), a slice, a list or a tensor picks; TL's own
    Slice object is applied as TL applies it."""
    if hasattr(pos_slice, "apply") and hasattr(pos_slice, "slice"):  # TL's Slice: its int, slice or positions
        return pos_slice.apply(tensor, dim=dim)
    if pos_slice is None:
        return tensor
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, int):
        return tensor.select(dim, pos_slice)
    if isinstance(pos_slice, slice):
        return tensor[(slice(None),) * (dim % tensor.dim()) + (pos_slice,)]
    index = torch.as_tensor(pos_slice, device=tensor.device)
    if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32, torch.bool):
        raise ValueError(f"pos_slice must be None, an int, a slice or a 1-D list of positions; got {pos_slice!r}")
    if index.dtype == torch.bool:
        index = index.nonzero().flatten()
    return tensor.index_select(dim, index.long())


def _projected(stack: torch.Tensor, onto: torch.Tensor | None) -> torch.Tensor:
    """`stack`'s last axis h projected on `onto` ([h]: the axis goes; [h, k]: it becomes k), or `stack`."""
    if onto is None:
        return stack
    if onto.dim() not in (1, 2) or onto.shape[0] != stack.shape[-1]:
        raise ValueError(f"project_output_onto must be [d_model] or [d_model, k] with d_model {stack.shape[-1]}, got "
                         f"{tuple(onto.shape)}")
    return stack @ onto.to(stack.dtype)


def _stack_named(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    shapes = {tuple(t.shape) for _, t in named}
    if len(shapes) > 1:
        described = ", ".join(f"{name} {tuple(t.shape)}" for name, t in named[:6])
        raise ValueError(f"cannot stack tensors of different shapes: {described}")
    return torch.stack([t for _, t in named])


def _one_row(name: str, tensor: torch.Tensor, row: int, batch: int, dims: tuple[str, ...],
             kept: tuple[torch.Tensor, int] | None) -> torch.Tensor:
    """`tensor`'s batch row `row` (a broadcast row of 1 serves every row). With `kept`, (positions the run's
    attention mask keeps, the mask's length), only those positions on each sequence axis: an axis of size m covers
    the mask's last m positions (the new tokens after a KV cache, or the logits kept by logits_to_keep)."""
    if dims[0] == "t":  # the tokens routed to one expert, every sequence's in batch order (parts/moe.py)
        if batch == 1 and (kept is None or kept[0].numel() == kept[1]):
            return tensor
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} ({', '.join(dims)}): the tokens of every sequence "
                         "routed to one expert, whose rows say no sequence; run the sequence alone, unpadded, to "
                         "keep them with its batch axis removed")
    if dims[0] != "b" or tensor.shape[0] not in (batch, 1):
        raise ValueError(f"{name} has shape {tuple(tensor.shape)} ({', '.join(dims)}), not one row per sequence of "
                         f"the batch of {batch}: cannot pick a row (inputs of several choices per example?)")
    tensor = tensor[row if tensor.shape[0] > 1 else 0]
    if kept is None:
        return tensor
    positions, length = kept
    for axis, dim in enumerate(dims[1:]):
        if dim in ("s", "p + s"):
            offset = length - tensor.shape[axis]
            tensor = tensor.index_select(axis, (positions[positions >= offset] - offset).to(tensor.device))
    return tensor
