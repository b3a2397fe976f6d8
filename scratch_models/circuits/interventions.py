"""Feature interventions, as circuit-tracer 0.5.0's `feature_intervention` computes them: set features to values and
read the logits and every layer's transcoder activations that follow.

    logits, acts = feature_intervention(model, transcoders, input_ids, [(layer, position, feature, value), ...])

Each intervention (layer, position, feature, value) adds (value - the feature's activation) times its decoder rows to
the outputs it writes (a cross-layer feature to every layer from its own on). Position and feature may be ints,
slices or index tensors, as circuit-tracer takes them. What else moves:

- `freeze_attention` (default): every attention pattern stays at its value on the unedited prompt.
- `constrained_layers` (a range of layers): in those layers the MLP outputs stay at their unedited values plus the
  interventions' decoder writes (and, with a skip connection, its change with the MLP's input), and the delta is
  taken from the unedited activations, so effects do not propagate through transcoders there; where the range covers
  every layer, every norm's divisor is frozen too: this is the local replacement model of the attribution graph, so
  each feature's pre-activation then changes by its edges times the sources' changes.
- otherwise each MLP runs as it is, its output corrected by the decoder rows times (value - the activation the
  transcoders read in this run).

The activations returned are [layers, positions, features] (position 0 zeroed, as circuit-tracer does), through the
activation function unless `apply_activation_function=False` (the pre-activations, which attribution predicts).
"""

from collections import defaultdict

import torch

from .attribution import frozen_points
from .transcoders import Transcoders


@torch.no_grad()
def feature_intervention(model, transcoders: Transcoders, input_ids, interventions, *,
                         constrained_layers: range | None = None, freeze_attention: bool = True,
                         apply_activation_function: bool = True, zero_positions: slice = slice(0, 1)):
    """(logits [1, n, V], activations [layers, n, features]); see the module's docstring."""
    out, acts = _intervened(model, transcoders, input_ids, interventions, constrained_layers=constrained_layers,
                            freeze_attention=freeze_attention, apply_activation_function=apply_activation_function,
                            zero_positions=zero_positions)
    return out.logits, acts


@torch.no_grad()
def feature_intervention_generate(model, transcoders: Transcoders, input_ids, interventions, *,
                                  max_new_tokens: int = 10, constrained_layers: range | None = None,
                                  freeze_attention: bool = True, apply_activation_function: bool = True,
                                  stop_at_eos: bool = True):
    """Greedy generation under `interventions`, as circuit-tracer's feature_intervention_generate with do_sample
    False: the prompt's pass as feature_intervention (frozen attention, constrained layers); then, token by token
    over the KV cache, the interventions whose position is an open-ended slice (slice(k, None)) applied to each new
    token, nothing frozen. Returns (the token ids, prompt and new [n + new], the logits of each generated token's
    step [new, V], the activations [layers, n + new - 1, features]: the prompt's, then each step's)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    ids = torch.as_tensor(input_ids).reshape(-1)
    out, acts = _intervened(model, transcoders, ids, interventions, constrained_layers=constrained_layers,
                            freeze_attention=freeze_attention, apply_activation_function=apply_activation_function,
                            forward=dict(use_cache=True))
    open_ended = [(layer, 0, feature, value) for layer, pos, feature, value in interventions
                  if isinstance(pos, slice) and pos.stop is None]
    eos = getattr(model.config, "eos_token_id", None)
    eos = set(eos if isinstance(eos, list) else [eos]) if stop_at_eos and eos is not None else set()
    tokens, logits, activations = [*ids.tolist()], [out.logits[0, -1]], [acts]
    for step in range(max_new_tokens):
        token = int(logits[-1].argmax())
        tokens.append(token)
        if token in eos or step == max_new_tokens - 1:
            break
        out, acts = _intervened(model, transcoders, torch.tensor([token], device=ids.device), open_ended,
                                freeze_attention=False, apply_activation_function=apply_activation_function,
                                zero_positions=slice(0, 0),
                                forward=dict(past_key_values=out.past_key_values, use_cache=True))
        logits.append(out.logits[0, -1])
        activations.append(acts)
    return torch.tensor(tokens), torch.stack(logits), torch.cat(activations, dim=1)


def _intervened(model, transcoders, input_ids, interventions, *, constrained_layers=None, freeze_attention=True,
                apply_activation_function=True, zero_positions=slice(0, 1), forward=None):
    """One forward pass under `interventions` (the model's output, the activations [layers, n, features]);
    `forward`: more arguments of the model's forward (a KV cache: then nothing is frozen, as the unedited pass that
    freezing reads is of the prompt alone)."""
    forward = forward or {}
    input_ids = torch.as_tensor(input_ids).reshape(1, -1)
    inputs, outputs = transcoders.sites(model)
    n_layers = transcoders.n_layers
    by_layer = defaultdict(list)
    for layer, pos, feature, value in interventions:
        layer = int(layer)
        if not 0 <= layer < n_layers:
            raise ValueError(f"intervention at layer {layer}: the transcoders have layers 0..{n_layers - 1}")
        by_layer[layer].append((pos, feature, value))
    constrained = list(constrained_layers) if constrained_layers else []
    scales, probs = frozen_points(model)
    frozen: dict[str, torch.Tensor] = {}
    original: list[torch.Tensor] = []

    def encode(layer, x):
        pre = transcoders.pre_acts(layer, x[0])
        acts = transcoders.activate(layer, pre)
        acts[zero_positions] = 0
        pre[zero_positions] = 0
        return pre, acts

    freeze_scales = bool(interventions) and set(range(n_layers)) <= set(constrained)
    # where the divisors are frozen, the transcoders read their input hook itself (what the frozen norm gives);
    # elsewhere they read it without listening on an opt-in point, which would change the norm's rounding
    reading = [(name, lambda x: x) for name in inputs] if freeze_scales else transcoders.readers(model)
    by_input = {name: l for l, (name, _) in enumerate(reading)}
    clean_inputs: dict[int, torch.Tensor] = {}
    if (freeze_attention or constrained) and interventions:
        to_freeze = set(probs) | (set(scales) if freeze_scales else set()) | {outputs[l] for l in constrained}

        def keep(x, name):
            if name in to_freeze:
                frozen[name] = x
            if name in by_input:
                l = by_input[name]
                clean_inputs[l] = reading[l][1](x)

        with model.hooks([(lambda name: name in to_freeze or name in by_input, keep)]):
            model(input_ids=input_ids)
        original = [encode(l, clean_inputs[l])[1] for l in range(n_layers)]

    deltas = torch.zeros(n_layers, input_ids.shape[1], transcoders.d_model, dtype=transcoders.dtype)
    current: dict[int, torch.Tensor] = {}
    recorded: dict[int, torch.Tensor] = {}
    skip_diff: dict[int, torch.Tensor] = {}
    by_output = {name: l for l, name in enumerate(outputs)}
    intervention_range = set(constrained) if constrained else set(range(n_layers))

    def freeze(x, name):
        return frozen[name]

    def read_input(x, name):
        l = by_input[name]
        x = reading[l][1](x)
        pre, acts = encode(l, x)
        current[l] = acts
        recorded[l] = acts if apply_activation_function else pre
        if l in constrained and l in clean_inputs and transcoders.W_skip is not None:
            skip_diff[l] = transcoders.skip(l, x) - transcoders.skip(l, clean_inputs[l])

    def write_output(x, name):
        l = by_output[name]
        if l in constrained and name in frozen:
            x = frozen[name]
        if l in by_layer:
            base = original[l] if constrained else current[l]
            change = torch.zeros_like(base)
            for pos, feature, value in by_layer[l]:
                change[pos, feature] = value - base[pos, feature]
            positions, features = change.nonzero(as_tuple=True)
            amounts = change[positions, features]
            for m in transcoders.writes(l):
                deltas[m].index_add_(0, positions, transcoders.decoder(l, m)[features] * amounts[:, None])
        if l in intervention_range:
            x = x + deltas[l].to(x.dtype)
        deltas[l].zero_()
        if l in skip_diff:
            x = x + skip_diff[l].to(x.dtype)
        return x

    # patterns and divisors are replaced here; the transcoders' own points are handled by read_input / write_output
    replaced = {name for name in frozen if name not in by_input and name not in by_output}
    hooks = [(lambda name: name in by_input, read_input), (lambda name: name in by_output, write_output)]
    if replaced:
        hooks.insert(0, (lambda name: name in replaced, freeze))
    with model.hooks(hooks):
        out = model(input_ids=input_ids, **forward)
    return out, torch.stack([recorded[l] for l in range(n_layers)])
