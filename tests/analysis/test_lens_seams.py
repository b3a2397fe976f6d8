"""Where the TransformerLens dialect answered silently wrong (issue 34, item 1): hooks that stay attached, positions
of left-padded text, a cache or a hook changing the logits' last bits, and generate's defaults. Each beside TL 4.3's
TransformerBridge over transformers' model with the same weights (weight processing off), for every registered
family, on the second day's tiny random models (test_lens_second_day.built).
"""

import pytest
import torch

from helpers import each_family
from test_lens_second_day import SHORT, TEXTS, built, close  # noqa: F401  (built: the module's fixture)

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


@each_family
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
                    close(model(tokens), ablated, atol=1e-4)
                with model.hooks(fwd_hooks=[SECOND]):
                    close(model(tokens), both, atol=1e-4)  # the added hook, then the block's
                    model.reset_hooks()  # inside a block: the block's own hooks go too, as in TL
                    close(model(tokens), plain, atol=1e-4)
                close(model(tokens), plain, atol=1e-4)
            finally:
                model.reset_hooks(including_permanent=True)


@each_family
def test_reset_hooks_end_false_keeps_the_run_s_hooks_and_permanent_hooks_survive_reset(built, family):
    _, ours, bridge, _ = built(family)
    tokens = ours.to_tokens(list(TEXTS))
    with torch.no_grad():
        plain = ours(tokens)
        ablated = ours.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        for model in (ours, bridge):
            try:
                model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)], reset_hooks_end=False)
                close(model(tokens), ablated, atol=1e-4)
                model.reset_hooks()
                close(model(tokens), plain, atol=1e-4)
                with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", zero_head)], reset_hooks_end=False):
                    pass
                close(model(tokens), ablated, atol=1e-4)
                model.reset_hooks()
                if model is ours:  # the bridge's run_with_cache takes no hooks of its own
                    model.run_with_cache(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)],
                                         reset_hooks_end=False)
                    close(model(tokens), ablated, atol=1e-4)
                    model.reset_hooks()
                model.add_hook(lambda name: name == "blocks.1.attn.hook_z", zero_head, is_permanent=True)
                model.reset_hooks()
                close(model(tokens), ablated, atol=1e-4)  # permanent: kept
                model.reset_hooks(including_permanent=True)
                close(model(tokens), plain, atol=1e-4)
            finally:
                model.reset_hooks(including_permanent=True)
    assert all(point.fn is None for point in ours.hook_points().values())


def test_the_plain_dialect_keeps_its_own_hooks_the_same_way(built):
    """Our own names and hook functions (fn(tensor, name)) follow the same rule: a `hooks=` pair stays after a run
    only with reset_hooks_end=False, and a hook added to the model outlives runs."""
    from scratch_models.families import FAMILIES

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
