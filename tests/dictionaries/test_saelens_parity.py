"""Exactly SAELens: its own SAE classes and HookedSAETransformer against ours on the same weights.

sae-lens needs transformer-lens < 4, which the peers extra's >= 4.3 excludes, so these tests run in a venv of their
own and skip elsewhere. From the repository's root:

    python3 -m venv /work/venv-saelens && /work/venv-saelens/bin/pip install torch==2.13.0 && \
    /work/venv-saelens/bin/pip install sae-lens pytest && \
    PYTHONPATH=. /work/venv-saelens/bin/python -m pytest -q tests/dictionaries/test_saelens_parity.py

(sae-lens 6.54.12 with transformer-lens 3.9.0 when written.)
"""

import json

import pytest
import torch

sae_lens = pytest.importorskip("sae_lens", reason="sae-lens is not installed (it needs transformer-lens < 4, which "
                                                   "the peers extra's >= 4.3 excludes): run this file in a venv of "
                                                   "its own, as its docstring says")

from sae_lens.saes.gated_sae import GatedSAE, GatedSAEConfig  # noqa: E402
from sae_lens.saes.jumprelu_sae import JumpReLUSAE, JumpReLUSAEConfig  # noqa: E402
from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig  # noqa: E402
from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig  # noqa: E402

from dictionary_data import random_sae, randomize_  # noqa: E402
from helpers import assert_parity, model_sizes  # noqa: E402
from scratch_models.dictionaries import SAE  # noqa: E402

THEIRS = {"standard": (StandardSAE, StandardSAEConfig), "topk": (TopKSAE, TopKSAEConfig),
          "jumprelu": (JumpReLUSAE, JumpReLUSAEConfig), "gated": (GatedSAE, GatedSAEConfig)}
CASES = [("standard", {}), ("topk", {"k": 7}), ("topk", {"k": 7, "rescale_acts_by_decoder_norm": True}),
         ("jumprelu", {}), ("gated", {}), ("standard", {"normalize_activations": "constant_norm_rescale"}),
         ("standard", {"normalize_activations": "layer_norm"}), ("jumprelu", {"apply_b_dec_to_input": False})]


def theirs(architecture: str, d_in: int, d_sae: int, hook_name: str, seed: int = 0, **fields):
    """SAELens' own inference SAE of `architecture`, its parameters random (thresholds and biases chosen so some
    features fire and some do not)."""
    cls, cfg_cls = THEIRS[architecture]
    cfg = cfg_cls(d_in=d_in, d_sae=d_sae, **fields)
    cfg.metadata.hook_name = hook_name
    return randomize_(cls(cfg), seed).eval()


@pytest.mark.parametrize("architecture, fields", CASES)
def test_we_read_saelens_files_and_encode_decode_as_it_does(tmp_path, architecture, fields):
    reference = theirs(architecture, 24, 80, "blocks.1.hook_resid_pre", **fields)
    reference.save_model(tmp_path / "sae")
    ours = SAE.from_pretrained(tmp_path / "sae")
    assert ours.architecture == architecture and ours.cfg.hook_name == "blocks.1.hook_resid_pre"
    x = torch.randn(3, 11, 24) * 2
    with torch.no_grad():
        acts = reference.encode(x)
        recons = reference.decode(acts)  # uses the statistics encode left on the module, for a normalising SAE
        pre = {}
        reference.hook_sae_acts_pre.add_hook(lambda t, hook: pre.setdefault("pre", t.clone()))
        reference.encode(x)
        reference.reset_hooks()
        sae_in, norm = ours.sae_in(x)
        assert torch.equal(ours.hidden_pre(sae_in), pre["pre"])
        assert torch.equal(ours.encode(x), acts), "feature activations differ from SAELens' bitwise"
        assert (acts > 0).any() and (acts == 0).any()
        assert torch.equal(ours.decode(acts, norm), recons), "the reconstruction differs from SAELens' bitwise"
        assert torch.equal(ours(x), recons)


@pytest.mark.parametrize("architecture", THEIRS)
def test_saelens_reads_what_we_save(tmp_path, architecture):
    ours = random_sae(architecture, 24, 80, hook_name="blocks.1.hook_resid_pre")
    ours.save_pretrained(tmp_path / "sae")
    reference = sae_lens.SAE.load_from_disk(tmp_path / "sae")
    assert reference.cfg.architecture() == architecture and reference.cfg.metadata.hook_name == ours.cfg.hook_name
    x = torch.randn(5, 24)
    with torch.no_grad():
        assert torch.equal(reference.encode(x), ours.encode(x))
        assert torch.equal(reference.decode(reference.encode(x)), ours(x))


def test_older_files_read_alike(tmp_path):
    """A cfg.json from before SAELens 6 (hook_point, activation_fn_str topk with its k): SAELens'
    handle_pre_6_0_config and ours read the same dictionary."""
    reference = theirs("topk", 24, 80, "blocks.0.hook_resid_post", k=5)
    reference.save_model(tmp_path / "sae")
    cfg = tmp_path / "sae" / "cfg.json"
    cfg.write_text(json.dumps({"d_in": 24, "d_sae": 80, "hook_point": "blocks.0.hook_resid_post",
                               "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 5},
                               "normalize_activations": False, "dtype": "float32", "model_name": "gpt2"}))
    old = sae_lens.SAE.load_from_disk(tmp_path / "sae")
    ours = SAE.from_pretrained(tmp_path / "sae")
    assert old.cfg.metadata.hook_name == ours.cfg.hook_name and old.cfg.k == ours.cfg.k == 5
    x = torch.randn(5, 24)
    with torch.no_grad():
        assert torch.equal(old.encode(x), ours.encode(x))


# ---- HookedSAETransformer, on the same GPT-2 weights ----------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One random GPT-2 (2 layers, hidden 48): transformers' saved, ours loaded from it, and TransformerLens 3's
    HookedSAETransformer given its weights without processing."""
    import transformers
    from sae_lens import HookedSAETransformer
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    from helpers import randomize_
    from scratch_models import GPT2LMHeadModel

    config = transformers.GPT2Config(vocab_size=61, n_positions=32, n_embd=48, n_layer=2, n_head=3)
    hf = randomize_(transformers.GPT2LMHeadModel(config), 0.3).eval()
    directory = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(directory)
    cfg = HookedTransformerConfig(n_layers=2, d_model=48, n_heads=3, d_head=16, d_mlp=192, d_vocab=61, n_ctx=32,
                                  act_fn="gelu_new", normalization_type="LN", eps=config.layer_norm_epsilon,
                                  default_prepend_bos=False, original_architecture="GPT2LMHeadModel")
    tl = HookedSAETransformer(cfg)
    tl.load_and_process_state_dict(convert_gpt2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False)
    ours = GPT2LMHeadModel.from_pretrained(directory, transformer_lens=True)
    return ours, tl.eval()


@pytest.mark.parametrize("hook, d_in", [("blocks.1.hook_resid_pre", 48), ("blocks.1.attn.hook_z", 48),
                                        ("blocks.0.hook_mlp_out", 48)])
def test_the_spliced_forward_is_hooked_sae_transformers(models, hook, d_in):
    ours_model, tl = models
    reference = theirs("standard", d_in, 96, hook, reshape_activations="hook_z" if hook.endswith("hook_z") else "none")
    with torch.no_grad():
        reference.b_enc.sub_(0.2)
    ours = SAE.from_pretrained(_saved(reference, hook))
    tokens = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain_tl, plain_ours = tl(tokens), ours_model(tokens)
        sizes = model_sizes(ours_model.config)
        spliced = dict(terms=max(sizes["terms"], 96), depth=sizes["depth"] + 2)  # + the dictionary's two sums
        assert_parity(plain_ours, plain_tl, "logits", **sizes)  # the models agree to start with
        names = [f"{hook}.hook_sae_acts_post", f"{hook}.hook_sae_recons"]
        for error_term in (False, True):
            logits_tl, cache_tl = tl.run_with_cache_with_saes(tokens, saes=[reference], use_error_term=error_term)
            logits_ours, cache_ours = ours_model.run_with_cache_with_saes(tokens, saes=[ours],
                                                                          use_error_term=error_term)
            # on the same input, SAELens' dictionary gives our spliced features to the bit (a hook_z one reads
            # [.., heads, d_head], which it puts side by side) ...
            read = cache_ours[f"{hook}.hook_sae_input"]
            read = read.unflatten(-1, (3, 16)) if hook.endswith("hook_z") else read
            assert torch.equal(cache_ours[names[0]], reference.encode(read))
            assert (cache_ours[names[0]] > 0).any() and (cache_ours[names[0]] == 0).any()
            # ... and on its own model's input, within the two models' rounding
            for name in names:
                assert_parity(cache_ours[name], cache_tl[name], name, **spliced)
            assert_parity(logits_ours, logits_tl, "logits with the dictionary", **spliced)
            if error_term:  # the error term gives back the model's own output: ours to the bit
                assert torch.equal(logits_ours, ours_model.run_with_cache(tokens)[0])  # a cache: explicit attention
                assert_parity(cache_ours[f"{hook}.hook_sae_error"], cache_tl[f"{hook}.hook_sae_error"],
                              "hook_sae_error", **spliced)
            else:
                assert not torch.allclose(logits_ours, plain_ours, atol=1e-3)
        assert ours_model.acts_to_saes == {} and tl.acts_to_saes == {}


def _saved(reference, hook):
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp()) / hook
    reference.save_model(directory)
    return directory
