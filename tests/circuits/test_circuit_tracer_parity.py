"""Exactly circuit-tracer 0.5.0: its TransformerLens replacement model and `attribute` against ours, on tiny random
Gemma 2 and Llama checkpoints with per-layer (JumpReLU with a skip connection, ReLU) and cross-layer transcoder sets
written in its layout and read back by its own loaders.

circuit-tracer needs transformers <= 4.57 and transformer-lens < 4, which the peers extra excludes, so this file
runs in a venv of its own and skips elsewhere. From the repository's root:

    python3 -m venv /work/venv-circuit-tracer && /work/venv-circuit-tracer/bin/pip install torch==2.13.0 && \
    /work/venv-circuit-tracer/bin/pip install circuit-tracer==0.5.0 pytest && \
    PYTHONPATH=.:tests/circuits /work/venv-circuit-tracer/bin/python -m pytest -q -p no:cacheprovider \
        tests/circuits/test_circuit_tracer_parity.py

(circuit-tracer 0.5.0 with transformer-lens 3.2.1 and transformers 4.57.3 when written.)

Tolerances: the adjacency within 1e-5 of its largest entry (float32; the two sides sum the same products in other
orders through models whose forward passes round differently by a few units in the last place); activations and
probabilities within 1e-5 relative; the sets of active features, logit targets, selected features and the pruning
masks equal.
"""

import importlib
import json
import math

import pytest
import torch

circuit_tracer = pytest.importorskip("circuit_tracer", reason="circuit-tracer is not installed (it needs "
                                                              "transformers <= 4.57 and transformer-lens < 4): run "
                                                              "this file in a venv of its own, as its docstring says")

from circuit_tracer import attribute as their_attribute  # noqa: E402
from circuit_tracer.graph import compute_graph_scores, compute_node_influence  # noqa: E402
from circuit_tracer.graph import prune_graph as their_prune  # noqa: E402

import circuit_tracer_side as side  # noqa: E402
from circuit_data import random_transcoders  # noqa: E402
from scratch_models import FAMILIES  # noqa: E402
from scratch_models.circuits import (attribute, feature_intervention, feature_intervention_generate,  # noqa
                                     graph_scores, load_transcoders, node_influence, prune_graph, save_transcoders,
                                     write_frontend_files)

TINY = side.Sizes(vocab=41, hidden=32, heads=4, kv_heads=2, head_dim=8, mlp=48, layers=3, context=64)
LAYERS = TINY.layers


def hf_checkpoint(family: str, directory):
    return side.hf_checkpoint(family, directory, TINY)


def their_model(family: str, hf_model, transcoders):
    return side.their_model(family, hf_model, transcoders, TINY)


def their_transcoders(directory, kind: str):
    return side.their_transcoders(directory, kind, LAYERS)


def tokenizer():
    return side.Tokenizer(TINY.vocab)


HOOKS = {"gemma2": ("ln2.hook_normalized", "hook_mlp_out"), "llama": ("mlp.hook_in", "mlp.hook_out")}
CASES = [("gemma2", "transcoder_set", dict(jumprelu=True, skip=True), {}),
         ("gemma2", "transcoder_set", dict(), dict(max_feature_nodes=40, batch_size=7)),
         ("gemma2", "cross_layer_transcoder", dict(), {}),
         ("llama", "transcoder_set", dict(jumprelu=True, skip=True), dict(max_feature_nodes=50, batch_size=16)),
         ("llama", "transcoder_set", dict(), {}),
         ("llama", "cross_layer_transcoder", dict(jumprelu=True), dict(max_feature_nodes=60, batch_size=9))]


@pytest.mark.parametrize("family, kind, shape, options", CASES)
def test_attribution_graph_is_circuit_tracers(tmp_path, monkeypatch, family, kind, shape, options):
    hf = hf_checkpoint(family, tmp_path / "model")
    ours_tc = random_transcoders(LAYERS, TINY.hidden, 24, kind=kind, hooks=HOOKS[family], **shape)
    save_transcoders(ours_tc, tmp_path / "transcoders")
    ours_tc = load_transcoders(tmp_path / "transcoders")  # read back from circuit-tracer's layout
    theirs_model = their_model(family, hf, their_transcoders(tmp_path / "transcoders", kind))
    ours_model = FAMILIES[family].lm.from_pretrained(tmp_path / "model")
    ours_model.tokenizer = tokenizer()  # the same token texts on both sides (the checkpoint has no tokenizer)
    ids = torch.tensor([1, 7, 19, 3, 33, 12, 5, 28, 9])
    settings = dict(batch_size=options.get("batch_size", 512), max_feature_nodes=options.get("max_feature_nodes"))
    theirs = their_attribute(ids, theirs_model, max_n_logits=6, desired_logit_prob=0.9, **settings)
    ours = attribute(ours_model, ours_tc, ids, max_n_logits=6, desired_logit_prob=0.9, **settings)

    assert torch.equal(ours.active_features, theirs.active_features)
    torch.testing.assert_close(ours.activation_values, theirs.activation_values, rtol=1e-5, atol=1e-6)
    assert [v for _, v in ours.logit_targets] == [t.vocab_idx for t in theirs.logit_targets]
    torch.testing.assert_close(ours.logit_probabilities, theirs.logit_probabilities, rtol=1e-5, atol=1e-7)
    assert torch.equal(ours.selected_features, theirs.selected_features)
    a, b = ours.adjacency_matrix, theirs.adjacency_matrix
    assert a.shape == b.shape
    scale = b.abs().max()
    assert (a - b).abs().max() <= 1e-5 * scale, (a - b).abs().max() / scale

    weights = torch.zeros(b.shape[0])
    weights[-len(theirs.logit_targets):] = theirs.logit_probabilities
    torch.testing.assert_close(node_influence(ours), compute_node_influence(b, weights), rtol=1e-4, atol=1e-7)
    for node_threshold, edge_threshold in ((0.8, 0.98), (0.5, 0.9)):
        mine, reference = prune_graph(ours, node_threshold, edge_threshold), their_prune(theirs, node_threshold,
                                                                                          edge_threshold)
        assert torch.equal(mine.node_mask, reference.node_mask)
        assert torch.equal(mine.edge_mask, reference.edge_mask)
        torch.testing.assert_close(mine.cumulative_scores, reference.cumulative_scores, rtol=1e-4, atol=1e-6)
        assert 0 < mine.node_mask.sum() < len(mine.node_mask) and 0 < mine.edge_mask.sum()
    for mine, reference in zip(graph_scores(ours), compute_graph_scores(theirs)):
        assert mine == pytest.approx(reference, rel=1e-4)
    if options.get("max_feature_nodes"):
        assert len(ours.selected_features) == options["max_feature_nodes"] < len(ours.active_features)

    # the frontend's files, as create_graph_files writes them (its tokenizer: ours above, by name)
    module = importlib.import_module("circuit_tracer.utils.create_graph_files")
    monkeypatch.setattr(module, "AutoTokenizer", type("AutoTokenizer", (), {
        "from_pretrained": staticmethod(lambda name: tokenizer())}))
    module.create_graph_files(theirs, "parity", str(tmp_path / "theirs"), node_threshold=0.8, edge_threshold=0.98)
    write_frontend_files(ours, "parity", tmp_path / "ours", decode=tokenizer().decode)
    for name in ("parity.json", "graph-metadata.json"):
        mine, reference = (json.loads((tmp_path / side / name).read_text()) for side in ("ours", "theirs"))
        _same(mine, reference, name)


INTERVENTIONS = [("gemma2", "transcoder_set", dict(jumprelu=True, skip=True), dict()),
                 ("gemma2", "transcoder_set", dict(jumprelu=True, skip=True), dict(freeze_attention=False)),
                 ("gemma2", "transcoder_set", dict(jumprelu=True, skip=True),
                  dict(constrained_layers=range(LAYERS), apply_activation_function=False)),
                 ("llama", "cross_layer_transcoder", dict(), dict(constrained_layers=range(1, LAYERS))),
                 ("llama", "cross_layer_transcoder", dict(jumprelu=True), dict()),
                 ("llama", "transcoder_set", dict(skip=True), dict(constrained_layers=range(LAYERS)))]


@pytest.mark.parametrize("family, kind, shape, options", INTERVENTIONS)
def test_feature_intervention_is_circuit_tracers(tmp_path, family, kind, shape, options):
    """Set one active feature to 0 and scale another by 3 (a slice of positions for a third): the logits and every
    layer's activations after, within 1e-5 of the largest."""
    hf = hf_checkpoint(family, tmp_path / "model")
    save_transcoders(random_transcoders(LAYERS, TINY.hidden, 24, kind=kind, hooks=HOOKS[family], **shape),
                     tmp_path / "transcoders")
    ours_tc = load_transcoders(tmp_path / "transcoders")
    theirs_model = their_model(family, hf, their_transcoders(tmp_path / "transcoders", kind))
    ours_model = FAMILIES[family].lm.from_pretrained(tmp_path / "model")
    ids = torch.tensor([1, 7, 19, 3, 33, 12, 5, 28, 9])
    _, clean = theirs_model.get_activations(ids)
    first = (clean[0, 2] > 0).nonzero()[0, 0].item()
    second = (clean[1, 5] > 0).nonzero()[0, 0].item()
    interventions = [(0, 2, first, 0.0), (1, 5, second, 3 * clean[1, 5, second].item()), (2, slice(3, 6), 4, 1.5)]
    their_logits, their_acts = theirs_model.feature_intervention(ids, interventions, **options)
    our_logits, our_acts = feature_intervention(ours_model, ours_tc, ids, interventions, **options)
    assert (our_logits - their_logits).abs().max() <= 1e-5 * their_logits.abs().max()
    assert (our_acts - their_acts).abs().max() <= 1e-5 * their_acts.abs().max()
    unedited, _ = theirs_model.feature_intervention(ids, [], **options)
    assert (their_logits - unedited).abs().max() > 1e-3 * unedited.abs().max()  # the interventions change something


@pytest.mark.parametrize("family, kind", [("gemma2", "transcoder_set"), ("llama", "cross_layer_transcoder")])
def test_generation_under_an_intervention_is_circuit_tracers(tmp_path, family, kind):
    """Greedy generation with one feature zeroed in the prompt and one set on every position from 4 on (an
    open-ended slice, applied to each new token too): the same tokens, each step's logits and the activations."""
    hf = hf_checkpoint(family, tmp_path / "model")
    save_transcoders(random_transcoders(LAYERS, TINY.hidden, 24, kind=kind, hooks=HOOKS[family], jumprelu=True),
                     tmp_path / "transcoders")
    theirs_model = their_model(family, hf, their_transcoders(tmp_path / "transcoders", kind))
    ours_model = FAMILIES[family].lm.from_pretrained(tmp_path / "model")
    ids = torch.tensor([1, 7, 19, 3, 33, 12, 5, 28, 9])
    _, clean = theirs_model.get_activations(ids)
    interventions = [(0, 2, (clean[0, 2] > 0).nonzero()[0, 0].item(), 0.0), (1, slice(4, None), 3, 2.0)]
    tokens, logits, acts = theirs_model.feature_intervention_generate(ids[None], interventions, do_sample=False,
                                                                       max_new_tokens=4, verbose=False)
    our_tokens, our_logits, our_acts = feature_intervention_generate(ours_model, load_transcoders(
        tmp_path / "transcoders"), ids, interventions, max_new_tokens=4)
    assert our_tokens.tolist() == tokens[0].tolist()
    assert (our_logits - logits).abs().max() <= 1e-5 * logits.abs().max()
    assert (our_acts - acts).abs().max() <= 1e-5 * acts.abs().max()


@pytest.mark.parametrize("targets", ["ids", "strings", "direction"])
def test_chosen_targets_are_circuit_tracers(tmp_path, targets):
    """Token ids, token strings, and a logit difference as a custom direction."""
    hf = hf_checkpoint("llama", tmp_path / "model")
    save_transcoders(random_transcoders(LAYERS, TINY.hidden, 24, hooks=HOOKS["llama"], jumprelu=True, skip=True),
                     tmp_path / "transcoders")
    theirs_model = their_model("llama", hf, their_transcoders(tmp_path / "transcoders", "transcoder_set"))
    ours_model = FAMILIES["llama"].lm.from_pretrained(tmp_path / "model")
    ours_model.tokenizer = tokenizer()
    W = theirs_model.unembed.W_U  # [h, V]
    given = {"ids": torch.tensor([5, 9, 30]), "strings": ["t5", "t9"],
             "direction": [("t5 - t9", 1.0, (W[:, 5] - W[:, 9]).detach())]}[targets]
    ids = torch.tensor([1, 7, 19, 3, 33, 12, 5, 28, 9])
    theirs = their_attribute(ids, theirs_model, attribution_targets=given)
    ours = attribute(ours_model, load_transcoders(tmp_path / "transcoders"), ids, attribution_targets=given)
    assert ours.logit_targets == [tuple(t) for t in theirs.logit_targets]
    torch.testing.assert_close(ours.logit_probabilities, theirs.logit_probabilities, rtol=1e-5, atol=1e-7)
    a, b = ours.adjacency_matrix, theirs.adjacency_matrix
    assert a.shape == b.shape and (a - b).abs().max() <= 1e-5 * b.abs().max()


@pytest.mark.parametrize("kind", ["transcoder_set", "cross_layer_transcoder"])
def test_topk_attribution_graph_is_circuit_tracers(tmp_path, kind):
    """A TopK set: circuit-tracer 0.5.0 has the activation (activation_functions.TopK) but no loader that builds one
    and no file that holds k, so its set is read by its loader and given TopK(k) as a set's activation function, the
    way its classes take one; ours reads k from config.yaml."""
    from circuit_tracer.transcoder.activation_functions import TopK

    hf = hf_checkpoint("llama", tmp_path / "model")
    save_transcoders(random_transcoders(LAYERS, TINY.hidden, 24, kind=kind, hooks=HOOKS["llama"], k=4),
                     tmp_path / "transcoders")
    theirs_tc = their_transcoders(tmp_path / "transcoders", kind)
    for module in ([theirs_tc] if kind == "cross_layer_transcoder" else theirs_tc.transcoders):
        module.activation_function = TopK(4)
    theirs_model = their_model("llama", hf, theirs_tc)
    ours_model = FAMILIES["llama"].lm.from_pretrained(tmp_path / "model")
    ours_model.tokenizer = tokenizer()
    ids = torch.tensor([1, 7, 19, 3, 33, 12, 5, 28, 9])
    theirs = their_attribute(ids, theirs_model, max_n_logits=6, desired_logit_prob=0.9, batch_size=11)
    ours = attribute(ours_model, load_transcoders(tmp_path / "transcoders"), ids, max_n_logits=6,
                     desired_logit_prob=0.9, batch_size=11)
    assert torch.equal(ours.active_features, theirs.active_features)
    assert len(ours.active_features) == LAYERS * 4 * (len(ids) - 1)  # k per token and layer, none at position 0
    torch.testing.assert_close(ours.activation_values, theirs.activation_values, rtol=1e-5, atol=1e-6)
    a, b = ours.adjacency_matrix, theirs.adjacency_matrix
    assert a.shape == b.shape and (a - b).abs().max() <= 1e-5 * b.abs().max()


@pytest.mark.parametrize("cross_layer", [False, True], ids=["per-layer", "cross-layer"])
def test_gemma_scope_2_files_load_as_circuit_tracer_reads_them(tmp_path, cross_layer):
    """Gemma Scope 2's params.safetensors (built as published, with the affine skip) through circuit-tracer's
    load_gemma_scope_2_transcoder / load_gemma_scope_2_clt and ours: the same tensors, and the same features and
    outputs on the same inputs. (circuit-tracer 0.5.0's load_gemma_scope_2_clt reads layers range(max(paths)): given
    layers 0..n-1 it loads n-1 and fails; it is given one key past the last here so that it reads all n.)"""
    from circuit_tracer.transcoder.cross_layer_transcoder import load_gemma_scope_2_clt
    from circuit_tracer.transcoder.single_layer_transcoder import load_gemma_scope_2_transcoder

    from circuit_data import gemma_scope_2_params, write_clt, write_plt

    cpu = torch.device("cpu")
    params = gemma_scope_2_params(LAYERS, d_model=TINY.hidden, cross_layer=cross_layer, affine=True)
    if cross_layer:
        where = write_clt(tmp_path, params, "width_262k_l0_medium_affine")
        paths = {l: str(where / f"params_layer_{l}.safetensors") for l in range(LAYERS + 1)}
        theirs = load_gemma_scope_2_clt(paths, "mlp.hook_in", "hook_mlp_out", device=cpu, dtype=torch.float32)
    else:
        where = write_plt(tmp_path, params, "width_16k_l0_small_affine")
        theirs = [load_gemma_scope_2_transcoder(str(where.parent / f"layer_{l}_{where.name}" / "params.safetensors"),
                                                l, device=cpu, dtype=torch.float32) for l in range(LAYERS)]
    ours = load_transcoders(where)
    x = torch.randn(LAYERS, 6, TINY.hidden)
    acts = [ours.encode(l, x[l]) for l in range(LAYERS)]
    for l in range(LAYERS):
        if cross_layer:
            assert torch.equal(ours.W_enc[l], theirs.W_enc[l]) and torch.equal(ours.W_dec[l], theirs.W_dec[l])
            assert torch.equal(ours.threshold[l], theirs.activation_function.threshold[l, 0])
            assert torch.equal(ours.W_skip[l], theirs.W_skip[l])
            theirs_acts = theirs.encode_layer(x[l], l)
        else:
            for name in ("W_enc", "W_dec", "b_enc", "b_dec", "W_skip"):
                assert torch.equal(getattr(ours, name)[l], getattr(theirs[l], name)), name
            assert torch.equal(ours.threshold[l], theirs[l].activation_function.threshold)
            theirs_acts = theirs[l].encode(x[l])
            torch.testing.assert_close(ours.reconstruct(l, acts, x[l]), theirs[l].decode(theirs_acts, x[l]),
                                       rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(acts[l], theirs_acts, rtol=1e-5, atol=1e-6)  # its CLT encodes by einsum
        assert torch.equal(acts[l] > 0, theirs_acts > 0) and (acts[l] > 0).any()
    if cross_layer:
        # every layer's output from every layer's features, plus the skip (its forward passes decode no input_acts,
        # which its decode then asks for)
        decoded = theirs.decode(theirs.encode(x).to_sparse(), x)
        for l in range(LAYERS):
            torch.testing.assert_close(ours.reconstruct(l, acts, x[l]), decoded[l], rtol=1e-5, atol=1e-6)


def _same(mine, reference, where="") -> None:
    """The two JSON values alike: the same structure, strings and ints, and floats within 1e-4 relative (influences
    and weights are sums taken in other orders)."""
    assert type(mine) is type(reference) or {type(mine), type(reference)} == {int, float}, (where, mine, reference)
    if isinstance(reference, dict):
        assert mine.keys() == reference.keys(), where
        for key in reference:
            _same(mine[key], reference[key], f"{where}.{key}")
    elif isinstance(reference, list):
        assert len(mine) == len(reference), where
        for i, (a, b) in enumerate(zip(mine, reference)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(reference, float):
        assert math.isclose(mine, reference, rel_tol=1e-4, abs_tol=1e-6), (where, mine, reference)
    else:
        assert mine == reference, (where, mine, reference)
