"""Numbers at the edges, where a wrong answer would be silent: queries that see no key in half precision, graphs
captured by torch.jit.trace and torch.export, hooks that return another tensor, what a forward keeps alive, and
loading beside other threads.

Gradients through padded batches are in test_training.py; verify in half precision in test_verify.py.
"""

import threading
import weakref

import pytest
import torch

from helpers import assert_parity, blind_zeroed, each_device, each_family, padded_batch, reference, save
from scratch_models import BertModel
from scratch_models.registry.families import FAMILIES


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every family's LM, random, saved by transformers, with its (eager) reference."""
    out = {}
    for family in FAMILIES:
        theirs = reference(family, attention="eager")
        out[family] = save(theirs, tmp_path_factory.mktemp(family)), theirs
    return out


def padded(family: str = "bert", seq: int = 9) -> dict:
    """Four rows: full, left-padded, right-padded, all padding."""
    return padded_batch(family, seq)


def lm(family: str):
    return FAMILIES[family].lm


# ------------------------------------------------------------------------------------------- half precision


def scores_pushed_down(model) -> list:
    """Hooks that hold every query at +4 and every key at -4 in each dimension: every score is -4 * 4 * 16 / 4
    = -64, below -16, where adding float16's most negative number (-65504) overflows to -inf. (Through the
    tensors, so the weights before them still get their gradient, 0.)"""
    return [hook for i in range(len(model.layers)) for hook in (
        (f"layers.{i}.attn.q", lambda t, name: t * 0 + 4), (f"layers.{i}.attn.k", lambda t, name: t * 0 - 4))]


def run_pushed(directory, family: str, dtype, explicit: bool, device: str = "cpu"):
    """Forward (hidden states, logits, attentions), the gradient of every parameter, scores pushed down, and a
    mixture's routing (hook name -> the chosen experts, or the router's probabilities)."""
    model = lm(family).from_pretrained(directory, dtype=dtype, device=device)  # eval mode: no dropout
    routing = {}

    def record(tensor, name):
        routing[name] = tensor.detach().float().softmax(-1) if name.endswith("logits") else tensor

    routers = [(name, record) for name in model.hook_names() if name.endswith(("mlp.chosen", "mlp.router_logits"))]
    with model.hooks(scores_pushed_down(model) + routers):
        out = model(**{k: v.to(device) for k, v in padded(family).items()}, output_hidden_states=True,
                    output_attentions=explicit)
    out.logits.float().pow(2).mean().backward()
    # a mixture's expert no token went to takes no part in the pass: no gradient (None), its exact one 0
    return out, {name: torch.zeros_like(p) if p.grad is None and ".experts." in name else p.grad
                 for name, p in model.named_parameters()}, routing


def rerouted(routing: dict, exact: dict, eps: float) -> torch.Tensor:
    """[b] the rows where a mixture chose other experts than in the float32 run, at some token of some layer. Each
    such token must be a near tie in float32 (its k-th and (k+1)-th router probabilities within 8 eps of the half
    dtype apart), which rounding may order either way: a choice that differs elsewhere is a fault."""
    rows = torch.zeros(len(padded()["input_ids"]), dtype=torch.bool)
    for name in (name for name in exact if name.endswith("chosen")):
        k = exact[name].shape[-1]
        moved = (routing[name].cpu().sort(-1).values != exact[name].sort(-1).values).any(-1)  # [b, s]
        top = exact[name.replace("chosen", "router_logits")].sort(-1, descending=True).values
        margin = top[..., k - 1] - top[..., k]
        assert bool((margin[moved] <= 8 * eps).all()), f"{name}: other experts chosen at a margin of " \
                                                         f"{margin[moved].max():.2e}, not a near tie"
        rows |= moved.any(-1)
    return rows


# Half against float32, normwise: max |half - fp32| <= HALF_EPS x eps(dtype) x max |fp32|, per tensor (per
# gradient: against the largest gradient of any parameter, as many are near zero). Worst seen: 1.9 eps forward,
# 3.0 eps for gradients (BERT, float16, fused). Forwards that is assert_parity's bound for half with one stage.
HALF_EPS = 8


@each_device
@each_family
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_is_finite_everywhere_and_follows_float32_on_both_paths(saved, family, dtype, device):
    """Scores far below zero and queries that see no key (left padding, a row of padding): no NaN or inf in any
    output or gradient, on either path, and both paths follow the float32 run, forwards and backwards.
    transformers' eager attention gives NaN here in float16."""
    directory, _ = saved[family]
    exact, exact_grads, exact_routing = run_pushed(directory, family, torch.float32, explicit=True)
    top_grad = max(float(g.abs().max()) for g in exact_grads.values())
    eps = torch.finfo(dtype).eps
    for explicit in (False, True):
        path = "explicit" if explicit else "fused"
        out, grads, routing = run_pushed(directory, family, dtype, explicit, device)
        # a mixture that chose other experts at a near tie computes another function there: its rows are compared
        # no further, and its gradients not at all
        same = ~rerouted(routing, exact_routing, eps)
        tensors = {**{f"hidden_states[{i}]": t for i, t in enumerate(out.hidden_states)}, "logits": out.logits,
                   **{f"attentions[{i}]": t for i, t in enumerate(out.attentions or ())}}
        for name, tensor in tensors.items():
            assert bool(tensor.isfinite().all()), f"{path} {name}: not finite"
        for name, grad in grads.items():
            assert bool(grad.isfinite().all()), f"{path} gradient of {name}: not finite"
        for name, (half, ref) in {"logits": (out.logits, exact.logits), **{
                f"hidden_states[{i}]": pair for i, pair in enumerate(zip(out.hidden_states, exact.hidden_states))}
                                  }.items():
            assert_parity(half.detach().float().cpu()[same], ref.detach()[same], f"{path} {name}", depth=1,
                          dtype=dtype)
        for name, grad in grads.items() if same.all() else ():
            diff = float((grad.float().cpu() - exact_grads[name]).abs().max())
            assert diff <= HALF_EPS * eps * top_grad, f"{path} gradient of {name}: |diff| {diff:.3e}"


@each_family
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_follows_float32_where_queries_see_keys(saved, family, dtype):
    """The same model, weights as drawn, in float32 and in half, on the explicit path. A mixture that routes in the
    model's dtype (GPT-OSS, as transformers does) may send a token whose best router logits lie within rounding of
    each other to another expert in half precision, as transformers' does too: the half model is routed as float32
    chose (its `mlp.chosen`), and the rest follows float32."""
    directory, _ = saved[family]
    inputs = padded(family)
    with torch.no_grad():
        model = lm(family).from_pretrained(directory)
        routing = [name for name in model.hook_names() if name.endswith("mlp.chosen")]
        out, chosen = model.run_with_cache(**inputs, names=routing, output_attentions=True)
        half = lm(family).from_pretrained(directory, dtype=dtype).run_with_hooks(
            **inputs, hooks=[(name, lambda _, name: chosen[name]) for name in routing], output_attentions=True).logits
    assert_parity(half.float(), out.logits, f"{dtype} logits", depth=1, dtype=dtype)


@pytest.mark.parametrize("family", [name for name in FAMILIES if getattr(
    __import__("transformers"), FAMILIES[name].lm.__name__)._supports_sdpa])
def test_the_stand_in_for_sdpa_is_sdpa_where_a_class_has_both(family):
    """What the tests hold our fused path to in a transformers class without SDPA (Gemma 2's: helpers.blind_zeroed,
    the class's eager attention with the queries that see no key given 0), run on a class that has SDPA: its SDPA
    numbers on a batch padded left, right and all through, at every query, blind ones included."""
    theirs = reference(family, attention="sdpa")
    inputs = padded(family)
    with torch.no_grad():
        sdpa = theirs(**inputs, output_hidden_states=True)
        theirs.set_attn_implementation(blind_zeroed())
        stand_in = theirs(**inputs, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(stand_in.hidden_states, sdpa.hidden_states)):
        assert_parity(a, b, f"{family} hidden_states[{i}]")
    assert_parity(stand_in.logits, sdpa.logits, f"{family} logits")


# ------------------------------------------------------------------------------------ tracing and exporting


class Traced(torch.nn.Module):
    """What a user traces: ids and mask in, one tensor out."""

    def __init__(self, model, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, input_ids, attention_mask):
        return getattr(self.model(input_ids, attention_mask=attention_mask), self.field)


def traceable(saved, family: str) -> Traced:
    return Traced(lm(family).from_pretrained(saved[family][0]), "logits").eval()


VOCAB = FAMILIES["bert"].tiny().vocab_size  # every family's tiny config has this vocabulary


def inputs_of(kind: str, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(batch, seq, dtype=torch.long)
    if kind == "padded":
        mask[-1, :seq // 2] = 0  # left padding in the last row
        mask[0, seq - 2:] = 0  # right padding in the first
    return ids, mask


# The trace warns where the input checks compare shapes with Python (frozen checks, not math), and that
# torch.jit.trace is deprecated.
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
@each_family
@pytest.mark.parametrize("example", ["unpadded", "padded"])
def test_jit_trace_equals_eager_on_padded_and_unpadded_inputs(saved, family, example):
    """A trace records the path its example takes; no Python branch on the mask's values may be among them."""
    model = traceable(saved, family)
    with torch.no_grad():
        traced = torch.jit.trace(model, inputs_of(example, 2, 7, 0), check_trace=False)
        for kind in ("unpadded", "padded"):
            for shape in ((2, 7), (3, 11)):
                ids, mask = inputs_of(kind, *shape, seed=1)
                assert_parity(traced(ids, mask), model(ids, mask), f"traced on {example}, run on {kind} {shape}")


@each_family
@pytest.mark.parametrize("example", ["unpadded", "padded"])
def test_torch_export_with_dynamic_batch_and_sequence_equals_eager(saved, family, example):
    from torch.export import Dim, export

    model = traceable(saved, family)
    batch, seq = Dim("batch"), Dim("seq", max=24)
    exported = export(model, inputs_of(example, 2, 7, 0), dynamic_shapes=((batch, seq), (batch, seq))).module()
    with torch.no_grad():
        for kind in ("unpadded", "padded"):
            for shape in ((2, 7), (3, 11), (1, 5)):
                ids, mask = inputs_of(kind, *shape, seed=2)
                assert_parity(exported(ids, mask), model(ids, mask), f"exported on {example}, run on {kind} {shape}")


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_traced_model_does_not_check_values_but_eager_does(saved):
    """Checks on values need a Python branch on the input: a graph cannot hold them, eager still raises."""
    model = traceable(saved, "bert")
    ids, mask = inputs_of("padded", 2, 7, 0)
    with torch.no_grad():
        traced = torch.jit.trace(model, (ids, mask), check_trace=False)
        traced(ids, mask)
    with pytest.raises(ValueError, match=rf"input_ids\[0, 0\] = {VOCAB} is out of range"):
        model(ids.index_fill(1, torch.tensor([0]), VOCAB), mask)


# -------------------------------------------------------------------------------------------------------- hooks


@pytest.mark.parametrize("returned, fragment", [
    (lambda t: t[:, :1], "returned a tensor of shape (4, 1, 48), dtype torch.float32, device cpu; "
                         "layers.0.out holds shape (4, 9, 48), dtype torch.float32, device cpu"),
    (lambda t: t[:1], "shape (1, 9, 48)"),  # would broadcast silently
    (lambda t: t.unsqueeze(0), "shape (1, 4, 9, 48)"),
    (lambda t: t.double(), "dtype torch.float64"),
    (lambda t: t.to("meta"), "device meta"),
], ids=["shorter", "broadcastable", "extra axis", "dtype", "device"])
def test_hook_returning_another_tensor_is_an_error_naming_the_point(saved, returned, fragment):
    model = BertModel.from_pretrained(saved["bert"][0])

    def edit(tensor, name):
        return returned(tensor)

    with pytest.raises(ValueError, match="hook 'edit' on 'layers.0.out'") as error:
        model.run_with_hooks(**padded(), hooks=[("layers.0.out", edit)])
    assert fragment in str(error.value)


def test_hook_returning_something_else_than_a_tensor_is_a_type_error(saved):
    model = BertModel.from_pretrained(saved["bert"][0])
    with pytest.raises(TypeError, match="hook .* on 'layers.1.attn.probs' returned tuple"):
        model.run_with_hooks(**padded(), hooks=[("layers.1.attn.probs", lambda t, name: (t,))])


def test_hooks_that_keep_the_tensor_like_still_chain_and_edit(saved):
    """The neighbours: a same-shape edit, None (no edit), and two hooks on one point, in order."""
    model = BertModel.from_pretrained(saved["bert"][0])
    seen = []
    with torch.no_grad():
        plain = model(**padded()).last_hidden_state
        edited = model.run_with_hooks(**padded(), hooks=[
            ("layers.0.out", lambda t, name: seen.append("first") or t * 2),
            ("layers.0.out", lambda t, name: seen.append("second")),
            ("layers.1.attn.probs", lambda t, name: t.clone())]).last_hidden_state
    assert seen == ["first", "second"]
    assert not torch.allclose(plain, edited)


@each_family
@pytest.mark.parametrize("output_hidden_states", [False, True])
def test_layer_outputs_are_kept_through_the_forward_only_when_hidden_states_are_asked_for(family,
                                                                                         output_hidden_states):
    """Keeping every layer's output costs (layers + 1) x b x s x h at the forward's peak: only
    output_hidden_states pays it. Layer 0's output is dropped once layer 1 has read it."""
    declared = FAMILIES[family]
    model = declared.lm(declared.tiny(**{declared.table.layers_field: 3})).eval()
    first, alive_in_the_last_layer = [], []

    def remember(tensor, name):
        first.append(weakref.ref(tensor))

    def check(tensor, name):
        alive_in_the_last_layer.append(first[0]() is not None)

    with torch.no_grad():
        out = model.run_with_hooks(**padded(family), output_hidden_states=output_hidden_states,
                                   hooks=[("layers.0.out", remember), ("layers.2.out", check)])
    assert alive_in_the_last_layer == [output_hidden_states]
    assert (out.hidden_states is not None) == output_hidden_states


# ------------------------------------------------------------------------------------------------ threads


def test_loading_leaves_torch_init_working_in_other_threads(saved, monkeypatch):
    """While from_pretrained builds its model without init, a module built in another thread is initialised."""
    from scratch_models.bert import model as bert

    building, built_elsewhere = threading.Event(), threading.Event()
    original = bert.BertEmbeddings.__init__

    def pause_while_building(self, config):  # the loader is mid-build: let the other thread work now
        original(self, config)
        building.set()
        assert built_elsewhere.wait(timeout=60)

    monkeypatch.setattr(bert.BertEmbeddings, "__init__", pause_while_building)
    result = {}

    def other_thread():
        assert building.wait(timeout=60)
        torch.manual_seed(0)
        linear = torch.nn.Linear(64, 64)
        weights = torch.zeros(1000)
        torch.nn.init.normal_(weights)
        result["linear std"] = float(linear.weight.detach().std())
        result["normal_ std"] = float(weights.std())
        built_elsewhere.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    model = BertModel.from_pretrained(saved["bert"][0])
    thread.join(timeout=60)
    assert model.loading_info.loaded
    # kaiming-uniform with a=sqrt(5): uniform(-1/8, 1/8) for 64 inputs, std 1/(8 sqrt(3)) = 0.072
    assert 0.06 < result["linear std"] < 0.085, result
    assert 0.9 < result["normal_ std"] < 1.1, result


# -------------------------------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("family", [name for name, family in FAMILIES.items() if family.causal])
def test_a_kv_cache_of_another_depth_or_batch_is_refused_and_left_as_it_was(family):
    """A cache filled by a model of 2 layers, fed to one of 3 (it would index past its layers), or given another
    batch size: a ValueError naming both, and the cache keeps what it held."""
    declared = FAMILIES[family]
    shallow, deep = (declared.lm(declared.tiny(**{declared.table.layers_field: n})).eval() for n in (2, 3))
    ids = padded(family)["input_ids"][:2, :4]
    with torch.no_grad():
        cache = shallow(ids, use_cache=True).past_key_values
        held = [k.clone() for k in cache.keys]
        with pytest.raises(ValueError, match="past_key_values holds 2 layers, but this model has 3"):
            deep(ids[:, :1], past_key_values=cache)
        with pytest.raises(ValueError, match="input_ids has batch size 1, but past_key_values holds 2 rows"):
            shallow(ids[:1, :1], past_key_values=cache)
    assert cache.length == 4 and all(torch.equal(k, h) for k, h in zip(cache.keys, held))


# ------------------------------------------------------------------------------------------------ hook points


@each_family
def test_hook_points_fire_in_the_order_hook_names_lists_them(family):
    """hook_names() is forward order (the compiled cache and stack() rely on it): every point of every class of the
    family fires once per forward, in that order."""
    declared = FAMILIES[family]
    for cls in declared.classes:
        if cls.multiple_choice:
            continue  # [b, c, s] inputs; its base model's points are the base class's
        model = cls(declared.tiny(pad_token_id=declared.tiny().vocab_size - 1)).eval()
        fired = []
        with torch.no_grad():
            model.run_with_hooks(**padded(family), hooks=[(name, lambda t, name: fired.append(name))
                                                          for name in model.hook_names()])
        assert fired == model.hook_names(), cls.__name__  # the opt-in points too: each one listened to
