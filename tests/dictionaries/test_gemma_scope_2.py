"""Gemma Scope 2's dictionaries (google/gemma-scope-2-*, for Gemma 3) as published: a folder per dictionary
(`resid_post/layer_1_width_16k_l0_small`) holding params.safetensors (lower-case w_enc [d_in, d_sae], w_dec, b_enc,
b_dec, threshold) and config.json (hf_hook_point_in). Built here from random numbers on a tiny Gemma 3; they attach
at the point they read, the output stays the model's bitwise with the error term, and the features are JumpReLU's."""

import json

import pytest
import torch
from safetensors.torch import save_file

from dictionary_data import tiny_model
from helpers import fake_hub
from scratch_models.dictionaries import SAE, DictionaryError
from scratch_models.dictionaries.releases import published

# folder, the transformers point config.json names, TL's name, our hook point, the width it reads on the tiny model
SITES = [("resid_post", "model.layers.1.output", "blocks.1.hook_resid_post", "layers.1.out", 48),
         ("attn_out", "model.layers.1.self_attn.o_proj.input", "blocks.1.attn.hook_z", "layers.1.attn.context", 64),
         ("mlp_out", "model.layers.1.post_feedforward_layernorm.output", "blocks.1.hook_mlp_out", "layers.1.mlp_out",
          48)]


def gemma_scope_2_folder(directory, d_in, d_sae=40, *, hf_point=None, seed=0, **extra):
    """params.safetensors (+ config.json when hf_point is given) as Gemma Scope 2 publishes a dictionary."""
    g = torch.Generator().manual_seed(seed)
    params = {"w_enc": torch.randn(d_in, d_sae, generator=g) * 0.3, "w_dec": torch.randn(d_sae, d_in, generator=g) * 0.3,
              "b_enc": torch.randn(d_sae, generator=g) * 0.1 - 0.2, "b_dec": torch.randn(d_in, generator=g) * 0.1,
              "threshold": torch.rand(d_sae, generator=g) * 0.3} | extra
    directory.mkdir(parents=True)
    save_file(params, str(directory / "params.safetensors"))
    if hf_point is not None:
        (directory / "config.json").write_text(json.dumps({"architecture": "jump_relu", "model_name": "gemma-v3-1b-pt",
                                                           "hf_hook_point_in": hf_point, "width": d_sae}))
    return params


@pytest.mark.parametrize("site", SITES, ids=[s[0] for s in SITES])
@pytest.mark.parametrize("with_config", [True, False], ids=["config.json", "folder-only"])
def test_attaches_where_it_reads_and_computes_jumprelu(tmp_path, site, with_config):
    folder, hf_point, tl_name, ours, d_in = site
    model = tiny_model("gemma3_text")
    directory = tmp_path / "gemma-scope-2-1b-pt" / folder / "layer_1_width_16k_l0_small"
    p = gemma_scope_2_folder(directory, d_in, hf_point=hf_point if with_config else None)
    sae = SAE.from_pretrained(directory)
    assert sae.architecture == "jumprelu" and not sae.cfg.apply_b_dec_to_input and sae.cfg.hook_name == tl_name
    assert sae.cfg.format == "gemma_scope_2"
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    plain = model(input_ids=ids, attention_mask=mask).logits
    plain_cached = model.run_with_cache(input_ids=ids, attention_mask=mask)[0].logits
    where = model.attach(sae)
    assert where == ours
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, plain)  # the error term: bitwise
    out, cache = model.run_with_cache(input_ids=ids, attention_mask=mask)
    assert torch.equal(out.logits, plain_cached)
    x = cache[f"{where}.sae.input"]
    assert x.shape[-1] == d_in  # attn_out reads the heads side by side (o_proj's input), n_heads * head_dim
    # Gemma Scope 2's JumpReLU (SAELens' gemma_3 loader, the model card): pre = x @ w_enc + b_enc, kept where
    # pre > threshold; the reconstruction acts @ w_dec + b_dec
    pre = x @ p["w_enc"] + p["b_enc"]
    acts = torch.relu(pre) * (pre > p["threshold"])
    assert torch.equal(cache[f"{where}.sae.acts"], acts) and (acts > 0).any() and (acts == 0).any()
    assert torch.equal(cache[f"{where}.sae.recons"], acts @ p["w_dec"] + p["b_dec"])
    model.detach()
    model.attach(sae, error_term=False)
    _, spliced = model.run_with_cache(input_ids=ids, attention_mask=mask, names=[f"{where}.sae.recons", tl_name])
    assert torch.equal(spliced[tl_name].flatten(-2) if folder == "attn_out" else spliced[tl_name],
                       spliced[f"{where}.sae.recons"])  # what goes on is the reconstruction


def test_a_dictionary_for_another_gemma_3_is_refused_naming_what_differs(tmp_path):
    model = tiny_model("gemma3_text")
    wide = tmp_path / "resid_post" / "layer_1_width_16k_l0_small"
    gemma_scope_2_folder(wide, 64)  # a wider model's stream
    with pytest.raises(DictionaryError, match=r"d_in 64.*holds 48 numbers per token.*another model size"):
        model.attach(SAE.from_pretrained(wide))
    deep = tmp_path / "resid_post" / "layer_7_width_16k_l0_small"
    gemma_scope_2_folder(deep, 48)  # a layer this two-layer model has not
    with pytest.raises(DictionaryError, match=r"'blocks\.7\.hook_resid_post', which .* has not"):
        model.attach(SAE.from_pretrained(deep))


def test_what_the_files_do_not_say_and_transcoders_are_refused(tmp_path):
    bare = tmp_path / "mine"
    gemma_scope_2_folder(bare, 48)
    with pytest.raises(DictionaryError, match=r"names no hook.*resid_post, attn_out or mlp_out.*pass hook_name="):
        SAE.from_pretrained(bare)
    assert SAE.from_pretrained(bare, hook_name="blocks.0.hook_resid_post").cfg.hook_name == "blocks.0.hook_resid_post"
    multimodal = tmp_path / "multimodal"  # the 4b-27b checkpoints name the language model's layers so
    gemma_scope_2_folder(multimodal, 48, hf_point="model.language_model.layers.1.output")
    assert SAE.from_pretrained(multimodal).cfg.hook_name == "blocks.1.hook_resid_post"
    odd = tmp_path / "odd"
    gemma_scope_2_folder(odd, 48, hf_point="model.layers.1.input_layernorm.output")
    with pytest.raises(DictionaryError, match=r"hf_hook_point_in 'model.layers.1.input_layernorm.output' is none of"):
        SAE.from_pretrained(odd)
    transcoder = tmp_path / "transcoder_all" / "layer_0_width_16k_l0_small_affine"
    gemma_scope_2_folder(transcoder, 48, affine_skip_connection=torch.zeros(48, 48))
    with pytest.raises(DictionaryError, match=r"a Gemma Scope 2 transcoder .*load_transcoders"):
        SAE.from_pretrained(transcoder)


def test_releases_name_gemma_scope_2_folders(monkeypatch, tmp_path):
    # SAELens 6.54's pretrained_saes.yaml, as published there (its gemma_3 loader reads these folders)
    res = published("gemma-scope-2-1b-pt-res", "layer_13_width_16k_l0_small")
    assert (res.repo_id, res.path, res.model) == ("google/gemma-scope-2-1b-pt", "resid_post/layer_13_width_16k_l0_small",
                                                  "google/gemma-3-1b-pt")
    assert published("gemma-scope-2-270m-pt-transcoders-all", "layer_0_width_16k_l0_big_affine").path == \
        "transcoder_all/layer_0_width_16k_l0_big_affine"
    assert published("gemma-scope-2-1b-pt-transcoders", "transcoder/layer_13_width_16k_l0_big").path == \
        "transcoder/layer_13_width_16k_l0_big"
    with pytest.raises(DictionaryError, match=r"has no sae_id 'layer_14_width_16k_l0_small'.*nearest"):
        published("gemma-scope-2-1b-pt-res", "layer_14_width_16k_l0_small")
    directory = tmp_path / "mlp_out" / "layer_7_width_16k_l0_small"
    p = gemma_scope_2_folder(directory, 48)
    from huggingface_hub.errors import RemoteEntryNotFoundError
    from helpers import http_error

    where = "mlp_out/layer_7_width_16k_l0_small"
    calls = fake_hub(monkeypatch, {f"{where}/cfg.json": http_error(RemoteEntryNotFoundError, 404),
                                   f"{where}/config.json": http_error(RemoteEntryNotFoundError, 404),
                                   f"{where}/params.npz": http_error(RemoteEntryNotFoundError, 404),
                                   f"{where}/params.safetensors": directory / "params.safetensors"})
    sae = SAE.from_pretrained(release="gemma-scope-2-1b-pt-mlp", sae_id="layer_7_width_16k_l0_small")
    assert {c["repo_id"] for c in calls} == {"google/gemma-scope-2-1b-pt"}
    assert sae.cfg.hook_name == "blocks.7.hook_mlp_out" and torch.equal(sae.W_enc, p["w_enc"])
    assert sae.cfg.metadata.model_name == "google/gemma-3-1b-pt"
