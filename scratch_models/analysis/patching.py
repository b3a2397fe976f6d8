"""Activation patching, batched: which activations carry the difference between a clean and a corrupted prompt.

Run the corrupted prompt, write one activation of the clean run into it (a layer's residual stream at one
position, one head's output, ...), and measure how far the output moves back towards the clean one (Meng et al.
2022; TransformerLens' `patching` module, whose function names these are). A sweep asks that for every layer x
position, or layer x head: hundreds of forward passes that differ in one small edit each. Here they run as
batches: the corrupted batch is repeated once per patch, and one hook per hook point writes the clean values
into exactly the rows and positions each patch asks for (`run_patches`); with a token metric, GPT-2's LM head
runs only from the first position it reads. Zero- and mean-ablating heads (heads.py) are the same edit with
another source.

    _, clean_cache = model.run_with_cache(**clean, names=lambda name: name.endswith(".out"))
    metric = LogitDiff(answer, wrong, positions=last_positions(clean["attention_mask"]))
    get_act_patch_resid_pre(model, corrupted, clean_cache, metric)        # [layers, positions]

The metric gets what the model's call returns (metrics.py): for a model loaded with transformer_lens=True, the
logits, as TransformerLens' patching functions give them, and it may return one number for the batch as TL's do.

Cache what the sweep patches, not every name: caching the attention probabilities sends the clean run down the
explicit attention path, and the patched runs (which do not cache them) down the fused one, whose last bits
differ.

The patched runs see the corrupted prompts' own attention_mask, token types and position ids, so clean and
corrupted prompts must be padded alike: checked against the clean run's attention_mask, which
`activation_patching` is given and run_with_cache's ActivationCache remembers (a plain dict of tensors: only the
lengths are checked). Attribution patching (Nanda 2023; Syed et al. 2023) estimates
every patch at once from one backward pass: patching a ≈ (a_clean - a_corrupted) · d metric / d a, at the
corrupted run.
"""

import dataclasses
import inspect
from typing import Callable, Mapping, Sequence

import torch

from ..parts.outputs import logits_of
from .metrics import LogitDiff, TokenLogit, TokenLogProb, normalized, per_prompt

DEFAULT_BATCH_SIZE = 32  # rows (patched copies x prompts) per forward pass: bounds the memory a sweep takes

Metric = Callable[[object], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Patch:
    """Replace hook point `name` where `where` is True: a bool tensor that broadcasts against the activation
    without its batch dimension (e.g. [s, 1] for one position of a [b, s, h] tensor, [n, 1, 1] for one head of
    `attn.context` [b, n, s, d])."""

    name: str
    where: torch.Tensor


def run_patches(model, tokens, patches: Sequence[Patch], sources: Mapping[str, torch.Tensor], metric: Metric, *,
                batch_size: int = DEFAULT_BATCH_SIZE, vector_metric: bool = False) -> torch.Tensor:
    """The metric of one run of `tokens` per patch: [len(patches), batch] float64 on the CPU ([..., k] with
    `vector_metric`, where the metric may give a vector per prompt; [len(patches), 1] for a metric that gives one
    number for the batch).

    tokens: input_ids [b, s], or a dict of forward arguments (input_ids, attention_mask, token_type_ids,
    position_ids, flags such as output_attentions). sources: hook name -> the values a patch writes there,
    broadcastable to that activation ([b, ...] a clean run's, [1, n, 1, d] a mean, a 0-d zero). Patched copies
    run `batch_size // b` (at least 1) to a forward pass; every copy is exactly the run with only its patch.
    A patch that would write the values already there is the unpatched run, and takes its metric without a run
    of its own (in GPT-2, every patch before the first token where clean and corrupted prompts differ). With
    LogitDiff, TokenLogit or TokenLogProb, GPT-2's patched runs score only from the first position it reads.
    """
    inputs = forward_inputs(tokens)
    batch = inputs["input_ids"].shape[0]
    _check_ready(model, batch_size)
    for patch in patches:
        if patch.name not in sources:
            raise ValueError(f"no source for hook point {patch.name!r}: sources has {', '.join(sources) or 'none'}")
        if patch.where.dtype != torch.bool:
            raise ValueError(f"Patch({patch.name!r}).where must be bool, got {patch.where.dtype}")
    with torch.no_grad():
        output, unpatched = model.run_with_cache(**inputs, names=list(dict.fromkeys(p.name for p in patches)),
                                                 return_type="output")
        check_positions(model, metric, inputs, output)
        values = [check_metric(measure(model, metric, output), batch, vector_metric)] * len(patches)
        runs = [i for i, patch in enumerate(patches) if not _writes_nothing_new(patch, sources, unpatched)]
        per_forward = max(1, batch_size // batch)
        kept, patched_metric = _logits_read(model, inputs, patches, metric)
        for start in range(0, len(runs), per_forward):
            chunk = runs[start:start + per_forward]
            output = model.run_with_hooks(**_repeated(inputs, len(chunk), batch), **kept, return_type="output",
                                          hooks=_writers([patches[i] for i in chunk], sources, batch))
            for j, i in enumerate(chunk):
                rows = prompt_rows(output, j * batch, (j + 1) * batch)
                values[i] = check_metric(measure(model, patched_metric, rows), batch, vector_metric)
    if not values:
        return torch.empty(0, batch, dtype=torch.float64)
    return torch.stack(values).double().cpu()


def _logits_read(model, inputs: dict, patches: Sequence[Patch], metric: Metric) -> tuple[dict, Metric]:
    """(extra forward arguments, the metric to read them with) for the patched runs.

    GPT-2's LM head scores every position against the whole vocabulary: for a short prompt that is a third of
    the forward pass. Our token metrics read one position per prompt, so the patched runs compute the logits from
    the earliest of those positions on (`logits_to_keep`) and the metric reads them there, shifted. Any other
    metric (its positions unknown), a model without `logits_to_keep`, or a patch of the logits themselves gets
    every position, as the unpatched run does."""
    if (not isinstance(metric, (LogitDiff, TokenLogit, TokenLogProb)) or metric.positions is None
            or "logits_to_keep" not in inspect.signature(model.forward).parameters
            or any(name in inputs for name in ("logits_to_keep", "labels"))
            or any(patch.name == "logits" for patch in patches)):
        return {}, metric
    ids = inputs["input_ids"]
    batch, seq = ids.shape
    at = per_prompt(-1 if metric.positions is None else metric.positions, batch, "positions", ids.device)
    if bool(((at < -seq) | (at >= seq)).any()):
        return {}, metric  # the metric says what is wrong when it reads the unpatched run
    at = at % seq
    keep = seq - int(at.min())
    return {"logits_to_keep": keep}, dataclasses.replace(metric, positions=at - (seq - keep))


def _writes_nothing_new(patch: Patch, sources, unpatched) -> bool:
    current = unpatched[patch.name]
    if not _broadcasts_to(patch.where.shape, current.shape[1:]):
        return False  # the patched run refuses it, naming the shapes
    source = sources[patch.name].to(current.device, current.dtype)
    if not _broadcasts_to(source.shape, current.shape):
        raise ValueError(f"sources[{patch.name!r}] has shape {tuple(source.shape)}, which does not broadcast to "
                         f"{patch.name}'s {tuple(current.shape)}")
    return torch.equal(torch.where(patch.where.to(current.device), source, current), current)


def forward_inputs(tokens) -> dict:
    """input_ids [b, s] or a dict of forward arguments -> the dict, checked for what a sweep can repeat."""
    inputs = {"input_ids": tokens} if isinstance(tokens, torch.Tensor) else dict(tokens)
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.numel() == 0:
        got = f"shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"tokens: give input_ids [batch, seq] (a tensor, or a dict of forward arguments holding "
                         f"them); got {got}")
    for name in ("past_key_values", "use_cache"):
        if inputs.get(name):
            raise ValueError(f"{name}: a sweep runs each patched copy afresh; a KV cache cannot be shared by them")
    return inputs


def measure(model, metric: Metric, output):
    """metric(what the model's call returns for `output`): the output object, or TransformerLens' logits."""
    return metric(model.returned(output))


def check_metric(value, batch: int, vector_metric: bool = False) -> torch.Tensor:
    """The metric's value as [batch] ([batch, k] for a vector metric), or [1] for one number for the batch (what
    TransformerLens' patching metrics return)."""
    shapes = "[batch] or [batch, k]" if vector_metric else "[batch]"
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"the metric returned {type(value).__name__}; it returns a tensor {shapes}, one value per "
                         "prompt, or one number for the batch")
    if value.dim() == 0:
        return value.detach().reshape(1)
    if value.dim() not in ((1, 2) if vector_metric else (1,)) or value.shape[0] != batch:
        raise ValueError(f"the metric returned shape {tuple(value.shape)} for {batch} prompts; it returns {shapes}, "
                         "one value per prompt, or one number for the batch")
    return value.detach()


def check_positions(model, metric: Metric, inputs: dict, output) -> None:
    """A token metric without positions reads the last position of per-position logits: right for a causal
    model's prompts unless one is right-padded (its last column is padding), wrong for BERT's MLM head, whose
    masked token is elsewhere."""
    if (not isinstance(metric, (LogitDiff, TokenLogit, TokenLogProb)) or metric.positions is not None
            or logits_of(output).dim() != 3):
        return
    if not model.family.causal:
        raise ValueError(f"{type(metric).__name__} without positions reads the last position, the next token of a "
                         f"causal model; {type(model).__name__} is not one: give positions (the masked token's)")
    mask = inputs.get("attention_mask")
    if mask is not None and not bool(mask[:, -1].bool().all()):
        raise ValueError(f"{type(metric).__name__} without positions reads the last position, and a prompt is "
                         "right-padded there: give positions=last_positions(attention_mask)")


def prompt_rows(output, start: int, stop: int):
    """The output of rows start..stop of a batched run, as the model would return it for those rows alone."""
    def cut(field, value):
        if value is None:
            return None
        if isinstance(value, tuple):
            return tuple(cut(field, v) for v in value)
        if isinstance(value, torch.Tensor) and value.dim():
            return value[start:stop]
        raise ValueError(f"{type(output).__name__}.{field} is one value for the whole batch of patched copies "
                         "and cannot be split per prompt: leave out labels and caches")

    return dataclasses.replace(output, **{f.name: cut(f.name, getattr(output, f.name))
                                          for f in dataclasses.fields(output)})


def _check_ready(model, batch_size: int):
    if model.training:
        raise ValueError("the model is in training mode: dropout would make every patched run differ; call "
                         "model.eval() first")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")


def check_autograd(what: str):
    if torch.is_inference_mode_enabled():
        raise ValueError(f"{what} takes a gradient, which torch.inference_mode() switches off for good; call it "
                         "outside (torch.no_grad() around it is fine)")


def _repeated(inputs: dict, copies: int, batch: int) -> dict:
    """Every per-prompt tensor repeated `copies` times along the batch, copy-major: rows [c0 p0, c0 p1, c1 p0 ...]."""
    return {name: value.repeat(copies, *[1] * (value.dim() - 1))
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch else value
            for name, value in inputs.items()}


def _writers(chunk: Sequence[Patch], sources, batch: int) -> list:
    """One hook per hook point the chunk patches; copy j's rows take the source where patch j says so."""
    hooks = []
    for name in dict.fromkeys(patch.name for patch in chunk):
        try:
            shape = torch.broadcast_shapes(*(patch.where.shape for patch in chunk if patch.name == name))
        except RuntimeError:
            raise ValueError(f"the patches of {name!r} have where-shapes that do not broadcast together: "
                             f"{sorted({tuple(p.where.shape) for p in chunk if p.name == name})}") from None
        nothing = torch.zeros(shape, dtype=torch.bool)
        where = torch.stack([patch.where.cpu().expand(shape) if patch.name == name else nothing for patch in chunk])
        hooks.append((name, _writer(where, sources[name], batch)))
    return hooks


def _writer(where: torch.Tensor, source: torch.Tensor, batch: int):
    copies = where.shape[0]

    def write(x, name):
        per_copy = x.shape[1:]
        if not _broadcasts_to(where.shape[1:], per_copy):
            raise ValueError(f"a patch's where has shape {tuple(where.shape[1:])}, which does not broadcast to "
                             f"{name}'s {tuple(per_copy)} per prompt")
        rows = x.reshape(copies, batch, *per_copy)
        mask = where.to(x.device).reshape(copies, 1, *[1] * (len(per_copy) - where.dim() + 1), *where.shape[1:])
        return torch.where(mask, source.to(x.device, x.dtype), rows).reshape(x.shape)

    return write


def _broadcasts_to(shape, target) -> bool:
    return len(shape) <= len(target) and all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


# TransformerLens' activation names, and the hook points that hold them in both families.
COMPONENTS = ("resid_pre", "resid_mid", "attn_out", "mlp_out", "z")


def hook_name(model, component: str, layer: int) -> str:
    """Our hook point for TransformerLens' `component` of `layer`.

    resid_pre: the residual stream layer reads (embeddings.out, or the layer before's out). resid_mid: between
    attention and MLP: GPT-2's resid_mid; in post-LN BERT the normalised attention block output, which is what the
    MLP reads and adds to. attn_out, mlp_out: the sublayers' outputs before the residual sum. z: each head's
    output before the heads are merged, attn.context [b, n, s, d] (TransformerLens holds z as [b, s, n, d])."""
    stream = model.family.stream(model)
    if component == "resid_pre":
        return stream.resid_pre(layer)
    named = {"resid_mid": stream.resid_mid, "attn_out": stream.attn_out, "mlp_out": stream.mlp_out,
             "z": "layers.{}.attn.context".format}
    if component not in named:
        raise ValueError(f"unknown component {component!r}; choose from {', '.join(COMPONENTS)}")
    return named[component](layer)


def num_layers(model) -> int:
    return len(model.layers)


def clean_activation(clean_cache, name: str, inputs: dict, seq_dim: int) -> torch.Tensor:
    """clean_cache[name], refused unless it covers the corrupted prompts' batch and positions."""
    try:
        value = clean_cache[name]
    except KeyError:
        raise ValueError(f"clean_cache has no {name!r}: cache it in the clean run (run_with_cache with names=None "
                         "or a list that holds it)") from None
    batch, seq = inputs["input_ids"].shape
    if value.shape[0] != batch:
        raise ValueError(f"clean_cache[{name!r}] holds {value.shape[0]} prompts; the corrupted tokens are {batch}")
    if value.shape[seq_dim] != seq:
        raise ValueError(f"the clean prompt is {value.shape[seq_dim]} tokens long and the corrupted one {seq}: "
                         "patching by position needs prompts of the same length in tokens")
    return value


def _one_hot(size: int, index: int) -> torch.Tensor:
    return torch.arange(size) == index


def _check_against_clean_run(clean_cache, corrupted: dict):
    """An ActivationCache remembers its run's input_ids and attention_mask: the prompts must be alike."""
    ids = getattr(clean_cache, "input_ids", None)
    if ids is not None and ids.dim() == 2:
        _check_alike({"input_ids": ids, "attention_mask": clean_cache.attention_mask}, corrupted)


def _sweep_sources(model, component, corrupted_tokens, clean_cache, batch_size) -> tuple[dict, int, list, dict]:
    """(the corrupted inputs, their length, the hook name of `component` in each layer, name -> the clean
    activation there), all checked."""
    _check_ready(model, batch_size)
    inputs = forward_inputs(corrupted_tokens)
    _check_against_clean_run(clean_cache, inputs)
    names = [hook_name(model, component, layer) for layer in range(num_layers(model))]
    seq_dim = 2 if component == "z" else 1
    sources = {name: clean_activation(clean_cache, name, inputs, seq_dim) for name in names}
    return inputs, inputs["input_ids"].shape[1], names, sources


def _by_position(model, component, corrupted_tokens, clean_cache, metric, batch_size) -> torch.Tensor:
    inputs, seq, names, sources = _sweep_sources(model, component, corrupted_tokens, clean_cache, batch_size)
    patches = [Patch(name, _one_hot(seq, position)[:, None]) for name in names for position in range(seq)]
    values = run_patches(model, inputs, patches, sources, metric, batch_size=batch_size)
    return values.mean(1).view(len(names), seq)


def _heads(model, corrupted_tokens, clean_cache, metric, batch_size, by_position: bool) -> torch.Tensor:
    inputs, seq, names, sources = _sweep_sources(model, "z", corrupted_tokens, clean_cache, batch_size)
    heads = sources[names[0]].shape[1]
    if by_position:  # TransformerLens' order: layer, position, head
        patches = [Patch(name, (_one_hot(heads, head)[:, None] & _one_hot(seq, position))[..., None])
                   for name in names for position in range(seq) for head in range(heads)]
        shape = (len(names), seq, heads)
    else:
        patches = [Patch(name, _one_hot(heads, head)[:, None, None]) for name in names for head in range(heads)]
        shape = (len(names), heads)
    return run_patches(model, inputs, patches, sources, metric, batch_size=batch_size).mean(1).view(shape)


def get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                            batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, positions]: the metric (mean over the prompts) with the residual stream that each layer reads
    patched in from the clean run at one position."""
    return _by_position(model, "resid_pre", corrupted_tokens, clean_cache, patching_metric, batch_size)


def get_act_patch_resid_mid(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                            batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, positions]: as get_act_patch_resid_pre, for the residual stream between attention and MLP."""
    return _by_position(model, "resid_mid", corrupted_tokens, clean_cache, patching_metric, batch_size)


def get_act_patch_attn_out(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                           batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, positions]: the attention output of one layer at one position patched."""
    return _by_position(model, "attn_out", corrupted_tokens, clean_cache, patching_metric, batch_size)


def get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                          batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, positions]: the MLP output of one layer at one position patched."""
    return _by_position(model, "mlp_out", corrupted_tokens, clean_cache, patching_metric, batch_size)


def get_act_patch_attn_head_out_by_pos(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                                       batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, positions, heads]: one head's output at one position patched."""
    return _heads(model, corrupted_tokens, clean_cache, patching_metric, batch_size, by_position=True)


def get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                                        batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[layers, heads]: one head's output at every position patched."""
    return _heads(model, corrupted_tokens, clean_cache, patching_metric, batch_size, by_position=False)


def get_act_patch_block_every(model, corrupted_tokens, clean_cache, patching_metric: Metric, *,
                              batch_size: int = DEFAULT_BATCH_SIZE) -> torch.Tensor:
    """[3, layers, positions]: resid_pre, attn_out and mlp_out, as TransformerLens stacks them."""
    return torch.stack([_by_position(model, component, corrupted_tokens, clean_cache, patching_metric, batch_size)
                        for component in ("resid_pre", "attn_out", "mlp_out")])


def attribution_patch(model, clean_tokens, corrupted_tokens, metric: Metric,
                      components: Sequence[str] = ("resid_pre", "attn_out", "mlp_out", "z")) -> dict:
    """First-order estimates of every patch of `components` from one clean forward and one corrupted forward and
    backward: (a_clean - a_corrupted) · d metric / d a at the corrupted run, summed over the hidden (for z: the
    head's) dimension, mean over the prompts. component -> [layers, positions]; z -> [layers, positions, heads],
    the order of get_act_patch_attn_head_out_by_pos (summed over positions it estimates ..._all_pos)."""
    clean, corrupted = forward_inputs(clean_tokens), forward_inputs(corrupted_tokens)
    _check_ready(model, 1)
    check_autograd("attribution patching")
    layers = num_layers(model)
    names = {component: [hook_name(model, component, layer) for layer in range(layers)] for component in components}
    wanted = [name for per_layer in names.values() for name in per_layer]
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(**clean, names=wanted)
    captured = {}

    def capture(x, name):
        captured[name] = x

    def start_graph(x, name):  # a leaf below every hook point, so each one has a gradient even with frozen weights
        return x.detach().requires_grad_()

    with torch.enable_grad():
        output = model.run_with_hooks(**corrupted, return_type="output",
                                      hooks=[("embeddings.word", start_graph), *((name, capture) for name in wanted)])
        batch = corrupted["input_ids"].shape[0]
        check_positions(model, metric, corrupted, output)
        value = measure(model, metric, output)
        check_metric(value, batch)
        grads = torch.autograd.grad(value.sum(), [captured[name] for name in wanted], allow_unused=True)
    # per prompt: the mean of the prompts' estimates; one number for the batch: its own estimate, over every prompt
    over_prompts = torch.sum if value.dim() == 0 else torch.mean
    grad_of = dict(zip(wanted, grads))
    result = {}
    for component, per_layer in names.items():
        seq_dim = 2 if component == "z" else 1
        estimates = []
        for name in per_layer:
            corrupted_value = captured[name].detach()
            delta = clean_activation(clean_cache, name, corrupted, seq_dim) - corrupted_value
            grad = grad_of[name] if grad_of[name] is not None else torch.zeros_like(corrupted_value)
            # sum over the last dimension, then over the prompts
            estimates.append(over_prompts((delta.double() * grad.double()).sum(-1), 0).cpu())
        stacked = torch.stack(estimates)  # [layers, s] or, for z, [layers, n, s]
        result[component] = stacked.transpose(1, 2) if component == "z" else stacked
    return result


@dataclasses.dataclass
class PatchingResult:
    """Every sweep of `activation_patching`: the raw metric (mean over the prompts) of each patched run, with the
    clean and corrupted runs' metric; `normalized` maps them to 0 = corrupted, 1 = clean."""

    clean_metric: float
    corrupted_metric: float
    patched: dict[str, torch.Tensor]  # component -> [layers, positions]; attn_head_out_* as TransformerLens shapes
    attribution: dict[str, torch.Tensor]  # the same keys and shapes: first-order estimates of the patched metric

    def normalized(self, values: torch.Tensor) -> torch.Tensor:
        return normalized(values, self.clean_metric, self.corrupted_metric)

    def to_json(self, tokens: Sequence[str] | None = None) -> dict:
        def table(values):
            return self.normalized(values).tolist()

        return {"tokens": list(tokens) if tokens is not None else None,
                "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
                "patched": {k: v.tolist() for k, v in self.patched.items()},
                "patched_normalized": {k: table(v) for k, v in self.patched.items()},
                "attribution": {k: v.tolist() for k, v in self.attribution.items()},
                "attribution_normalized": {k: table(v) for k, v in self.attribution.items()}}


SWEEPS = {"resid_pre": get_act_patch_resid_pre, "resid_mid": get_act_patch_resid_mid,
          "attn_out": get_act_patch_attn_out, "mlp_out": get_act_patch_mlp_out,
          "attn_head_out_all_pos": get_act_patch_attn_head_out_all_pos,
          "attn_head_out_by_pos": get_act_patch_attn_head_out_by_pos}
SWEPT = {"resid_pre": "resid_pre", "resid_mid": "resid_mid", "attn_out": "attn_out", "mlp_out": "mlp_out",
         "attn_head_out_all_pos": "z", "attn_head_out_by_pos": "z"}  # the component each sweep patches


def activation_patching(model, clean_tokens, corrupted_tokens, metric: Metric, *,
                        sweeps: Sequence[str] | None = None, attribution: bool = True,
                        batch_size: int = DEFAULT_BATCH_SIZE) -> PatchingResult:
    """Run the clean and corrupted prompts and every sweep in `sweeps` (keys of SWEEPS; None: every one the model
    has, which leaves resid_mid out where no stream runs between attention and MLP), and, with `attribution`,
    attribution patching's estimate of each. Clean and corrupted prompts must have the same length and the same
    padding, so that a position holds the same slot in both."""
    clean, corrupted = forward_inputs(clean_tokens), forward_inputs(corrupted_tokens)
    _check_alike(clean, corrupted)
    if sweeps is None:
        has_mid = model.family.stream(model).has_mid
        sweeps = [sweep for sweep in SWEEPS if has_mid or SWEPT[sweep] != "resid_mid"]
    unknown = [sweep for sweep in sweeps if sweep not in SWEEPS]
    if unknown:
        raise ValueError(f"unknown sweep {', '.join(unknown)}; choose from {', '.join(SWEEPS)}")
    _check_ready(model, batch_size)
    batch = clean["input_ids"].shape[0]
    wanted = list(dict.fromkeys(SWEPT[sweep] for sweep in sweeps))
    names = [hook_name(model, component, layer) for component in wanted for layer in range(num_layers(model))]
    with torch.no_grad():
        clean_output, clean_cache = model.run_with_cache(**clean, names=names, return_type="output")
        corrupted_output = model(**corrupted, return_type="output")
    clean_metric = float(check_metric(measure(model, metric, clean_output), batch).double().mean())
    corrupted_metric = float(check_metric(measure(model, metric, corrupted_output), batch).double().mean())
    patched = {sweep: SWEEPS[sweep](model, corrupted, clean_cache, metric, batch_size=batch_size) for sweep in sweeps}
    estimates = {}
    if attribution:
        first_order = attribution_patch(model, clean, corrupted, metric, components=wanted)
        for sweep in sweeps:
            delta = first_order[SWEPT[sweep]]
            estimates[sweep] = corrupted_metric + (delta.sum(1) if sweep == "attn_head_out_all_pos" else delta)
    return PatchingResult(clean_metric, corrupted_metric, patched, estimates)


def _check_alike(clean: dict, corrupted: dict):
    clean_ids, corrupted_ids = clean["input_ids"], corrupted["input_ids"]
    if clean_ids.shape[1] != corrupted_ids.shape[1]:
        raise ValueError(f"the clean prompt is {clean_ids.shape[1]} tokens long and the corrupted one "
                         f"{corrupted_ids.shape[1]}: patching by position needs prompts of the same length in tokens")
    if clean_ids.shape[0] != corrupted_ids.shape[0]:
        raise ValueError(f"{clean_ids.shape[0]} clean prompts and {corrupted_ids.shape[0]} corrupted ones: give "
                         "one corrupted prompt for each clean one")
    clean_mask, corrupted_mask = (torch.ones_like(clean_ids, dtype=torch.bool) if inputs.get("attention_mask") is None
                                  else inputs["attention_mask"].to(clean_ids.device).bool()
                                  for inputs in (clean, corrupted))
    differ = (clean_mask != corrupted_mask).any(-1)
    if bool(differ.any()):
        row = int(differ.nonzero()[0])
        raise ValueError(f"the clean and corrupted attention_mask differ (first in prompt {row}): pad both alike, "
                         "so that each position holds the same slot in both runs")
