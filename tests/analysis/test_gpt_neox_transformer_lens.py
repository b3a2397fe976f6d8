"""GPT-NeoX in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' GPT-NeoX with
the same random weights (its weight processing off): every hook name both have holds the same tensor, TL's weights
and config fields are the bridge's, for the parallel residual (Pythia) and the sequential one."""

import pytest
import torch

from helpers import (assert_bridge_weights, assert_parity, assert_rotary_hooks_refused, compare_bridge_caches,
                     model_sizes, ours_and_bridge)

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")


@pytest.fixture(scope="module", params=[True, False], ids=["parallel", "sequential"])
def models(request, tmp_path_factory):
    return ours_and_bridge("gpt_neox", tmp_path_factory.mktemp("neox"), tokenizer=None,
                           use_parallel_residual=request.param)


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, _ = models
    cache, theirs, compared = compare_bridge_caches(*models, 7)
    assert {"blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z",
            "blocks.1.ln2.hook_normalized", "blocks.1.hook_resid_post", "ln_final.hook_scale"} <= set(compared)
    # the turned queries and keys, TL's HookedTransformer names: the scores are their products
    q, k = cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_rot_k"]
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / q.shape[-1] ** 0.5
    seen = theirs["blocks.1.attn.hook_attn_scores"].isfinite()
    assert_parity(scores[seen], theirs["blocks.1.attn.hook_attn_scores"][seen], "scores", **model_sizes(ours.cfg))


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    assert_bridge_weights(ours, bridge, ("W_E", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "b_in",
                                         "W_out", "b_out", "W_U"), ("parallel_attn_mlp", "rotary_base"))
    assert ours.cfg.rotary_dim == 8  # the bridge leaves it None; TL's HookedTransformer has it


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    assert_rotary_hooks_refused(models[0])


def test_resid_mid_is_the_sequential_models_only(models):
    ours, _ = models
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
    if ours.config.use_parallel_residual:
        with pytest.raises(KeyError, match="blocks.0.hook_resid_mid"):
            cache["blocks.0.hook_resid_mid"]
    else:
        assert torch.equal(cache["blocks.0.hook_resid_mid"], cache["layers.0.resid_mid"])
