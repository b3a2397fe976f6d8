"""Mixtral, Qwen 3 MoE and GPT-OSS in TransformerLens' names, against TransformerLens' own TransformerBridge over
transformers' model with the same random weights (its weight processing off): every hook name both have holds the same
tensor (the router's input and logits, the chosen experts and their weights one row per token, GPT-OSS's router
scores, the mixture's input and output; Qwen 3 MoE's dense layer 0 as a gated MLP; GPT-OSS's pattern with its sinks'
share left out), TL's weights (GPT-OSS's sinks too) and config fields are the bridge's, an edit of the experts'
weights re-routes as the bridge's does, and text gets a BOS token as the bridge gives it."""

import pytest
import torch

from helpers import assert_bridge_weights, assert_parity, compare_bridge_caches, ours_and_bridge

pytestmark = pytest.mark.usefixtures("one_thread")
transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

FAMILY_NAMES = ("mixtral", "qwen3_moe", "gpt_oss")
# the bridge's name of the router (ours is always mlp.gate)
ROUTER = {"gpt_oss": "router"}


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def models(request, tmp_path_factory):
    family = request.param
    return family, *ours_and_bridge(family, tmp_path_factory.mktemp(family), eager=True, tokenizer=(30, "<s>", "</s>"))


def test_every_hook_name_both_have_holds_the_bridges_tensor(models):
    family, ours, bridge = models
    cache, theirs, compared = compare_bridge_caches(ours, bridge, exact=False)
    router = ROUTER.get(family, "gate")
    sparse = {f"blocks.1.{name}" for name in (
        "ln2.hook_out", "mlp.hook_in", "mlp.hook_pre", f"mlp.{router}.hook_in", f"mlp.{router}.hook_out",
        "mlp.hook_expert_indices", f"mlp.{router}.hook_expert_indices", "mlp.hook_expert_weights",
        f"mlp.{router}.hook_expert_weights", "mlp.hook_post", "mlp.hook_out", "hook_mlp_out", "attn.hook_rot_q",
        "attn.hook_pattern", "hook_resid_post")}
    assert sparse | {"hook_embed", "ln_final.hook_scale", "hook_unembed"} <= set(compared)
    if family == "gpt_oss":  # its block returns the chosen experts' weights, which the bridge shows
        assert {"blocks.0.mlp.hook_router_scores", "blocks.1.mlp.hook_router_scores"} <= set(compared)
        # the sinks take a share of every query's attention: no row of the pattern sums to 1
        assert bool((cache["blocks.1.attn.hook_pattern"].sum(-1) < 1 - 1e-3).all())
    else:
        assert "blocks.1.mlp.hook_router_scores" not in theirs
        # the reason names the layer asked for, not a pattern ({i})
        with pytest.raises(KeyError, match=r"hook_router_scores only for a mixture whose block returns.*"
                                           r"blocks\.1\.mlp\.gate\.hook_out"):
            cache["blocks.1.mlp.hook_router_scores"]
    if family == "qwen3_moe":  # layer 0 is dense: a gated MLP under the same names
        assert {f"blocks.0.mlp.{name}" for name in ("hook_pre", "hook_pre_linear", "hook_post", "hook_out")} \
            <= set(compared)
        assert cache["blocks.0.mlp.hook_pre"].shape[-1] == ours.config.intermediate_size
        with pytest.raises(KeyError, match="layers.0.mlp.router_logits"):
            cache["blocks.0.mlp.gate.hook_out"]
    # the weights: each token's k chosen, renormalised where the family does, 0 elsewhere
    weights, chosen = cache["blocks.1.mlp.hook_expert_weights"], cache["blocks.1.mlp.hook_expert_indices"]
    assert torch.equal((weights != 0).sum(-1), torch.full((18,), 2)) and torch.equal(weights.gather(-1, chosen) > 0,
                                                                                     torch.ones(18, 2, dtype=bool))


def test_an_edit_of_the_experts_weights_reroutes_as_the_bridges_does(models):
    """Each token's weights mirrored, expert e's to expert E - 1 - e (the bridge: the top k of the edited weights,
    no renormalisation): the same logits on both, and the chosen experts read after the edit are the mirrored ones;
    unedited, a listener changes nothing, bitwise."""
    _, ours, bridge = models
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(1))
    hooks = [("blocks.1.mlp.hook_expert_weights", lambda weights, hook: weights.flip(-1))]
    with torch.no_grad():
        plain, before = ours.run_with_cache(ids)
        theirs, mine = bridge.run_with_hooks(ids, fwd_hooks=hooks), ours.run_with_hooks(ids, fwd_hooks=hooks)
        untouched = ours.run_with_hooks(ids, fwd_hooks=[("blocks.1.mlp.hook_expert_weights", lambda w, hook: w)])
        _, after = ours.run_with_cache(ids, fwd_hooks=hooks)
    assert torch.equal(untouched, plain)
    assert not torch.allclose(mine, plain)
    assert_parity(mine, theirs, "logits after the edit")
    experts = before["blocks.1.mlp.hook_expert_weights"].shape[-1]
    assert torch.equal(after["blocks.1.mlp.hook_expert_indices"],
                       experts - 1 - before["blocks.1.mlp.hook_expert_indices"])


def test_an_edit_of_gpt_oss_router_scores_reweighs_ours_and_not_the_bridge(models):
    """The bridge fires hook_router_scores after the experts ran (the block returns them beside its output), so its
    edit changes nothing; ours is the weights the experts' outputs are summed with (routing_weights): the docs'
    difference."""
    family, ours, bridge = models
    if family != "gpt_oss":
        pytest.skip("only GPT-OSS's block returns its router's scores")
    ids = torch.randint(1, 36, (2, 9), generator=torch.Generator().manual_seed(2))
    hooks = [("blocks.1.mlp.hook_router_scores", lambda scores, hook: scores.flip(-1))]
    with torch.no_grad():
        plain, theirs = ours(ids), bridge(ids)
        mine, theirs_edited = ours.run_with_hooks(ids, fwd_hooks=hooks), bridge.run_with_hooks(ids, fwd_hooks=hooks)
    assert torch.equal(theirs_edited, theirs)
    assert not torch.allclose(mine, plain)


def test_weights_and_config_are_the_bridges(models):
    family, ours, bridge = models
    for name in ("W_gate", "W_in", "W_out"):  # a mixture has none, on both
        with pytest.raises(AttributeError):
            getattr(bridge.blocks[1].mlp, name)
        with pytest.raises(Exception, match="mixture of experts.*layers.1.mlp.experts"):
            getattr(ours.blocks[1].mlp, name)
    if family == "gpt_oss":  # the attention sinks: a parameter, no hook, on both
        for layer in (0, 1):
            assert torch.equal(ours.blocks[layer].attn.sinks, bridge.blocks[layer].attn.sinks), layer
        assert ours.blocks[1].attn.sinks is ours.layers[1].attn.sinks
    # qwen3_moe's layer 0 is dense: its gated MLP's weights
    assert_bridge_weights(ours, bridge, ("W_E", "W_Q", "W_K", "W_V", "W_O", "W_U"),
                          ("eps", "normalization_type", "gated_mlp", "n_key_value_heads", "tie_word_embeddings",
                           "num_experts", "experts_per_token", "default_prepend_bos"),
                          block=("mlp.W_gate", "mlp.W_in", "mlp.W_out"), layers=(0,) if family == "qwen3_moe" else ())
    # the bridge's Mixtral adapter says its final norm is no RMSNorm; it is one, as ours says
    assert ours.cfg.final_rms and bridge.cfg.final_rms == (family == "qwen3_moe")


def test_text_gets_a_bos_token_as_the_bridge_gives_it(models):
    _, ours, bridge = models
    for prepend_bos in (None, True, False):
        kwargs = {} if prepend_bos is None else dict(prepend_bos=prepend_bos)
        assert torch.equal(ours.to_tokens("a b c", **kwargs), bridge.to_tokens("a b c", **kwargs)), prepend_bos


def test_the_routers_names_of_one_sequence_without_its_batch_axis(models):
    """remove_batch_dim (TL's detect_head runs one sequence so): the router's names keep one row per token."""
    family, ours, _ = models
    with torch.no_grad():
        _, cache = ours.run_with_cache(torch.arange(1, 8)[None])
        kept = {name: cache[name] for name in (f"blocks.1.mlp.{ROUTER.get(family, 'gate')}.hook_out",
                                               "blocks.1.mlp.hook_expert_indices")}
        cache.remove_batch_dim()
    for name, tensor in kept.items():
        assert torch.equal(cache[name], tensor), name
