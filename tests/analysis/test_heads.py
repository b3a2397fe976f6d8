"""Head analysis: ablation scores = the same ablation done on the weights, the head-mask gradient = finite
differences, the attention summary = a plain loop over the queries, labels from forced patterns, and the errors.
Small odd models of both families, padded on either side, fused and explicit attention."""

import copy

import pytest
import torch

from scratch_models import BertConfig, BertModel
from scratch_models.analysis.heads import (AttentionSummary, analyze_heads, attention_summary, head_ablation_scores,
                                           head_mask_importance, token_groups)
from scratch_models.analysis.metrics import PoolerOutput, TokenLogit, TokenLogProb, last_positions
from helpers import randomize_
from test_patching import SEQ, VOCAB, prompts, small, with_path

HEADS = 3


pytestmark = pytest.mark.usefixtures("one_thread")

def pooled(dtype=torch.float32):
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=HEADS,
                                 intermediate_size=40, max_position_embeddings=16))
    return randomize_(model, 0.3).to(dtype).eval()


def model_and_metric(kind: str, padding: str, dtype=torch.float32):
    inputs = prompts(padding, 1)
    if kind == "pooler":
        return pooled(dtype), inputs, PoolerOutput()
    model = small(kind, dtype)
    at = last_positions(inputs["attention_mask"])
    metric = TokenLogProb(torch.tensor([3, 5]), positions=at) if kind == "bert" else TokenLogit(torch.tensor([3, 5]),
                                                                                               positions=at)
    return model, inputs, metric


def value_slices(model, layer: int, head: int):
    """The value weight and bias entries that make head `head`'s values: BERT's value Linear rows; GPT-2's
    c_attn columns 2h + head*d .. (q, k and v side by side, Conv1D stored [in, out])."""
    attn = model.layers[layer].attn
    d = attn.head_dim
    if hasattr(attn, "value"):
        return [(attn.value.weight, (slice(head * d, (head + 1) * d),)), (attn.value.bias, (slice(head * d, (head + 1) * d),))]
    h = attn.num_heads * d
    cols = slice(2 * h + head * d, 2 * h + (head + 1) * d)
    return [(attn.c_attn.weight, (slice(None), cols)), (attn.c_attn.bias, (cols,))]


def change(metric, edited, base):
    delta = (edited - base).double()
    return float((delta if delta.dim() == 1 else delta.norm(dim=-1)).mean())


KINDS = [(kind, padding, path) for kind in ("bert", "gpt2", "pooler") for padding in ("right", "left")
         for path in ("fused", "explicit")]


@pytest.mark.parametrize("kind,padding,path", KINDS)
def test_ablation_scores_equal_ablating_the_value_weights(kind, padding, path):
    """Zero ablation = the head's rows of the value weight and value bias zeroed; mean ablation = those weights
    zeroed and the bias set to the head's mean output (its weights over the keys sum to 1)."""
    model, inputs, metric = model_and_metric(kind, padding)
    inputs = with_path(inputs, path)
    zero = head_ablation_scores(model, inputs, metric, ablation="zero", batch_size=4)
    mean = head_ablation_scores(model, inputs, metric, ablation="mean")
    with torch.no_grad():
        base = metric(model(**inputs))
        _, cache = model.run_with_cache(**inputs, names=lambda n: n.endswith("attn.context"))
    real = inputs["attention_mask"].bool()
    worst = 0.0
    for layer in range(2):
        context = cache[f"layers.{layer}.attn.context"]  # [b, n, s, d]
        for head in range(HEADS):
            for how, scores in (("zero", zero), ("mean", mean)):
                edited = copy.deepcopy(model)
                weight, bias = value_slices(edited, layer, head)
                with torch.no_grad():
                    weight[0][weight[1]] = 0
                    bias[0][bias[1]] = 0 if how == "zero" else context[:, head][real].mean(0)
                    expected = change(metric, metric(edited(**inputs)), base)
                worst = max(worst, abs(float(scores[layer, head]) - expected))
                assert float(scores[layer, head]) == pytest.approx(expected, abs=2e-5), (how, layer, head)
    assert worst <= 2e-5


@pytest.mark.parametrize("kind,padding,path", KINDS)
def test_head_mask_gradient_equals_finite_differences(kind, padding, path):
    model, inputs, metric = model_and_metric(kind, padding, torch.float64)
    inputs = with_path(inputs, path)
    importance = head_mask_importance(model, inputs, metric)
    eps = 1e-6
    for layer in range(2):
        for head in range(HEADS):
            def scaled(factor):
                def hook(x, _):
                    x = x.clone()
                    x[:, head] *= factor
                    return x
                with torch.no_grad():
                    return metric(model.run_with_hooks(**inputs, hooks=[(f"layers.{layer}.attn.context", hook)]))

            derivative = (scaled(1 + eps) - scaled(1 - eps)) / (2 * eps)  # per prompt: [b] or [b, k]
            size = derivative.abs() if derivative.dim() == 1 else derivative.norm(dim=-1)
            assert float(importance[layer, head]) == pytest.approx(float(size.mean()), rel=1e-6, abs=1e-8)


def test_gradient_is_taken_per_prompt_before_the_absolute_value():
    """Two prompts whose gradients have opposite signs would cancel in the gradient of the mean."""
    model, inputs, metric = model_and_metric("gpt2", "right", torch.float64)
    per_prompt = head_mask_importance(model, inputs, metric)
    alone = torch.stack([head_mask_importance(model, {k: v[i:i + 1] for k, v in inputs.items()},
                                              TokenLogit(metric.token[i:i + 1], positions=metric.positions[i:i + 1]))
                         for i in range(2)])
    assert torch.allclose(per_prompt, alone.mean(0), rtol=1e-10)


def reference_summary(probs, real, groups):
    """A plain loop over the real queries: {behaviour: share}, entropy, for one layer's [b, n, s, s] probs."""
    b, n, s, _ = probs.shape
    totals = {name: torch.zeros(n, dtype=torch.float64) for name in [*groups, "self", "prev", "next", "entropy"]}
    count = 0
    for row in range(b):
        for q in range(s):
            if not real[row, q]:
                continue
            count += 1
            p = probs[row, :, q].double()  # [n, keys]
            for name, keys in groups.items():
                totals[name] += p[:, keys[row]].sum(-1)
            totals["self"] += p[:, q]
            totals["prev"] += p[:, q - 1] if q > 0 else 0
            totals["next"] += p[:, q + 1] if q + 1 < s else 0
            totals["entropy"] -= torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
    return {name: total / count for name, total in totals.items()}


@pytest.mark.parametrize("family,padding", [(f, p) for f in ("bert", "gpt2") for p in ("none", "right", "left")])
def test_attention_summary_equals_a_loop_over_the_queries(family, padding):
    model = small(family)
    inputs = prompts(padding, 3)
    groups = {"first": torch.zeros(2, SEQ, dtype=torch.bool), "odd": torch.arange(SEQ).repeat(2, 1) % 2 == 1}
    groups["first"][:, 0] = True
    with torch.no_grad():
        _, cache = model.run_with_cache(**inputs)  # every hook point, as inspect caches them
    # from a run of its own, and from a run already made
    for summary in attention_summary(model, inputs, groups), AttentionSummary.from_cache(cache, groups):
        for layer in range(2):
            expected = reference_summary(cache[f"layers.{layer}.attn.probs"], inputs["attention_mask"].bool(), groups)
            for name, values in expected.items():
                got = summary.entropy[layer] if name == "entropy" else summary.shares[name][layer]
                assert torch.allclose(got, values, atol=1e-12), (layer, name)


@pytest.mark.parametrize("family,padding", [("bert", "right"), ("gpt2", "left")])
def test_labels_name_the_dominant_behaviour(family, padding):
    """Layer 0's heads forced to attend to the previous token, to the group "sink" (each row's first real token,
    which every query may see), and evenly to every key they may see; layer 1 left as it is."""
    model = small(family)
    inputs = prompts(padding, 4)
    real = inputs["attention_mask"].bool()
    seq = SEQ
    visible = real[:, None, :].expand(2, seq, seq)
    if family == "gpt2":
        visible = visible & torch.ones(seq, seq, dtype=torch.bool).tril()
    sink = torch.zeros(2, seq, dtype=torch.bool)
    sink[torch.arange(2), real.long().argmax(-1)] = True

    def forced(probs, _):
        out = torch.zeros_like(probs)
        prev = torch.diag_embed(torch.ones(seq - 1), offset=-1)
        prev[0, 0] = 1
        out[:, 0] = prev
        weights = (sink[:, None, :] & visible).float()
        out[:, 1] = torch.where(weights.sum(-1, keepdim=True) > 0, weights, visible.float())
        out[:, 2] = visible.float() / visible.sum(-1, keepdim=True).clamp(min=1)
        return out

    with model.hooks([("layers.0.attn.probs", forced)]):
        summary = attention_summary(model, inputs, {"sink": sink})
    labels = summary.labels[0]
    assert labels[0] == "prev" and labels[1] == "→sink" and labels[2] == "broad", labels
    assert summary.entropy[0, 2] == pytest.approx(summary.uniform_entropy, rel=1e-6)


def test_token_groups():
    tokens = [["[CLS]", "hello", ",", "##.", "[SEP]", "[PAD]"], ["[CLS]", " world", " !", "word", "[SEP]", "[SEP]"]]
    groups = token_groups(tokens, ["[CLS]", "[SEP]", "[MASK]"], first_token=True)
    assert set(groups) == {"[CLS]", "[SEP]", "punct", "first"}  # no [MASK] in the texts: no group for it
    assert groups["[SEP]"].tolist() == [[False] * 4 + [True, False], [False] * 4 + [True, True]]
    assert groups["punct"].tolist() == [[False, False, True, True, False, False], [False, False, True, False, False,
                                                                                    False]]
    assert groups["first"][:, 0].all() and not groups["first"][:, 1:].any()
    left_padded = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    first = token_groups(tokens, attention_mask=left_padded, first_token=True)["first"]
    assert first.nonzero().tolist() == [[0, 2], [1, 0]]


def test_analyze_heads_reports_and_ranks():
    model, inputs, metric = model_and_metric("bert", "right")
    report = analyze_heads(model, inputs, metric, groups={"first": inputs["attention_mask"].bool() & (
        torch.arange(SEQ) == 0)}, target="MLM log-probability")
    assert report.zero_ablation.shape == report.mean_ablation.shape == report.importance.shape == (2, HEADS)
    assert not report.vector_target
    ranked = report.ranked()
    assert len(ranked) == 2 * HEADS
    assert [abs(r["zero_ablation"]) for r in ranked] == sorted((abs(r["zero_ablation"]) for r in ranked),
                                                               reverse=True)
    data = report.to_json()
    assert data["labels"] == report.attention.labels and data["num_heads"] == HEADS
    assert set(data["shares"]) == {"first", "self", "prev", "next"}
    vector = analyze_heads(*model_and_metric("pooler", "left"), target="pooler")
    assert vector.vector_target and bool((vector.zero_ablation >= 0).all())


def test_head_refusals():
    model, inputs, metric = model_and_metric("gpt2", "none")
    with pytest.raises(ValueError, match="ablation must be 'zero' or 'mean'"):
        head_ablation_scores(model, inputs, metric, ablation="random")
    with pytest.raises(ValueError, match="training mode"):
        head_mask_importance(copy.deepcopy(model).train(), inputs, metric)
    with torch.inference_mode(), pytest.raises(ValueError, match="head_mask_importance takes a gradient"):
        head_mask_importance(model, inputs, metric)
    with pytest.raises(ValueError, match=r"groups\['sep'\] must be bool \(2, 7\)"):
        attention_summary(model, inputs, {"sep": torch.zeros(2, 7)})
    with pytest.raises(ValueError, match="'self' is a positional behaviour"):
        attention_summary(model, inputs, {"self": torch.zeros(2, 7, dtype=torch.bool)})
    with torch.no_grad():
        _, probs_only = model.run_with_cache(**inputs, names=lambda n: n.endswith("attn.probs"))
    with pytest.raises(KeyError, match="'layers.0.attn.scores' is not cached"):
        AttentionSummary.from_cache(probs_only)
    with pytest.raises(ValueError, match="not one after remove_batch_dim"):
        AttentionSummary.from_cache(probs_only.remove_batch_dim(row=0))
    with pytest.raises(ValueError, match="masks every token"):
        head_ablation_scores(model, {**inputs, "attention_mask": torch.zeros(2, 7, dtype=torch.long)}, metric,
                             ablation="mean")
    with pytest.raises(ValueError, match=r"returned shape \(2, 3, 4\)"):
        head_mask_importance(model, inputs, lambda out: torch.zeros(2, 3, 4))
