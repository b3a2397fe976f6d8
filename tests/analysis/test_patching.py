"""Activation patching, batched: the identities (everything patched = the clean run, nothing = the corrupted run),
batched = one forward at a time = a plain TransformerLens-style loop, attribution patching = the derivative, and
the errors. Small odd models of every registered family (its tiny config, from its declaration), padded on either
side, fused and explicit attention; what only some families have (a pooler, causal attention) on those."""

import copy

import pytest
import torch

from scratch_models.analysis.metrics import LogitDiff, PoolerCosine, TokenLogit, TokenLogProb, last_positions, normalized
from scratch_models.analysis.patching import (SWEEPS, Patch, activation_patching, attribution_patch,
                                              get_act_patch_attn_head_out_all_pos, get_act_patch_attn_head_out_by_pos,
                                              get_act_patch_block_every, get_act_patch_resid_pre, hook_name,
                                              prompt_rows, run_patches)
from scratch_models.registry.families import FAMILIES
from helpers import assert_parity, each_family, model_sizes, randomize_

VOCAB, SEQ = 97, 7
LAYERS = 2
CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
# A mixture's expert multiplies as many rows as tokens are routed to it, which depends on the other tokens of the
# batch, and a matmul of 1 to 3 rows takes another kernel than one of more (float32 on CPU: last bits). A token's
# activations are then the same run to run to rounding, not bit for bit, whatever else the batch holds: the tests
# that count on bit-equal runs of different batches hold the other families to it.
BATCH_INVARIANT = [name for name in CAUSAL if FAMILIES[name].table.experts_field is None]

pytestmark = pytest.mark.usefixtures("one_thread")


def small(family: str, dtype=torch.float32, cls: type | None = None):
    """The family's LM (or `cls`) of its tiny config with a vocabulary of VOCAB, 16 positions and LAYERS layers,
    weights redrawn large."""
    declared = FAMILIES[family]
    torch.manual_seed(0)
    config = declared.tiny(vocab_size=VOCAB, **{declared.positions_field: 16, declared.table.layers_field: LAYERS})
    return randomize_((cls or declared.lm)(config), 0.3).to(dtype).eval()


def sweeps_of(model) -> list[str]:
    """The sweeps the model's stream has: resid_mid only where a stream runs between attention and MLP."""
    has_mid = model.family.stream(model).has_mid
    return [name for name in SWEEPS if name != "resid_mid" or has_mid]


def heads_of(model) -> int:
    return model.layers[0].attn.num_heads


def prompts(padding: str, seed: int):
    """Two prompts of SEQ tokens; the second padded on `padding`'s side (none, right, left) by two."""
    ids = torch.randint(VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(2, SEQ, dtype=torch.long)
    if padding == "right":
        mask[1, -2:] = 0
    elif padding == "left":
        mask[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask}


def with_path(inputs: dict, path: str) -> dict:
    """The explicit attention path is taken when attentions are asked for; the fused one otherwise."""
    return {**inputs, "output_attentions": path == "explicit"}


def all_logits(output):
    return output.logits.flatten(1)


def answer_metric(inputs):
    return TokenLogProb(torch.tensor([3, 5]), positions=last_positions(inputs["attention_mask"]))


CASES = [(family, padding, path) for family in FAMILIES for padding in ("none", "right", "left")
         for path in ("fused", "explicit")]


@pytest.mark.parametrize("family,padding,path", CASES)
def test_patching_everything_gives_the_clean_run_and_nothing_the_corrupted_run(family, padding, path):
    model = small(family)
    clean, corrupted = with_path(prompts(padding, 1), path), with_path(prompts(padding, 2), path)
    components = ("resid_pre", "resid_mid") if model.family.stream(model).has_mid else ("resid_pre",)
    names = [hook_name(model, c, layer) for c in components for layer in range(LAYERS)]
    names.append(hook_name(model, "resid_pre", LAYERS))  # the last layer's output
    # only these names: the clean run then takes the attention path the patched runs take (caching probs would not)
    clean_output, clean_cache = model.run_with_cache(**clean, names=names)
    corrupted_logits = all_logits(model(**corrupted)).detach()
    everything = [Patch(name, torch.ones(1, dtype=torch.bool)) for name in names]
    nothing = [Patch(name, torch.zeros(1, dtype=torch.bool)) for name in names]
    values = run_patches(model, corrupted, everything + nothing, clean_cache, all_logits, vector_metric=True)
    # the patched copies run as a larger batch, whose matmuls may block (and round) otherwise: assert_parity's bound
    clean_logits = all_logits(clean_output).detach()
    for i in range(len(names)):
        assert_parity(values[i], clean_logits, f"everything patched ({names[i]}) against the clean run")
        assert_parity(values[len(names) + i], corrupted_logits, f"nothing patched ({names[i]}) against the "
                      "corrupted run")


def naive_sweep(model, corrupted, clean_cache, metric, component, by_head=False):
    """TransformerLens' way: one forward per patch, writing the clean slice into a clone."""
    layers, seq = len(model.layers), corrupted["input_ids"].shape[1]
    heads = heads_of(model)
    out = torch.zeros(layers, seq, heads) if by_head else torch.zeros(layers, seq)
    for layer in range(layers):
        name = hook_name(model, component, layer)
        for position in range(seq):
            for head in range(heads) if by_head else [None]:
                def hook(x, _, position=position, head=head):
                    x = x.clone()
                    if head is None:
                        x[:, position] = clean_cache[name][:, position]
                    else:
                        x[:, head, position] = clean_cache[name][:, head, position]
                    return x
                with torch.no_grad():
                    value = metric(model.run_with_hooks(**corrupted, hooks=[(name, hook)])).mean()
                out[(layer, position) if head is None else (layer, position, head)] = value
    return out


@each_family
@pytest.mark.parametrize("padding,path", [("none", "fused"), ("right", "explicit"), ("left", "fused")])
def test_batched_sweeps_equal_one_forward_at_a_time(family, padding, path):
    """Every sweep the family has, in chunks of 10 against one patch per forward pass. Three of the six paddings
    and paths per family (each case runs some 150 forward passes); the plain loop below takes two others."""
    model = small(family)
    clean, corrupted = with_path(prompts(padding, 1), path), with_path(prompts(padding, 2), path)
    _, clean_cache = model.run_with_cache(**clean)
    metric = answer_metric(corrupted)
    for name in sweeps_of(model):
        sweep = SWEEPS[name]
        batched = sweep(model, corrupted, clean_cache, metric, batch_size=10)  # several chunks, one cut short
        alone = sweep(model, corrupted, clean_cache, metric, batch_size=1)
        assert_parity(batched, alone, name, **model_sizes(model.config), dtype=torch.float32)


@each_family
@pytest.mark.parametrize("padding,path", [("right", "fused"), ("left", "explicit")])
def test_batched_sweeps_equal_a_plain_loop(family, padding, path):
    model = small(family)
    clean, corrupted = with_path(prompts(padding, 1), path), with_path(prompts(padding, 2), path)
    _, clean_cache = model.run_with_cache(**clean)
    metric = answer_metric(corrupted)
    sizes = dict(model_sizes(model.config), dtype=torch.float32)
    resid = get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert_parity(resid, naive_sweep(model, corrupted, clean_cache, metric, "resid_pre"), "resid_pre", **sizes)
    mlp = SWEEPS["mlp_out"](model, corrupted, clean_cache, metric)
    assert_parity(mlp, naive_sweep(model, corrupted, clean_cache, metric, "mlp_out"), "mlp_out", **sizes)
    by_head = get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric)
    assert_parity(by_head, naive_sweep(model, corrupted, clean_cache, metric, "z", by_head=True), "z", **sizes)


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_patched_causal_runs_score_only_from_the_first_position_the_metric_reads(family, padding):
    """A causal LM's head over every position is a large share of a short patched run (a third of GPT-2's): with our
    token metrics the patched runs keep the logits from the earliest position read on (logits_to_keep, which the
    causal families take), and give what an opaque metric (every position scored) gives."""
    model = small(family)
    clean, corrupted = prompts(padding, 1), prompts(padding, 2)
    _, clean_cache = model.run_with_cache(**clean)
    metric = answer_metric(corrupted)
    kept = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: kept.append(kwargs.get("logits_to_keep", 0)), with_kwargs=True)
    try:
        fast = get_act_patch_resid_pre(model, corrupted, clean_cache, metric, batch_size=10)
    finally:
        handle.remove()
    every_position = get_act_patch_resid_pre(model, corrupted, clean_cache, lambda output: metric(output),
                                             batch_size=10)
    assert_parity(fast, every_position, "resid_pre", **model_sizes(model.config), dtype=torch.float32)
    first_read = int(last_positions(corrupted["attention_mask"]).min())
    assert kept[0] == 0 and len(kept) > 1  # the unpatched run scores every position
    assert set(kept[1:]) == {SEQ - first_read}
    assert (SEQ - first_read) == (3 if padding == "right" else 1)


@pytest.mark.parametrize("family", BATCH_INVARIANT)
@pytest.mark.parametrize("path", ["fused", "explicit"])
def test_patches_that_change_nothing_are_not_run(family, path):
    """Causal prompts that differ from position 4 on: before it, clean and corrupted activations are the same, so
    those patches are the corrupted run, taken without a forward pass of their own."""
    model = small(family)
    clean = with_path(prompts("none", 1), path)
    corrupted = {**clean, "input_ids": clean["input_ids"].clone()}
    corrupted["input_ids"][:, 4:] = (corrupted["input_ids"][:, 4:] + 1) % VOCAB
    # the residual stream alone, so the clean run takes the attention path the patched runs take
    names = [hook_name(model, "resid_pre", layer) for layer in range(LAYERS)]
    _, clean_cache = model.run_with_cache(**clean, names=names)
    metric = answer_metric(corrupted)
    rows = []
    with model.hooks([(names[0], lambda x, _: rows.append(x.shape[0]))]):
        values = get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    with torch.no_grad():
        unpatched = metric(model(**corrupted)).double().mean()
    assert (values[:, :4] == unpatched).all()
    assert sum(rows) == 2 + 2 * 2 * (SEQ - 4)  # the unpatched run, then 2 layers x 3 positions of 2 prompts
    assert (values[:, 4:] != unpatched).all()


@each_family
def test_sweep_shapes_follow_transformer_lens(family):
    model = small(family)
    heads = heads_of(model)
    clean, corrupted = prompts("none", 1), prompts("none", 2)
    _, clean_cache = model.run_with_cache(**clean)
    metric = answer_metric(corrupted)
    assert get_act_patch_resid_pre(model, corrupted, clean_cache, metric).shape == (LAYERS, SEQ)
    assert get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric).shape == (LAYERS, SEQ, heads)
    all_pos = get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
    assert all_pos.shape == (LAYERS, heads)
    every = get_act_patch_block_every(model, corrupted, clean_cache, metric)
    assert every.shape == (3, LAYERS, SEQ)
    assert torch.equal(every[0], get_act_patch_resid_pre(model, corrupted, clean_cache, metric))
    # input_ids alone are the unpadded prompts; the first layer's residual at every position restores the clean run
    ids_only = get_act_patch_resid_pre(model, corrupted["input_ids"], clean_cache, metric)
    assert torch.equal(ids_only, every[0])


@each_family
@pytest.mark.parametrize("padding", ["right", "left"])
def test_attribution_patching_is_the_derivative_of_patching(family, padding):
    """Each estimate is d/dt metric(corrupted + t (clean - corrupted) at that patch) at t = 0: central
    differences through the batched engine, in float64."""
    model = small(family, torch.float64)
    clean, corrupted = prompts(padding, 1), prompts(padding, 2)
    metric = LogitDiff(torch.tensor([3, 5]), torch.tensor([4, 6]), positions=last_positions(corrupted["attention_mask"]))
    estimates = attribution_patch(model, clean, corrupted, metric, components=("resid_pre", "attn_out", "z"))
    _, clean_cache = model.run_with_cache(**clean)
    _, corrupted_cache = model.run_with_cache(**corrupted)
    eps = 1e-5
    heads = heads_of(model)
    for component, estimate in estimates.items():
        names = [hook_name(model, component, layer) for layer in range(LAYERS)]
        if component == "z":  # one head at one position: [layers, positions, heads]
            where = [(name, (torch.arange(heads)[:, None] == h) & (torch.arange(SEQ) == p)) for name in names
                     for p in range(SEQ) for h in range(heads)]
            where = [(name, w[..., None]) for name, w in where]
        else:
            where = [(name, (torch.arange(SEQ) == p)[:, None]) for name in names for p in range(SEQ)]
        patches = [Patch(name, w) for name, w in where]

        def shifted(t):
            return {name: corrupted_cache[name] + t * (clean_cache[name] - corrupted_cache[name]) for name in names}

        up = run_patches(model, corrupted, patches, shifted(eps), metric)
        down = run_patches(model, corrupted, patches, shifted(-eps), metric)
        derivative = ((up - down) / (2 * eps)).mean(1).view(estimate.shape)
        assert (derivative - estimate).abs().max() <= 1e-6 * (1 + estimate.abs().max()), component


@each_family
def test_attribution_needs_no_trainable_weights_and_no_grad_mode_outside(family):
    model = small(family).requires_grad_(False)
    clean, corrupted = prompts("none", 1), prompts("none", 2)
    with torch.no_grad():
        estimates = attribution_patch(model, clean, corrupted, answer_metric(corrupted), components=("resid_pre",))
    assert estimates["resid_pre"].abs().sum() > 0
    with torch.inference_mode(), pytest.raises(ValueError, match="attribution patching takes a gradient"):
        attribution_patch(model, clean, corrupted, answer_metric(corrupted), components=("resid_pre",))


@each_family
def test_activation_patching_gathers_every_sweep_and_normalises(family):
    model = small(family)
    clean, corrupted = prompts("right", 1), prompts("right", 2)
    metric = answer_metric(corrupted)
    result = activation_patching(model, clean, corrupted, metric, batch_size=16)
    with torch.no_grad():
        assert result.clean_metric == pytest.approx(float(metric(model(**clean)).double().mean()), abs=1e-6)
        assert result.corrupted_metric == pytest.approx(float(metric(model(**corrupted)).double().mean()), abs=1e-6)
    assert list(result.patched) == sweeps_of(model) == list(result.attribution)
    for name, values in result.patched.items():
        assert result.attribution[name].shape == values.shape, name
    # the first layer's residual stream at every position is the whole clean prompt; at one position, its token
    names = [hook_name(model, "resid_pre", layer) for layer in range(LAYERS)]
    clean_cache = model.run_with_cache(**clean, names=names)[1]
    swept = get_act_patch_resid_pre(model, corrupted, clean_cache, metric)  # in other batches: see BATCH_INVARIANT
    assert torch.equal(result.patched["resid_pre"], swept) if family in BATCH_INVARIANT else \
        torch.allclose(result.patched["resid_pre"], swept, atol=1e-5, rtol=1e-5)
    scores = result.normalized(result.patched["resid_pre"])
    assert torch.allclose(scores, (result.patched["resid_pre"] - result.corrupted_metric)
                          / (result.clean_metric - result.corrupted_metric))
    page = result.to_json(tokens=[f"t{i}" for i in range(SEQ)])
    assert page["patched_normalized"]["resid_pre"] == scores.tolist()


def test_patching_png_draws_the_heads_of_largest_effect_by_position(tmp_path):
    """Heads by position: GPT-2 small's 144 rows would make a 4000-pixel panel of mostly nothing; the PNG keeps the
    TOP_HEADS strongest (by either sign, at any position), labelled L{l}H{h} in layer order."""
    from PIL import Image

    from scratch_models.views.figures import TOP_HEADS, _shown_rows, patching_png
    from scratch_models.analysis.patching import PatchingResult

    layers, positions, heads = 4, 3, 5  # 20 heads, more than TOP_HEADS
    by_pos = torch.full((layers, positions, heads), 0.01)
    strong = {(3, 4): 0.9, (0, 1): -0.8, (2, 0): 0.5}  # (layer, head): effect at position 1
    for (layer, head), effect in strong.items():
        by_pos[layer, 1, head] = effect
    small_effects = torch.linspace(0.02, 0.3, layers * heads).view(layers, heads)  # ties broken by size
    by_pos[:, 2, :] = small_effects
    sweeps = {"resid_pre": torch.zeros(layers, positions), "attn_head_out_by_pos": by_pos}
    result = PatchingResult(clean_metric=1.0, corrupted_metric=0.0, patched=sweeps, attribution=dict(sweeps))
    shown, labels = _shown_rows(result, "attn_head_out_by_pos", layers)
    expected = sorted(l * heads + h for l, h in strong) + [
        int(i) for i in small_effects.flatten().argsort(descending=True)
        if int(i) not in {l * heads + h for l, h in strong}][:TOP_HEADS - len(strong)]
    assert shown == sorted(expected) and len(shown) == TOP_HEADS
    assert labels == [f"L{row // heads}H{row % heads}" for row in shown]
    assert {"L3H4", "L0H1", "L2H0"} <= set(labels)
    assert _shown_rows(result, "resid_pre", layers) == (list(range(layers)), ["L0", "L1", "L2", "L3"])

    with Image.open(patching_png(result, ["a", "b", "c"], tmp_path / "p.png")) as image:
        every_head_height = 40 + (layers + layers * heads) * 28 + 2 * (60 + 90)
        assert image.size[1] == every_head_height - (layers * heads - TOP_HEADS) * 28


@each_family
def test_bfloat16_patching_writes_in_the_model_dtype(family):
    model = small(family, torch.bfloat16)
    clean, corrupted = prompts("left", 1), prompts("left", 2)
    clean_output, clean_cache = model.run_with_cache(**clean)
    everything = [Patch(hook_name(model, "resid_pre", 1), torch.ones(1, dtype=torch.bool))]
    values = run_patches(model, corrupted, everything, clean_cache, all_logits, vector_metric=True)
    reference = all_logits(clean_output).double()
    assert (values[0] - reference).abs().max() <= 0.02 * (1 + reference.abs().max())
    resid = get_act_patch_resid_pre(model, corrupted, clean_cache, answer_metric(corrupted))
    assert torch.isfinite(resid).all()


@each_family
def test_prompt_rows_cuts_every_field(family):
    model = small(family)
    inputs = prompts("right", 1)
    output = model(**{key: value.repeat(3, 1) for key, value in inputs.items()}, output_attentions=True,
                   output_hidden_states=True)
    rows = prompt_rows(output, 2, 4)
    alone = model(**inputs, output_attentions=True, output_hidden_states=True)
    assert rows.logits.shape == alone.logits.shape
    assert len(rows.attentions) == LAYERS and rows.attentions[0].shape == alone.attentions[0].shape
    assert_parity(rows.hidden_states[-1], alone.hidden_states[-1], "last hidden state")
    with pytest.raises(ValueError, match="loss is one value for the whole batch"):
        prompt_rows(model(**inputs, labels=inputs["input_ids"]), 0, 1)


@pytest.mark.parametrize("family", [name for name, family in FAMILIES.items() if "pooler.out" in family.output_fields])
def test_pooler_cosine_is_one_on_the_clean_run(family):
    """The families whose base model has a pooler (BERT's)."""
    model = small(family, cls=FAMILIES[family].base)
    clean, corrupted = prompts("right", 1), prompts("right", 2)
    metric = PoolerCosine(model(**clean).pooler_output.detach())
    result = activation_patching(model, clean, corrupted, metric, sweeps=["resid_pre"], attribution=False)
    assert result.clean_metric == pytest.approx(1.0, abs=1e-6)
    assert result.normalized(result.patched["resid_pre"])[0].sum() > 0
    assert result.attribution == {}


# ---------- errors ----------

@each_family
def test_refuses_prompts_of_different_lengths_naming_both(family):
    model = small(family)
    clean, corrupted = prompts("none", 1), {"input_ids": torch.randint(VOCAB, (2, 9))}
    with pytest.raises(ValueError, match="clean prompt is 7 tokens long and the corrupted one 9"):
        activation_patching(model, clean, corrupted, answer_metric(clean))
    _, clean_cache = model.run_with_cache(**clean)
    with pytest.raises(ValueError, match="clean prompt is 7 tokens long and the corrupted one 9"):
        get_act_patch_resid_pre(model, corrupted, clean_cache, TokenLogit(3, positions=-1))
    with pytest.raises(ValueError, match="2 clean prompts and 3 corrupted ones"):
        get_act_patch_resid_pre(model, torch.randint(VOCAB, (3, SEQ)), clean_cache, TokenLogit(3, positions=-1))
    with pytest.raises(ValueError, match="holds 2 prompts; the corrupted tokens are 3"):  # a plain dict of tensors
        get_act_patch_resid_pre(model, torch.randint(VOCAB, (3, SEQ)), dict(clean_cache), TokenLogit(3, positions=-1))


@each_family
def test_refuses_prompts_padded_differently(family):
    model = small(family)
    clean, corrupted = prompts("right", 1), prompts("left", 2)
    with pytest.raises(ValueError, match="attention_mask differ \\(first in prompt 1\\)"):
        activation_patching(model, clean, corrupted, answer_metric(corrupted))
    _, clean_cache = model.run_with_cache(**clean)  # an ActivationCache: it remembers the clean run's mask
    for sweep in (get_act_patch_resid_pre, get_act_patch_attn_head_out_all_pos):
        with pytest.raises(ValueError, match="attention_mask differ \\(first in prompt 1\\)"):
            sweep(model, corrupted, clean_cache, answer_metric(corrupted))
    plain = dict(clean_cache)  # a plain dict of tensors says nothing of padding: only lengths are checked
    assert get_act_patch_resid_pre(model, corrupted, plain, answer_metric(corrupted)).shape == (2, SEQ)


@each_family
def test_a_metric_of_one_number_for_the_batch_is_taken_as_transformer_lens_takes_it(family):
    """TL's patching metrics average over the prompts themselves: their number is each patch's value (for a mean,
    the per-prompt sweep's mean); its attribution estimate sums the prompts' shares instead of averaging them.
    Neither a shape per prompt but the wrong one, nor a float, is taken."""
    model = small(family)
    clean, corrupted = prompts("none", 1), prompts("none", 2)
    _, clean_cache = model.run_with_cache(**clean)
    per_prompt = answer_metric(corrupted)
    mean = get_act_patch_resid_pre(model, corrupted, clean_cache, lambda out: per_prompt(out).mean())
    assert torch.allclose(mean, get_act_patch_resid_pre(model, corrupted, clean_cache, per_prompt), atol=1e-12)
    estimates = attribution_patch(model, clean, corrupted, lambda out: per_prompt(out).mean(), components=["z"])
    assert torch.allclose(estimates["z"], attribution_patch(model, clean, corrupted, per_prompt, components=["z"])["z"],
                          atol=1e-12)
    with pytest.raises(ValueError, match=r"returned shape \(3,\) for 2 prompts; it returns \[batch\]"):
        get_act_patch_resid_pre(model, corrupted, clean_cache, lambda out: torch.zeros(3))
    with pytest.raises(ValueError, match="returned float"):
        get_act_patch_resid_pre(model, corrupted, clean_cache, lambda out: 1.0)


@each_family
def test_other_refusals(family):
    model = small(family)
    first, second = hook_name(model, "resid_pre", 0), hook_name(model, "resid_pre", 1)
    clean, corrupted = prompts("none", 1), prompts("none", 2)
    _, clean_cache = model.run_with_cache(**clean, names=[first])
    hidden = clean_cache[first].shape[-1]
    metric = answer_metric(corrupted)
    with pytest.raises(ValueError, match=f"clean_cache has no '{second}'"):
        get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        get_act_patch_resid_pre(model, corrupted, clean_cache, metric, batch_size=0)
    with pytest.raises(ValueError, match="training mode"):
        get_act_patch_resid_pre(copy.deepcopy(model).train(), corrupted, clean_cache, metric)
    with pytest.raises(ValueError, match="KV cache"):
        get_act_patch_resid_pre(model, {**corrupted, "use_cache": True}, clean_cache, metric)
    with pytest.raises(ValueError, match="unknown component 'resid_post'"):
        hook_name(model, "resid_post", 0)
    with pytest.raises(ValueError, match="unknown sweep nope"):
        activation_patching(model, clean, corrupted, metric, sweeps=["nope"])
    with pytest.raises(ValueError, match="where must be bool"):
        run_patches(model, corrupted, [Patch(first, torch.ones(1))], clean_cache, metric)
    with pytest.raises(ValueError, match=f"does not broadcast to {first}"):
        run_patches(model, corrupted, [Patch(first, torch.ones(3, 1, dtype=torch.bool))], clean_cache, metric)
    with pytest.raises(ValueError, match=rf"sources\['{first}'\] has shape \(2, 9, {hidden}\)"):
        run_patches(model, corrupted, [Patch(first, torch.ones(1, dtype=torch.bool))],
                    {first: torch.zeros(2, 9, hidden)}, metric)
    with pytest.raises(ValueError, match=f"no source for hook point '{second}'"):
        run_patches(model, corrupted, [Patch(second, torch.ones(1, dtype=torch.bool))], clean_cache, metric)
    with pytest.raises(ValueError, match="input_ids"):
        run_patches(model, {"attention_mask": corrupted["attention_mask"]}, [], clean_cache, metric)


@each_family
def test_metric_refusals(family):
    model = small(family)
    output = model(**prompts("none", 1))
    assert torch.equal(TokenLogit(3)(output), output.logits[:, -1, 3])  # no positions: the last
    with pytest.raises(ValueError, match=r"positions \[9, 9\] out of range for 7 positions"):
        TokenLogit(3, positions=9)(output)
    with pytest.raises(ValueError, match=r"token \[97, 97\] out of range: the output has 97 entries"):
        TokenLogit(97, positions=-1)(output)
    with pytest.raises(ValueError, match=r"answer has shape \(3,\): give one int, or one per prompt \(2\)"):
        LogitDiff([1, 2, 3], 4, positions=-1)(output)
    with pytest.raises(ValueError, match="has no pooler_output"):
        PoolerCosine(torch.zeros(2, 48))(output)  # an LM's output has none
    with pytest.raises(ValueError, match="nothing to restore"):
        normalized(torch.ones(2), 1.5, 1.5)


def test_last_positions_reads_either_padding():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    assert last_positions(mask).tolist() == [2, 3, 3]
