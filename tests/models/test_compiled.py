"""The compiled path (scratch_models.decoding.compiled): torch.compile of our models with the hook points idle makes one
graph; a hook attached later is never met by a stale graph; frozen weights edited in place are refused; the
compiled forward and the compiled decoding step over a static KV cache follow eager float32 within the bound below.

Compiling takes seconds even for these tiny models, so the tests are few and each compiles as little as it can.
"""

import pytest
import torch

from helpers import assert_parity, sighted
from scratch_models import BertForMaskedLM
from scratch_models.decoding.compiled import StaticKVCache, compile_model
from scratch_models.registry.families import FAMILIES
from scratch_models.parts.kv_cache import KVCache
from test_edges import VOCAB, lm, padded, saved  # noqa: F401 (saved: a fixture)

CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
# Compiling costs tens of seconds per family and graph on a 2-core machine, so the compiled path is run on the
# families that between them hold every part the compiler meets: an encoder with token types and learned positions
# (BERT), Conv1D and a tied head (GPT-2), and rotary angles, grouped key/value heads, RMSNorm, a gated MLP,
# sliding-window layers and soft caps (Gemma 2). Every family's eager path is held to transformers elsewhere, and
# the static cache's decoding (eager) runs on every causal family below.
COMPILED = [name for name in ("bert", "gpt2", "gemma2") if name in FAMILIES]
COMPILED_CAUSAL = [name for name in COMPILED if FAMILIES[name].causal]

# Compiled against eager float32, and against transformers: Inductor fuses and reorders sums, so the last bits
# differ (worst seen here ~2e-6 on logits of magnitude ~10, on BERT-base and GPT-2 124M with random weights 3.6e-6:
# scripts/benchmark.py prints it for every case as max_diff, against transformers); assert_parity's bound (from
# the sizes summed and the magnitude of what is compared) holds them.


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with no compiled code and no recompile counted, as a user's process would."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family", COMPILED)
def test_idle_hook_points_make_one_graph_that_follows_eager_and_transformers(saved, family):
    """No graph break on a batch padded on the left, on the right and all through (fullgraph=True would raise at
    one); the compiled logits follow eager float32 within assert_parity's bound, and transformers wherever a query sees
    a key."""
    directory, reference = saved[family]
    model = lm(family).from_pretrained(directory)
    inputs = padded(family)
    explained = torch._dynamo.explain(model)(**inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, dynamic=False)(**inputs).logits
        eager = model(**inputs).logits
        theirs = reference(**inputs).logits
    assert bool(compiled.isfinite().all())
    assert_parity(compiled, eager, "compiled logits against eager")
    seen = sighted(family, inputs["attention_mask"])
    assert_parity(compiled[seen], theirs[seen], "compiled logits against transformers")


def zero_layer_1_mlp(tensor, name):
    return torch.zeros_like(tensor)


def test_a_hook_attached_after_torch_compile_is_seen_not_stale(saved):
    """Plain torch.compile: its guard on each hook point's `fn` fails once a hook is attached, so the call is
    traced again with the hook in it; detached, the first graph serves again."""
    model = BertForMaskedLM.from_pretrained(saved["bert"][0])
    compiled = torch.compile(model, dynamic=False)
    inputs = padded()
    with torch.no_grad():
        idle = compiled(**inputs).logits
        with model.hooks([("layers.1.mlp.post_act", zero_layer_1_mlp)]):
            hooked = compiled(**inputs).logits
            eager_hooked = model(**inputs).logits
        again = compiled(**inputs).logits
    assert not torch.allclose(hooked, idle, atol=1e-2)
    assert_parity(hooked, eager_hooked, "hooked, compiled against eager")
    assert torch.equal(again, idle)


def test_compile_model_runs_a_listening_call_eagerly_and_compiles_nothing_for_it(saved):
    """compile_model's wrapper: a call with any hook point listening is the eager model's call (bitwise) and
    compiles nothing; so is run_with_cache with hooks of its own; idle calls run the compiled graph."""
    model = lm("gpt2").from_pretrained(saved["gpt2"][0])
    fast = compile_model(model)
    inputs = padded("gpt2")
    with torch.no_grad():
        idle = fast(**inputs).logits
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        with model.hooks([("layers.1.mlp.post_act", zero_layer_1_mlp)]):
            assert fast.listening()
            assert torch.equal(fast(**inputs).logits, model(**inputs).logits)
        hooks = [("layers.1.mlp.post_act", zero_layer_1_mlp)]
        out, cache = fast.run_with_cache(**inputs, names=["layers.0.attn.probs"], hooks=hooks)
        eager_out, eager_cache = model.run_with_cache(**inputs, names=["layers.0.attn.probs"], hooks=hooks)
        assert torch.equal(out.logits, eager_out.logits)
        assert torch.equal(cache["layers.0.attn.probs"], eager_cache["layers.0.attn.probs"])
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames
        assert not fast.listening()
        assert torch.equal(fast(**inputs).logits, idle)
    assert fast.hook_names() == model.hook_names() and fast.config is model.config


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_compiled_run_with_cache_follows_eager_and_compiles_once_per_set_of_names(saved):
    """run_with_cache asked only to cache runs one compiled graph per set of names (no graph break: the wrapper
    compiles with fullgraph=True): the same names in the same order as eager, each tensor within assert_parity's bound
    of eager's, on a batch padded left, right and all through; a subset with an opt-in point compiles once more;
    afterwards no hook point listens and an idle call is the idle graph's. On GPT-2: the wrapper is the same for
    every family, and a graph with Gemma 2's every point as an output takes two minutes to compile (its compiled
    forward and generate are tested here)."""
    family = "gpt2"
    model = lm(family).from_pretrained(saved[family][0])
    fast = compile_model(model, freeze=True)
    inputs = padded(family)
    with torch.no_grad():
        idle = fast(**inputs).logits
        before = graphs()
        out, cache = fast.run_with_cache(**inputs)
        assert graphs() == before + 1
        eager_out, eager_cache = model.run_with_cache(**inputs)
        opt_in = sum(point.opt_in for point in model.hook_points().values())  # attn.result, the norms' scale...
        assert list(cache) == list(eager_cache) and len(cache) == len(model.hook_names()) - opt_in
        for name, tensor in eager_cache.items():
            assert_parity(cache[name], tensor, f"compiled cache {name}")
        assert_parity(out.logits, eager_out.logits, "compiled caching logits")
        assert torch.equal(cache.input_ids, inputs["input_ids"]) and cache.model is model
        _, again = fast.run_with_cache(**inputs)
        assert graphs() == before + 1 and all(torch.equal(again[n], cache[n]) for n in cache)

        names = ["layers.0.attn.probs", "layers.1.attn.result", "layers.1.out"]  # attn.result: opt-in
        _, subset = fast.run_with_cache(**inputs, names=names)
        _, eager_subset = model.run_with_cache(**inputs, names=names)
        assert list(subset) == list(eager_subset) == names
        for name in subset:
            assert_parity(subset[name], eager_subset[name], f"compiled cache {name}")
        assert graphs() == before + 2
        assert not fast.listening()
        assert torch.equal(fast(**inputs).logits, idle)


def test_compiled_run_with_cache_leaves_no_hook_behind_and_falls_back_to_eager_for_gradients(saved):
    """An unknown name and a forward pass that raises both leave every hook point idle, and a refused input raises
    the model's own ValueError through the wrapper; incl_bwd (gradients) runs the eager run_with_cache, bitwise,
    and so does metric without incl_bwd's error."""
    model = lm("bert").from_pretrained(saved["bert"][0])
    fast = compile_model(model)
    inputs = padded()
    with pytest.raises(ValueError, match="unknown hook point 'layers.0.mlp.outt'"):
        fast.run_with_cache(**inputs, names=["layers.0.mlp.outt"])
    assert not fast.listening()
    floats = dict(inputs, input_ids=inputs["input_ids"].float())
    for call in (fast, fast.run_with_cache):  # the model's own error, not Dynamo's report of it
        with pytest.raises(ValueError, match="input_ids must hold integers"):
            call(**floats)
        assert not fast.listening()

    def metric(out):
        return out.logits[:, 1, 3].sum()

    names = ["layers.0.out", "layers.1.mlp.post_act"]
    _, cache = fast.run_with_cache(**inputs, names=names, incl_bwd=True, metric=metric)
    _, eager = model.run_with_cache(**inputs, names=names, incl_bwd=True, metric=metric)
    assert list(cache) == list(eager) and all(torch.equal(cache[n], eager[n]) for n in eager)
    with pytest.raises(ValueError, match="metric is used only with incl_bwd=True"):
        fast.run_with_cache(**inputs, metric=metric)


@pytest.mark.parametrize("family", COMPILED)
def test_compile_model_refuses_bad_values_with_the_models_own_error(saved, family):
    """An id past the vocabulary, a position past the table, an additive mask: a compiled graph cannot check values,
    and a parallel CPU kernel that indexes out of bounds aborts the process (pytorch/pytorch#195402), so the wrapper
    makes the model's checks on values first and raises its ValueError naming the entry, for calls and for
    run_with_cache alike; with gradients on as well as off. Good inputs are unaffected."""
    model = lm(family).from_pretrained(saved[family][0])
    fast = compile_model(model)
    inputs = padded(family)
    vocab = model.config.vocab_size
    positions = getattr(model.config, FAMILIES[family].positions_field)
    bad = {
        rf"input_ids\[2, 5\] = {vocab} is out of range: must be 0 <= id < vocab_size = {vocab}":
            dict(inputs, input_ids=inputs["input_ids"].index_put((torch.tensor(2), torch.tensor(5)),
                                                                 torch.tensor(vocab))),
        rf"position_ids\[0, 8\] = {positions} is out of range":
            dict(inputs, position_ids=torch.arange(1, 10)[None, :] + positions - 9),
        r"attention_mask\[1, 0\] = -10000 is not 1 \(attend\) or 0":
            dict(inputs, attention_mask=inputs["attention_mask"].masked_fill(inputs["attention_mask"] == 0, -10000)),
    }
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            expected = fast(**inputs).logits
            for message, arguments in bad.items():
                for call in (fast, fast.run_with_cache):
                    with pytest.raises(ValueError, match=message):
                        call(**arguments)
            assert torch.equal(fast(**inputs).logits, expected)
            assert not fast.listening()


def test_frozen_weights_edited_in_place_are_refused_and_unfrozen_ones_are_followed(saved):
    """freeze=True folds the weights into the compiled code: after an in-place edit the next call raises, naming
    the weight, instead of computing with the old one. An edit through `.data` escapes the tensor's version
    counter and so the check: the frozen graph then still computes with the old weights (which shows they are
    folded in; the README says so). Without freezing the weights stay inputs of the graph and an edit is seen."""
    inputs = padded()
    for freeze in (True, False):
        model = BertForMaskedLM.from_pretrained(saved["bert"][0])
        fast = compile_model(model, freeze=freeze)
        with torch.no_grad():
            before = fast(**inputs).logits
            model.layers[1].mlp.down.weight.data.mul_(2.0)
            edited = model(**inputs).logits
            assert not torch.allclose(edited, before, atol=1e-2)
            if freeze:
                assert torch.equal(fast(**inputs).logits, before)
            else:  # the doubled weights make larger logits, so the bound scales with them (2.2e-5 seen)
                assert_parity(fast(**inputs).logits, edited, "after a .data edit")
            model.layers[1].mlp.down.weight.mul_(0.5)
            if freeze:
                with pytest.raises(RuntimeError, match=r"layers\.1\.mlp\.down\.weight was modified in place"):
                    fast(**inputs)
            else:
                assert_parity(fast(**inputs).logits, model(**inputs).logits, "after an edit")


@pytest.mark.parametrize("family", COMPILED_CAUSAL)
def test_compiled_generate_gives_the_eager_tokens(saved, family):
    """Greedy decoding over the static KV cache, left-padded prompts of three lengths: the tokens of eager
    generate, which equal transformers' (test_families.py); a longer generation that needs a larger cache too.
    With a hook listening, generate decodes eagerly and the hook acts."""
    model = lm(family).from_pretrained(saved[family][0])
    fast = compile_model(model)
    ids = torch.randint(1, VOCAB - 1, (3, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :5] = 0, 0
    for new in (9, 17, 9):  # a cache of 16 columns, of 32, then 16 again: the first graph on new buffers
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=None)
        assert torch.equal(fast.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=None), expected)
    with model.hooks([("layers.1.mlp.post_act", zero_layer_1_mlp)]):
        hooked = model.generate(ids, attention_mask=mask, max_new_tokens=9, eos_token_id=None)
        assert torch.equal(fast.generate(ids, attention_mask=mask, max_new_tokens=9, eos_token_id=None), hooked)


def test_static_kv_cache_writes_one_column_in_place_and_refuses_more():
    """The static cache takes over the buffers, zeroes the columns not written yet (a masked key's weight is 0, and
    0 * NaN from uninitialised memory is NaN), writes a step's token into column `slot`, offers every column as a
    key, and refuses a step of several tokens."""
    cache = KVCache(num_layers=1, capacity=4)
    k = torch.randn(2, 3, 2, 5)
    cache.update(0, k, k + 1)
    cache.advance(2)
    cache.keys[0][:, :, 2:] = float("nan")
    cache.values[0][:, :, 2:] = float("inf")
    static = StaticKVCache(cache)
    assert static.length == 3 and static.capacity == 4
    assert not bool(cache.keys[0][:, :, 2:].any()) and not bool(cache.values[0][:, :, 2:].any())
    static.slot.fill_(2)
    new = torch.randn(2, 3, 1, 5)
    keys, values = static.update(0, new, new + 1)
    assert keys.data_ptr() == cache.keys[0].data_ptr() and keys.shape == (2, 3, 4, 5)
    assert torch.equal(keys[:, :, :2], k) and torch.equal(keys[:, :, 2:3], new)
    assert torch.equal(values[:, :, 2:3], new + 1) and not bool(values[:, :, 3:].any())
    with pytest.raises(ValueError, match="one new token per step, got 2"):
        static.update(0, k, k)


@pytest.mark.parametrize("family", CAUSAL)
def test_static_decoding_scores_every_step_as_the_growing_cache_does(saved, family):
    """The static cache's new token sits at column `slot`, not at its end: a sliding-window layer (Gemma 2's first)
    counts its window back from there. Each step's scores over the static cache, run eagerly (the graph's
    arithmetic is the compiled tests' business), against the growing cache's, past the window."""
    from scratch_models.decoding.compiled import StaticDecoding
    from scratch_models.decoding.generation import CachedDecoding

    model = lm(family).from_pretrained(saved[family][0])
    ids = torch.randint(1, VOCAB - 1, (3, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :5] = 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    def step(model, cache, ids, positions, keys):
        return model(ids, attention_mask=keys, position_ids=positions, past_key_values=cache, logits_to_keep=1,
                     return_type="output").logits[:, -1].float()

    growing, static = CachedDecoding(model, mask, 16), StaticDecoding(model, step, mask, 16)
    with torch.no_grad():
        for _ in range(10):
            expected = growing(ids, positions)
            assert_parity(static(ids, positions), expected, f"{family} step at positions {positions[:, -1].tolist()}")
            ids, positions = expected.argmax(-1)[:, None], positions[:, -1:] + 1


def test_a_call_in_another_thread_waits_while_a_compiled_cache_listens(saved):
    """While run_with_cache's recorders listen on the model's hook points, a call in another thread would see a
    listening model, run it eagerly, and be heard: its tensors would land in that cache. The wrapper's calls take
    turns: the second call waits until the cache is taken, and each gets its own tensors."""
    import threading

    model = lm("gpt2").from_pretrained(saved["gpt2"][0])
    fast = compile_model(model)
    mine = padded("gpt2")
    other = dict(mine, input_ids=mine["input_ids"].flip(1))
    _, expected = fast.run_with_cache(**mine, names=["layers.0.out"])  # compiles both graphs: grad mode is
    other_logits = fast(**other).logits  # per thread, so the threads below run as this one does
    inside, release = threading.Event(), threading.Event()
    compiled_forward = fast._compiled_forward

    def held(*args, **kwargs):  # the cache's compiled call, paused with its recorders listening
        inside.set()
        release.wait(10)
        return compiled_forward(*args, **kwargs)

    fast._compiled_forward = held
    caches, logits = [], []
    first = threading.Thread(target=lambda: caches.append(fast.run_with_cache(**mine, names=["layers.0.out"])[1]))
    second = threading.Thread(target=lambda: logits.append(fast(**other).logits))
    first.start()
    assert inside.wait(10)
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second call ran while the first one's recorders listened"
    release.set()
    first.join(30)
    second.join(30)
    assert torch.equal(caches[0]["layers.0.out"], expected["layers.0.out"])
    assert torch.equal(logits[0], other_logits) and not fast.listening()


def test_frozen_and_unfrozen_calls_in_two_threads_leave_inductors_freezing_as_it_was(saved):
    """inductor's `freezing` is process-wide. A frozen call in one thread and an unfrozen one in another, the second
    started while the first runs: each sees its own setting, and the setting is off afterwards. Patched and restored
    out of order it would stay on, and every later compile would bake its weights in unseen."""
    import threading

    import torch._inductor.config as inductor

    model = lm("bert").from_pretrained(saved["bert"][0])
    frozen, unfrozen = compile_model(model, freeze=True), compile_model(model)
    seen, inside = [], threading.Event()
    release = threading.Event()

    def frozen_call():
        inside.set()
        release.wait(10)
        seen.append(("frozen", inductor.freezing))

    first = threading.Thread(target=frozen.run_compiled, args=(frozen_call,))
    second = threading.Thread(target=unfrozen.run_compiled,
                              args=(lambda: seen.append(("unfrozen", inductor.freezing)),))
    first.start()
    inside.wait(10)
    second.start()
    second.join(0.2)  # it waits for the frozen call to end
    release.set()
    first.join(10)
    second.join(10)
    assert seen == [("frozen", True), ("unfrozen", False)]
    assert inductor.freezing is False
