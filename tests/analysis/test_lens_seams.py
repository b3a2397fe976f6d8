"""Where the TransformerLens dialect answered silently wrong (issue 34, item 1): hooks that stay attached, positions
of left-padded text, a cache or a hook changing the logits' last bits, and generate's defaults. Each beside TL 4.3's
TransformerBridge over transformers' model with the same weights (weight processing off), for every registered
family, on the second day's tiny random models (test_lens_second_day.built).
"""

import pytest
import torch

from helpers import assert_parity, each_lens_family
from test_lens_second_day import SHORT, TEXTS, built  # noqa: F401  (built: the module's fixture)

pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:.*gated-off hook name"),
              pytest.mark.filterwarnings("ignore:.*model-agnostic default")]


def zero_head(z, hook):
    z = z.clone()
    z[:, :, 0] = 0
    return z


# a second edit, the same on both sides (BERT's hook_resid_post is another tensor on the bridge)
SECOND = ("blocks.0.attn.hook_z", zero_head)


# ---- hooks that stay attached ------------------------------------------------------------------------------------


@each_lens_family
def test_a_hook_added_to_the_model_lives_until_reset_hooks_as_on_the_bridge(built, family):
    """The issue's repro: add_hook, then run_with_cache, then a plain call: still ablated on the bridge, and on ours
    (which removed the hook at the end of any run_with_hooks, run_with_cache or hooks() block)."""
    _, ours, bridge, _ = built(family)
    tokens = ours.to_tokens(list(TEXTS))
    with torch.no_grad():
        plain = ours(tokens)
        ablated = ours.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        both = ours.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head),
                                                      SECOND])
        assert not torch.allclose(plain, ablated, atol=1e-3)
        for model in (ours, bridge):
            model.add_hook("blocks.1.attn.hook_z", zero_head)
            try:
                for run in (lambda: model.run_with_cache(tokens), lambda: model.run_with_hooks(tokens),
                            lambda: model.run_with_hooks(tokens, fwd_hooks=[SECOND])):
                    run()
                    assert_parity(model(tokens), ablated, "logits")
                with model.hooks(fwd_hooks=[SECOND]):
                    assert_parity(model(tokens), both, "logits")  # the added hook, then the block's
                    model.reset_hooks()  # inside a block: the block's own hooks go too, as in TL
                    assert_parity(model(tokens), plain, "logits")
                assert_parity(model(tokens), plain, "logits")
            finally:
                model.reset_hooks(including_permanent=True)


@each_lens_family
def test_reset_hooks_end_false_keeps_the_run_s_hooks_and_permanent_hooks_survive_reset(built, family):
    _, ours, bridge, _ = built(family)
    tokens = ours.to_tokens(list(TEXTS))
    with torch.no_grad():
        plain = ours(tokens)
        ablated = ours.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        for model in (ours, bridge):
            try:
                model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)], reset_hooks_end=False)
                assert_parity(model(tokens), ablated, "logits")
                model.reset_hooks()
                assert_parity(model(tokens), plain, "logits")
                with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_head)], reset_hooks_end=False):
                    pass
                assert_parity(model(tokens), ablated, "logits")
                model.reset_hooks()
                if model is ours:  # the bridge's run_with_cache takes no hooks of its own
                    model.run_with_cache(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)],
                                         reset_hooks_end=False)
                    assert_parity(model(tokens), ablated, "logits")
                    model.reset_hooks()
                model.add_hook(lambda name: name == "blocks.1.attn.hook_z", zero_head, is_permanent=True)
                model.reset_hooks()
                assert_parity(model(tokens), ablated, "logits")  # permanent: kept
                model.reset_hooks(including_permanent=True)
                assert_parity(model(tokens), plain, "logits")
            finally:
                model.reset_hooks(including_permanent=True)
    assert all(point.fn is None for point in ours.hook_points().values())


def test_the_plain_dialect_keeps_its_own_hooks_the_same_way(built):
    """Our own names and hook functions (fn(tensor, name)) follow the same rule: a `hooks=` pair stays after a run
    only with reset_hooks_end=False, and a hook added to the model outlives runs."""
    from scratch_models.registry.families import FAMILIES

    directory, _, _, _ = built("gpt2")
    model = FAMILIES["gpt2"].lm.from_pretrained(directory)
    ids = model.to_tokens(list(TEXTS))
    double = ("layers.0.out", lambda x, name: x * 2)
    with torch.no_grad():
        plain = model(ids).logits
        doubled = model.run_with_hooks(ids, hooks=[double]).logits
        assert torch.equal(model(ids).logits, plain)
        model.run_with_hooks(ids, hooks=[double], reset_hooks_end=False)
        assert torch.equal(model(ids).logits, doubled)
        model.run_with_cache(ids)
        assert torch.equal(model(ids).logits, doubled)
        model.reset_hooks()
        assert torch.equal(model(ids).logits, plain)
    with pytest.raises(TypeError):
        model.reset_hooks(True)  # TL's first positional argument is clear_contexts: not taken for including_permanent


# ---- a cache or a hook changes no bit --------------------------------------------------------------------------


def identity(x, hook):
    return x


@each_lens_family
def test_a_cache_or_a_hook_gives_the_plain_call_s_logits_bitwise(built, family):
    """TL's bridge gives the same logits with or without a cache or hooks (its Attribution Patching demo asserts
    1e-5 between them). Ours took the fused attention without listeners and the explicit one with them (3e-5 apart
    on logits of 14): a TL-dialect model now takes the explicit one on every call. (A hook on hook_scale or
    hook_normalized still takes the norm step by step, about one unit in the last place apart; the bridge's norm
    goes back to its fused formula when the hook returns the very tensor it was given.)"""
    _, ours, _, _ = built(family)
    with torch.no_grad():
        for text in (TEXTS[0], list(TEXTS), [SHORT, TEXTS[1]]):
            tokens = ours.to_tokens(text)
            plain = ours(tokens)
            assert torch.equal(ours.run_with_cache(tokens)[0], plain)
            assert torch.equal(ours.run_with_cache(tokens, names_filter=lambda name: True)[0], plain)
            for point in ("attn.hook_pattern", "attn.hook_attn_scores", "attn.hook_z", "attn.hook_q"):
                hooked = ours.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith(point), identity)])
                assert torch.equal(hooked, plain), point


# ---- generate's defaults ---------------------------------------------------------------------------------------


@each_lens_family
def test_generate_follows_tl_s_defaults_not_generation_config_json(built, family, tmp_path):
    """TL's generate reads no generation_config.json: a Llama 3 file's temperature 0.6 and top_p 0.9 (here with
    3 new tokens and a repetition penalty, which ours refused) change nothing in TL mode. temperature=0 is greedy,
    as TL's LLaMA demo calls it: the bridge's tokens."""
    import json
    import shutil

    from scratch_models.registry.families import FAMILIES

    if not FAMILIES[family].causal:
        pytest.skip("generate belongs to the causal families")
    directory, _, bridge, _ = built(family)
    shutil.copytree(directory, tmp_path, dirs_exist_ok=True)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 3, "repetition_penalty": 1.3}))
    ours = FAMILIES[family].lm.from_pretrained(tmp_path, transformer_lens=True)
    prompt = ours.to_tokens(SHORT)
    eos = ours.config.eos_token_id
    torch.manual_seed(1)
    sampled = ours.generate(prompt, stop_at_eos=False)
    torch.manual_seed(1)
    assert torch.equal(sampled, ours.generate(prompt, do_sample=True, temperature=1.0, top_k=None, top_p=None,
                                              max_new_tokens=10, eos_token_id=eos, stop_at_eos=False))
    assert sampled.shape[1] == prompt.shape[1] + 10
    greedy = ours.generate(prompt, temperature=0, max_new_tokens=6, stop_at_eos=False)
    assert torch.equal(greedy, ours.generate(prompt, do_sample=False, max_new_tokens=6, stop_at_eos=False))
    # the bridge without its KV cache: with it (transformers 5 here) its second token on is not its own argmax
    with torch.no_grad():
        assert torch.equal(greedy, bridge.generate(prompt, temperature=0, max_new_tokens=6, stop_at_eos=False,
                                                   verbose=False, use_past_kv_cache=False))


# ---- left padding --------------------------------------------------------------------------------------------------


@each_lens_family
def test_a_left_padded_row_reads_the_positions_it_reads_alone_as_on_the_bridge(built, family):
    """TL's bridge counts a left-padded row's positions from its first token, so it gives the logits of the text
    alone; ours gave GPT-2's short row the positions of its padded columns (logits off by up to 8). Rotary
    families shift too (the bridge hands transformers the same positions), and so does run_with_cache."""
    _, ours, bridge, _ = built(family)
    texts = [SHORT, TEXTS[1]]
    with torch.no_grad():
        batch = ours(texts, padding_side="left")
        theirs = bridge(texts, padding_side="left")
        for row, text in enumerate(texts):
            alone = ours(text)[0]
            width = alone.shape[0]
            assert_parity(batch[row, -width:], alone, "logits")
            assert_parity(batch[row, -width:], theirs[row, -width:], "logits")
        logits, cache = ours.run_with_cache(texts, padding_side="left")
        assert torch.equal(logits, batch)
        resid = cache["blocks.1.hook_resid_pre"]
        _, their_cache = bridge.run_with_cache(texts, padding_side="left")
        width = ours(SHORT).shape[1]
        assert_parity(resid[0, -width:], their_cache["blocks.1.hook_resid_pre"][0, -width:], "logits")
        # right padding, and token ids without a mask (every column a token, as on the bridge), change nothing
        right = ours(texts, padding_side="right")
        assert_parity(right[0, :width], ours(SHORT)[0], "logits")
        tokens = ours.to_tokens(texts, padding_side="left")
        assert_parity(ours(tokens), bridge(tokens), "logits")
