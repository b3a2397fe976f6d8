"""OLMo 3 in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' OLMo 3 with the
same random weights (its weight processing off): every hook name both have holds the same tensor (the post-norms,
the norms over the whole query and key projections, in TL's flat layout, the local layer's window), TL's weights and
config fields are the bridge's."""

import pytest
import torch
import transformers

from helpers import assert_bridge_tensors, byte_level_bpe, reference, save
from scratch_models import Olmo3ForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

WEIGHTS = ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U")
BRIDGE_ONLY = ("hook_cos", "hook_sin", "attn.hook_hidden_states")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge

    directory = save(reference("olmo3", num_hidden_layers=4), tmp_path_factory.mktemp("olmo3"))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(["a b c"] * 4, 300),
                                                     bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)
    hf = transformers.Olmo3ForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return Olmo3ForCausalLM.from_pretrained(directory, transformer_lens=True), bridge


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, bridge = models
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = ours.run_with_cache(ids)
    assert torch.equal(our_logits, logits)
    declared = ours.lens_names()
    names = [name for name in theirs.keys() if name in declared or not name.endswith((".hook_in", ".hook_out"))]
    compared = assert_bridge_tensors(cache, theirs, names, BRIDGE_ONLY)
    assert {f"blocks.1.{name}" for name in (
        "hook_resid_pre", "attn.q_norm.hook_scale", "attn.q_norm.hook_normalized", "attn.hook_q_normed",
        "attn.k_norm.hook_scale", "attn.hook_k_normed", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k",
        "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "attn.hook_out", "ln1_post.hook_scale",
        "ln1_post.hook_out", "hook_attn_out", "hook_resid_mid", "mlp.hook_pre", "mlp.hook_pre_linear",
        "mlp.hook_post", "mlp.hook_out", "ln2_post.hook_normalized", "hook_mlp_out", "hook_resid_post")} | {
        "hook_embed", "ln_final.hook_scale", "hook_unembed"} <= set(compared)
    assert {"blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.mlp.hook_in"} <= set(compared)
    # layers 0 to 2 are local: their last query sees the window's 5 keys; layer 3 is global: all 9
    assert [int(theirs[f"blocks.{i}.attn.hook_attn_scores"][0, 0, -1].isfinite().sum()) for i in range(4)] == [
        5, 5, 5, 9]


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    for name in WEIGHTS:
        assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    for layer in range(2):
        for name in ("W_gate", "W_in", "W_out"):
            assert torch.equal(getattr(ours.blocks[layer].mlp, name), getattr(bridge.blocks[layer].mlp, name)), name
        for norm in ("ln1_post", "ln2_post"):
            assert torch.equal(getattr(ours.blocks[layer], norm).w, getattr(bridge.blocks[layer], norm).weight)
        assert torch.equal(ours.blocks[layer].attn.q_norm.w, bridge.blocks[layer].attn.q_norm.weight)
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "eps",
                  "positional_embedding_type", "normalization_type", "gated_mlp", "final_rms", "n_key_value_heads",
                  "tie_word_embeddings", "default_prepend_bos"):
        assert getattr(ours.cfg, field) == getattr(bridge.cfg, field), field
