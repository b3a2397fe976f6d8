"""Phi-3 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' Phi-3 with the
same random weights (its weight processing off): every hook name both have holds the same tensor (the queries, keys
and values split from the fused qkv_proj, the gate and linear branch from gate_up_proj, half of each head turned),
TL's weights (blocks of the fused matrices) and config fields are the bridge's."""

import pytest
import torch
import transformers

from helpers import assert_bridge_tensors, assert_parity, byte_level_bpe, reference, save
from scratch_models import Phi3ForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

WEIGHTS = ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "W_U", "b_U")
BRIDGE_ONLY = ("hook_cos", "hook_sin", "attn.hook_hidden_states")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge

    directory = save(reference("phi3"), tmp_path_factory.mktemp("phi3"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(["a b c"] * 4, 300),
                                                     bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)
    hf = transformers.Phi3ForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return Phi3ForCausalLM.from_pretrained(directory, transformer_lens=True), bridge


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, bridge = models
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = ours.run_with_cache(ids)
    # not bitwise: the bridge splits qkv_proj and gate_up_proj into separate matrices, whose products round
    # otherwise than the fused ones transformers (and ours) multiply by
    assert_parity(our_logits, logits, "logits")
    declared = ours.lens_names()
    names = [name for name in theirs.keys() if name in declared or not name.endswith((".hook_in", ".hook_out"))]
    compared = assert_bridge_tensors(cache, theirs, names, BRIDGE_ONLY)
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
    for name in WEIGHTS:
        assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    for layer in range(2):
        for name in ("W_gate", "W_in", "W_out"):
            assert torch.equal(getattr(ours.blocks[layer].mlp, name), getattr(bridge.blocks[layer].mlp, name)), name
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            assert torch.equal(getattr(ours.blocks[layer].attn, name), getattr(bridge.blocks[layer].attn, name)), name
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "eps",
                  "positional_embedding_type", "normalization_type", "gated_mlp", "final_rms", "n_key_value_heads",
                  "tie_word_embeddings", "default_prepend_bos"):
        assert getattr(ours.cfg, field) == getattr(bridge.cfg, field), field
    # TL 4.3's bridge leaves rotary_dim unset for Phi-3 (its rotary runs in transformers' module); ours is
    # HookedTransformer's meaning, the dimensions turned
    assert bridge.cfg.rotary_dim is None and ours.cfg.rotary_dim == 6
