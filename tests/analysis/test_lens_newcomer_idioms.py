"""TransformerLens idioms a newcomer's code used that ours did not take: `cache.to(device)`, a slice of the model
run from a layer on (`model(resid, start_at_layer=k)`, with `stop_at_layer` the pair TL users run a slice of the
model with), and TL's own `Slice` (and its tuple spelling) as a pos_slice; each against TL 4.3's bridge on the same
random checkpoint."""

import pytest
import torch

from helpers import each_lens_family
from test_lens_second_day import TEXTS, built, supported  # noqa: F401  (built: the module's fixture)

transformer_lens = pytest.importorskip("transformer_lens", reason="transformer-lens is not installed (test extra)")
from transformer_lens.utilities import Slice  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:.*gated-off hook name"),
              pytest.mark.filterwarnings("ignore:.*model-agnostic default")]


def test_cache_to_moves_every_tensor_and_returns_the_cache(built):
    _, ours, _, _ = built("gpt2")
    _, cache = ours.run_with_cache(ours.to_tokens(list(TEXTS)))
    before = cache["blocks.0.hook_resid_pre"]
    assert cache.to("cpu") is cache and torch.equal(cache["blocks.0.hook_resid_pre"], before)
    moved = cache.to("meta")  # a device every machine has: nothing is computed on it
    assert moved is cache and {t.device.type for t in cache.values()} == {"meta"}
    assert cache.input_ids.device.type == "meta" and next(ours.parameters()).device.type == "cpu"


@each_lens_family
def test_start_at_layer_runs_the_rest_of_the_model_from_a_residual(built, family):
    """stop_at_layer=k then start_at_layer=k gives the whole run's logits bitwise (the same operations on the same
    numbers), on every family, padded batches included; its cache holds nothing from before block k."""
    _, ours, bridge, _ = built(family)
    tokens = ours.to_tokens(list(TEXTS))
    with torch.no_grad():
        whole = ours(tokens, return_type="logits")
        for layer in (0, 1, 2, -1):
            resid = ours(tokens, stop_at_layer=layer)
            assert torch.equal(ours(resid, start_at_layer=layer, tokens=tokens, return_type="logits"), whole)
            assert torch.equal(ours(resid, start_at_layer=layer, return_type="logits"), whole)
        cached_logits, whole_cache = ours.run_with_cache(tokens, return_type="logits")
        resid = whole_cache["blocks.1.hook_resid_pre"]
        logits, cache = ours.run_with_cache(resid, start_at_layer=1, return_type="logits")
        assert torch.equal(logits, cached_logits)
        assert "blocks.0.hook_resid_pre" not in cache and "blocks.0.attn.hook_z" not in cache
        assert torch.equal(cache["blocks.1.hook_resid_pre"], resid)
        assert torch.equal(cache["blocks.1.hook_resid_post"], whole_cache["blocks.1.hook_resid_post"])
        if family == "gpt2":  # the bridge's start_at_layer, on the same residual
            theirs = bridge(resid, start_at_layer=1, return_type="logits")
            scale = float(theirs.abs().max())
            assert float((logits - theirs).abs().max()) <= 64 * torch.finfo(torch.float32).eps * scale
    if ours.family.causal:  # TL's loss is the next-token one
        resid = ours(tokens, stop_at_layer=1)
        loss = ours(resid, start_at_layer=1, tokens=tokens, return_type="loss")
        assert torch.equal(loss, ours(tokens, return_type="loss"))
    with pytest.raises(ValueError, match=r"start_at_layer with a loss needs tokens="):
        ours(resid, start_at_layer=1, return_type="loss")
    with pytest.raises(ValueError, match=r"the input is the residual stream \[batch, pos, d_model=\d+\] in floating "
                                         r"point; got shape \[2, \d+\], torch.int64"):
        ours(tokens, start_at_layer=1)
    with pytest.raises(ValueError, match=r"start_at_layer must be an int in -2..2, got 3"):
        ours(resid, start_at_layer=3)


def test_tl_slice_and_its_tuple_spelling_pick_positions_as_tl_does(built):
    _, ours, bridge, _ = built("gpt2")
    tokens = ours.to_tokens(TEXTS[0])
    with torch.no_grad():
        _, cache = ours.run_with_cache(tokens)
        _, theirs = bridge.run_with_cache(tokens)
    for pos_slice in (Slice(-1), Slice((1, 4)), Slice([0, 2]), (2,), (1, 4), -1):
        mine, labels = cache.accumulated_resid(pos_slice=pos_slice, return_labels=True)
        reference, their_labels = theirs.accumulated_resid(pos_slice=pos_slice, return_labels=True)
        assert labels == their_labels and mine.shape == reference.shape, pos_slice
        scale = float(reference.abs().max())
        assert float((mine - reference).abs().max()) <= 64 * torch.finfo(torch.float32).eps * scale, pos_slice
