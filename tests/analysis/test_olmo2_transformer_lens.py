"""OLMo 2 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' OLMo 2 with the
same random weights (its weight processing off): every hook name both have holds the same tensor (the post-norms,
the norms over the whole query and key projections, in TL's flat layout), TL's weights and config fields are the
bridge's."""

import pytest

from helpers import assert_bridge_weights, compare_bridge_caches, ours_and_bridge

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

# what the bridge's cache holds and ours must too (OLMo 3's blocks are these)
COMPARED = {f"blocks.1.{name}" for name in (
    "hook_resid_pre", "attn.q_norm.hook_scale", "attn.q_norm.hook_normalized", "attn.hook_q_normed",
    "attn.k_norm.hook_scale", "attn.hook_k_normed", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q",
    "attn.hook_rot_k", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_out",
    "ln1_post.hook_scale", "ln1_post.hook_out", "hook_attn_out", "hook_resid_mid", "mlp.hook_pre",
    "mlp.hook_pre_linear", "mlp.hook_post", "mlp.hook_out", "ln2_post.hook_normalized", "hook_mlp_out",
    "hook_resid_post")} | {"hook_embed", "ln_final.hook_scale", "hook_unembed", "blocks.0.attn.hook_q",
                           "blocks.0.attn.hook_k", "blocks.0.mlp.hook_in"}
WEIGHTS = dict(weights=("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U"),
               fields=("eps", "normalization_type", "gated_mlp", "final_rms", "n_key_value_heads",
                       "tie_word_embeddings", "default_prepend_bos"),
               block=("mlp.W_gate", "mlp.W_in", "mlp.W_out"), norms=("ln1_post", "ln2_post", "attn.q_norm"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ours_and_bridge("olmo2", tmp_path_factory.mktemp("olmo2"), eager=True)


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    _, _, compared = compare_bridge_caches(*models)
    assert COMPARED <= set(compared)


def test_weights_and_config_are_the_bridges(models):
    assert_bridge_weights(*models, **WEIGHTS)
