"""Gemma 2 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' Gemma 2 with
the same random weights (its weight processing off): every hook name both have holds the same tensor (the norms
after each sublayer, ln1_post and ln2_post, and their hook_scale included), TL's weights and config fields are the
bridge's; the names Gemma Scope's dictionaries are read at resolve on a deep model."""

import pytest
import torch

from helpers import (assert_bridge_weights, assert_parity, assert_rotary_hooks_refused, compare_bridge_caches,
                     ours_and_bridge)
from scratch_models import Gemma2Config, Gemma2ForCausalLM
from scratch_models.registry.families import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ours_and_bridge("gemma2", tmp_path_factory.mktemp("gemma2"), eager=True, tokenizer=None)


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    # 9 tokens, longer than the window; the logits capped, both; the norms' hook_out (we declare them) compared
    cache, _, compared = compare_bridge_caches(*models)
    assert {"hook_embed", "blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_rot_k",
            "blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z",
            "blocks.0.attn.hook_out", "blocks.0.ln1_post.hook_scale", "blocks.0.ln1_post.hook_out",
            "blocks.0.hook_attn_out", "blocks.1.hook_resid_mid", "blocks.1.mlp.hook_pre_linear",
            "blocks.1.mlp.hook_post", "blocks.1.ln2_post.hook_normalized", "blocks.1.hook_mlp_out",
            "blocks.1.hook_resid_post", "ln_final.hook_scale", "hook_unembed"} <= set(compared)
    # grouped-query attention in TL's default layout: keys and values keep their 2 key/value heads
    assert cache["blocks.0.attn.hook_k"].shape == (2, 9, 2, 16) and cache["blocks.0.attn.hook_q"].shape == (2, 9, 4, 16)
    # the window: layer 0's query 8 sees keys 4..8 only
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert bool((pattern[:, :, 8, :4] == 0).all()) and bool((cache["blocks.1.attn.hook_pattern"][:, :, 8] > 0).all())
    # what attention adds to the stream is after ln1_post, not the heads' merged output
    assert not torch.allclose(cache["blocks.0.hook_attn_out"], cache["blocks.0.attn.hook_out"])
    assert_parity(cache["blocks.0.hook_resid_mid"], cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"],
                  "resid_mid", terms=2)


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    assert_bridge_weights(ours, bridge, ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U"),
                          ("eps", "normalization_type", "gated_mlp", "final_rms", "n_key_value_heads", "rotary_base",
                           "attn_scores_soft_cap", "output_logits_soft_cap", "rmsnorm_uses_offset", "uses_rms_norm",
                           "tie_word_embeddings"), block=("mlp.W_gate", "mlp.W_in", "mlp.W_out"))
    # the bridge gives no b_Q ... b_out for a model without biases ("construct zeros"): ours are those zeros
    assert not ours.b_Q.any() and ours.b_K.shape == (2, 2, 16) and not ours.b_out.any()
    assert ours.cfg.attn_scale == 12 ** 0.5 and ours.cfg.window_size == 5  # the bridge leaves these at defaults
    assert ours.cfg.layer_types == bridge.cfg.layer_types


def test_the_norm_weights_are_stored_as_the_bridge_reads_them_and_applied_plus_one(models):
    """ln1.w is the stored w (the bridge's too); the norm computes (1 + w): hook_normalized times (1 + w) is
    ln1's output."""
    ours, bridge = models
    for path in ("ln1", "ln1_post", "ln2", "ln2_post"):
        assert torch.equal(getattr(ours.blocks[1], path).w, getattr(bridge.blocks[1], path).weight), path
    ids = torch.arange(1, 8)[None]
    with torch.no_grad():
        _, cache = ours.run_with_cache(ids)
    rebuilt = cache["blocks.1.ln1.hook_normalized"] * (1 + ours.blocks[1].ln1.w)
    assert_parity(rebuilt, cache["blocks.1.ln1.hook_out"], "ln1 from hook_normalized", terms=1)


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    assert_rotary_hooks_refused(models[0])


def test_gemma_scopes_hook_names_resolve_on_a_deep_model():
    """Gemma Scope's dictionaries read the residual stream after a block, the MLP's output and each head's z:
    `blocks.12.hook_resid_post`, `blocks.12.hook_mlp_out`, `blocks.12.attn.hook_z` name our tensors (a 13-layer
    model, random)."""
    model = Gemma2ForCausalLM(Gemma2Config(**FAMILIES["gemma2"].tiny_config | dict(num_hidden_layers=13))).eval()
    names = model.lens_names()
    assert names["blocks.12.hook_resid_post"].source == "layers.12.out"
    assert names["blocks.12.hook_mlp_out"].source == "layers.12.mlp_out"
    assert names["blocks.12.hook_attn_out"].source == "layers.12.attn_out"
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.arange(1, 8)[None], names=["layers.12.out", "layers.12.attn.context"])
    assert torch.equal(cache["blocks.12.hook_resid_post"], cache["layers.12.out"])
    assert torch.equal(cache["blocks.12.attn.hook_z"], cache["layers.12.attn.context"].transpose(1, 2))
