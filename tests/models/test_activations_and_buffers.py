"""Issue 34 item 3, false refusals at loading: activations transformers runs for the Llama-like families (relu2,
mish, ...), and a Gemma 2 file holding the rotary inv_freq buffers that the Llama-like families already skip."""

import pytest
import torch
from transformers.activations import ACT2FN

from helpers import assert_parity, reference, save, write_weights
from scratch_models.registry.families import FAMILIES
from scratch_models.parts.activations import ACTIVATIONS


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_activation_is_transformers_act2fn_bitwise(name, dtype):
    x = torch.linspace(-12, 12, 2001, dtype=dtype)
    assert torch.equal(ACTIVATIONS[name](x), ACT2FN[name](x)), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("act", ["relu2", "mish"])
def test_llama_like_models_with_relu2_or_mish_match_transformers(tmp_path, family, act):
    theirs = reference(family, hidden_act=act)
    save(theirs, tmp_path)
    ours = FAMILIES[family].lm.from_pretrained(tmp_path)
    ids = torch.randint(36, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_parity(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, f"{family} {act}: logits")


def test_a_gemma2_file_with_rotary_buffers_loads_skipping_them(tmp_path):
    """As transformers 4.4x conversions saved them (the Llama 2 .bin files do, and Llama loads those)."""
    theirs = reference("gemma2")
    state = dict(theirs.state_dict())
    layers = FAMILIES["gemma2"].tiny().num_hidden_layers
    head_dim = FAMILIES["gemma2"].tiny().head_dim
    buffers = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.ones(head_dim // 2) for i in range(layers)}
    buffers["model.rotary_emb.inv_freq"] = torch.ones(head_dim // 2)
    del state["lm_head.weight"]  # tied, as in the hub files
    theirs.config.save_pretrained(tmp_path)
    write_weights(state | buffers, tmp_path, "bin")
    ours = FAMILIES["gemma2"].lm.from_pretrained(tmp_path)
    assert set(buffers) <= set(ours.loading_info.ignored)
    ids = torch.randint(36, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_parity(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, "gemma2 logits")
