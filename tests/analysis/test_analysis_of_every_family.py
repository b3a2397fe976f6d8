"""The analysis layer on every registered family, built from its declaration alone: the activation cache's
residual-stream helpers, the per-head results, the logit lens, activation and attribution patching and the heads'
summaries, each held to an identity that must hold exactly (or within assert_parity's bound) whatever the family.

A family registered in scratch_models.registry.known is tested here with no edit; what its stream has or lacks
(BERT is post-LN; GPT-NeoX's parallel residual has no stream between attention and MLP) is read from its
ResidualStream.
"""

from pathlib import Path

import pytest
import torch

from helpers import assert_parity, each_family, padded_batch, reference, save, sighted
from scratch_models.analysis.heads import AttentionSummary
from scratch_models.analysis.metrics import LogitDiff, last_positions
from scratch_models.analysis.patching import (Patch, activation_patching, get_act_patch_resid_mid, hook_name,
                                              run_patches)
from scratch_models.registry.families import FAMILIES
from test_heads import reference_summary

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """family -> (transformers' LM with eager attention, ours loaded from its save)."""
    out = {}
    for family in FAMILIES:
        theirs = reference(family, attention="eager")
        out[family] = theirs, FAMILIES[family].lm.from_pretrained(save(theirs, tmp_path_factory.mktemp(family)))
    return out


def stream_of(model):
    return model.family.stream(model)


@each_family
@pytest.mark.parametrize("explicit", [False, True], ids=["fused", "explicit"])
def test_head_results_sum_to_the_attention_output_and_each_is_its_heads_share(loaded, family, explicit):
    """attn.proj less the heads' results is the same vector everywhere (the projection's bias, or 0), and zeroing
    one head's context takes exactly its result out of attn.proj."""
    _, model = loaded[family]
    inputs = padded_batch(family) | {"output_attentions": explicit}
    names = [f"layers.{i}.attn.{point}" for i in range(len(model.layers)) for point in ("result", "proj")]
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs, names=names)
        _, ablated = model.run_with_cache(**inputs, names=names, hooks=[
            ("layers.0.attn.context", lambda t, name: t.index_fill(1, torch.tensor([1]), 0.0))])
    for i in range(len(model.layers)):
        rest = cache[f"layers.{i}.attn.proj"] - cache[f"layers.{i}.attn.result"].sum(-2)
        assert_parity(rest, rest[:1, :1].expand_as(rest), f"{family} layer {i}: attn.proj less the heads' sum")
    assert_parity(ablated["layers.0.attn.proj"], cache["layers.0.attn.proj"] - cache["layers.0.attn.result"][:, :, 1],
                  f"{family}: attn.proj with head 1 zeroed")


@each_family
def test_accumulated_resid_is_transformers_hidden_states(loaded, family):
    theirs, model = loaded[family]
    inputs = padded_batch(family)
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs)
        ref = theirs(**inputs, output_hidden_states=True)
    stack, labels = cache.accumulated_resid(return_labels=True)
    n = len(model.layers)
    assert labels == [f"{l}_pre" for l in range(n)] + ["final_post"]
    seen = sighted(family, inputs["attention_mask"])
    for i in range(n):
        assert_parity(stack[i][seen], ref.hidden_states[i][seen], f"{family} hidden_states[{i}]")
    last = cache.accumulated_resid(apply_ln=True)[-1] if not stream_of(model).post_ln else stack[-1]
    assert_parity(last[seen], ref.hidden_states[-1][seen], f"{family} hidden_states[-1]")


@each_family
def test_every_decomposition_sums_to_its_stream_and_folds_into_its_norm(loaded, family):
    """decompose_resid(layer, mlp_input) sums to the stream its norm reads, for every layer and both inputs the
    family has; with apply_ln, the parts plus the norm's bias sum to that norm of the stream, whatever the norm
    (the norm is asked how it normalises: a LayerNorm centres, an RMSNorm does not, Gemma's gain is 1 + weight).
    resid_mid is refused, naming why, where no stream runs between attention and MLP."""
    _, model = loaded[family]
    stream = stream_of(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(**padded_batch(family))
        for layer in range(stream.n_layers + 1):
            for mlp_input in (False, True) if layer < stream.n_layers else (False,):
                parts, total, norm = stream.decomposition(layer, mlp_input)
                where = f"{family} layer {layer}, mlp_input={mlp_input}"
                summed = cache.decompose_resid(layer, mlp_input=mlp_input).sum(0)
                assert_parity(summed, cache[total], f"{where}: parts {parts}")
                folded = cache.decompose_resid(layer, mlp_input=mlp_input, apply_ln=True).sum(0)
                bias = 0.0 if norm.bias is None else norm.bias
                assert_parity(folded + bias, norm(cache[total]), f"{where}: the folded {type(norm).__name__}")
    if stream.has_mid:
        assert stream.resid_mid(0) in cache
        assert cache.accumulated_resid(1, incl_mid=True, return_labels=True)[1] == ["0_pre", "0_mid", "1_pre"]
    else:
        with pytest.raises(ValueError, match="no resid_mid"):
            cache.accumulated_resid(1, incl_mid=True)
        with pytest.raises(ValueError, match="no resid_mid"):
            get_act_patch_resid_mid(model, padded_batch(family), cache, lambda out: out.logits[:, 0, 0])


@each_family
def test_logit_lens_at_the_last_layer_is_the_models_logits(loaded, family):
    theirs, model = loaded[family]
    inputs = padded_batch(family)
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
        ref = theirs(**inputs).logits
    lens = cache.logit_lens()
    assert lens.shape == (len(model.layers) + 1, *out.logits.shape)
    assert_parity(lens[-1], out.logits, f"{family} lens at the last layer")
    seen = sighted(family, inputs["attention_mask"])
    assert_parity(lens[-1][seen], ref[seen], f"{family} lens against transformers' logits")


@each_family
def test_direct_logit_attribution_sums_to_the_logit_or_is_refused(loaded, family):
    """Pre-LN: the parts of the final stream, through ln_f frozen at the stream and the unembedding, plus ln_f's
    bias read out, sum to the logit (before the soft cap of a family that caps its logits: the point its stream
    names as attributed_logits). Post-LN (BERT): refused, as its head is not linear in the stream."""
    _, model = loaded[family]
    inputs = padded_batch(family)
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
    stream = stream_of(model)
    if stream.post_ln:
        with pytest.raises(ValueError, match="not linear"):
            cache.logit_attrs(cache.decompose_resid(), tokens=3)
        return
    parts = cache.decompose_resid(pos_slice=-1)  # before any LayerNorm: logit_attrs freezes ln_f at the stream
    attrs = cache.logit_attrs(parts, tokens=3, pos_slice=-1)
    assert_parity(attrs.sum(0) + final_bias(model, 3), cache[stream.attributed_logits][:, -1, 3],
                  f"{family} logit attribution")
    if stream.attributed_logits == "logits":
        assert torch.equal(cache["logits"], out.logits)


@each_family
def test_each_heads_part_of_the_stream_sums_to_what_attention_adds_and_attributes_the_logit(loaded, family):
    """stack_head_results gives each head's part of the residual stream: per layer the heads' parts plus the output
    projection's bias (through the norm a family puts on the attention's output, Gemma 2's post-attention norm,
    its divisor frozen at the whole output's) sum to the stream's attn_out; with the remainder they sum to the
    stream; read out by logit_attrs they sum to the attributed logit. Post-LN (BERT): heads of several layers sum
    to no stream, refused."""
    _, model = loaded[family]
    inputs = padded_batch(family)
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs)
    stream = stream_of(model)
    if stream.post_ln:
        with pytest.raises(ValueError, match="sum to none"):
            cache.stack_head_results(incl_remainder=True)
        return
    n, heads = stream.n_layers, stream.num_heads
    parts = cache.stack_head_results()
    cache.compute_head_results()  # the raw results, which sum to attn.proj less the projection's bias
    for layer in range(n):
        bias = cache[f"layers.{layer}.attn.proj"] - cache[f"layers.{layer}.attn.result"].sum(-2)
        normalised = stream.attn_out_norm(layer)
        if normalised is not None:
            read, norm = normalised
            bias = norm.frozen(bias, norm.divisor(cache[read]))
        summed = parts[layer * heads:(layer + 1) * heads].sum(0) + bias
        assert_parity(summed, cache[stream.attn_out(layer)], f"{family} layer {layer}: heads' parts")
    stack = cache.stack_head_results(incl_remainder=True)
    assert_parity(stack.sum(0), cache[stream.resid_pre(n)], f"{family}: heads and remainder")
    attrs = cache.logit_attrs(cache.stack_head_results(incl_remainder=True, pos_slice=-1), tokens=3, pos_slice=-1)
    assert_parity(attrs.sum(0) + final_bias(model, 3), cache[stream.attributed_logits][:, -1, 3],
                  f"{family}: heads' logit attribution")


def final_bias(model, token: int):
    """What the final norm's bias adds to `token`'s logit (no part of the stream writes it); 0 for an RMSNorm."""
    stream = stream_of(model)
    bias = stream.decomposition(stream.n_layers, False)[2].bias
    return 0.0 if bias is None else bias @ stream.unembedding()[token]


README = Path(__file__).resolve().parents[2] / "README.md"


@each_family
def test_readmes_direct_attribution_line_states_an_identity_that_holds(loaded, family):
    """README's line `cache.logit_attrs(cache.decompose_resid(), mary.expand(2))`, run as written on a batch of two:
    the attributions of the parts sum to the logit less the final norm's bias term, at every position (one meaning:
    logit_attrs applies the final norm itself, so the parts it takes are before any norm)."""
    line = next(line.split("#")[0].strip() for line in README.read_text(encoding="utf-8").splitlines()
                if line.startswith("cache.logit_attrs("))
    _, model = loaded[family]
    inputs = {name: tensor[:2] for name, tensor in padded_batch(family).items()}
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
    mary = torch.tensor(3)
    if stream_of(model).post_ln:
        with pytest.raises(ValueError, match="not linear"):
            eval(line, {"cache": cache, "mary": mary})
        return
    attrs = eval(line, {"cache": cache, "mary": mary})
    seen = sighted(family, inputs["attention_mask"])
    assert_parity((attrs.sum(0) + final_bias(model, 3))[seen],
                  cache[stream_of(model).attributed_logits][..., 3][seen], f"{family}: README's line, summed")


@each_family
def test_patching_everything_is_the_clean_run_and_nothing_the_corrupted_one(loaded, family):
    _, model = loaded[family]
    clean, corrupted = padded_batch(family, seed=1), padded_batch(family, seed=2)
    corrupted["attention_mask"] = clean["attention_mask"]
    names = [hook_name(model, "resid_pre", layer) for layer in range(len(model.layers))]
    names.append(f"layers.{len(model.layers) - 1}.out")
    with torch.no_grad():
        clean_output, clean_cache = model.run_with_cache(**clean, names=names)
        corrupted_logits = model(**corrupted).logits.flatten(1)
    patches = ([Patch(name, torch.ones(1, dtype=torch.bool)) for name in names]
               + [Patch(name, torch.zeros(1, dtype=torch.bool)) for name in names])
    values = run_patches(model, corrupted, patches, clean_cache, lambda out: out.logits.flatten(1),
                         vector_metric=True)
    for i, name in enumerate(names):
        assert_parity(values[i], clean_output.logits.flatten(1), f"{family}: {name} patched")
        assert_parity(values[len(names) + i], corrupted_logits, f"{family}: nothing patched")


@each_family
def test_activation_patching_runs_every_sweep_the_family_has(loaded, family):
    _, model = loaded[family]
    clean, corrupted = padded_batch(family, seed=1), padded_batch(family, seed=2)
    del clean["attention_mask"], corrupted["attention_mask"]
    metric = LogitDiff(torch.tensor(3), torch.tensor(5), positions=last_positions(torch.ones(4, 11)))
    result = activation_patching(model, clean, corrupted, metric)
    expected = ["resid_pre", "resid_mid", "attn_out", "mlp_out", "attn_head_out_all_pos", "attn_head_out_by_pos"]
    if not stream_of(model).has_mid:
        expected.remove("resid_mid")
    assert list(result.patched) == expected == list(result.attribution)
    layers, heads = len(model.layers), model.layers[0].attn.num_heads
    assert result.patched["resid_pre"].shape == (layers, 11)
    assert result.patched["attn_head_out_all_pos"].shape == (layers, heads)
    assert result.patched["attn_head_out_by_pos"].shape == (layers, 11, heads)
    assert result.clean_metric != result.corrupted_metric
    assert all(bool(values.isfinite().all()) for values in (*result.patched.values(), *result.attribution.values()))


@each_family
def test_attention_summary_from_the_cache_equals_its_own_run(loaded, family):
    _, model = loaded[family]
    inputs = padded_batch(family)
    groups = {"first": torch.zeros(4, 11, dtype=torch.bool)}
    groups["first"][:, 0] = True
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs)
    summary = AttentionSummary.from_cache(cache, groups)
    for layer in range(len(model.layers)):
        expected = reference_summary(cache[f"layers.{layer}.attn.probs"], inputs["attention_mask"].bool(), groups)
        for name, values in expected.items():
            got = summary.entropy[layer] if name == "entropy" else summary.shares[name][layer]
            assert torch.allclose(got, values, atol=1e-12), (family, layer, name)
