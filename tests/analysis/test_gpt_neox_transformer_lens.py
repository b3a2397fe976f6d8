"""GPT-NeoX in TransformerLens' names, against TransformerLens' own TransformerBridge over transformers' GPT-NeoX with
the same random weights (its weight processing off): every hook name both have holds the same tensor, TL's weights
and config fields are the bridge's, for the parallel residual (Pythia) and the sequential one."""

import pytest
import torch
import transformers

from helpers import assert_bridge_tensors, assert_parity, model_sizes, reference, save
from scratch_models import GPTNeoXForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

WEIGHTS = ("W_E", "W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "W_in", "b_in", "W_out", "b_out", "W_U")
# the bridge's rotary angles (per layer and the model's); ours are computed once per forward
# (GPTNeoXModel.positional), no hook point; and the bridge's copy of the attention's output
BRIDGE_ONLY = ("hook_cos", "hook_sin", "attn.hook_hidden_states")


@pytest.fixture(scope="module", params=[True, False], ids=["parallel", "sequential"])
def models(request, tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge

    directory = save(reference("gpt_neox", use_parallel_residual=request.param), tmp_path_factory.mktemp("neox"))
    hf = transformers.GPTNeoXForCausalLM.from_pretrained(directory).eval()
    bridge = TransformerBridge.boot_transformers(str(directory), hf_model=hf)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return GPTNeoXForCausalLM.from_pretrained(directory, transformer_lens=True), bridge


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    ours, bridge = models
    ids = torch.randint(1, 36, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = ours.run_with_cache(ids)
    assert torch.equal(our_logits, logits)
    names = [name for name in theirs.keys() if not name.endswith((".hook_in", ".hook_out"))
             or name in ("ln_final.hook_out",) or ".ln1.hook_out" in name or ".ln2.hook_out" in name]
    compared = assert_bridge_tensors(cache, theirs, names, BRIDGE_ONLY)
    assert {"blocks.1.attn.hook_q", "blocks.1.attn.hook_k", "blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z",
            "blocks.1.ln2.hook_normalized", "blocks.1.hook_resid_post", "ln_final.hook_scale"} <= set(compared)
    # the turned queries and keys, TL's HookedTransformer names: the scores are their products
    q, k = cache["blocks.1.attn.hook_rot_q"], cache["blocks.1.attn.hook_rot_k"]
    scores = torch.einsum("bqnd,bknd->bnqk", q, k) / q.shape[-1] ** 0.5
    seen = theirs["blocks.1.attn.hook_attn_scores"].isfinite()
    assert_parity(scores[seen], theirs["blocks.1.attn.hook_attn_scores"][seen], "scores", **model_sizes(ours.cfg))


def test_weights_and_config_are_the_bridges(models):
    ours, bridge = models
    for name in WEIGHTS:
        assert torch.equal(getattr(ours, name), getattr(bridge, name)), name
    for field in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn",
                  "positional_embedding_type", "parallel_attn_mlp", "rotary_base"):
        assert getattr(ours.cfg, field) == getattr(bridge.cfg, field), field
    assert ours.cfg.rotary_dim == 8  # the bridge leaves it None; TL's HookedTransformer has it


def test_the_bridges_rotary_angle_hooks_are_refused_saying_where_the_angles_are(models):
    ours, _ = models
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
    with pytest.raises(KeyError, match="rotary angles are computed once per forward pass"):
        cache["blocks.0.attn.hook_cos"]


def test_resid_mid_is_the_sequential_models_only(models):
    ours, _ = models
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
    if ours.config.use_parallel_residual:
        with pytest.raises(KeyError, match="blocks.0.hook_resid_mid"):
            cache["blocks.0.hook_resid_mid"]
    else:
        assert torch.equal(cache["blocks.0.hook_resid_mid"], cache["layers.0.resid_mid"])
