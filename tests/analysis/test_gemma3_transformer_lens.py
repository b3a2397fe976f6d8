"""Gemma 3 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' Gemma 3 with
the same random weights (its weight processing off): every hook name both have holds the same tensor (the norms of
the queries and keys, each sublayer's post-norm, a local and a global layer), TL's weights and config fields are the
bridge's; the names Gemma Scope 2's dictionaries are read at resolve on a deep model."""

import pytest
import torch

from helpers import assert_bridge_weights, assert_rotary_hooks_refused, compare_bridge_caches, ours_and_bridge
from scratch_models import Gemma3ForCausalLM, Gemma3TextConfig
from scratch_models.registry.families import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return ours_and_bridge("gemma3_text", tmp_path_factory.mktemp("gemma3"), eager=True, tokenizer=None)


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    cache, _, compared = compare_bridge_caches(*models)  # 9 tokens, longer than the window
    assert {f"blocks.{layer}.{name}" for layer in (0, 1) for name in (
        "attn.hook_q", "attn.hook_k", "attn.q_norm.hook_scale", "attn.q_norm.hook_normalized", "attn.q_norm.hook_out",
        "attn.hook_q_normed", "attn.k_norm.hook_normalized", "attn.hook_k_normed", "attn.hook_rot_q",
        "attn.hook_rot_k", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_out",
        "ln1_post.hook_out", "hook_attn_out", "hook_resid_mid", "mlp.hook_pre_linear", "ln2_post.hook_normalized",
        "hook_mlp_out", "hook_resid_post")} | {"hook_embed", "ln_final.hook_scale", "hook_unembed"} <= set(compared)
    # layer 0 is local: query 8 sees keys 4..8 only; layer 1 global
    assert bool((cache["blocks.0.attn.hook_pattern"][:, :, 8, :4] == 0).all())
    assert bool((cache["blocks.1.attn.hook_pattern"][:, :, 8] > 0).all())
    # hook_q is before the norm, the rotation after it
    assert not torch.allclose(cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_q_normed"].transpose(1, 2))


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    assert_bridge_weights(ours, bridge, ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U"),
                          ("eps", "normalization_type", "gated_mlp", "n_key_value_heads", "attn_scores_soft_cap",
                           "output_logits_soft_cap", "rmsnorm_uses_offset", "uses_rms_norm", "tie_word_embeddings",
                           "layer_types", "default_prepend_bos"), block=("mlp.W_gate", "mlp.W_in", "mlp.W_out"),
                          norms=("ln1", "ln1_post", "ln2", "ln2_post", "attn.q_norm", "attn.k_norm"))
    # the bridge leaves these at its defaults (rotary_base 10000 whatever the file says)
    assert (ours.cfg.rotary_base, ours.cfg.rotary_base_local) == (1000.0, 10.0)
    assert ours.cfg.attn_scale == 12 ** 0.5 and ours.cfg.window_size == 5 and ours.cfg.use_qk_norm


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    assert_rotary_hooks_refused(models[0], match="model.rotary_local")


def test_gemma_scope_2s_hook_names_resolve_on_a_deep_model():
    """Gemma Scope 2's dictionaries read the residual stream after a block, the MLP's and attention's outputs, each
    head's z: those names are our tensors (a 13-layer model, random)."""
    model = Gemma3ForCausalLM(Gemma3TextConfig(**FAMILIES["gemma3_text"].tiny_config | dict(
        num_hidden_layers=13, sliding_window_pattern=6))).eval()
    names = model.lens_names()
    assert names["blocks.12.hook_resid_post"].source == "layers.12.out"
    assert names["blocks.12.hook_mlp_out"].source == "layers.12.mlp_out"
    assert names["blocks.12.hook_attn_out"].source == "layers.12.attn_out"
    assert names["blocks.12.ln2.hook_out"].source == "layers.12.ln_2"  # a transcoder's input
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.arange(1, 8)[None], names=["layers.12.out", "layers.12.attn.context"])
    assert torch.equal(cache["blocks.12.hook_resid_post"], cache["layers.12.out"])
    assert torch.equal(cache["blocks.12.attn.hook_z"], cache["layers.12.attn.context"].transpose(1, 2))
