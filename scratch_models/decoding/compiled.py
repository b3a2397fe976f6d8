"""Speed machinery beside the models: torch.compile with the hook points idle, and a static KV cache for decoding.

The models stay the reference, eager and exact; this module only changes how they are run.

    fast = compile_model(GPT2LMHeadModel.from_pretrained("gpt2", dtype=torch.bfloat16), freeze=True)
    fast(input_ids).logits                          # the compiled forward pass
    fast.generate(input_ids, max_new_tokens=50)     # a compiled decoding step over a static KV cache
    fast.run_with_cache(input_ids)                  # one compiled graph that also hands back every activation
    fast.run_with_hooks(input_ids, hooks=[...])     # hook points listening: the model as written, eagerly

Hook points: idle, each is one attribute test that torch.compile resolves while tracing, so the whole forward is
one graph (no graph break). A listening hook point never meets a stale graph: the wrapper runs the eager model
for any call with a hook listening, and compiles nothing for it; the one exception is `run_with_cache` asked only
to cache, which compiles a graph of its own (CompiledModel.run_with_cache). (Compiling a model with plain
`torch.compile` works too: its guard on each hook point's `fn` sees a hook attached later and recompiles, a few
seconds for each new set of hooks, up to torch's recompile limit, after which that call runs eagerly.)

Parity: not bitwise. Compiled code fuses and reorders operations, so its sums round differently: the README's
performance section gives the bounds measured against eager float32 and against transformers.
"""

import functools
import inspect
import threading

import torch
import torch._inductor.config

from ..hooking.hooked_model import activation_cache, names_to_cache
from ..parts.attention import causal_mask
from ..parts.kv_cache import KVCache
from .generation import CachedDecoding, GenerationMixin


def compile_model(model, *, freeze: bool = False) -> "CompiledModel":
    """Wrap `model` (any of our models) so its calls run compiled by torch.compile (inductor), shapes static.

    `freeze=True` (inference only) lets inductor fold the weights into the compiled code as constants and lay
    them out for the CPU's matrix kernels (oneDNN's prepacking): faster for small batches, but the weights are
    then baked in, so a later in-place edit of a weight raises an error at the next call instead of being
    silently ignored (compile again after editing). Each new input shape compiles once (seconds to a minute).
    """
    wrapper = CompiledLM if isinstance(model, GenerationMixin) else CompiledModel
    return wrapper(model, freeze)


class CompiledModel:
    """A model's compiled forward pass; every other attribute (hook_names, run_with_cache, config, ...) is the
    model's own, and so is any call made while a hook point listens."""

    def __init__(self, model, freeze: bool):
        self.model = model
        self.freeze = freeze
        self._points = model.hook_points()  # the model's tree is taken as built
        self._weights = [(name, t, t._version) for name, t in (*model.named_parameters(), *model.named_buffers())]
        self._settings = _inductor_settings(model, freeze)
        self._forward = torch.compile(model, dynamic=False, fullgraph=True)
        self._recorded: dict[str, torch.Tensor] = {}  # run_with_cache's: what the recorders heard in one call
        self._recorders: dict[str, _Recorder] = {}
        # The wrapper's calls take turns: while run_with_cache's recorders listen on the model's hook points, any
        # other run of the model would be heard too, and its tensors would land in that cache.
        self._turns = threading.RLock()

    def __call__(self, *args, **kwargs):
        with self._turns:
            if self.listening():
                return self.model(*args, **kwargs)
            return self._compiled_forward(*args, **kwargs)

    def _compiled_forward(self, *args, **kwargs):
        """The compiled forward pass, after the model's checks on the values of its arguments, which the graph
        cannot hold: without them an id past a table is read out of bounds, and a compiled CPU kernel aborts the
        whole process on it (pytorch/pytorch#195402). A call the model refuses while Dynamo traces it (a
        ValueError naming the argument at fault) is reported by Dynamo as `Unsupported: Observed exception`: such
        a call runs eagerly instead, so the model's own error is what is raised."""
        self.model.check_input_values(*args, **kwargs)
        try:
            return self.run_compiled(self._forward, *args, **kwargs)
        except torch._dynamo.exc.Unsupported:
            return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def run_with_cache(self, *args, names=None, hooks=(), incl_bwd: bool = False, metric=None, **kwargs):
        """The model's `run_with_cache`, compiled when it only caches (no `hooks`, no `incl_bwd`, no hook listening
        already): each hook point named listens with a recorder of its own, kept for the model's life, so Dynamo
        traces one graph per input shape and set of names that returns those tensors beside the output (a point
        such as `attn.probs` takes the explicit attention path in it, as it does eagerly). The values are the
        compiled graph's, within the compiled forward's bounds of the eager ones, not bitwise. Anything else is the
        model's own run_with_cache, eagerly; so is a set of names beyond torch's recompile limit."""
        with self._turns:
            # TransformerLens' options (names_filter, fwd_hooks, return_type, ...: not the forward's) and text run
            # eagerly too
            forward = inspect.signature(self.model.forward).parameters
            if (hooks or incl_bwd or metric is not None or self.listening() or kwargs.keys() - forward.keys()
                    or not all(isinstance(a, torch.Tensor) for a in args)):
                return self.model.run_with_cache(*args, names=names, hooks=hooks, incl_bwd=incl_bwd, metric=metric,
                                                 **kwargs)
            points = self._points
            wanted = names_to_cache(self.model, names)
            try:
                for name in wanted:
                    points[name].listen(self._recorders.setdefault(name, _Recorder(name, self._recorded)))
                output = self._compiled_forward(*args, **kwargs)
                cache = {name: self._recorded[name].detach() for name in wanted if name in self._recorded}
            finally:
                for name in wanted:
                    points[name].listen(None)
                self._recorded.clear()
        return output, activation_cache(self.model, cache, args, kwargs)

    def listening(self) -> bool:
        """Whether a hook point of the model has a listener: calls then run the eager model."""
        return any(point.fn is not None for point in self._points.values())

    def run_compiled(self, fn, *args, **kwargs):
        """Call a compiled function of this model. torch.compile(options=) does not reach Dynamo, which reads
        inductor's `freezing` while it traces: the setting is patched in around every call, when any (re)compile
        happens. A frozen graph holds the weights as they were when compiled: it is refused on edited ones.

        `freezing` is process-wide, so compiled calls take turns (_FREEZING): two threads patching and restoring it
        out of order could leave it on for good, and every later compile would bake its weights in unseen. A
        torch.compile of another library's running in another thread during a frozen call would still see it on."""
        if self.freeze:
            for name, tensor, version in self._weights:
                if tensor._version != version:
                    raise RuntimeError(f"{name} was modified in place after compile_model(..., freeze=True) baked "
                                       "the weights into the compiled code; compile the model again")
        with _FREEZING, torch._inductor.config.patch(self._settings):
            return fn(*args, **kwargs)


_FREEZING = threading.Lock()  # held while a compiled call has inductor's settings patched


class _Recorder:
    """A hook point's listener that puts its tensor in `recorded` under the point's name. Dynamo traces the dict
    write as a side effect, so the compiled graph returns the tensor and the write happens after it runs."""

    def __init__(self, name: str, recorded: dict):
        self.name, self.recorded = name, recorded

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.recorded[self.name] = x
        return x


def _inductor_settings(model, freeze: bool) -> dict:
    """What inductor is told for `model`'s compiled calls. On CPU: `cpp_wrapper`, the graph's kernels called from
    generated C++ rather than Python, and with frozen weights `cpp.enable_concat_linear`, which turns the linear
    layers that read the same input (q, k and v) into one GEMM: a bigger matrix streams its weights faster. Each
    took about 0.5 ms off a 10 ms BERT-base b1xs16 bfloat16 forward pass here."""
    cpu = next(model.parameters()).device.type == "cpu"
    return {"freezing": freeze, "cpp_wrapper": cpu, "cpp.enable_concat_linear": cpu and freeze}


class CompiledLM(CompiledModel, GenerationMixin):
    """A language model's compiled forward pass, and `generate` with a compiled decoding step: the prompts run
    eagerly, then every new token runs one graph over a static KV cache (see StaticDecoding)."""

    def __init__(self, model, freeze: bool):
        super().__init__(model, freeze)
        self._step = torch.compile(_decoding_step, dynamic=False, fullgraph=True)

    def generate(self, *args, **kwargs):
        """GenerationMixin.generate, taking its turn among the wrapper's calls."""
        with self._turns:
            return super().generate(*args, **kwargs)

    def decoding(self, attention_mask: torch.Tensor, capacity: int) -> CachedDecoding:
        eager = self.model.decoding(attention_mask, capacity)
        # a family that decodes its own way (Phi-3 under LongRoPE feeds the sequence again where its angles switch)
        # keeps its way, eagerly: one graph over a static cache cannot
        if self.listening() or type(eager) is not CachedDecoding:
            return eager
        return StaticDecoding(self.model, functools.partial(self.run_compiled, self._step), attention_mask, capacity)


def _decoding_step(model, cache: "StaticKVCache", ids, positions, keys):
    return model(ids, attention_mask=keys, position_ids=positions, past_key_values=cache, logits_to_keep=1,
                 return_type="output").logits[:, -1].float()


class StaticKVCache(KVCache):
    """A KV cache whose tensors never change shape, so one compiled graph serves every decoding step (the
    gpt-fast recipe).

    It takes over a KVCache's buffers [b, n, capacity, d]. Each step writes its one new token into column `slot`
    (a tensor, so the graph does not depend on its value) and offers every column as a key: to the model the cache
    holds `capacity - 1` tokens in front of the new one, and the step's attention_mask [b, capacity] says which
    columns hold tokens it may see. The columns not written yet are zeroed first: a masked key gets weight 0, and
    0 times the NaN that uninitialised memory may hold would still be NaN.
    """

    def __init__(self, cache: KVCache):
        super().__init__(len(cache.keys))
        self.keys, self.values = cache.keys, cache.values
        for buffer in (*self.keys, *self.values):
            buffer[:, :, cache.length:].zero_()
        self.capacity = cache.keys[0].shape[2]
        self.length = self.capacity - 1
        self.slot = torch.zeros(1, dtype=torch.long, device=cache.keys[0].device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if k.shape[2] != 1:
            raise ValueError(f"a StaticKVCache takes one new token per step, got {k.shape[2]}")
        self.keys[layer].index_copy_(2, self.slot, k)
        self.values[layer].index_copy_(2, self.slot, v)
        return self.keys[layer], self.values[layer]

    def advance(self, num_tokens: int) -> None:
        """Nothing to count: the caller moves `slot`."""

    def window_mask(self, attention_mask, seq, window, device):
        """The new token sits at column `slot`, not at the end: a sliding-window layer's query sees the written
        columns after slot - window (attention_mask [b, capacity] marks those written)."""
        columns = torch.arange(self.capacity, device=device)
        return causal_mask(attention_mask & (columns > self.slot - window), seq, self.length, device)


class StaticDecoding(CachedDecoding):
    """CachedDecoding whose steps after the prompts all run one compiled graph.

    The capacity is rounded up to a power of two, so generations of similar lengths share their graph (another
    capacity or batch size compiles once more); the columns past the last token are masked, and attending over
    them costs little next to reading the weights.
    """

    def __init__(self, model, step, attention_mask: torch.Tensor, capacity: int):
        capacity = 1 << (capacity - 1).bit_length()
        super().__init__(model, attention_mask, capacity)
        self.step = step
        self.columns = torch.arange(capacity, device=attention_mask.device)
        if self.mask is None:
            self.mask = attention_mask.new_ones(attention_mask.shape[0], capacity)
        self.static = None  # the prompts fill the cache first

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.static is None:  # the prompts: their length varies from call to call, so they run eagerly
            scores = super().__call__(ids, positions)
            self.static = StaticKVCache(self.cache)
            return scores
        self.static.slot.fill_(self.length)
        self.length += 1
        keys = self.mask.bool() & (self.columns < self.length)
        return self.step(self.model, self.static, ids, positions, keys)
