"""Attribution graphs without a peer: identities the local replacement model must satisfy on every registered causal
family (circuit-tracer's numbers themselves: test_circuit_tracer_parity.py, in its own venv)."""

import pytest
import torch

from circuit_data import DEFAULT_HOOKS, HOOKS, random_transcoders, tiny_model
from scratch_models import FAMILIES
from scratch_models.circuits import Graph, attribute, compute_influence, graph_scores, prune_graph
from scratch_models.circuits.graph import normalize_matrix

CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
IDS = torch.tensor([2, 5, 9, 11, 7, 3, 8])


def without_constants(family: str):
    """A tiny model of `family` whose every bias (and GPT-2's position embeddings) is 0: then nothing but the graph's
    nodes feeds the stream."""
    model = tiny_model(family)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "wpe" in name:
                p.zero_()
    return model


def reads(model, transcoders, ids):
    """What each layer's input hook and the final norm hold on `ids`: {hook: [n, h]}."""
    names = set(transcoders.sites(model)[0]) | {"ln_f"}
    seen = {}
    with torch.no_grad(), model.hooks([(lambda name: name in names, lambda x, name: seen.__setitem__(name, x[0]))]):
        model(input_ids=ids[None])
    return seen


@pytest.mark.parametrize("family", CAUSAL)
@pytest.mark.parametrize("kind", ["transcoder_set", "cross_layer_transcoder"])
def test_each_row_sums_to_what_its_target_reads(family, kind):
    """With no constants (biases 0, b_dec 0) and every position given its nodes, the local replacement model is
    linear in its nodes: a feature's row sums to its pre-activation less b_enc, a logit's to the demeaned logit
    read from the final norm's output. Tolerance: float32 rounding of the dot products the two sides take, 1e-5 of
    the sum of the magnitudes they add (|W_enc| |x| for the read, the row's absolute sum for the edges)."""
    model = without_constants(family)
    tc = random_transcoders(2, model.config.hidden_size, 20, kind=kind, hooks=HOOKS.get(family, DEFAULT_HOOKS),
                            b_dec=False, skip=True, jumprelu=True)
    graph = attribute(model, tc, IDS, batch_size=16, zero_positions=slice(0, 0))
    A, seen, inputs = graph.adjacency_matrix, reads(model, tc, IDS), tc.sites(model)[0]
    assert len(graph.selected_features) > 20
    for row, index in enumerate(graph.selected_features.tolist()):
        layer, pos, feature = graph.active_features[index].tolist()
        x, w = seen[inputs[layer]][pos], tc.W_enc[layer][feature]
        scale = w.norm() * x.norm() + A[row].abs().sum()
        assert (A[row].sum() - x @ w).abs() <= 1e-5 * scale, (layer, pos, feature)
    W = model.family.stream(model).unembedding()
    for j, (_, token) in enumerate(graph.logit_targets):
        vector = W[token] - W.mean(0)
        row = A[len(A) - len(graph.logit_targets) + j]
        scale = vector.norm() * seen["ln_f"][-1].norm() + row.abs().sum()
        assert (row.sum() - seen["ln_f"][-1] @ vector).abs() <= 1e-5 * scale


def test_bos_has_no_features_and_no_error():
    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20)
    graph = attribute(model, tc, IDS)
    assert (graph.active_features[:, 1] > 0).all()
    n, S = len(IDS), len(graph.selected_features)
    errors = graph.adjacency_matrix[:, S:S + 2 * n]
    assert (errors[:, 0] == 0).all() and (errors[:, n] == 0).all()  # error[layer][0] of both layers
    assert errors[:, 1].abs().sum() > 0


def test_max_feature_nodes_keeps_the_full_graphs_entries_and_batches_change_nothing():
    """The graph of the 30 most influential features holds the full graph's entries at their rows and columns;
    computing the rows 3 at a time gives the same numbers as all at once."""
    model = tiny_model("gemma2")
    tc = random_transcoders(2, model.config.hidden_size, 20, hooks=HOOKS["gemma2"], jumprelu=True, skip=True)
    full = attribute(model, tc, IDS)
    part = attribute(model, tc, IDS, max_feature_nodes=30, batch_size=3)
    assert len(part.selected_features) == 30 < len(full.selected_features)
    assert torch.equal(part.active_features, full.active_features)
    keep = torch.cat([part.selected_features, torch.arange(len(full.selected_features), len(full.adjacency_matrix))])
    expected = full.adjacency_matrix[keep][:, keep]
    torch.testing.assert_close(part.adjacency_matrix[:30], expected[:30], rtol=0, atol=1e-6)
    torch.testing.assert_close(part.adjacency_matrix[-len(part.logit_targets):], expected[-len(part.logit_targets):],
                               rtol=0, atol=1e-6)
    # the kept features are the most influential ones by the logit rows' ranking: the first is the top one
    influence = compute_influence(normalize_matrix(full.adjacency_matrix), full.logit_weights())
    assert int(influence[:len(full.selected_features)].argmax()) in part.selected_features.tolist()


def test_rows_in_groups_under_the_gradient_budget_are_the_same(monkeypatch):
    """A backward pass's gradients kept under a budget of two targets' worth: the same graph, bitwise."""
    from scratch_models.circuits import attribution as module

    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20, kind="cross_layer_transcoder")
    whole = attribute(model, tc, IDS, batch_size=16)
    pattern = model.config.num_attention_heads * len(IDS) ** 2
    monkeypatch.setattr(module, "GRADIENT_BYTES", 2 * (2 * 3 * len(IDS) * model.config.hidden_size + pattern) * 4)
    grouped = attribute(model, tc, IDS, batch_size=16)
    assert torch.equal(grouped.adjacency_matrix, whole.adjacency_matrix)


def test_custom_direction_is_linear_in_the_logit_rows():
    """A logit difference (W[a] - W[b]) as a custom target: its row is row(a) - row(b)."""
    model = tiny_model("qwen3")
    tc = random_transcoders(2, model.config.hidden_size, 20)
    W = model.family.stream(model).unembedding()
    tokens = attribute(model, tc, IDS, attribution_targets=torch.tensor([4, 9]))
    assert [t for _, t in tokens.logit_targets] == [4, 9]
    diff = attribute(model, tc, IDS, attribution_targets=[("4 - 9", 1.0, W[4] - W[9])])
    assert diff.logit_targets[0] == ("4 - 9", model.config.vocab_size)
    expected = tokens.adjacency_matrix[-2] - tokens.adjacency_matrix[-1]
    got = diff.adjacency_matrix[-1]
    assert (got[:-1] - expected[:-2]).abs().max() <= 1e-5 * expected.abs().max()


def test_salient_logits_stop_at_the_cumulative_probability():
    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20)
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=IDS[None]).logits[0, -1], -1)
    top = probs.sort(descending=True)
    graph = attribute(model, tc, IDS, desired_logit_prob=0.5, max_n_logits=30)
    k = int((top.values.cumsum(0) < 0.5).sum()) + 1
    assert [t for _, t in graph.logit_targets] == top.indices[:k].tolist()
    torch.testing.assert_close(graph.logit_probabilities, top.values[:k])
    assert len(attribute(model, tc, IDS, desired_logit_prob=0.99, max_n_logits=3).logit_targets) == 3


def test_influence_is_the_series_and_pruning_keeps_tokens_and_logits(tmp_path):
    model = tiny_model("gemma2")
    tc = random_transcoders(2, model.config.hidden_size, 20, hooks=HOOKS["gemma2"])
    graph = attribute(model, tc, IDS)
    A = normalize_matrix(graph.adjacency_matrix).double()
    w = graph.logit_weights().double()
    series = w @ (torch.linalg.inv(torch.eye(len(A), dtype=A.dtype) - A) - torch.eye(len(A), dtype=A.dtype))
    torch.testing.assert_close(compute_influence(normalize_matrix(graph.adjacency_matrix), graph.logit_weights()),
                               series.float(), rtol=1e-4, atol=1e-7)
    pruned = prune_graph(graph, 0.5, 0.9)
    n, k = len(IDS), len(graph.logit_targets)
    assert pruned.node_mask[-n - k:].all() and not pruned.node_mask.all()
    assert not pruned.edge_mask[~pruned.node_mask].any() and not pruned.edge_mask[:, ~pruned.node_mask].any()
    replacement, completeness = graph_scores(graph)
    assert 0 < replacement < 1 and 0 < completeness < 1
    graph.to_pt(tmp_path / "graph.pt")
    again = Graph.from_pt(tmp_path / "graph.pt")
    assert torch.equal(again.adjacency_matrix, graph.adjacency_matrix) and again.logit_targets == graph.logit_targets
    with pytest.raises(ValueError, match="node_threshold must be between"):
        prune_graph(graph, 1.5)


def test_rows_on_disk_are_the_rows_in_memory(tmp_path):
    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20, kind="cross_layer_transcoder")
    in_memory = attribute(model, tc, IDS, batch_size=5)
    on_disk = attribute(model, tc, IDS, batch_size=5, rows_to=tmp_path / "adjacency.npy")
    assert torch.equal(on_disk.adjacency_matrix, in_memory.adjacency_matrix)
    import numpy as np

    assert np.array_equal(np.load(tmp_path / "adjacency.npy"), in_memory.adjacency_matrix.numpy())


def test_bad_input_is_refused_naming_it():
    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 37\)"):
        attribute(model, tc, torch.tensor([2, 40, 3]))
    with pytest.raises(ValueError, match="at least 2 token ids"):
        attribute(model, tc, torch.tensor([2]))
    with pytest.raises(ValueError, match="30 tokens long; this model reads at most 24"):
        attribute(model, tc, torch.arange(30) % 30)
    with pytest.raises(ValueError, match=r"token ids in \[0, 37\)"):
        attribute(model, tc, IDS, attribution_targets=torch.tensor([50]))
    with pytest.raises(ValueError, match="vector of shape \\[3\\]"):
        attribute(model, tc, IDS, attribution_targets=[("x", 1.0, torch.zeros(3))])
    with pytest.raises(ValueError, match="attribution target 'hello': the model has no tokenizer; give token ids"):
        attribute(model, tc, IDS, attribution_targets=["hello"])
    bert = FAMILIES["bert"].lm(FAMILIES["bert"].tiny())
    with pytest.raises(ValueError, match="not one"):
        attribute(bert, random_transcoders(2, bert.config.hidden_size, 20), IDS)


class Stop(Exception):
    pass


@pytest.mark.parametrize("max_feature_nodes", [None, 25])
def test_a_run_stopped_part_way_continues_from_its_rows_to_the_same_graph(tmp_path, monkeypatch, max_feature_nodes):
    """Stopped after a few batches (and a half-written file left behind), the same call with the same rows_dir
    computes only the rows still missing and gives the uninterrupted graph bitwise; with max_feature_nodes the
    influence-ranked visit is replayed from the stored rows."""
    from scratch_models.circuits import attribution as module

    model = tiny_model("gemma2")
    tc = random_transcoders(2, model.config.hidden_size, 20, hooks=HOOKS["gemma2"], jumprelu=True, skip=True)
    options = dict(batch_size=4, max_feature_nodes=max_feature_nodes, update_interval=2)
    whole = attribute(model, tc, IDS, **options)

    def stop_after(batches):
        def progress(done, total):
            if done >= 4 * batches:
                raise Stop
        return progress

    with pytest.raises(Stop):
        attribute(model, tc, IDS, rows_dir=tmp_path / "rows", progress=stop_after(3), **options)
    (tmp_path / "rows" / "batch-000004.npy.partial").write_bytes(b"half")  # a kill during a write
    computed = []
    real = module._Rows.__call__
    monkeypatch.setattr(module._Rows, "__call__", lambda self, layers, *a: computed.append(len(layers)) or real(
        self, layers, *a))
    again = attribute(model, tc, IDS, rows_dir=tmp_path / "rows", **options)
    assert torch.equal(again.adjacency_matrix, whole.adjacency_matrix)
    assert torch.equal(again.selected_features, whole.selected_features)
    n_features = len(whole.selected_features)
    assert sum(computed) == n_features - 12 and n_features > 12  # the logit rows and 3 batches were kept
    assert not list((tmp_path / "rows").glob("*.partial"))


def test_rows_of_other_settings_are_refused_naming_what_differs(tmp_path):
    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20)
    attribute(model, tc, IDS, batch_size=4, rows_dir=tmp_path, identity={"model": "a"})
    with pytest.raises(ValueError, match=r"other settings \(batch_size: 4 there, 5 now\)"):
        attribute(model, tc, IDS, batch_size=5, rows_dir=tmp_path, identity={"model": "a"})
    with pytest.raises(ValueError, match=r'input_ids: \[2, 5, 9, 11, 7, 3, 8\] there, \[2, 5, 9, 11, 7, 3\] now'):
        attribute(model, tc, IDS[:-1], batch_size=4, rows_dir=tmp_path, identity={"model": "a"})
    with pytest.raises(ValueError, match=r'model: "a" there, "b" now'):
        attribute(model, tc, IDS, batch_size=4, rows_dir=tmp_path, identity={"model": "b"})
    other = random_transcoders(2, model.config.hidden_size, 20, seed=5)  # the same names, other numbers
    with pytest.raises(ValueError, match=r"other settings \(forward pass \(digest\): \"\w+\" there, \"\w+\" now\)"):
        attribute(model, other, IDS, batch_size=4, rows_dir=tmp_path, identity={"model": "a"})
    (tmp_path / "batch-000001.npy").write_bytes(b"\x93NUMPY cut short")
    with pytest.raises(ValueError, match=r"batch-000001.npy: unreadable \(.*\): delete .* to start again"):
        attribute(model, tc, IDS, batch_size=4, rows_dir=tmp_path, identity={"model": "a"})
    (tmp_path.parent / "strange").mkdir()
    (tmp_path.parent / "strange" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"strange: holds notes.txt and no rows.json: not the rows of an attribution"):
        attribute(model, tc, IDS, rows_dir=tmp_path.parent / "strange")


def test_influence_pruning_and_scores_read_in_blocks_of_rows_are_the_whole_matrix(monkeypatch, tmp_path):
    """Blocks of 3 rows (of a memory-mapped adjacency) against the whole matrix at once: the same masks, and influence
    and scores within float32 rounding of sums taken in another order (1e-5 relative to the largest)."""
    from scratch_models.circuits import graph as module
    from scratch_models.circuits import node_influence

    model = tiny_model("gemma2")
    tc = random_transcoders(2, model.config.hidden_size, 20, hooks=HOOKS["gemma2"], jumprelu=True)
    graph = attribute(model, tc, IDS, max_feature_nodes=30, rows_to=tmp_path / "adjacency.npy")
    whole = compute_influence(normalize_matrix(graph.adjacency_matrix), graph.logit_weights())
    monkeypatch.setattr(module, "BLOCK_ROWS", 10 ** 9)
    at_once, scores_at_once = prune_graph(graph, 0.7, 0.9), graph_scores(graph)
    monkeypatch.setattr(module, "BLOCK_ROWS", 3)
    blocked = node_influence(graph)
    assert (blocked - whole).abs().max() <= 1e-5 * whole.abs().max()
    pruned = prune_graph(graph, 0.7, 0.9)
    assert torch.equal(pruned.node_mask, at_once.node_mask) and torch.equal(pruned.edge_mask, at_once.edge_mask)
    assert pruned.edge_mask.any() and not pruned.node_mask.all()
    assert graph_scores(graph) == pytest.approx(scores_at_once, rel=1e-5)
