"""The KV cache and generation on every causal family, from its declaration alone: a cache filled step by step is
one forward pass, a cache started with use_cache=True counts positions on, `logits_to_keep`, greedy decoding and
seeded sampling token for token against transformers' generate, streaming, the position table's limit, and the
warpers. A causal family registered in scratch_models.registry.families is tested here with no edit.

Edges of `generate` (end tokens outside the vocabulary, lists of them, bad ids, padding on the wrong side) are in
test_generate_edges.py; a cache of another depth or batch in test_edges.py.
"""

import dataclasses

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from helpers import assert_parity, each_device, fused_attention, reference, save
from scratch_models.registry.families import FAMILIES
from scratch_models.decoding.generation import warp
from scratch_models.parts.kv_cache import KVCache

CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
each_causal = pytest.mark.parametrize("family", CAUSAL)
PAD = 0  # the id padding is filled with; the mask says what is padding, the id never matters
NEW = 12  # tokens generated after the prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """family -> (transformers' LM of the family's tiny config with eager attention, ours loaded from its save, the
    directory)."""
    out = {}
    for name in CAUSAL:
        theirs = reference(name)
        directory = save(theirs, tmp_path_factory.mktemp(name))
        out[name] = theirs, FAMILIES[name].lm.from_pretrained(directory), directory
    return out


@pytest.fixture
def endless(loaded, family):
    """Our model with no end token, in its config nor in its generation config (generate's defaults, from the
    checkpoint's generation_config.json): it always generates max_new_tokens."""
    model = loaded[family][1]
    config, generation = model.config, model.generation_config
    model.config = dataclasses.replace(config, eos_token_id=None)
    model.generation_config = dataclasses.replace(generation, eos_token_id=None)
    yield model
    model.config, model.generation_config = config, generation


def vocab(family: str) -> int:
    return FAMILIES[family].tiny().vocab_size


def padded_inputs(family: str, seq: int = 11, seed: int = 1) -> dict:
    """Three rows: full, left-padded (as for generation), right-padded; positions count real tokens only, as
    generate gives them. Real ids avoid the vocabulary's last id, the end of text."""
    ids = torch.randint(1, vocab(family) - 1, (3, seq), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:] = 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids.masked_fill(mask == 0, PAD), attention_mask=mask, position_ids=positions)


def left_padded_prompts(family: str, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Four prompts of lengths 7, 3, 5, 1, left-padded to 7."""
    ids = torch.randint(1, vocab(family) - 1, (4, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(4, 7, dtype=torch.long)
    for row, length in enumerate((7, 3, 5, 1)):
        mask[row, 7 - length:] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def sdpa_generate(theirs, *args, **kwargs) -> torch.Tensor:
    """transformers' generate with its default SDPA attention (fused_attention: eager with blind queries zeroed for
    a class without SDPA): our generate runs the fused path, so like is compared with like (eager and SDPA round
    differently, and greedy decoding follows any difference at a near tie)."""
    theirs.set_attn_implementation(fused_attention(type(theirs)))
    try:
        with torch.no_grad():
            return theirs.generate(*args, **kwargs)
    finally:
        theirs.set_attn_implementation("eager")


# ---------------------------------------------------------------------------------------------------- KV cache


@each_causal
@pytest.mark.parametrize("capacity", [0, 11], ids=["growing", "preallocated"])
def test_cache_step_by_step_equals_one_forward(loaded, family, capacity):
    """The prompt, then one token at a time into one cache: the logits of one forward pass at every real token, and
    each step's attention row the full pass's row (keys are cached as the family's attention made them: GPT-NeoX's
    turned by the rotary embedding at their own positions, the new token's at its own)."""
    model = loaded[family][1]
    inputs = padded_inputs(family)
    ids, mask, positions = inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"]
    cache = KVCache(len(model.layers), capacity=capacity)
    with torch.no_grad():
        full = model(**inputs, output_attentions=True)
        steps = [model(ids[:, :4], attention_mask=mask[:, :4], position_ids=positions[:, :4], past_key_values=cache,
                       output_attentions=True)]
        for t in range(4, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=positions[:, t:t + 1],
                               past_key_values=cache, output_attentions=True))
    assert cache.length == ids.shape[1] and all(step.past_key_values is cache for step in steps)
    # a padding query that sees no key spreads over all keys in one forward, over the cached ones step by step
    real = mask.bool()
    assert_parity(torch.cat([s.logits for s in steps], dim=1)[real], full.logits[real], "logits, cached")
    for i in range(len(model.layers)):
        for t, step in enumerate(steps[1:], start=4):
            assert_parity(step.attentions[i][:, :, 0], full.attentions[i][:, :, t, :t + 1], f"attentions[{i}] at {t}")


@each_causal
def test_use_cache_continues_with_default_positions(loaded, family):
    """use_cache=True starts a cache; default positions then count on from the cached tokens."""
    theirs, model, _ = loaded[family]
    ids = torch.randint(vocab(family) - 1, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = theirs(ids)
        first = model(ids[:, :6], use_cache=True)
        rest = model(ids[:, 6:], past_key_values=first.past_key_values)
    assert_parity(torch.cat([first.logits, rest.logits], dim=1), ref.logits, "logits")


@each_causal
def test_logits_to_keep_gives_the_last_positions_only(loaded, family):
    model = loaded[family][1]
    ids = torch.randint(vocab(family) - 1, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(ids).logits
        last = model(ids, logits_to_keep=1).logits
    assert last.shape == (2, 1, vocab(family))
    assert_parity(last, full[:, -1:], "last logits")  # not bitwise: a 1-row matmul may sum in another order
    with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0, got -1"):
        model(ids, logits_to_keep=-1)
    with pytest.raises(ValueError, match="labels need the logits of every position"):
        model(ids, labels=ids, logits_to_keep=1)


# -------------------------------------------------------------------------------------------------- generation


@each_device
@each_causal
def test_greedy_generation_matches_transformers_token_for_token(loaded, family, device):
    """Left-padded prompts of lengths 7, 3, 5 and 1; then with an end token that one row generates before its last
    step and another never does: the first stops and is padded, the other runs on, as in transformers."""
    theirs, model, directory = loaded[family]
    if device != "cpu":  # copies: the module's models stay on the CPU
        theirs = reference(family).to(device)
        model = FAMILIES[family].lm.from_pretrained(directory, device=device)
    ids, mask = (t.to(device) for t in left_padded_prompts(family))

    def both(**kwargs):
        expected = sdpa_generate(theirs, ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                 pad_token_id=PAD, **kwargs)
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD, **kwargs), expected

    ours, expected = both(eos_token_id=None)
    assert torch.equal(ours, expected), f"\nours   {ours}\ntheirs {expected}"
    new = ours[:, 7:]
    stopping, running, eos = next((a, b, int(t)) for a in range(len(new)) for b in range(len(new)) if a != b
                                  for t in new[a, :-1] if int(t) not in new[b].tolist())
    ours, expected = both(eos_token_id=eos)
    assert torch.equal(ours, expected), f"\nours   {ours}\ntheirs {expected}"
    stop = ours[stopping, 7:].tolist().index(eos)
    assert stop < ours.shape[1] - 8 and set(ours[stopping, 8 + stop:].tolist()) == {PAD}
    assert not (ours[running, 7:] == eos).any()


@each_causal
def test_seeded_sampling_matches_transformers_token_for_token(loaded, family):
    """do_sample with temperature, top-k and top-p from the same global seed: transformers' tokens (it draws with
    torch.multinomial from the same probabilities, and so do we when no generator is given)."""
    theirs, model, _ = loaded[family]
    ids, mask = left_padded_prompts(family)
    settings = dict(do_sample=True, temperature=1.7, top_k=9, top_p=0.95)
    torch.manual_seed(11)
    expected = sdpa_generate(theirs, ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD,
                             eos_token_id=None, **settings)
    torch.manual_seed(11)
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None, **settings)
    assert torch.equal(ours, expected), f"\nours   {ours}\ntheirs {expected}"
    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
    assert not torch.equal(ours, greedy)  # sampled indeed


@each_causal
def test_generation_streams_and_stops_at_the_position_table(endless, family):
    model = endless
    ids, mask = left_padded_prompts(family)

    class Streamer:
        def __init__(self):
            self.parts, self.ended = [], False

        def put(self, tokens):
            self.parts.append(tokens if tokens.dim() == 2 else tokens[:, None])

        def end(self):
            self.ended = True

    streamer = Streamer()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=5, streamer=streamer)
    assert out.shape == (4, 12) and streamer.ended and torch.equal(torch.cat(streamer.parts, dim=1), out)
    # the last prompt token sits at position 6; the last new token is returned but never fed, so limit - 6 fit
    field = FAMILIES[family].positions_field
    limit = getattr(model.config, field)
    assert model.generate(ids, attention_mask=mask, max_new_tokens=limit - 6).shape == (4, limit + 1)
    with pytest.raises(ValueError, match=f"reaches position {limit}; this model has {field}={limit}"):
        model.generate(ids, attention_mask=mask, max_new_tokens=limit - 5)
    with pytest.raises(ValueError, match="top_k"):
        model.generate(ids, attention_mask=mask, do_sample=True, top_k=-1)
    with pytest.raises(ValueError, match=f"eos_token_id={vocab(family)}"):
        model.generate(ids, attention_mask=mask, eos_token_id=vocab(family))


@each_causal
def test_sampling_is_seeded_and_respects_top_k(endless, family):
    model = endless
    ids, mask = left_padded_prompts(family)

    def sample(seed, **kwargs):
        return model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=True,
                              generator=torch.Generator().manual_seed(seed), **kwargs)

    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=10)
    assert torch.equal(sample(0, temperature=2.0, top_k=4), sample(0, temperature=2.0, top_k=4))
    assert not torch.equal(sample(0, temperature=2.0, top_k=4), sample(1, temperature=2.0, top_k=4))
    assert torch.equal(sample(0, top_k=1), greedy)
    assert torch.equal(sample(0, top_p=1e-9), greedy)

    # every sampled token is among the 4 best at its step: score the sampled sequences in one forward pass
    out = sample(3, temperature=2.0, top_k=4)
    full_mask = torch.cat([mask, torch.ones(4, 10, dtype=torch.long)], dim=1)
    positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
    with torch.no_grad():
        logits = model(out, attention_mask=full_mask, position_ids=positions).logits[:, 6:-1]
    ranks = (logits > logits.gather(-1, out[:, 7:, None])).sum(-1)
    assert int(ranks.max()) < 4 and int(ranks.max()) > 0  # within top-4, and not simply greedy


def test_warp_matches_transformers_warpers():
    """The warpers alone, on scores of no model."""
    scores = torch.randn(6, 101, generator=torch.Generator().manual_seed(4)) * 3
    scores[0, :10] = scores[0, 10]  # ties at the cut
    for temperature, top_k, top_p in [(0.7, 10, 0.9), (1.0, 1, None), (1.3, None, 0.5), (1.0, 101, 1e-9)]:
        expected = scores
        for warper in ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + (
                [TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p else []):
            expected = warper(None, expected)
        assert torch.equal(warp(scores, temperature, top_k, top_p), expected), (temperature, top_k, top_p)
