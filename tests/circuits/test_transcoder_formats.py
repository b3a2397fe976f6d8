"""Transcoder sets as other tools publish them, built here from random numbers: Gemma Scope 2's (google/gemma-scope-2-*,
per-layer and cross-layer, on a tiny Gemma 3), circuit-tracer's configs that list those files, SAELens-saved
transcoders, and TopK sets. Each splices in with the error term leaving the output bitwise the model's, reconstructs
what the publisher's formula says, and a set for another model or hook is refused naming what differs."""

import json

import pytest
import torch
import yaml
from safetensors.torch import save_file

from circuit_data import gemma_scope_2_params, random_transcoders, tiny_model, write_clt, write_plt
from helpers import assert_parity, fake_hub
from scratch_models.circuits import attribute, load_transcoders, save_transcoders, spliced
from scratch_models.dictionaries import DictionaryError

IDS = torch.tensor([[2, 7, 19, 3, 33, 12, 5]])
H, F = 48, 24  # the tiny Gemma 3's hidden size; the features (circuit_data's Gemma Scope 2 sets)


def published_reconstruction(params, xs, layer, *, cross_layer):
    """Gemma Scope 2's formula, from its own tensors: acts_l = JumpReLU(x_l @ w_enc + b_enc); out_m = sum over the
    layers l that write m of acts_l @ w_dec_l (into m) + b_dec_m + x_m @ affine_skip_connection_m."""
    def acts(l):
        pre = xs[l] @ params[l]["w_enc"] + params[l]["b_enc"]
        return pre * (pre > params[l]["threshold"])

    if cross_layer:
        out = sum(acts(l) @ params[l]["w_dec"][:, layer] for l in range(layer + 1))
    else:
        out = acts(layer) @ params[layer]["w_dec"]
    out = out + params[layer]["b_dec"]
    if "affine_skip_connection" in params[layer]:
        out = out + xs[layer] @ params[layer]["affine_skip_connection"]
    return out


def check_splice(model, tc, params, *, cross_layer):
    """Bitwise with the error term; without it, each output hook holds the published formula's reconstruction."""
    inputs, outputs = tc.sites(model)
    with torch.no_grad():
        before = model(input_ids=IDS).logits
        with spliced(model, tc) as acts:
            assert torch.equal(model(input_ids=IDS).logits, before)
        assert all((a > 0).any() and (a == 0).any() for a in acts.values())
        with spliced(model, tc, error_term=False):
            _, cache = model.run_with_cache(input_ids=IDS, names=inputs + outputs)
    xs = [cache[name][0] for name in inputs]
    for layer, name in enumerate(outputs):
        assert_parity(cache[name][0], published_reconstruction(params, xs, layer, cross_layer=cross_layer),
                      f"layer {layer}'s reconstruction", terms=F * len(params) + H)


def check_graph(model, tc):
    """`attribute` takes the set: its active features and activations are the splice's, position 0 left out."""
    graph = attribute(model, tc, IDS[0], max_n_logits=3)
    with spliced(model, tc) as acts, torch.no_grad():
        model(input_ids=IDS)
    active = sorted((l, p, f) for l in range(tc.n_layers) for p, f in (acts[l][0] != 0).nonzero().tolist() if p)
    assert sorted(map(tuple, graph.active_features.tolist())) == active
    assert torch.equal(graph.activation_values, torch.stack([acts[l][0, p, f]
                                                             for l, p, f in graph.active_features.tolist()]))


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
def test_gemma_scope_2_per_layer_transcoders_on_gemma_3(tmp_path, affine):
    model = tiny_model("gemma3_text")
    params = gemma_scope_2_params(2, affine=affine)
    where = write_plt(tmp_path / "gemma-scope-2-1b-pt", params, "width_16k_l0_small" + "_affine" * affine)
    tc = load_transcoders(where)  # the name circuit-tracer's sets give them: {site}/{variant}
    assert (tc.cfg.kind, tc.activation_function, tc.W_skip is not None) == ("transcoder_set", "jumprelu", affine)
    # the MLP's input after pre_feedforward_layernorm, its output after post_feedforward_layernorm
    assert tc.sites(model) == (["layers.0.ln_2", "layers.1.ln_2"], ["layers.0.mlp_out", "layers.1.mlp_out"])
    assert torch.equal(tc.W_enc[1], params[1]["w_enc"].T) and torch.equal(tc.threshold[0], params[0]["threshold"])
    check_splice(model, tc, params, cross_layer=False)
    check_graph(model, tc)
    save_transcoders(tc, tmp_path / "saved")  # in circuit-tracer's layout, and back
    assert all(torch.equal(a, b) for a, b in zip(load_transcoders(tmp_path / "saved").state_dict().values(),
                                                 tc.state_dict().values()))
    # circuit-tracer's config.yaml listing the files loads the same set, also from hf:// (the cache or the hub)
    files = [where.parent / f"layer_{l}_{where.name}" / "params.safetensors" for l in range(2)]
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in", "feature_output_hook": "hook_mlp_out",
        "transcoders": [f"hf://google/gemma-scope-2-1b-pt/transcoder_all/{f.parent.name}/params.safetensors"
                        for f in files]}))
    with pytest.MonkeyPatch.context() as patch:
        calls = fake_hub(patch, {f"transcoder_all/{f.parent.name}/params.safetensors": f for f in files})
        again = load_transcoders(listed)
    assert [c["repo_id"] for c in calls] == ["google/gemma-scope-2-1b-pt"] * 2
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), tc.state_dict().values()))


def test_gemma_scope_2_cross_layer_transcoder_on_gemma_3(tmp_path):
    model = tiny_model("gemma3_text")
    params = gemma_scope_2_params(2, cross_layer=True, affine=True)
    tc = load_transcoders(write_clt(tmp_path, params, "width_262k_l0_medium_affine"))
    assert tc.cross_layer and tc.W_skip is not None
    assert torch.equal(tc.W_dec[1], params[1]["w_dec"][:, 1:])  # layer 1 writes into layer 1 only: not into 0
    check_splice(model, tc, params, cross_layer=True)
    check_graph(model, tc)
    with pytest.raises(DictionaryError, match=r"a cross-layer set with a skip connection .*nothing written"):
        save_transcoders(tc, tmp_path / "saved")  # circuit-tracer's CLT files hold no skip
    assert not (tmp_path / "saved").exists()


def test_a_gemma_scope_2_set_for_another_model_is_refused_naming_what_differs(tmp_path):
    model = tiny_model("gemma3_text")
    deeper = load_transcoders(write_plt(tmp_path / "a", gemma_scope_2_params(3)))
    with pytest.raises(DictionaryError, match=r"3 layers of transcoders; this Gemma3ForCausalLM has 2 layers"):
        deeper.sites(model)
    wider = load_transcoders(write_clt(tmp_path / "b", gemma_scope_2_params(2, d_model=64, cross_layer=True)))
    with pytest.raises(DictionaryError, match=r"over 64 dimensions .*hidden size is 48"):
        wider.sites(model)
    where = write_plt(tmp_path / "c", gemma_scope_2_params(2), config=False)
    config = where.parent / f"layer_1_{where.name}" / "config.json"
    config.write_text(json.dumps({"architecture": "jump_relu", "hf_hook_point_in": "model.layers.1.output"}))
    with pytest.raises(DictionaryError, match=r"hf_hook_point_in 'model.layers.1.output'; a Gemma Scope 2 "
                                              r"transcoder of layer 1 reads model.layers.1.pre_feedforward"):
        load_transcoders(where)
    gap = write_plt(tmp_path / "d", gemma_scope_2_params(3), config=False)
    for file in (gap.parent / f"layer_1_{gap.name}").iterdir():
        file.unlink()
    (gap.parent / f"layer_1_{gap.name}").rmdir()
    with pytest.raises(DictionaryError, match=r"for layers \[0, 2\]; missing layer_1_width_16k_l0_small"):
        load_transcoders(gap)
    short = gemma_scope_2_params(2, cross_layer=True)
    short[1]["w_dec"] = short[1]["w_dec"][:, :1].contiguous()
    with pytest.raises(DictionaryError, match=r"params_layer_1.safetensors: w_dec is \[24, 1, 48\]; a cross-layer "
                                              r"transcoder of 2 layers"):
        load_transcoders(write_clt(tmp_path / "e", short))


# ---- SAELens-saved transcoders ------------------------------------------------------------------------------------


def write_saelens(root, architecture, n_layers=2, hooks=("ln2.hook_normalized", "hook_mlp_out"), seed=0):
    """Folders as SAELens' Transcoder.save_model writes them: cfg.json (SAELens 6's to_dict, d_out, metadata with
    hook_name and hook_name_out) + sae_weights.safetensors (W_enc [d_in, d_sae], W_dec [d_sae, d_out], W_skip
    [d_out, d_in])."""
    g = torch.Generator().manual_seed(seed)
    layers = []
    for layer in range(n_layers):
        t = {"W_enc": torch.randn(H, F, generator=g) * H ** -0.5, "b_enc": torch.randn(F, generator=g) * 0.1,
             "W_dec": torch.randn(F, H, generator=g) * 0.3, "b_dec": torch.randn(H, generator=g) * 0.1}
        if "jumprelu" in architecture:
            t["threshold"] = torch.rand(F, generator=g) * 0.1
        if "skip" in architecture:
            t["W_skip"] = torch.randn(H, H, generator=g) * 0.3 * H ** -0.5
        folder = root / f"blocks.{layer}.{hooks[0]}"
        folder.mkdir(parents=True)
        save_file(t, str(folder / "sae_weights.safetensors"))
        (folder / "cfg.json").write_text(json.dumps({
            "d_in": H, "d_sae": F, "d_out": H, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": False,
            "normalize_activations": "none", "reshape_activations": "none", "architecture": architecture,
            "metadata": {"sae_lens_version": "6.54.12", "model_name": "gemma-3-1b", "hook_name":
                         f"blocks.{layer}.{hooks[0]}", "hook_name_out": f"blocks.{layer}.{hooks[1]}",
                         "hook_head_index": None, "prepend_bos": True}}))
        layers.append(t)
    return layers


@pytest.mark.parametrize("architecture", ["transcoder", "jumprelu_skip_transcoder"])
def test_saelens_saved_transcoders(tmp_path, architecture):
    model = tiny_model("gemma3_text")
    t = write_saelens(tmp_path / "set", architecture)
    tc = load_transcoders(tmp_path / "set")
    # TL's ln2.hook_normalized: the MLP's input normalised, before the norm's gain
    assert tc.sites(model) == (["layers.0.norm_2.normalized", "layers.1.norm_2.normalized"],
                               ["layers.0.mlp_out", "layers.1.mlp_out"])
    _, outputs = tc.sites(model)
    with torch.no_grad():
        before = model(input_ids=IDS).logits
        with spliced(model, tc):
            assert torch.equal(model(input_ids=IDS).logits, before)
        with spliced(model, tc, error_term=False):
            _, cache = model.run_with_cache(input_ids=IDS, names=outputs + [f"blocks.{l}.ln2.hook_normalized"
                                                                          for l in range(2)])
    for layer in range(2):
        # SAELens' (JumpReLU)(Skip)Transcoder: relu(x @ W_enc + b_enc) (masked where not above threshold),
        # @ W_dec + b_dec (+ x @ W_skip.T); x what TransformerLens' ln2.hook_normalized holds, read by its formula
        x = cache[f"blocks.{layer}.ln2.hook_normalized"][0]
        pre = x @ t[layer]["W_enc"] + t[layer]["b_enc"]
        acts = torch.relu(pre) * (pre > t[layer]["threshold"]) if "threshold" in t[layer] else torch.relu(pre)
        expected = acts @ t[layer]["W_dec"] + t[layer]["b_dec"]
        if "W_skip" in t[layer]:
            expected = expected + x @ t[layer]["W_skip"].T
        assert_parity(cache[outputs[layer]][0], expected, f"layer {layer}", terms=F + H)


def test_saelens_transcoders_that_are_no_set_are_refused(tmp_path):
    write_saelens(tmp_path / "a", "transcoder", hooks=("hook_mlp_in", "hook_mlp_out"))
    write_saelens(tmp_path / "b", "transcoder", n_layers=1, hooks=("ln2.hook_normalized", "hook_mlp_out"))
    (tmp_path / "b" / "blocks.0.ln2.hook_normalized").rename(tmp_path / "a" / "blocks.0.ln2.hook_normalized")
    with pytest.raises(DictionaryError, match=r"a second transcoder for layer 0"):
        load_transcoders(tmp_path / "a")
    write_saelens(tmp_path / "c", "jumprelu_transcoder", n_layers=3)
    for file in (tmp_path / "c" / "blocks.1.ln2.hook_normalized").iterdir():
        file.unlink()
    with pytest.raises(DictionaryError, match=r"layers \[0, 2\]; none for layer\(s\) 1"):
        load_transcoders(tmp_path / "c")
    write_saelens(tmp_path / "d", "jumprelu_transcoder", n_layers=1)
    cfg = tmp_path / "d" / "blocks.0.ln2.hook_normalized" / "cfg.json"
    raw = json.loads(cfg.read_text())
    cfg.write_text(json.dumps(raw | {"architecture": "jumprelu"}))
    with pytest.raises(DictionaryError, match=r"architecture 'jumprelu' is not one of SAELens' transcoders"):
        load_transcoders(tmp_path / "d")
    raw["metadata"]["hook_name_out"] = "blocks.1.hook_mlp_out"
    cfg.write_text(json.dumps(raw))
    with pytest.raises(DictionaryError, match=r"hook_name_out 'blocks.1.hook_mlp_out'"):
        load_transcoders(tmp_path / "d")
    write_saelens(tmp_path / "e", "jumprelu_transcoder", n_layers=1)
    weights = tmp_path / "e" / "blocks.0.ln2.hook_normalized" / "sae_weights.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(weights)
    tensors["threshold"][3] = -0.5
    save_file(tensors, str(weights))
    with pytest.raises(DictionaryError, match=r"threshold holds 1 values below 0"):
        load_transcoders(tmp_path / "e")
    from scratch_models.dictionaries import SAE

    with pytest.raises(DictionaryError, match=r"a transcoder \(reads blocks.0.ln2.hook_normalized, writes "
                                              r"blocks.0.hook_mlp_out\), .*circuits.load_transcoders"):
        SAE.from_pretrained(tmp_path / "e" / "blocks.0.ln2.hook_normalized")  # one is no SAE


# ---- TopK ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["transcoder_set", "cross_layer_transcoder"])
def test_topk_sets_keep_k_as_circuit_tracer_applies_it(tmp_path, kind):
    model = tiny_model("llama")
    tc = random_transcoders(2, model.config.hidden_size, 20, kind=kind, k=3)
    save_transcoders(tc, tmp_path / "set")
    assert yaml.safe_load((tmp_path / "set" / "config.yaml").read_text())["k"] == 3
    tc = load_transcoders(tmp_path / "set")
    assert tc.activation_function == "topk" and tc.cfg.k == 3
    pre = tc.pre_acts(0, torch.randn(5, model.config.hidden_size))
    # circuit-tracer's TopK (activation_functions.py): a 0/1 gate on torch.topk's indices, times the pre-activations
    gate = torch.zeros_like(pre).scatter_(-1, torch.topk(pre, k=3, dim=-1).indices, 1)
    assert torch.equal(tc.activate(0, pre), pre * gate) and bool(((tc.activate(0, pre) != 0).sum(-1) == 3).all())
    with torch.no_grad():
        before = model(input_ids=IDS).logits
        with spliced(model, tc):
            assert torch.equal(model(input_ids=IDS).logits, before)
    graph = attribute(model, tc, IDS[0], max_n_logits=3)
    # every position but the first (no features there, as in circuit-tracer) has k features per layer
    assert len(graph.active_features) == 2 * 3 * (IDS.shape[1] - 1)
    with spliced(model, tc) as acts, torch.no_grad():
        model(input_ids=IDS)
    for layer, position, feature in graph.active_features.tolist():
        assert acts[layer][0, position, feature] != 0


def test_a_bad_k_is_refused(tmp_path):
    save_transcoders(random_transcoders(2, 16, 10), tmp_path / "set")
    raw = yaml.safe_load((tmp_path / "set" / "config.yaml").read_text())
    for k, message in ((11, r"k 11; a TopK set keeps 1 to 10 features"), ("3", r"k '3' is not an integer"),
                       (0, r"k 0; a TopK set keeps 1 to 10")):
        (tmp_path / "set" / "config.yaml").write_text(yaml.safe_dump(raw | {"k": k}))
        with pytest.raises(DictionaryError, match=message):
            load_transcoders(tmp_path / "set")
    save_transcoders(random_transcoders(2, 16, 10, jumprelu=True), tmp_path / "jump")
    raw = yaml.safe_load((tmp_path / "jump" / "config.yaml").read_text())
    (tmp_path / "jump" / "config.yaml").write_text(yaml.safe_dump(raw | {"k": 2}))
    with pytest.raises(DictionaryError, match=r"both k \(2, TopK\) and JumpReLU thresholds"):
        load_transcoders(tmp_path / "jump")


def test_gemma_scope_2_hub_names_load_offline_from_the_cache(tmp_path):
    """`google/gemma-scope-2-1b-pt/transcoder_all/{variant}` (the per-layer folders) and `.../clt/{variant}` from the
    Hugging Face cache with HF_HUB_OFFLINE set, as circuit-tracer's set names spell them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers import fake_hub_cache

    plt = write_plt(tmp_path / "src", gemma_scope_2_params(2, affine=True), "width_16k_l0_small_affine")
    write_plt(tmp_path / "src", gemma_scope_2_params(2, seed=3), "width_16k_l0_small")  # a variant beside it
    clt = write_clt(tmp_path / "src", gemma_scope_2_params(2, cross_layer=True), "width_262k_l0_medium")
    files = {str(p.relative_to(tmp_path / "src")): p for p in (tmp_path / "src").rglob("*") if p.is_file()}
    fake_hub_cache(tmp_path / "cache", "google/gemma-scope-2-1b-pt", files)
    code = ("from scratch_models.circuits import load_transcoders\n"
            "a = load_transcoders('google/gemma-scope-2-1b-pt/transcoder_all/width_16k_l0_small_affine')\n"
            "b = load_transcoders('google/gemma-scope-2-1b-pt/clt/width_262k_l0_medium')\n"
            "print(a.cfg.kind, a.n_layers, a.W_skip is not None, float(a.W_enc[1].sum()))\n"
            "print(b.cfg.kind, b.n_layers, float(b.W_enc[1].sum()))\n")
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.split()[:3] == ["transcoder_set", "2", "True"]  # the _affine variant's folders, not the other's
    assert float(first.split()[3]) == pytest.approx(float(load_transcoders(plt).W_enc[1].sum()))
    assert second.split()[:2] == ["cross_layer_transcoder", "2"]
    assert float(second.split()[2]) == pytest.approx(float(load_transcoders(clt).W_enc[1].sum()))
