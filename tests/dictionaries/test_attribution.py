"""Feature attribution: every feature's activation x gradient estimate, the exact ablation of the top ones (batched,
each the run with that feature zeroed), a table, JSON and a picture."""

import json

import pytest
import torch

from dictionary_data import random_sae, tiny_model
from scratch_models.analysis.metrics import LogitDiff
from scratch_models.dictionaries.attribution import feature_attribution
from scratch_models.views.dictionary_plots import attribution_png


@pytest.fixture
def spliced(tiny_lm):
    tiny_lm.attach(random_sae("standard", 48, 40, hook_name="blocks.1.hook_resid_pre"))
    mlp = random_sae("topk", 48, 24, hook_name="blocks.1.hook_mlp_out", seed=1)
    with torch.no_grad():
        mlp.b_enc.add_(1.0)  # the MLP's output is small: fire anyway
    tiny_lm.attach(mlp)
    ids = torch.randint(0, 36, (2, 6), generator=torch.Generator().manual_seed(2))
    return tiny_lm, ids


def test_the_estimate_is_activation_times_gradient_and_the_ablation_exact(spliced):
    model, ids = spliced
    metric = LogitDiff(3, 5)
    result = feature_attribution(model, ids, metric, top=5, batch_size=3)
    values = [abs(row["attribution"]) for row in result.features]
    assert values == sorted(values, reverse=True) and len(result.top()) == 5
    assert {row["hook"] for row in result.features} == {"layers.0.out", "layers.1.mlp.proj"}
    _, cache = model.run_with_cache(ids, incl_bwd=True, metric=lambda out: metric(out).sum(),
                                    names=["layers.0.out.sae.acts", "layers.1.mlp.proj.sae.acts"])
    with torch.no_grad():
        baseline = metric(model(ids)).mean()
    for row in result.features[:8]:
        name = f"{row['hook']}.sae.acts"
        a, g = cache[name][..., row["feature"]].double(), cache[f"{name}_grad"][..., row["feature"]].double()
        assert row["attribution"] == pytest.approx(float(-(a * g).sum(1).mean()), rel=1e-9, abs=1e-12)
    for row in result.top():
        def zero(t, _, feature=row["feature"]):
            return t.index_fill(-1, torch.tensor([feature]), 0)
        with torch.no_grad():
            ablated = metric(model.run_with_hooks(ids, hooks=[(f"{row['hook']}.sae.acts", zero)])).mean()
        assert row["ablation"] == pytest.approx(float(ablated - baseline), abs=1e-5)
    assert result.metric == pytest.approx(float(baseline), abs=1e-6)


def test_the_gradient_is_the_finite_difference_in_float64():
    model = tiny_model("gpt2").double()
    model.attach(random_sae("jumprelu", 48, 40, hook_name="layers.1.out").double())
    ids = torch.randint(0, 36, (1, 5), generator=torch.Generator().manual_seed(4))
    metric = LogitDiff(3, 5)
    result = feature_attribution(model, ids, metric, top=3)
    row = result.top()[0]
    _, cache = model.run_with_cache(ids, names=["layers.1.out.sae.acts"])
    acts = cache["layers.1.out.sae.acts"]
    position = row["position"][1]
    eps = 1e-6

    def nudged(t, _):
        t = t.clone()
        t[0, position, row["feature"]] += eps
        return t

    with torch.no_grad():
        moved = metric(model.run_with_hooks(ids, hooks=[("layers.1.out.sae.acts", nudged)])) - metric(model(ids))
    estimate_there = result.per_position["layers.1.out", row["feature"]][0, position]
    assert float(-acts[0, position, row["feature"]] * moved / eps) == pytest.approx(float(estimate_there), rel=1e-5)


def test_table_json_and_picture(spliced, tmp_path):
    model, ids = spliced
    result = feature_attribution(model, ids, LogitDiff(3, 5), top=4)
    table = result.table(6)
    assert table.splitlines()[0].startswith("metric ") and len(table.splitlines()) == 2 + min(6, len(result.features))
    data = json.loads(json.dumps(result.to_json()))
    assert len(data["per_position"]) == 4 and data["features"][0]["ablation"] is not None
    png = attribution_png(result, tmp_path / "features.png")
    assert png.read_bytes().startswith(b"\x89PNG")


def test_nothing_attached_is_refused(tiny_lm):
    with pytest.raises(ValueError, match=r"no dictionary is attached: model.attach\(sae\) first"):
        feature_attribution(tiny_lm, torch.zeros(1, 3, dtype=torch.long), LogitDiff(3, 5))
