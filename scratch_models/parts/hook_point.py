"""`HookPoint`: an identity placed on a tensor inside a forward pass, where a listener can read or replace it.

With nobody listening it returns its input after one attribute test: `__call__` is overridden to skip nn.Module's
call machinery. Its axes are declared (`dims`), so the layers above (the activation cache, the parity report, the
docs) read a tensor's shape from the point itself.
"""

from torch import nn


class HookPoint(nn.Module):
    """`dims`: the tensor's axes, comma-separated ("b, n, s, d"; b batch, s new tokens, p cached ones, n heads, d
    head size, h hidden, m MLP width, V vocabulary, L labels, c choices); `doc`: what the tensor is;
    `docs/hook_names.md` is generated from both. `opt_in`: a point whose tensor is computed only for a listener (it
    costs work and memory of its own), so `run_with_cache` caches it only when named. `lens`: TransformerLens' name
    of a point that lives inside a module spliced into another point (a dictionary's `hook_sae_acts_post`), said
    after each TL name of that point."""

    spliced = None  # a module run on the tensor before any listener (see `splice`)
    # the path that makes this point's tensor runs on every call, listened to or not (see `computed`)
    always = False

    def __init__(self, dims: str, doc: str, opt_in: bool = False, lens: str | None = None):
        super().__init__()
        # plain attributes, set past nn.Module's __setattr__ (a model builds hundreds of points: a 1B Llama 358)
        self.__dict__.update(dims=tuple(part.strip() for part in dims.split(",")), doc=doc, opt_in=opt_in, lens=lens,
                             fn=None)  # fn: set only while a listener is attached

    def __call__(self, x):
        if self.spliced is not None:
            x = self.spliced(x)
        return x if self.fn is None else self.fn(x)

    def splice(self, module) -> None:
        """Run `module` on this point's tensor before its listeners, which then see (and edit) what the module
        returns; None removes it, leaving the point as it was. The module becomes this point's child `sae`, so its
        own hook points are named under this one (`layers.8.out.sae.acts`). A sparse dictionary is spliced so
        (scratch_models/dictionaries/splice.py)."""
        if module is None:
            self._modules.pop("sae", None)
            self.__dict__.pop("spliced", None)
        else:
            self.add_module("sae", module)
            object.__setattr__(self, "spliced", module)

    def listen(self, fn) -> None:
        """Set the listener (None: none). Past nn.Module's __setattr__, which takes ten times as long (a full
        cache sets and clears some 170 listeners per run) and would register a listener that is a module as a
        submodule of the model."""
        object.__setattr__(self, "fn", fn)

    @property
    def active(self) -> bool:
        """Whether anything reads this point's tensor: a listener, or a module spliced in (an opt-in point is then
        computed, as TransformerLens' switch would make it)."""
        return self.fn is not None or self.spliced is not None

    @property
    def computed(self) -> bool:
        """Whether the layer makes this point's tensor on this call: someone listens, or the point is made
        `always` (a model loaded with transformer_lens=True sets it on its attention's scores and probabilities, so
        a call with a cache or attention hooks takes the path a plain call takes and gives its logits bitwise, as
        TransformerLens' bridge does)."""
        return self.always or self.fn is not None

    @property
    def described(self) -> str:
        """The doc with its shape in front: "[b, n, s, d] queries, per head"."""
        return f"[{', '.join(self.dims)}] {self.doc}"
