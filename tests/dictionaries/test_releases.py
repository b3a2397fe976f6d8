"""SAELens' names for published dictionaries (release and id, from its directory of releases) resolve to the hub
repository and folder SAELens reads, with what the files lack (norm_scaling_factor, overrides); unknown names are
refused naming the nearest. The hub is stood in for by the answers of fake_hub."""

import json

import pytest
import torch

from dictionary_data import random_sae
from helpers import fake_hub
from scratch_models.dictionaries import SAE, DictionaryError
from scratch_models.dictionaries.releases import published, releases


def saved(tmp_path, folder: str, **settings):
    sae = random_sae("standard", 12, 40, hook_name=folder if folder.startswith("blocks") else "blocks.0.hook_resid_pre",
                     **settings)
    return sae, dict(zip(("cfg.json", "sae_weights.safetensors"), sae.save_pretrained(tmp_path / folder)))


def test_a_release_and_id_read_the_folder_saelens_reads(monkeypatch, tmp_path):
    sae, files = saved(tmp_path, "blocks.8.hook_resid_pre")
    calls = fake_hub(monkeypatch, {f"blocks.8.hook_resid_pre/{name}": path for name, path in files.items()})
    by_keyword = SAE.from_pretrained(release="gpt2-small-res-jb", sae_id="blocks.8.hook_resid_pre")
    positional = SAE.from_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pre")  # SAELens' positional call
    assert {c["repo_id"] for c in calls} == {"jbloom/GPT2-Small-SAEs-Reformatted"}  # the release's repository
    for loaded in (by_keyword, positional):
        assert torch.equal(loaded.W_enc, sae.W_enc) and loaded.cfg.hook_name == "blocks.8.hook_resid_pre"
        assert loaded.cfg.metadata.release == "gpt2-small-res-jb"
        # SAELens' users load GPT-2 with center_writing_weights for these: the metadata says so, as SAELens' does
        assert loaded.cfg.metadata.model_from_pretrained_kwargs == {"center_writing_weights": True}


def test_the_release_gives_what_the_files_lack(monkeypatch, tmp_path):
    # a release whose ids carry a norm_scaling_factor: the factor is folded in as SAELens folds it at load
    name, entry = next((name, entry) for name, entry in releases().items() if entry["format"] == "saelens" and any(
        isinstance(sae, dict) for sae in entry["saes"].values()))
    sae_id, where = next((sae_id, sae) for sae_id, sae in entry["saes"].items() if isinstance(sae, dict))
    sae, files = saved(tmp_path, where["path"], normalize_activations="expected_average_only_in")
    fake_hub(monkeypatch, {f"{where['path']}/{file}": path for file, path in files.items()})
    loaded = SAE.from_pretrained(release=name, sae_id=sae_id)
    factor = where["norm_scaling_factor"]
    assert loaded.cfg.normalize_activations == "none"
    assert torch.equal(loaded.W_enc, sae.W_enc * factor) and torch.equal(loaded.W_dec, sae.W_dec / factor)
    # a release that overrides normalize_activations (mistral-7b-res-wg: constant_norm_rescale) sets it
    entry = releases()["mistral-7b-res-wg"]
    assert entry["normalize_activations"] == "constant_norm_rescale"
    sae_id = next(iter(entry["saes"]))
    _, files = saved(tmp_path / "m", entry["saes"][sae_id])
    fake_hub(monkeypatch, {f"{entry['saes'][sae_id]}/{file}": path for file, path in files.items()})
    assert SAE.from_pretrained(release="mistral-7b-res-wg", sae_id=sae_id).cfg.normalize_activations == \
        "constant_norm_rescale"


def test_unknown_names_are_refused_naming_the_nearest():
    with pytest.raises(DictionaryError, match=r"'gpt2-small-res-jbb' is no local path, hub id \(owner/name\) or "
                                              r"release .*; nearest: gpt2-small-res-jb"):
        SAE.from_pretrained("gpt2-small-res-jbb", "blocks.8.hook_resid_pre")
    with pytest.raises(DictionaryError, match=r"release 'gpt2-small-res-jb' has no sae_id 'blocks.8.hook_resid_prex'"
                                              r": it holds 13 dictionaries .*nearest: blocks.8.hook_resid_pre"):
        SAE.from_pretrained(release="gpt2-small-res-jb", sae_id="blocks.8.hook_resid_prex")
    with pytest.raises(DictionaryError, match=r"release 'gpt2-small-res-jb' needs sae_id"):
        SAE.from_pretrained(release="gpt2-small-res-jb")
    with pytest.raises(DictionaryError, match=r"not both"):
        SAE.from_pretrained("org/saes", release="gpt2-small-res-jb", sae_id="blocks.8.hook_resid_pre")


def test_a_release_in_a_format_not_read_here_is_refused_by_name():
    name, entry = next((name, entry) for name, entry in releases().items() if entry["format"] == "llama_scope")
    with pytest.raises(DictionaryError, match=rf"release '{name}' \({entry['repo_id']}, trained on .*\) is published "
                                              r"in a format this loader does not read .*'llama_scope'"):
        published(name, "anything")


def test_the_directory_holds_saelens_facts():
    # a few entries of SAELens 6.54's pretrained_saes.yaml, as published there
    gemma = published("gemma-scope-2b-pt-res", "layer_20/width_16k/average_l0_71")
    assert (gemma.repo_id, gemma.path, gemma.model) == ("google/gemma-scope-2b-pt-res",
                                                         "layer_20/width_16k/average_l0_71", "gemma-2-2b")
    jb = published("gpt2-small-res-jb", "blocks.0.hook_resid_pre")
    assert (jb.repo_id, jb.path, jb.model) == ("jbloom/GPT2-Small-SAEs-Reformatted", "blocks.0.hook_resid_pre",
                                               "gpt2-small")
    assert len(releases()) >= 170 and json.loads(json.dumps(releases())) == releases()
