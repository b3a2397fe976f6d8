"""Dictionaries in the formats they are published in: SAELens' cfg.json + sae_weights.safetensors (6.x and the older
field names), Gemma Scope's params.npz, sparsify's cfg.json + sae.safetensors; from a directory, a file or a hub id;
and every bad file refused by name before any work."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from dictionary_data import random_sae
from helpers import assert_parity, fake_hub, fake_hub_cache
from scratch_models.dictionaries import SAE, DictionaryError

ARCHITECTURES = ("standard", "topk", "jumprelu", "gated")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_saved_and_loaded_as_saelens_files(tmp_path, architecture):
    sae = random_sae(architecture, 12, 40, hook_name="blocks.1.hook_resid_pre")
    files = sae.save_pretrained(tmp_path / "sae")
    assert [f.name for f in files] == ["cfg.json", "sae_weights.safetensors"]
    raw = json.loads(files[0].read_text())
    # SAELens 6's SAEConfig.to_dict(): the fields at the top, what it was trained on under metadata
    assert raw["architecture"] == architecture and raw["d_in"] == 12 and raw["d_sae"] == 40
    assert raw["metadata"]["hook_name"] == "blocks.1.hook_resid_pre" and raw["reshape_activations"] == "none"
    loaded = SAE.from_pretrained(tmp_path / "sae")
    assert type(loaded) is type(sae) and loaded.cfg.format == "saelens"
    assert loaded.state_dict().keys() == sae.state_dict().keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in sae.state_dict().items())
    x = torch.randn(3, 5, 12)
    assert torch.equal(loaded.encode(x), sae.encode(x))
    assert SAE.from_pretrained(tmp_path / "sae" / "sae_weights.safetensors").cfg.hook_name == "blocks.1.hook_resid_pre"


def write_saelens(directory, cfg: dict, tensors: dict):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cfg.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "sae_weights.safetensors"))
    return directory


def test_older_saelens_field_names(tmp_path):
    """Before SAELens 6 (no sae_lens_version of 6): hook_point, activation_fn_str "topk" with activation_fn_kwargs.k,
    normalize_activations as a bool, and an all-ones scaling_factor, as handle_pre_6_0_config and
    read_sae_components_from_disk read them."""
    sae = random_sae("topk", 12, 40)
    tensors = sae.state_dict() | {"scaling_factor": torch.ones(40)}
    old = {"d_in": 12, "d_sae": 40, "hook_point": "blocks.0.hook_resid_post", "activation_fn_str": "topk",
           "activation_fn_kwargs": {"k": 8}, "normalize_activations": False, "model_name": "gpt2-small",
           "sae_lens_training_version": "3.13.0", "dtype": "torch.float32"}
    loaded = SAE.from_pretrained(write_saelens(tmp_path / "old", old, tensors))
    assert loaded.architecture == "topk" and loaded.cfg.k == 8 and loaded.cfg.apply_b_dec_to_input
    assert loaded.cfg.hook_name == "blocks.0.hook_resid_post" and loaded.cfg.metadata.model_name == "gpt2-small"
    assert loaded.cfg.normalize_activations == "none" and loaded.cfg.metadata.context_size is None
    x = torch.randn(4, 12)
    assert torch.equal(loaded.encode(x), sae.encode(x))
    jump = random_sae("jumprelu", 12, 40)
    state = jump.state_dict()
    state["log_threshold"] = state.pop("threshold").log()
    loaded = SAE.from_pretrained(write_saelens(tmp_path / "jump", {"d_in": 12, "d_sae": 40, "architecture": "jumprelu",
                                                                    "hook_name": "layers.0.out"}, state))
    assert torch.allclose(loaded.threshold, jump.threshold)


def test_a_scaling_factor_not_all_ones_is_refused(tmp_path):
    tensors = random_sae("standard", 12, 40).state_dict() | {"scaling_factor": torch.full((40,), 2.0)}
    with pytest.raises(DictionaryError, match=r"sae_weights.safetensors: holds a finetuning scaling_factor"):
        SAE.from_pretrained(write_saelens(tmp_path / "s", {"d_in": 12, "d_sae": 40, "hook_point": "x"}, tensors))


def test_expected_average_only_in_needs_its_factor_and_folds_it(tmp_path):
    sae = random_sae("standard", 12, 40, hook_name="layers.0.out")
    cfg = {"d_in": 12, "d_sae": 40, "normalize_activations": "expected_average_only_in", "hook_name": "layers.0.out"}
    directory = write_saelens(tmp_path / "e", cfg, sae.state_dict())
    with pytest.raises(DictionaryError, match="pretrained_saes.yaml's norm_scaling_factor\\): pass norm_scaling_factor"):
        SAE.from_pretrained(directory)
    folded = SAE.from_pretrained(directory, norm_scaling_factor=2.5)
    x = torch.randn(6, 12)
    assert folded.cfg.normalize_activations == "none"
    # the folded weights read x as the dictionary reads 2.5 x, and give back its reconstruction scaled down again
    assert_parity(folded.encode(x), sae.encode(2.5 * x), "folded encode", terms=12)
    assert_parity(folded(x), sae(2.5 * x) / 2.5, "folded reconstruction", terms=40, depth=2)


def gemma_scope_params(path, d_model=12, d_sae=40, seed=0):
    """params.npz as Gemma Scope publishes it: np.savez of W_enc [d_model, d_sae], W_dec, b_enc, b_dec, threshold."""
    g = np.random.default_rng(seed)
    params = {"W_enc": g.normal(0, 0.3, (d_model, d_sae)), "W_dec": g.normal(0, 0.3, (d_sae, d_model)),
              "b_enc": g.normal(0, 0.1, d_sae), "b_dec": g.normal(0, 0.1, d_model),
              "threshold": g.uniform(0, 0.3, d_sae)}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{k: v.astype(np.float32) for k, v in params.items()})
    return {k: torch.from_numpy(v.astype(np.float32)) for k, v in params.items()}


def test_gemma_scope_params_and_its_reference_formula(tmp_path):
    path = tmp_path / "gemma-scope-2b-pt-res" / "layer_1" / "width_16k" / "average_l0_20" / "params.npz"
    p = gemma_scope_params(path)
    sae = SAE.from_pretrained(path.parent)
    assert sae.architecture == "jumprelu" and not sae.cfg.apply_b_dec_to_input
    assert sae.cfg.hook_name == "blocks.1.hook_resid_post"  # from the repository's -res and the layer_1 folder
    x = torch.randn(3, 7, 12)
    # the Gemma Scope tutorial's JumpReLUSAE: pre = x @ W_enc + b_enc; acts = (pre > threshold) * relu(pre)
    pre = x @ p["W_enc"] + p["b_enc"]
    acts = (pre > p["threshold"]) * torch.relu(pre)
    assert torch.equal(sae.encode(x), acts) and (acts > 0).any() and (acts == 0).any()
    assert torch.equal(sae.decode(acts), acts @ p["W_dec"] + p["b_dec"])
    assert SAE.from_pretrained(path, hook_name="blocks.0.hook_mlp_out").cfg.hook_name == "blocks.0.hook_mlp_out"
    other = tmp_path / "mine" / "params.npz"
    gemma_scope_params(other)
    with pytest.raises(DictionaryError, match="params.npz names no hook.*pass hook_name="):
        SAE.from_pretrained(other)


def sparsify_files(directory, d_in=12, num_latents=40, k=5, seed=0):
    """cfg.json + sae.safetensors as sparsify's SparseCoder.save_to_disk writes them: nn.Linear's encoder.weight
    [num_latents, d_in] and encoder.bias, W_dec [num_latents, d_in], b_dec [d_in]."""
    g = torch.Generator().manual_seed(seed)
    tensors = {"encoder.weight": torch.randn(num_latents, d_in, generator=g) * 0.3,
               "encoder.bias": torch.randn(num_latents, generator=g) * 0.1,
               "W_dec": torch.randn(num_latents, d_in, generator=g) * 0.3, "b_dec": torch.randn(d_in, generator=g) * 0.1}
    directory.mkdir(parents=True)
    (directory / "cfg.json").write_text(json.dumps({"activation": "topk", "expansion_factor": 32,
                                                    "normalize_decoder": True, "num_latents": num_latents, "k": k,
                                                    "multi_topk": False, "skip_connection": False,
                                                    "transcode": False, "d_in": d_in}))
    save_file(tensors, str(directory / "sae.safetensors"))
    return tensors


def test_sparsify_files_and_its_encoder(tmp_path):
    t = sparsify_files(tmp_path / "layers.1")
    sae = SAE.from_pretrained(tmp_path / "layers.1")
    assert sae.architecture == "topk" and sae.cfg.k == 5 and sae.cfg.hook_name == "layers.1"  # the hookpoint
    x = torch.randn(9, 12)
    # sparsify's encode: top-k of relu(linear(x - b_dec)); decode: the chosen rows of W_dec, weighted, plus b_dec
    pre = F.relu(F.linear(x - t["b_dec"], t["encoder.weight"], t["encoder.bias"]))
    values, indices = pre.topk(5, dim=-1)
    ours = sae.encode(x)
    assert_parity(ours.gather(-1, indices), values, "top-k values", terms=12)
    assert int((ours > 0).sum(-1).max()) <= 5 and torch.equal((ours > 0), torch.zeros_like(ours).scatter(
        -1, indices, values).gt(0))
    reference = (values[..., None] * t["W_dec"][indices]).sum(-2) + t["b_dec"]
    assert_parity(sae.decode(ours), reference, "decode", terms=5)


def test_hub_ids_resolve_folders_like_checkpoints(monkeypatch, tmp_path):
    sae = random_sae("standard", 12, 40, hook_name="blocks.1.hook_resid_pre")
    files = sae.save_pretrained(tmp_path / "blocks.1.hook_resid_pre")
    calls = fake_hub(monkeypatch, {"blocks.1.hook_resid_pre/cfg.json": files[0],
                                   "blocks.1.hook_resid_pre/sae_weights.safetensors": files[1]})
    loaded = SAE.from_pretrained("org/saes", "blocks.1.hook_resid_pre")
    assert torch.equal(loaded.W_dec, sae.W_dec) and [c["filename"] for c in calls] == [
        "blocks.1.hook_resid_pre/cfg.json", "blocks.1.hook_resid_pre/sae_weights.safetensors"]
    params = tmp_path / "npz" / "params.npz"
    gemma_scope_params(params)
    from huggingface_hub.errors import RemoteEntryNotFoundError
    from helpers import http_error

    fake_hub(monkeypatch, {"layer_3/width_16k/average_l0_9/cfg.json": http_error(RemoteEntryNotFoundError, 404),
                           "layer_3/width_16k/average_l0_9/params.npz": params})
    loaded = SAE.from_pretrained("google/gemma-scope-2b-pt-mlp", "layer_3/width_16k/average_l0_9/params.npz")
    assert loaded.cfg.hook_name == "blocks.3.hook_mlp_out"


def run_offline(code: str, cache):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_hub_id_offline_from_the_cache_and_named_when_absent(tmp_path):
    files = random_sae("standard", 12, 40, hook_name="blocks.1.hook_resid_pre").save_pretrained(tmp_path / "src")
    fake_hub_cache(tmp_path / "cache", "org/saes", {"blocks.1.hook_resid_pre/cfg.json": files[0],
                                                    "blocks.1.hook_resid_pre/sae_weights.safetensors": files[1]})
    done = run_offline("""
        from scratch_models.dictionaries import SAE
        print(SAE.from_pretrained("org/saes", "blocks.1.hook_resid_pre").cfg.d_sae)
        SAE.from_pretrained("org/saes", "blocks.2.hook_resid_pre")
    """, tmp_path / "cache")
    assert done.stdout.split() == ["40"]
    assert "DictionaryError: org/saes: no such local path, and blocks.2.hook_resid_pre/cfg.json / " \
           "blocks.2.hook_resid_pre/params.npz / blocks.2.hook_resid_pre/params.safetensors is not in the local " \
           "Hugging Face cache" in done.stderr


# ---- bad files: each refused by name before any work ------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    return random_sae("jumprelu", 12, 40, hook_name="layers.0.out").save_pretrained(tmp_path / "sae")


def test_truncated_or_corrupt_weights_are_refused(saved):
    cfg, weights = saved
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(DictionaryError, match=r"sae_weights.safetensors: not a readable safetensors file"):
        SAE.from_pretrained(cfg.parent)
    weights.write_bytes(b"")
    with pytest.raises(DictionaryError, match=r"sae_weights.safetensors: the file is empty"):
        SAE.from_pretrained(cfg.parent)


def test_truncated_npz_is_refused(tmp_path):
    path = tmp_path / "gemma-scope-2b-pt-res" / "layer_0" / "params.npz"
    gemma_scope_params(path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(DictionaryError, match=r"params.npz: not a readable .npz file"):
        SAE.from_pretrained(path)


def test_corrupt_cfg_and_unknown_architecture(saved):
    cfg, _ = saved
    raw = json.loads(cfg.read_text())
    cfg.write_text("{not json")
    with pytest.raises(DictionaryError, match=r"cfg.json: cannot read it as JSON"):
        SAE.from_pretrained(cfg.parent)
    cfg.write_text(json.dumps(raw | {"architecture": "matryoshka_batchtopk"}))
    with pytest.raises(DictionaryError, match=r"cfg.json: architecture 'matryoshka_batchtopk' is not one we build; "
                                              r"known: standard, topk, jumprelu, gated"):
        SAE.from_pretrained(cfg.parent)
    cfg.write_text(json.dumps(raw | {"normalize_activations": "covariance_whitening"}))
    with pytest.raises(DictionaryError, match=r"normalize_activations 'covariance_whitening' is not one we apply"):
        SAE.from_pretrained(cfg.parent)
    cfg.write_text(json.dumps(raw | {"d_sae": 41}))
    with pytest.raises(DictionaryError, match=r"sae_weights.safetensors: W_enc has shape \[12, 40\]; d_in 12 and "
                                              r"d_sae 41 \(.*cfg.json\) make it \[d_in, d_sae\] = \[12, 41\]"):
        SAE.from_pretrained(cfg.parent)
    raw["metadata"]["hook_head_index"] = 3
    cfg.write_text(json.dumps(raw))
    with pytest.raises(DictionaryError, match="hook_head_index 3: this dictionary reads one attention head"):
        SAE.from_pretrained(cfg.parent)


def test_nan_missing_and_unexpected_tensors_are_named(saved):
    cfg, weights = saved
    sae = SAE.from_pretrained(cfg.parent)
    state = sae.state_dict()
    state["W_dec"][3, 4] = float("nan")
    state["b_enc"][7] = float("inf")
    save_file(state, str(weights))
    with pytest.raises(DictionaryError, match=r"sae_weights.safetensors: NaN or infinite values in W_dec 1 \(the "
                                              r"first at \[3, 4\]\); b_enc 1 \(the first at \[7\]\)"):
        SAE.from_pretrained(cfg.parent)
    state = sae.state_dict()
    del state["threshold"]
    save_file(state | {"b_gate": torch.zeros(40)}, str(weights))
    with pytest.raises(DictionaryError, match=r"a jumprelu dictionary holds W_enc, W_dec, b_dec, b_enc, threshold; "
                                              r"this file: missing threshold; unexpected b_gate"):
        SAE.from_pretrained(cfg.parent)


def test_not_a_dictionary(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DictionaryError, match=r"empty: no dictionary here; looked for cfg.json \+ "
                                              r"sae_weights.safetensors \(SAELens\)"):
        SAE.from_pretrained(tmp_path / "empty")
    with pytest.raises(DictionaryError, match=r"no such file or directory, and not a hub id"):
        SAE.from_pretrained(str(tmp_path / "nope" / "..x" / "deeper"))
