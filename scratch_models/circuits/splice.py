"""The transcoders spliced into a model: each layer's MLP output replaced by their reconstruction, plus (by default)
the error of the unedited reconstruction, so the model computes exactly what it did until a feature is edited.

    with spliced(model, transcoders, edit=lambda layer, acts: acts * keep[layer]) as acts:
        logits = model(input_ids=ids).logits              # acts[layer]: [b, s, f] the unedited activations

`edit(layer, acts) -> acts` sets or scales features (a new tensor; its output reaches the layers it writes, and
through them everything after). With the error term and no feature edited, each output hook passes the model's own
tensor on: the output is the model's, bitwise. `error_term=False`: the reconstruction alone goes on.
"""

import contextlib

import torch

from .transcoders import Transcoders


@contextlib.contextmanager
def spliced(model, transcoders: Transcoders, *, edit=None, error_term: bool = True):
    _, outputs = transcoders.sites(model)
    readers = transcoders.readers(model)
    by_input = {name: l for l, (name, _) in enumerate(readers)}
    by_output = {name: l for l, name in enumerate(outputs)}
    seen: dict[int, torch.Tensor] = {}
    state: dict = {}

    def read_input(x, name):
        l = by_input[name]
        x = readers[l][1](x)
        state.setdefault("x", {})[l] = x
        acts = transcoders.encode(l, x)
        seen[l] = acts
        edited = acts if edit is None else edit(l, acts)
        if edited.shape != acts.shape:
            raise ValueError(f"edit({l}, acts) returned shape {list(edited.shape)}; the activations are "
                             f"{list(acts.shape)}")
        state.setdefault("clean", {})[l] = acts
        state.setdefault("edited", {})[l] = edited

    def replace_output(out, name):
        l = by_output[name]
        clean, edited, x = state["clean"], state["edited"], state["x"][l]
        sources = range(l + 1) if transcoders.cross_layer else (l,)
        changed = any(edited[s] is not clean[s] and not torch.equal(edited[s], clean[s]) for s in sources)
        if error_term and not changed:
            return out
        recons = transcoders.reconstruct(l, [edited.get(s) for s in range(l + 1)], x)
        if error_term:
            recons = recons + (out.to(recons.dtype) - transcoders.reconstruct(l, [clean.get(s) for s in range(l + 1)],
                                                                              x))
        return recons.to(out.dtype)

    with model.hooks([(lambda name: name in by_input, read_input), (lambda name: name in by_output, replace_output)]):
        yield seen
