"""Phi-3 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' Phi-3 with the
same random weights (its weight processing off): every hook name both have holds the same tensor (the queries, keys
and values split from the fused qkv_proj, the gate and linear branch from gate_up_proj, half of each head turned),
TL's weights (blocks of the fused matrices) and config fields are the bridge's."""

import pytest

from helpers import assert_bridge_weights, compare_bridge_caches, ours_and_bridge

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ours_and_bridge("phi3", tmp_path_factory.mktemp("phi3"), eager=True)


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    # not bitwise: the bridge splits qkv_proj and gate_up_proj into separate matrices, whose products round
    # otherwise than the fused ones transformers (and ours) multiply by
    _, theirs, compared = compare_bridge_caches(*models, exact=False)
    assert {f"blocks.1.{name}" for name in (
        "hook_resid_pre", "ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v",
        "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
        "hook_attn_out", "hook_resid_mid", "ln2.hook_scale", "mlp.hook_pre", "mlp.hook_pre_linear",
        "mlp.hook_post", "hook_mlp_out", "hook_resid_post")} | {
        "hook_embed", "ln_final.hook_scale", "hook_unembed"} <= set(compared)
    # (TL 4.3's bridge has no hook_rot_q, hook_rot_k on Phi-3: ours hold the turned ones all the same)
    # the window (5) hides the first keys from the last query of 9
    assert int(theirs["blocks.1.attn.hook_attn_scores"][0, 0, -1].isfinite().sum()) == 5


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    assert_bridge_weights(ours, bridge, ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "W_U", "b_U"),
                          ("eps", "normalization_type", "gated_mlp", "final_rms", "n_key_value_heads",
                           "tie_word_embeddings", "default_prepend_bos"),
                          block=("mlp.W_gate", "mlp.W_in", "mlp.W_out", "attn.W_Q", "attn.W_K", "attn.W_V", "attn.W_O"))
    # TL 4.3's bridge leaves rotary_dim unset for Phi-3 (its rotary runs in transformers' module); ours is
    # HookedTransformer's meaning, the dimensions turned
    assert bridge.cfg.rotary_dim is None and ours.cfg.rotary_dim == 6
