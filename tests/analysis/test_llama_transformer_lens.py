"""The Llama-like families (Llama, Mistral, Qwen2, Qwen3) in TransformerLens' names, against TransformerLens' own
TransformerBridge over transformers' model of the same class with the same random weights (its weight processing
off): every hook name both have holds the same tensor, grouped key/value heads in TL's shapes, TL's weights and
config fields are the bridge's. Each family's tiny config has fewer key/value heads than query heads; Mistral's and
Qwen3's heads are not hidden / heads wide, Qwen2's second layer has a sliding window shorter than the input, Qwen3
normalises each head's queries and keys."""

import pytest
import torch

from helpers import (assert_bridge_weights, assert_parity, assert_rotary_hooks_refused, compare_bridge_caches,
                     model_sizes, ours_and_bridge)
from scratch_models import LlamaModel
from scratch_models.registry.families import FAMILIES
from scratch_models.registry.known import MIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

# the mixtures of experts are compared in test_moe_transformer_lens.py: no single MLP's weights, and their
# routing is compared within the bound (the bridge's router rounds otherwise)
LLAMA_LIKE = [name for name, family in FAMILIES.items()
              if issubclass(family.base, LlamaModel) and family.transformer_lens is not None and name not in MIXTURES]


@pytest.fixture(scope="module", params=LLAMA_LIKE)
def models(request, tmp_path_factory):
    return ours_and_bridge(request.param, tmp_path_factory.mktemp(request.param))


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, _ = models
    cache, theirs, compared = compare_bridge_caches(*models)
    config = ours.config
    groups = config.num_attention_heads // config.num_key_value_heads
    assert groups > 1
    # grouped key/value heads in TL's default shapes: hook_k and hook_v [b, s, n_kv, d], the pattern per query head
    assert cache["blocks.1.attn.hook_k"].shape == (2, 9, config.num_key_value_heads, config.head_dim)
    assert cache["blocks.1.attn.hook_pattern"].shape == (2, config.num_attention_heads, 9, 9)
    assert {"blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_v", "blocks.1.attn.hook_rot_q",
            "blocks.1.attn.hook_rot_k", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z",
            "blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_pre_linear", "blocks.1.mlp.hook_post",
            "blocks.1.ln2.hook_normalized", "blocks.1.hook_resid_post", "ln_final.hook_scale"} <= set(compared)
    if config.qk_norm:
        assert {"blocks.1.attn.q_norm.hook_scale", "blocks.1.attn.hook_k_normed"} <= set(compared)
    # the turned queries and keys are the scores' factors, each query head against its group's key head
    q, k = cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_rot_k"].repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / q.shape[-1] ** 0.5
    seen = theirs["blocks.1.attn.hook_attn_scores"].isfinite()
    assert_parity(scores[seen], theirs["blocks.1.attn.hook_attn_scores"][seen], "scores", **model_sizes(ours.cfg))
    if config.sliding_layers[1]:  # the last query sees the window, not the whole past
        assert int(seen[0, 0, -1].sum()) == config.sliding_window < 9


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    assert_bridge_weights(ours, bridge, ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "W_U", "b_U")
                          + (("b_Q", "b_K", "b_V") if ours.config.qkv_bias else ()),
                          ("eps", "normalization_type", "n_key_value_heads", "gated_mlp", "tie_word_embeddings"))
    # the bridge's rotary_base stays TL's default (10000) whatever the config says; its rope_parameters hold the
    # theta its model turns by, which is ours
    assert ours.cfg.rotary_base == bridge.cfg.rope_parameters["rope_theta"] == ours.config.rope_theta
    # final_rms: TL forces an RMS final norm with it; the bridge leaves it off for Mistral, whose every norm is RMS
    # already (normalization_type), and sets it for the others
    assert ours.cfg.final_rms and bridge.cfg.final_rms == (ours.family.name != "mistral")


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    assert_rotary_hooks_refused(models[0])
