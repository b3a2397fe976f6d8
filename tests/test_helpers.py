"""assert_parity, the bound every comparison with another implementation (transformers, TransformerLens, SAELens)
is held to: wide enough for two orders of the same float sums, narrow enough for a real slip."""

import pytest
import torch

from helpers import TINY, assert_parity, model_sizes, parity_bound

# GPT-2 124M's sizes (hidden 768, MLP 3,072, 12 layers), the largest model the suite compares
GPT2 = model_sizes(type("GPT2Config", (), dict(n_embd=768, n_inner=None, n_layer=12))())


def matmul_blocked(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    """x @ w with the inner sum cut in blocks of `block`, summed last block first: another kernel's order."""
    parts = [x[..., i:i + block] @ w[i:i + block] for i in range(0, x.shape[-1], block)]
    total = torch.zeros_like(parts[0])
    for part in reversed(parts):
        total = total + part
    return total


@pytest.mark.parametrize("n", [48, 192, 768, 3072])
def test_two_orders_of_the_same_sums_are_within_the_bound_with_margin(n):
    """One matmul summed whole, in blocks of 7 in reverse, and exactly (float64, rounded once): each pair well
    inside the bound for one stage of n terms."""
    g = torch.Generator().manual_seed(n)
    x, w = torch.randn(64, n, generator=g) * 3, torch.randn(n, 64, generator=g) * 0.3
    whole, blocked, exact = x @ w, matmul_blocked(x, w, 7), (x.double() @ w.double()).float()
    for ours, ref in ((blocked, whole), (whole, exact), (blocked, exact)):
        worst = assert_parity(ours, ref, f"n={n}", terms=n)
        assert worst <= parity_bound(ref, terms=n) / 4  # a margin of 4 at least


@pytest.mark.parametrize("sizes", [TINY, GPT2], ids=["tiny", "gpt2-124m"])
def test_a_wrong_scale_of_one_in_a_thousand_fails(sizes):
    """An output 1e-3 too large (a wrong scale) fails at every size the suite compares, up to GPT-2 124M's."""
    ref = torch.randn(2, 9, 48, generator=torch.Generator().manual_seed(0))
    assert_parity(ref.clone(), ref, "the same", **sizes)
    with pytest.raises(AssertionError, match="exceeds"):
        assert_parity(ref * (1 + 1e-3), ref, "scaled", **sizes)


def test_swapped_heads_fail():
    """Two heads' outputs in each other's place, [b, s, heads, d_head]."""
    ref = torch.randn(2, 9, 3, 16, generator=torch.Generator().manual_seed(1))
    with pytest.raises(AssertionError, match="exceeds"):
        assert_parity(ref[:, :, [1, 0, 2]], ref, "swapped", **TINY)


def test_one_element_off_by_a_little_fails_where_the_rest_is_equal():
    """A slip at one position (a mask off by one) is not averaged away: the bound is per element."""
    ref = torch.randn(4, 11, 48, generator=torch.Generator().manual_seed(2))
    ours = ref.clone()
    ours[3, 10, 7] += 1e-3 * float(ref.abs().max())
    with pytest.raises(AssertionError, match="exceeds"):
        assert_parity(ours, ref, "one element", **TINY)


def test_infinities_and_integers_must_match_exactly():
    ref = torch.tensor([1.0, float("-inf"), 2.0])
    assert_parity(torch.tensor([1.0, float("-inf"), 2.0]), ref, "masked scores")
    with pytest.raises(AssertionError, match="finite in one"):
        assert_parity(torch.tensor([1.0, -1e30, 2.0]), ref, "masked scores")
    with pytest.raises(AssertionError, match="different infinities"):
        assert_parity(torch.tensor([1.0, float("inf"), 2.0]), ref, "masked scores")
    with pytest.raises(AssertionError, match="positions"):
        assert_parity(torch.tensor([0, 1, 3]), torch.tensor([0, 1, 2]), "positions")


def test_the_bound_grows_with_what_is_summed_and_with_the_magnitude():
    ref = torch.ones(3)
    one = parity_bound(ref, terms=1)
    assert parity_bound(ref, terms=400) == pytest.approx(20 * one)  # sqrt(n)
    assert parity_bound(ref, terms=1, depth=3) == pytest.approx(3 * one)  # stage by stage
    assert parity_bound(10 * ref, terms=1) == pytest.approx(10 * one)  # the values' magnitude
    assert parity_bound(ref, terms=1, scale=5.0) == pytest.approx(5 * one)
    # half precision: the terms count once (sums accumulate in float32), in that format's eps
    assert parity_bound(ref.half(), terms=400) == pytest.approx(one * torch.finfo(torch.float16).eps
                                                                / torch.finfo(torch.float32).eps)
    assert parity_bound(ref.double(), terms=1, dtype=torch.float32) == pytest.approx(one)


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    """transformers' tiny GPT-2 (large random weights) and ours loaded from its files, with a padded batch."""
    from helpers import padded_batch, reference, save
    from scratch_models.registry.families import FAMILIES

    theirs = reference("gpt2")
    ours = FAMILIES["gpt2"].lm.from_pretrained(save(theirs, tmp_path_factory.mktemp("gpt2")))
    inputs = {name: t[:3] for name, t in padded_batch("gpt2").items()}  # full, left- and right-padded rows
    with torch.no_grad():
        ref = theirs(**inputs, output_hidden_states=True)
    return ours, inputs, ref


def swap_heads(context, name):
    return context[:, [1, 0, 2]]  # [b, heads, s, d_head]: heads 0 and 1 in each other's place


@pytest.mark.parametrize("slip", [None, ("layers.0.out", lambda t, name: t * (1 + 1e-3)),
                                  ("layers.1.attn.context", swap_heads)], ids=["none", "scale 1e-3", "swapped heads"])
def test_a_slip_inside_a_real_model_fails_its_comparison_with_transformers(gpt2_pair, slip):
    """Our GPT-2 against transformers' on the same weights: within the bound as it is; a 1e-3 scale on one layer's
    output, or two heads swapped in the last layer, fails the comparison of the logits."""
    ours, inputs, ref = gpt2_pair
    seen = inputs["attention_mask"].bool()
    with torch.no_grad(), ours.hooks([slip] if slip else []):
        logits = ours(**inputs).logits
    if slip is None:
        assert_parity(logits[seen], ref.logits[seen], "logits", **model_sizes(ours.config))
    else:
        with pytest.raises(AssertionError, match="exceeds"):
            assert_parity(logits[seen], ref.logits[seen], "logits", **model_sizes(ours.config))
