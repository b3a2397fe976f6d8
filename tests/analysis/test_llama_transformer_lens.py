"""The Llama-like families (Llama, Mistral, Qwen2, Qwen3) in TransformerLens' names, against TransformerLens' own
TransformerBridge over transformers' model of the same class with the same random weights (its weight processing
off): every hook name both have holds the same tensor, grouped key/value heads in TL's shapes, TL's weights and
config fields are the bridge's. Each family's tiny config has fewer key/value heads than query heads; Mistral's and
Qwen3's heads are not hidden / heads wide, Qwen2's second layer has a sliding window shorter than the input, Qwen3
normalises each head's queries and keys."""

import pytest
import torch
import transformers

from helpers import assert_bridge_tensors, assert_parity, byte_level_bpe, model_sizes, reference, save
from scratch_models import LlamaModel
from scratch_models.registry.families import FAMILIES
from scratch_models.registry.known import MIXTURES

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

# the mixtures of experts are compared in test_moe_transformer_lens.py: no single MLP's weights, and their
# routing is compared within the bound (the bridge's router rounds otherwise)
LLAMA_LIKE = [name for name, family in FAMILIES.items()
              if issubclass(family.base, LlamaModel) and family.transformer_lens is not None and name not in MIXTURES]
WEIGHTS = ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_in", "W_gate", "W_out", "W_U", "b_U")
# the bridge's rotary angles (per layer and the model's); ours are computed once per forward (the model's
# `positional`), no hook point; and the bridge's copy of the attention's output
BRIDGE_ONLY = ("hook_cos", "hook_sin", "attn.hook_hidden_states")


@pytest.fixture(scope="module", params=LLAMA_LIKE)
def models(request, tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge

    family = FAMILIES[request.param]
    directory = save(reference(request.param), tmp_path_factory.mktemp(request.param))
    # the bridge loads a tokenizer from the directory: a byte-level BPE as a fast tokenizer's files
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(["a b c"] * 4, 300),
                                                     bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)
    hf = getattr(transformers, family.lm.__name__).from_pretrained(directory).eval()
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return family.lm.from_pretrained(directory, transformer_lens=True), bridge


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, bridge = models
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = ours.run_with_cache(ids)
    assert torch.equal(our_logits, logits)
    names = [name for name in theirs.keys() if not name.endswith((".hook_in", ".hook_out"))
             or name == "ln_final.hook_out" or ".ln1.hook_out" in name or ".ln2.hook_out" in name]
    compared = assert_bridge_tensors(cache, theirs, names, skip=BRIDGE_ONLY)
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
    for name in WEIGHTS:
        assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    if ours.config.qkv_bias:
        for name in ("b_Q", "b_K", "b_V"):
            assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "eps",
                  "positional_embedding_type", "normalization_type", "n_key_value_heads", "gated_mlp",
                  "tie_word_embeddings"):
        assert getattr(ours.cfg, field) == getattr(bridge.cfg, field), field
    # the bridge's rotary_base stays TL's default (10000) whatever the config says; its rope_parameters hold the
    # theta its model turns by, which is ours
    assert ours.cfg.rotary_base == bridge.cfg.rope_parameters["rope_theta"] == ours.config.rope_theta
    # final_rms: TL forces an RMS final norm with it; the bridge leaves it off for Mistral, whose every norm is RMS
    # already (normalization_type), and sets it for the others
    assert ours.cfg.final_rms and bridge.cfg.final_rms == (ours.family.name != "mistral")


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    ours, _ = models
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
    with pytest.raises(KeyError, match="rotary angles are computed once per forward pass"):
        cache["blocks.0.attn.hook_cos"]
