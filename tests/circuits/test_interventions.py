"""Feature interventions without a peer (circuit-tracer's own numbers: test_circuit_tracer_parity.py)."""

import pytest
import torch

from circuit_data import DEFAULT_HOOKS, HOOKS, random_transcoders, tiny_model
from scratch_models.circuits import attribute, feature_intervention, feature_intervention_generate

IDS = torch.tensor([2, 5, 9, 11, 7, 3, 8])


@pytest.mark.parametrize("family, kind", [("llama", "transcoder_set"), ("gemma2", "cross_layer_transcoder"),
                                          ("gpt_neox", "transcoder_set")])
def test_with_every_layer_constrained_each_feature_moves_by_its_edge(family, kind):
    """Every layer constrained is the local replacement model: ablating a feature changes each feature node's
    pre-activation by minus its edge from it (an edge is the source's activation times its direct effect).
    Tolerance: 1e-5 of the largest pre-activation (two forward passes, each rounding in float32)."""
    model = tiny_model(family)
    tc = random_transcoders(2, model.config.hidden_size, 20, kind=kind, hooks=HOOKS.get(family, DEFAULT_HOOKS),
                            skip=kind == "transcoder_set", jumprelu=True)
    graph = attribute(model, tc, IDS)
    everything = dict(constrained_layers=range(2), apply_activation_function=False)
    _, before = feature_intervention(model, tc, IDS, [], **everything)
    for source in (graph.active_features[:, 0] == 0).nonzero()[:3, 0].tolist():
        layer, pos, feature = graph.active_features[source].tolist()
        _, after = feature_intervention(model, tc, IDS, [(layer, pos, feature, 0.0)], **everything)
        targets = graph.active_features[graph.selected_features]
        change = (after - before)[targets[:, 0], targets[:, 1], targets[:, 2]]
        edges = graph.adjacency_matrix[:len(targets), source]
        assert edges.abs().max() > 1e-3
        assert (change + edges).abs().max() <= 1e-5 * before.abs().max()


def test_unconstrained_interventions_propagate_and_no_intervention_is_the_model():
    model = tiny_model("gemma2")
    tc = random_transcoders(2, model.config.hidden_size, 20, hooks=HOOKS["gemma2"], jumprelu=True)
    with torch.no_grad():
        plain = model(input_ids=IDS[None]).logits
    logits, acts = feature_intervention(model, tc, IDS, [])
    assert torch.equal(logits, plain) and (acts[:, 0] == 0).all() and (acts[:, 1:] > 0).any()
    layer0 = (acts[0, 3] > 0).nonzero()[0, 0].item()
    steered, after = feature_intervention(model, tc, IDS, [(0, 3, layer0, 5.0)], freeze_attention=False)
    assert after[0, 3, layer0] == acts[0, 3, layer0]  # the transcoders read the unedited input there
    assert not torch.allclose(after[1], acts[1]) and torch.equal(after[0], acts[0])
    assert not torch.allclose(steered[0, 3:], plain[0, 3:]) and torch.allclose(steered[0, :3], plain[0, :3])
    with pytest.raises(ValueError, match="layer 5: the transcoders have layers 0..1"):
        feature_intervention(model, tc, IDS, [(5, 1, 0, 1.0)])


def test_generation_without_interventions_is_the_models_greedy_generation():
    model = tiny_model("qwen3")
    tc = random_transcoders(2, model.config.hidden_size, 20)
    tokens, logits, acts = feature_intervention_generate(model, tc, IDS, [], max_new_tokens=5, stop_at_eos=False)
    expected = model.generate(IDS[None], max_new_tokens=5, do_sample=False)[0]
    assert tokens.tolist() == expected.tolist()
    with torch.no_grad():
        full = model(input_ids=tokens[None]).logits[0]
    torch.testing.assert_close(logits, full[len(IDS) - 1:-1], rtol=1e-5, atol=1e-5)
    assert acts.shape == (2, len(tokens) - 1, 20)
    steered, _, _ = feature_intervention_generate(model, tc, IDS, [(1, slice(3, None), 0, 50.0)], max_new_tokens=5,
                                                  stop_at_eos=False)
    assert steered.tolist() != tokens.tolist()
