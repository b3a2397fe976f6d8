"""Gemma 3 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' Gemma 3 with
the same random weights (its weight processing off): every hook name both have holds the same tensor (the norms of
the queries and keys, each sublayer's post-norm, a local and a global layer), TL's weights and config fields are the
bridge's; the names Gemma Scope 2's dictionaries are read at resolve on a deep model."""

import pytest
import torch
import transformers

from helpers import assert_bridge_tensors, reference, save
from scratch_models import Gemma3ForCausalLM, Gemma3TextConfig
from scratch_models.registry.families import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

WEIGHTS = ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U")
# the bridge's rotary angles (per layer and the model's), ours computed once per forward per kind of layer and held
# at no hook point; and the bridge's copy of the attention's output
BRIDGE_ONLY = ("hook_cos", "hook_sin", "attn.hook_hidden_states")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge

    directory = save(reference("gemma3_text"), tmp_path_factory.mktemp("gemma3"))
    hf = transformers.Gemma3ForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return Gemma3ForCausalLM.from_pretrained(directory, transformer_lens=True), bridge


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, bridge = models
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(0))  # longer than the window
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = ours.run_with_cache(ids)
    assert torch.equal(our_logits, logits)
    declared = ours.lens_names()
    names = [name for name in theirs.keys() if name in declared or not name.endswith((".hook_in", ".hook_out"))]
    compared = assert_bridge_tensors(cache, theirs, names, BRIDGE_ONLY)
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
    for name in WEIGHTS:
        assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    for layer in range(2):
        for name in ("W_gate", "W_in", "W_out"):
            assert torch.equal(getattr(ours.blocks[layer].mlp, name), getattr(bridge.blocks[layer].mlp, name)), name
        for norm in ("ln1", "ln1_post", "ln2", "ln2_post", "attn.q_norm", "attn.k_norm"):
            path = norm.split(".")
            mine, theirs = ours.blocks[layer], bridge.blocks[layer]
            for part in path:
                mine, theirs = getattr(mine, part), getattr(theirs, part)
            assert torch.equal(mine.w, theirs.weight), norm
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "eps",
                  "positional_embedding_type", "normalization_type", "gated_mlp", "n_key_value_heads",
                  "attn_scores_soft_cap", "output_logits_soft_cap", "rmsnorm_uses_offset", "uses_rms_norm",
                  "tie_word_embeddings", "layer_types", "default_prepend_bos"):
        assert getattr(ours.cfg, field) == getattr(bridge.cfg, field), field
    # the bridge leaves these at its defaults (rotary_base 10000 whatever the file says)
    assert (ours.cfg.rotary_base, ours.cfg.rotary_base_local) == (1000.0, 10.0)
    assert ours.cfg.attn_scale == 12 ** 0.5 and ours.cfg.window_size == 5 and ours.cfg.use_qk_norm


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    ours, _ = models
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
    with pytest.raises(KeyError, match="model.rotary_local"):
        cache["blocks.0.attn.hook_cos"]


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
