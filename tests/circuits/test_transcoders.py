"""Transcoder sets as circuit-tracer and Gemma Scope store them, checked against a model, and spliced into it."""

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from circuit_data import DEFAULT_HOOKS, HOOKS, random_transcoders, tiny_model
from scratch_models.circuits import load_transcoders, save_transcoders, spliced
from scratch_models.dictionaries import DictionaryError

IDS = torch.tensor([[2, 5, 9, 11, 7, 3, 8]])


@pytest.mark.parametrize("kind, shape", [("transcoder_set", dict(jumprelu=True, skip=True)),
                                         ("transcoder_set", {}), ("cross_layer_transcoder", dict(jumprelu=True))])
def test_files_round_trip_and_encode_is_the_formula(tmp_path, kind, shape):
    tc = random_transcoders(3, 16, 10, kind=kind, **shape)
    save_transcoders(tc, tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    if kind == "cross_layer_transcoder":
        assert names == ["W_dec_0.safetensors", "W_dec_1.safetensors", "W_dec_2.safetensors", "W_enc_0.safetensors",
                         "W_enc_1.safetensors", "W_enc_2.safetensors", "config.yaml"]
        assert load_file(tmp_path / "W_dec_1.safetensors")["W_dec_1"].shape == (10, 2, 16)
        assert set(load_file(tmp_path / "W_enc_0.safetensors")) == {"W_enc_0", "b_enc_0", "b_dec_0", "threshold_0"}
    else:
        stored = load_file(tmp_path / "layer_1.safetensors")
        assert set(stored) == {"W_enc", "W_dec", "b_enc", "b_dec"} | (
            {"activation_function.threshold", "W_skip"} if shape else set())
    again = load_transcoders(tmp_path)
    assert again.cfg.kind == kind and again.cfg.feature_input_hook == "mlp.hook_in"
    for a, b in zip(again.state_dict().values(), tc.state_dict().values()):
        assert torch.equal(a, b)
    x = torch.randn(5, 16)
    pre = x @ tc.W_enc[1].T + tc.b_enc[1]
    want = pre * (pre > tc.threshold[1]) if shape.get("jumprelu") else pre.relu()
    torch.testing.assert_close(again.encode(1, x), want)
    assert 0 < (want > 0).sum() < want.numel()


def test_gemma_scope_params_npz(tmp_path):
    g = np.random.default_rng(0)
    params = {"W_enc": g.normal(size=(16, 12)).astype(np.float32), "W_dec": g.normal(size=(12, 16)).astype(np.float32),
              "b_enc": g.normal(size=12).astype(np.float32), "b_dec": g.normal(size=16).astype(np.float32),
              "threshold": np.abs(g.normal(size=12)).astype(np.float32)}
    for layer in range(2):
        (tmp_path / f"layer_{layer}").mkdir()
        np.savez(tmp_path / f"layer_{layer}" / "params.npz", **params)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "transcoder_set", "feature_input_hook": "ln2.hook_normalized",
        "feature_output_hook": "hook_mlp_out", "transcoders": [f"layer_{i}/params.npz" for i in range(2)]}))
    tc = load_transcoders(tmp_path)
    assert torch.equal(tc.W_enc[0], torch.from_numpy(params["W_enc"]).T) and tc.activation_function == "jumprelu"
    x = torch.from_numpy(g.normal(size=(3, 16)).astype(np.float32))
    pre = x @ torch.from_numpy(params["W_enc"]) + torch.from_numpy(params["b_enc"])
    torch.testing.assert_close(tc.encode(1, x), pre * (pre > torch.from_numpy(params["threshold"])))
    del params["threshold"]
    np.savez(tmp_path / "layer_1" / "params.npz", **params)
    with pytest.raises(DictionaryError, match=r"layer_1/params.npz: missing threshold"):
        load_transcoders(tmp_path)


def test_a_set_for_another_model_is_refused_naming_what_differs(tmp_path):
    model = tiny_model("llama")  # 2 layers, hidden 48
    with pytest.raises(DictionaryError, match="3 layers of transcoders; this LlamaForCausalLM has 2 layers"):
        random_transcoders(3, 48, 10).sites(model)
    with pytest.raises(DictionaryError, match="over 32 dimensions .*hidden size is 48"):
        random_transcoders(2, 32, 10).sites(model)
    with pytest.raises(DictionaryError, match="'ln2.hook_nromalized'.*closest: blocks.0.ln2.hook_normalized"):
        random_transcoders(2, 48, 10, hooks=("ln2.hook_nromalized", "hook_mlp_out")).sites(model)
    with pytest.raises(DictionaryError, match=r"attn.hook_z is our layers.0.attn.context in another layout"):
        random_transcoders(2, 48, 10, hooks=("attn.hook_z", "hook_mlp_out")).sites(model)
    assert random_transcoders(2, 48, 10, hooks=HOOKS["gemma2"]).sites(model) == (
        ["layers.0.norm_2.normalized", "layers.1.norm_2.normalized"], ["layers.0.mlp.proj", "layers.1.mlp.proj"])


def test_bad_files_are_refused_naming_the_file_and_tensor(tmp_path):
    tc = random_transcoders(2, 16, 10, jumprelu=True)
    save_transcoders(tc, tmp_path)
    stored = load_file(tmp_path / "layer_1.safetensors")
    stored["W_dec"] = torch.zeros(10, 15)
    save_file(stored, tmp_path / "layer_1.safetensors")
    with pytest.raises(DictionaryError, match=r"layer 1's W_dec is \[10, 15\].*needs \[10, 16\]"):
        load_transcoders(tmp_path)
    stored["W_dec"] = torch.full((10, 16), float("nan"))
    save_file(stored, tmp_path / "layer_1.safetensors")
    with pytest.raises(DictionaryError, match=r"layer_1.safetensors: tensor W_dec holds 160 NaN"):
        load_transcoders(tmp_path)
    del stored["activation_function.threshold"]
    stored["W_dec"] = torch.zeros(10, 16)
    save_file(stored, tmp_path / "layer_1.safetensors")
    with pytest.raises(DictionaryError, match="threshold is in .*layer_0.safetensors but not in .*layer_1"):
        load_transcoders(tmp_path)
    (tmp_path / "layer_1.safetensors").rename(tmp_path / "layer_2.safetensors")
    with pytest.raises(DictionaryError, match=r"layers \[0, 2\]; missing layer_1.safetensors"):
        load_transcoders(tmp_path)
    (tmp_path / "config.yaml").write_text("model_kind: sae\nfeature_input_hook: a\nfeature_output_hook: b\n")
    with pytest.raises(DictionaryError, match="model_kind 'sae' is not one circuit-tracer loads"):
        load_transcoders(tmp_path)
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(DictionaryError, match="no transcoder set here; looked for circuit-tracer.s config.yaml"):
        load_transcoders(tmp_path)


@pytest.mark.parametrize("family, kind", [("gemma2", "transcoder_set"), ("llama", "cross_layer_transcoder"),
                                          ("gpt2", "transcoder_set")])
def test_spliced_with_the_error_term_the_output_is_the_models_bitwise(family, kind):
    model = tiny_model(family)
    tc = random_transcoders(2, model.config.hidden_size, 20, kind=kind, hooks=HOOKS.get(family, DEFAULT_HOOKS),
                            skip=kind == "transcoder_set", jumprelu=True)
    with torch.no_grad():
        before = model(input_ids=IDS).logits
        with spliced(model, tc) as acts:
            during = model(input_ids=IDS).logits
        assert torch.equal(before, during) and acts[1].shape == (1, 7, 20) and (acts[1] > 0).any()
        with spliced(model, tc, error_term=False):
            assert not torch.allclose(model(input_ids=IDS).logits, before, atol=1e-3)
        # zeroing layer 1's features takes exactly their decoded writes out of layer 1's output
        out = tc.sites(model)[1][1]
        _, clean = model.run_with_cache(input_ids=IDS, names=[out])
        with spliced(model, tc, edit=lambda l, a: a * 0 if l == 1 else a) as acts:
            _, ablated = model.run_with_cache(input_ids=IDS, names=[out])
        decoded = sum(acts[s] @ tc.decoder(s, 1) for s in range(2) if 1 in tc.writes(s) and s == 1)
        torch.testing.assert_close(ablated[out], clean[out] - decoded, rtol=1e-5, atol=1e-5)


def test_hub_id_offline_from_the_cache_and_named_when_absent(tmp_path):
    import os
    import subprocess
    import sys

    from helpers import fake_hub_cache

    save_transcoders(random_transcoders(2, 16, 10, jumprelu=True), tmp_path / "src")
    fake_hub_cache(tmp_path / "cache", "org/transcoders",
                   {f"plt/{p.name}": p for p in (tmp_path / "src").iterdir()})
    code = ("from scratch_models.circuits import load_transcoders\n"
            "print(load_transcoders('org/transcoders/plt').d_transcoder)\n"
            "load_transcoders('org/other')\n")
    repo = Path(__file__).resolve().parents[2]  # this tree's package, whatever the venv has installed
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["10"], done.stderr
    assert "DictionaryError: org/other: not a local directory, and the hub could not give it" in done.stderr


@pytest.mark.parametrize("family, kind", [("gemma2", "cross_layer_transcoder"), ("llama", "transcoder_set")])
def test_a_layer_as_a_dictionary_encodes_as_the_transcoder_at_its_input_hook(family, kind):
    """What `scratch-models features --transcoder-layer` counts: the layer's features, at the point the graph reads
    them (the features run is matched to the graph's layer by that point)."""
    from scratch_models.dictionaries import resolve_hook

    model = tiny_model(family)
    transcoders = random_transcoders(len(model.layers), model.config.hidden_size, 24, kind=kind, jumprelu=True,
                                     hooks=HOOKS.get(family, DEFAULT_HOOKS))
    x = torch.randn(5, model.config.hidden_size)
    for layer in range(transcoders.n_layers):
        sae = transcoders.dictionary(layer)
        assert resolve_hook(model, sae.cfg.hook_name).name == transcoders.sites(model)[0][layer]
        assert torch.equal(sae.encode(x), transcoders.encode(layer, x))
        assert (sae.encode(x) > 0).any() and (sae.encode(x) == 0).any()
    with pytest.raises(ValueError, match=r"layer 9: the transcoders have layers 0..1"):
        transcoders.dictionary(9)
