"""Which features of the attached dictionaries a metric depends on, for one batch of prompts.

    model.attach(sae)
    result = feature_attribution(model, batch, LogitDiff(answer, wrong))
    print(result.table())          # the ranked features; result.to_json(); attribution_png(result, "features.png")

Attribution (activation times gradient, the first-order estimate of attribution patching; Syed et al. 2023, Marks
et al. 2024) ranks every feature of every attached dictionary from one forward and one backward pass: zeroing
feature i at every position changes the metric by about -Σ_s acts[s, i] · d metric / d acts[s, i]. The `top`
features so ranked are then ablated exactly, each in a run of its own, batched as the patching sweeps are
(analysis/patching.py's run_patches: the batch repeated once per feature, a feature that never fires not run at all).
Gradients are the model's own through the splice (splice.py), so the estimate is that of the model with its error
term, which is the model itself.
"""

import dataclasses

import torch

from ..analysis.patching import (DEFAULT_BATCH_SIZE, Patch, _check_ready, check_autograd, check_metric,
                                 forward_inputs, measure, run_patches)


@dataclasses.dataclass
class FeatureAttribution:
    """Every feature's attribution, the exact ablation of the top ones, and where in the prompts each acts.

    `metric`: the unablated run's (the mean over the prompts; one number for a metric that gives one). `features`:
    one dict per feature that fires in the prompts, by |attribution| (largest first): hook (our hook point of the
    dictionary), feature, attribution (the estimated change of the metric when the feature is zeroed everywhere),
    ablation (the exact change, for the top ones; None for the rest), max_act, and positions: [prompt, position]
    where it contributes most. `per_position`: (hook, feature) -> [prompts, positions] estimates of the top ones.
    `tokens`: each prompt's tokens, when the model has a tokenizer."""

    metric: float
    features: list[dict]
    per_position: dict[tuple[str, int], torch.Tensor]
    tokens: list[list[str]] | None = None

    def top(self, n: int | None = None) -> list[dict]:
        return [row for row in self.features if row["ablation"] is not None][:n]

    def table(self, n: int = 20) -> str:
        """The `n` features of largest |attribution|, one line each."""
        lines = [f"metric {self.metric:.6g}; zeroing a feature everywhere changes it by:",
                 f"{'rank':>4}  {'hook':<28} {'feature':>7}  {'attribution':>12}  {'ablation':>12}  {'max act':>9}  "
                 "where (prompt, position: token)"]
        for rank, row in enumerate(self.features[:n]):
            ablation = "" if row["ablation"] is None else f"{row['ablation']:.6g}"
            prompt, position = row["position"]
            token = f": {self.tokens[prompt][position]!r}" if self.tokens else ""
            lines.append(f"{rank:>4}  {row['hook']:<28} {row['feature']:>7}  {row['attribution']:>12.6g}  "
                         f"{ablation:>12}  {row['max_act']:>9.4g}  {prompt}, {position}{token}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"metric": self.metric, "tokens": self.tokens, "features": self.features,
                "per_position": [{"hook": hook, "feature": feature, "values": values.tolist()}
                                 for (hook, feature), values in self.per_position.items()]}


def feature_attribution(model, tokens, metric, *, top: int = 20, batch_size: int = DEFAULT_BATCH_SIZE
                        ) -> FeatureAttribution:
    """Rank the features of every dictionary attached to `model` for `metric` (a callable of the model's output
    giving one value per prompt, or one for the batch: scratch_models.analysis.metrics) on `tokens` (input_ids, or a
    dict of forward arguments), and ablate the `top` of them exactly."""
    inputs = forward_inputs(tokens)
    _check_ready(model, batch_size)
    check_autograd("feature attribution")
    sites = list(model.dictionaries)
    if not sites:
        raise ValueError("no dictionary is attached: model.attach(sae) first")
    names = [f"{site}.sae.acts" for site in sites]
    batch = inputs["input_ids"].shape[0]
    measured = []

    def summed(output):  # the prompts' values summed: each prompt's gradient reaches its own positions only
        value = measure(model, metric, output)
        measured.append(check_metric(value, batch))
        return value.sum()

    _, cache = model.run_with_cache(**inputs, names=names, incl_bwd=True, metric=summed, return_type="output")
    value = measured[0]
    one_for_the_batch = value.numel() == 1 and batch > 1  # TransformerLens' metrics: summed over the prompts
    estimates = {}  # (site, feature) -> [b, s] estimated change of the metric
    rows = []
    for site, name in zip(sites, names):
        acts, grads = cache[name].double(), cache[f"{name}_grad"].double()
        change = -(acts * grads)  # [b, s, f]: zeroing the feature there, to first order
        total = change.sum((0, 1)) if one_for_the_batch else change.sum(1).mean(0)
        for feature in (acts > 0).flatten(0, 1).any(0).nonzero().flatten().tolist():  # the features that fire
            where = int(change[..., feature].abs().argmax())
            rows.append({"hook": site, "feature": feature, "attribution": float(total[feature]), "ablation": None,
                         "max_act": float(acts[..., feature].max()),
                         "position": [where // acts.shape[1], where % acts.shape[1]]})
            estimates[site, feature] = change[..., feature]
    rows.sort(key=lambda row: -abs(row["attribution"]))
    chosen = rows[:top]
    if chosen:
        patches = [Patch(f"{row['hook']}.sae.acts", torch.arange(model.dictionaries[row["hook"]].cfg.d_sae)
                         == row["feature"]) for row in chosen]
        sources = {f"{site}.sae.acts": torch.zeros(()) for site in sites}
        with torch.no_grad():
            values = run_patches(model, inputs, patches, sources, metric, batch_size=batch_size)
        baseline = float(value.double().mean())
        for row, ablated in zip(chosen, values):
            row["ablation"] = float(ablated.mean()) - baseline
    return FeatureAttribution(float(value.double().mean()), rows,
                              {(row["hook"], row["feature"]): estimates[row["hook"], row["feature"]].cpu()
                               for row in chosen}, _str_tokens(model, inputs["input_ids"]))


def _str_tokens(model, ids: torch.Tensor) -> list[list[str]] | None:
    """Each prompt's tokens as strings, or None for a model without a tokenizer's files."""
    from ..registry.tokenizer import NoTokenizerJson

    if getattr(model, "tokenizer", None) is None:
        return None
    try:
        return [model.tokenizer.str_tokens(row) for row in ids.cpu()]
    except NoTokenizerJson:
        return None
