"""The floor every family stands on (scratch_models/parts/), each part against transformers' own function for it:
the norms, the rotary embedding and its scalings, grouped-query attention on both paths, sliding windows and
soft-capping, the gated MLP. Bitwise where transformers computes the same operations in the same order."""

from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers import modeling_rope_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.llama import modeling_llama

from helpers import assert_parity
from scratch_models.parts.config import ConfigError
from scratch_models.parts.hook_point import HookPoint
from scratch_models.parts.attention import Mask, attend, causal_mask, repeat_kv
from scratch_models.parts.mlp import GatedMLP
from scratch_models.parts.norms import GemmaRMSNorm, LayerNorm, RMSNorm
from scratch_models.parts.rotary import RotaryEmbedding, inverse_frequencies, rope_fields, rotate

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ------------------------------------------------------------------------------------------------------------ norms


def norm_pairs(h=48):
    """(ours, transformers') with the same random weights."""
    weight, bias = randn(h, seed=1), randn(h, seed=2)
    pairs = []
    for ours, theirs in ((LayerNorm(h, eps=1e-5), torch.nn.LayerNorm(h, eps=1e-5)),
                         (RMSNorm(h, eps=1e-6), modeling_llama.LlamaRMSNorm(h, eps=1e-6)),
                         (GemmaRMSNorm(h, eps=1e-6), modeling_gemma2.Gemma2RMSNorm(h, eps=1e-6))):
        with torch.no_grad():
            for module in (ours, theirs):
                module.weight.copy_(weight)
                if getattr(module, "bias", None) is not None:
                    module.bias.copy_(bias)
        pairs.append((ours, theirs))
    return pairs


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_norm_is_transformers_bitwise_forwards_and_backwards(dtype):
    for ours, theirs in norm_pairs():
        ours, theirs = ours.to(dtype), theirs.to(dtype)
        x = (3 * randn(2, 5, 48, seed=3)).to(dtype).requires_grad_()
        y = x.detach().clone().requires_grad_()
        out, ref = ours(x), theirs(y)
        assert out.dtype == ref.dtype == dtype and torch.equal(out, ref), type(ours).__name__
        grad = randn(2, 5, 48, seed=4, dtype=dtype)
        out.backward(grad)
        ref.backward(grad)
        assert torch.equal(x.grad, y.grad) and torch.equal(ours.weight.grad, theirs.weight.grad), type(ours).__name__


def test_each_norm_declares_how_it_normalises_and_its_frozen_map_is_the_norm_of_the_sum():
    """The parts of a stream through `frozen` with the stream's divisor sum to the norm of the stream less its
    bias; a LayerNorm centres (a constant vector is nothing to it), an RMSNorm does not."""
    for norm, _ in norm_pairs():
        parts = randn(4, 3, 7, 48, seed=5)
        stream = parts.sum(0)
        with torch.no_grad():
            frozen = norm.frozen(parts, norm.divisor(stream)).sum(0)
            expected = norm(stream) - (norm.bias if norm.bias is not None else 0)
        assert_parity(frozen, expected, type(norm).__name__, terms=48)  # a norm over 48, of 4 parts
        constant = torch.ones(1, 48)
        moved = norm.frozen(constant, torch.ones(1, 1))
        assert bool((moved == 0).all()) == norm.centres, type(norm).__name__


def test_a_listened_norm_runs_through_its_scale_and_normalized_points_and_an_edit_reaches_the_output():
    for norm, _ in norm_pairs():
        x = randn(2, 5, 48, seed=6)
        seen = {}

        def keep(name):
            def fn(t):
                seen[name] = t
                return t
            return fn

        with torch.no_grad():
            fused = norm(x)
            norm.scale.listen(keep("scale"))
            norm.normalized.listen(keep("normalized"))
            explicit = norm(x)
            norm.normalized.listen(None)
            norm.scale.listen(lambda t: 2 * t)
            halved = norm(x)
            norm.scale.listen(None)
        assert_parity(explicit, fused, type(norm).__name__, terms=48)
        assert seen["scale"].shape == (2, 5, 1) and torch.equal(seen["scale"], norm.divisor(x))
        assert torch.equal(seen["normalized"], norm.normalize(x))
        bias = norm.bias if norm.bias is not None else 0
        assert_parity(halved - bias, (fused - bias) / 2, type(norm).__name__, terms=48)


# ------------------------------------------------------------------------------------------------------- rotary


def llama_config(rope_scaling=None, **changes):
    fields = dict(vocab_size=37, hidden_size=48, num_hidden_layers=1, num_attention_heads=3, intermediate_size=37,
                  max_position_embeddings=24, rope_theta=10000.0) | changes
    if rope_scaling is not None:
        fields["rope_scaling"] = dict(rope_scaling)
    return transformers.LlamaConfig(**fields)


SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
}


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_inverse_frequencies_are_transformers_rope_initialisers_bitwise(kind):
    config = llama_config(SCALINGS[kind], rope_theta=500000.0)
    scaling = rope_fields(config.to_dict(), "config")["rope_scaling"]
    ours = inverse_frequencies(16, 500000.0, scaling, 24)
    if kind == "default":
        theirs, _ = modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        theirs, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS[kind](config, None)
    assert torch.equal(ours, theirs)
    if kind == "dynamic":  # grown past the trained length: theta in float32 tensor arithmetic, as there
        for length in (25, 40, 97):
            theirs, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=torch.tensor(length))
            assert torch.equal(inverse_frequencies(16, 500000.0, scaling, 24, torch.tensor(length)), theirs)


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_rotary_angles_are_transformers_bitwise_in_three_dtypes_call_after_call(kind):
    """The same calls to ours and to transformers' LlamaRotaryEmbedding give the same angles, the dynamic type's
    growth past the trained length (24) and its reset included."""
    config = llama_config(SCALINGS[kind])
    theirs = modeling_llama.LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(16, 10000.0, 24, rope_fields(config.to_dict(), "config")["rope_scaling"])
    calls = [torch.tensor([[0, 1, 2, 23], [5, 0, 17, 20]]), torch.arange(40)[None], torch.arange(30)[None],
             torch.arange(50)[None], torch.arange(7)[None], torch.arange(33)[None]]
    for positions in calls:
        for dtype in DTYPES:
            x = torch.zeros(1, dtype=dtype)
            their_cos, their_sin = theirs(x, positions)
            cos, sin = ours(positions, dtype)
            assert torch.equal(cos, their_cos) and torch.equal(sin, their_sin), (positions.shape, dtype)


def test_rotation_is_transformers_on_a_full_and_on_a_partial_head():
    """rotate: Llama's apply_rotary_pos_emb on every dimension of a head, GPT-NeoX's on its first r."""
    from transformers.models.gpt_neox import modeling_gpt_neox

    q, k = randn(2, 3, 9, 16, seed=7), randn(2, 3, 9, 16, seed=8)
    positions = torch.arange(9)[None].expand(2, 9)
    for r, apply in ((16, modeling_llama.apply_rotary_pos_emb), (8, modeling_gpt_neox.apply_rotary_pos_emb)):
        cos, sin = RotaryEmbedding(r, 10000.0, 24)(positions, torch.float32)
        their_q, their_k = apply(q, k, cos, sin)
        assert torch.equal(rotate(q, cos, sin), their_q) and torch.equal(rotate(k, cos, sin), their_k), r
        assert torch.equal(rotate(q, cos, sin)[..., r:], q[..., r:])


def test_rotation_keeps_lengths_and_scores_depend_on_relative_positions_only():
    q, k = randn(2, 3, 1, 16, seed=9, dtype=torch.float64).unbind(0)
    cos, sin = RotaryEmbedding(8, 10000.0, 24)(torch.arange(9)[None], torch.float64)
    turned_q, turned_k = rotate(q.expand(1, 3, 9, 16), cos, sin), rotate(k.expand(1, 3, 9, 16), cos, sin)
    pair = turned_q[..., :4].pow(2) + turned_q[..., 4:8].pow(2)
    assert torch.allclose(pair, (q[..., :4].pow(2) + q[..., 4:8].pow(2)).expand_as(pair))
    scores = turned_q @ turned_k.transpose(-1, -2)
    for shift in (1, 3):
        assert torch.allclose(scores[..., shift:, shift:], scores[..., :-shift, :-shift])


def test_rope_fields_read_both_spellings_and_refuse_other_types_by_name():
    old = {"rope_theta": 500000, "rope_scaling": {"type": "linear", "factor": 4}, "max_position_embeddings": 64}
    new = {"rope_parameters": {"rope_type": "linear", "rope_theta": 500000, "factor": 4}, "max_position_embeddings": 64}
    assert rope_fields(old, "c")["rope_scaling"] == rope_fields(new, "c")["rope_scaling"] == {"rope_type": "linear",
                                                                                              "factor": 4}
    assert rope_fields(new, "c")["rope_theta"] == 500000
    assert rope_fields({"rope_parameters": {"rope_type": "default", "rope_theta": 7.0}}, "c") == {
        "rope_theta": 7.0, "rope_scaling": None}
    llama3 = rope_fields({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                                           "high_freq_factor": 4}, "max_position_embeddings": 64}, "c")
    assert llama3["rope_scaling"]["original_max_position_embeddings"] == 64  # transformers' default
    for kind in ("proportional", "su"):
        with pytest.raises(ConfigError, match=f"c: rope type '{kind}' is not supported; .*default, linear, dynamic"):
            rope_fields({"rope_scaling": {"rope_type": kind, "factor": 2}}, "c")
    with pytest.raises(ConfigError, match="'linear' needs 'factor'"):
        rope_fields({"rope_scaling": {"rope_type": "linear"}}, "c")


# ------------------------------------------------------------------------------------------- attention, grouped


def points():
    return HookPoint("b, n, s, k", "scores"), HookPoint("b, n, s, k", "probs")


def padded_keep(batch=3, seq=7, past=0, window=None):
    mask = torch.ones(batch, past + seq, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, past + seq - 2:] = 0  # right padding
    return mask, causal_mask(mask, seq, past, torch.device("cpu"), window)


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_attention_is_transformers_eager_and_sdpa_bitwise(groups, dtype):
    """Against transformers' eager attention (explicit path) and SDPA attention (fused path), given the same grouped
    q, k and v: padded causal masks, a fresh unpadded sequence, and one new token after a cache (SDPA's packed
    path)."""
    kv_heads, d = 2, 16
    module = SimpleNamespace(num_key_value_groups=groups, training=False, head_dim=d, is_causal=True)
    for seq, past, padded in ((7, 0, True), (7, 0, False), (1, 6, True)):
        q = randn(3, kv_heads * groups, seq, d, seed=10, dtype=dtype)
        k, v = randn(3, kv_heads, past + seq, d, seed=11, dtype=dtype), randn(3, kv_heads, past + seq, d, seed=12,
                                                                              dtype=dtype)
        attention_mask, mask = padded_keep(3, seq, past) if padded else (None, None)
        causal = not padded
        explicit, probs = attend(q, k, v, mask, scale=d ** -0.5, dropout_p=0.0, scores=points()[0],
                                 probs=points()[1], explicit=True, causal=causal, upcast_softmax=True)
        fused, _ = attend(q, k, v, mask, scale=d ** -0.5, dropout_p=0.0, scores=points()[0], probs=points()[1],
                          explicit=False, causal=causal)
        keep = mask.keep if mask is not None else causal_mask(None, seq, past, torch.device("cpu")).keep
        additive = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
        eager, their_probs = modeling_llama.eager_attention_forward(module, q, k, v, additive, scaling=d ** -0.5)
        sdpa, _ = sdpa_attention_forward(module, q, k, v, None if causal else keep, scaling=d ** -0.5)
        seen = ~mask.blind[:, 0, :, 0] if mask is not None else torch.ones(3, seq, dtype=torch.bool)
        assert torch.equal(explicit.transpose(1, 2)[seen], eager[seen]), (seq, past, padded)
        assert torch.equal(probs.transpose(1, 2)[seen], their_probs.transpose(1, 2)[seen])
        assert torch.equal(fused.transpose(1, 2)[seen], sdpa[seen]), (seq, past, padded)
        assert bool((fused.transpose(1, 2)[~seen] == 0).all())


def test_each_group_of_query_heads_reads_its_own_key_value_head():
    """Query head h reads key/value head h // groups: zeroing the values of head 1 zeroes the context of query
    heads 3, 4 and 5 only."""
    q, k, v = randn(1, 6, 5, 8, seed=13), randn(1, 2, 5, 8, seed=14), randn(1, 2, 5, 8, seed=15)
    v[:, 1] = 0
    for explicit in (True, False):
        context, _ = attend(q, k, v, None, scale=8 ** -0.5, dropout_p=0.0, scores=points()[0], probs=points()[1],
                            explicit=explicit, causal=True)
        assert bool((context[:, 3:] == 0).all()) and bool((context[:, :3] != 0).any())
    assert torch.equal(repeat_kv(k, 3), k.repeat_interleave(3, dim=1))
    with pytest.raises(ValueError, match="4 query heads cannot share 3 key/value heads"):
        attend(q[:, :4], randn(1, 3, 5, 8), randn(1, 3, 5, 8), None, scale=1.0, dropout_p=0.0,
               scores=points()[0], probs=points()[1], explicit=True)


def test_a_sliding_window_is_transformers_mask():
    """Query at position p sees key j when j <= p and j > p - window, positions counting padding, after a cache
    too: transformers' sliding_window_causal_mask_function."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    rule = sliding_window_causal_mask_function(3)
    for seq, past in ((7, 0), (2, 5), (1, 6)):
        attention_mask, mask = padded_keep(3, seq, past, window=3)
        queries, keys = torch.arange(past, past + seq)[:, None], torch.arange(past + seq)[None, :]
        theirs = rule(torch.tensor(0), torch.tensor(0), queries, keys)
        expected = theirs[None, None] & attention_mask[:, None, None, :].bool()
        assert torch.equal(mask.keep.expand_as(expected), expected), (seq, past)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_soft_capped_scores_are_gemma2_eager_attention_bitwise(dtype):
    module = SimpleNamespace(num_key_value_groups=2, training=False, head_dim=16)
    q, k, v = (randn(2, 4, 6, 16, seed=16, dtype=dtype) * 4, randn(2, 2, 6, 16, seed=17, dtype=dtype) * 4,
               randn(2, 2, 6, 16, seed=18, dtype=dtype))
    mask = causal_mask(None, 6, 0, torch.device("cpu"), 4)
    additive = torch.zeros(mask.keep.shape, dtype=dtype).masked_fill(~mask.keep, torch.finfo(dtype).min)
    ours, probs = attend(q, k, v, mask, scale=0.25, dropout_p=0.0, scores=points()[0], probs=points()[1],
                         explicit=False, upcast_softmax=True, softcap=5.0)  # a softcap takes the explicit path
    theirs, their_probs = modeling_gemma2.eager_attention_forward(module, q, k, v, additive, scaling=0.25,
                                                                  softcap=5.0)
    assert probs is not None and torch.equal(ours.transpose(1, 2), theirs) and torch.equal(probs, their_probs)


def test_mask_blind_rows_are_marked():
    mask = Mask.from_keep(torch.tensor([[[[True, False], [False, False]]]]))
    assert mask.blind.flatten().tolist() == [False, True] and bool(mask.kernel[0, 0, 1].all())


# -------------------------------------------------------------------------------------------------- gated MLP


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_gated_mlp_is_transformers_bitwise(act, dtype):
    config = llama_config(hidden_act=act, mlp_bias=True)
    theirs = modeling_llama.LlamaMLP(config)
    ours = GatedMLP(48, 37, act, bias=True)
    ours.load_state_dict(theirs.state_dict())
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = randn(2, 5, 48, seed=19, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))


# ---------------------------------------------------------------------------------------------- capped logits


def test_a_declared_logit_cap_caps_the_lm_heads_scores_as_gemma2_does():
    """CausalLM.logit_cap_field: the LM head's scores (hook point `uncapped_logits`, before `logits` in forward
    order) become cap · tanh(scores / cap) in Gemma2ForCausalLM's operations, bitwise in three dtypes; the loss and
    generate read the capped logits; a null cap leaves the scores as they are. (Shown on a GPT-NeoX given a cap
    field, so the floor is tested apart from the family that needs it.)"""
    import dataclasses

    from scratch_models import GPTNeoXConfig, GPTNeoXForCausalLM
    from scratch_models.registry.families import FAMILIES

    @dataclasses.dataclass(frozen=True)
    class CappedConfig(GPTNeoXConfig):
        final_logit_softcapping: float | None = 2.0

    class Capped(GPTNeoXForCausalLM):
        logit_cap_field = "final_logit_softcapping"

    fields = FAMILIES["gpt_neox"].tiny_config
    ids = torch.randint(36, (2, 7), generator=torch.Generator().manual_seed(0))
    for dtype in DTYPES:
        torch.manual_seed(0)
        model = Capped(CappedConfig(**fields)).eval().to(dtype)
        names = model.hook_names()
        assert names.index("uncapped_logits") == names.index("logits") - 1
        with torch.no_grad():
            out, cache = model.run_with_cache(ids, labels=ids, names=["uncapped_logits", "logits"])
        scores = cache["uncapped_logits"]
        cap = 2.0
        assert torch.equal(out.logits, torch.tanh(scores / cap) * cap) and out.logits.abs().max() < cap
        assert torch.equal(out.logits, cache["logits"]) and not torch.equal(scores, out.logits)
        expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        assert torch.equal(out.loss, expected)
        assert torch.equal(model.generate(ids[:1], max_new_tokens=1, eos_token_id=None)[0, -1],
                           out.logits[0, -1].float().argmax())
    uncapped = Capped(CappedConfig(**fields, final_logit_softcapping=None)).eval()
    with torch.no_grad():
        _, cache = uncapped.run_with_cache(ids, names=["uncapped_logits", "logits"])
    assert torch.equal(cache["uncapped_logits"], cache["logits"])


@pytest.mark.parametrize("norm", [RMSNorm, GemmaRMSNorm])
def test_norms_and_upcast_softmax_keep_float64(norm):
    """"In float32" is at least float32: a float64 model's RMS norms and upcast softmax stay in float64 (a float32
    round trip made gradients disagree with finite differences by 1e-2 relative in attribution patching)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    layer = norm(8).double()
    with torch.no_grad():
        layer.weight.normal_(generator=g)
    gain = layer.weight + (1 if norm is GemmaRMSNorm else 0)
    exact = x / (x.pow(2).mean(-1, keepdim=True) + layer.eps).sqrt() * gain
    with torch.no_grad():
        assert (layer(x) - exact).abs().max() < 1e-13
        assert (layer.affine(layer.normalize(x), x.dtype) - exact).abs().max() < 1e-13  # the path hooks take
        assert (layer.frozen(x, layer.divisor(x)) - exact).abs().max() < 1e-13
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    _, probs = attend(q, k, v, None, scale=8 ** -0.5, dropout_p=0.0, scores=points()[0], probs=points()[1],
                      explicit=True, upcast_softmax=True)
    exact = torch.softmax(q @ k.transpose(-1, -2) * 8 ** -0.5, dim=-1)
    assert (probs - exact).abs().max() < 1e-13
