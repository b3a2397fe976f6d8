"""generate at its edges on every causal family, token for token against transformers' generate: an end token
outside the vocabulary (transformers' GPT2Config keeps eos_token_id=50256 whatever vocab_size is; any config may
say so), eos_token_id=None, lists of end tokens, bad ids, and prompts padded on the wrong side. A causal family
registered in scratch_models.registry.families is tested here with no edit."""

import dataclasses

import pytest
import torch

from helpers import reference, save
from scratch_models.registry.families import FAMILIES

VOCAB = 100
OUTSIDE = 50256  # an end token outside the vocabulary: GPT-2's, which transformers keeps in every small GPT2Config
WIDTH = 6  # prompt columns
NEW = 10
PAD = 0

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=[name for name, family in FAMILIES.items() if family.causal])
def models(request, tmp_path_factory):
    """transformers' LM of the family (one layer of its tiny config, a vocabulary of 100) with the end token 50256
    outside the vocabulary (the case that could not generate at all), with its default SDPA attention as our generate
    runs the fused path, and ours loaded from its save. The unembedding is untied: tied to an embedding that
    dominates one layer's stream (Gemma 2 scales it by sqrt(hidden)), greedy decoding repeats each prompt's last token
    forever, and no end token can change what a row generates. The weights are the first seed's whose free run gives
    rows 0 and 1 a token no other row generates (the end tokens the tests choose): a random one-layer model often
    settles every row on one or two shared tokens."""
    family = FAMILIES[request.param]
    changes = {"vocab_size": VOCAB, "eos_token_id": OUTSIDE, "pad_token_id": None, family.table.layers_field: 1,
               "tie_word_embeddings": False}
    for seed in range(2, 12):
        theirs = reference(request.param, attention="sdpa", seed=seed, **changes)
        model = family.lm.from_pretrained(save(theirs, tmp_path_factory.mktemp(f"{request.param}-eos-outside-vocab")))
        ids, mask = left_padded()
        new = model.generate(ids, attention_mask=mask, max_new_tokens=NEW)[:, WIDTH:]
        if all(set(new[row].tolist()) - set(new[[r for r in range(3) if r != row]].flatten().tolist())
               for row in (0, 1)):
            break
    else:
        pytest.fail(f"no seed in 2..11 gives {request.param}'s rows 0 and 1 a token of their own")
    assert (theirs.config.eos_token_id, theirs.config.pad_token_id) == (OUTSIDE, None)
    assert model.config.eos_token_id == OUTSIDE
    return theirs, model


def left_padded(lengths=(6, 3, 1), seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, VOCAB, (len(lengths), WIDTH), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(len(lengths), WIDTH, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, WIDTH - length:] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def theirs(reference, ids, mask, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return reference.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **kwargs)


def assert_same(ours: torch.Tensor, ref: torch.Tensor):
    assert torch.equal(ours, ref), f"\nours   {ours}\ntheirs {ref}"


def only_in(row: torch.Tensor, *others: torch.Tensor) -> int:
    """The first token `row` generates that none of `others` does."""
    seen = {int(t) for other in others for t in other}
    return next(int(t) for t in row if int(t) not in seen)


@pytest.fixture
def free_run(models):
    """The left-padded prompts and what greedy decoding makes of them with nothing to stop it."""
    ids, mask = left_padded()
    out = models[1].generate(ids, attention_mask=mask, max_new_tokens=NEW)
    return ids, mask, out[:, WIDTH:]


# ------------------------------------------------------------------------------------------------ end tokens


def test_eos_outside_the_vocabulary_generates_to_max_new_tokens_like_transformers(models, free_run):
    reference, model = models
    ids, mask, new = free_run
    assert new.shape == (3, NEW)  # 50256 is never generated: every row runs to max_new_tokens
    assert_same(torch.cat([ids, new], dim=1), theirs(reference, ids, mask))
    # the config's value is excused because transformers writes it into every small config; an argument is not
    with pytest.raises(ValueError, match=rf"eos_token_id={OUTSIDE} is out of range: .* vocab_size = {VOCAB}; the "
                                         r"model can never generate it \(eos_token_id=None"):
        model.generate(ids, attention_mask=mask, eos_token_id=OUTSIDE)


@pytest.fixture
def config_eos(models, free_run, monkeypatch):
    """The model with an end token in its generation config that only row 0 generates when running free."""
    reference, model = models
    ids, mask, new = free_run
    eos = only_in(new[0], new[1], new[2])
    monkeypatch.setattr(model, "generation_config", dataclasses.replace(model.generation_config, eos_token_id=eos))
    return reference, model, ids, mask, new, eos


def test_config_eos_inside_the_vocabulary_stops_and_pads_like_transformers(config_eos):
    """The neighbour: the config's end token is generated by row 0; its pad falls back to it, as transformers'."""
    reference, model, ids, mask, new, eos = config_eos
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW)
    assert_same(ours, theirs(reference, ids, mask, eos_token_id=eos))
    stop = ours[0, WIDTH:].tolist().index(eos)
    assert set(ours[0, WIDTH + stop:].tolist()) == {eos} and not torch.equal(ours[0, WIDTH:], new[0])
    with_pad = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD)
    assert_same(with_pad, theirs(reference, ids, mask, eos_token_id=eos, pad_token_id=PAD))


def test_eos_none_turns_stopping_off_like_transformers(config_eos):
    reference, model, ids, mask, new, eos = config_eos
    stopped = model.generate(ids, attention_mask=mask, max_new_tokens=NEW)
    assert not torch.equal(stopped[:, WIDTH:], new)  # the default, the config's, stops row 0
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=None)
    # transformers' generate(eos_token_id=None) also overrides its generation config's end token with none
    reference.generation_config.eos_token_id = eos
    try:
        assert_same(ours, theirs(reference, ids, mask, eos_token_id=None))
    finally:
        reference.generation_config.eos_token_id = OUTSIDE
    assert torch.equal(ours[:, WIDTH:], new)


def test_a_list_of_eos_ids_stops_each_row_at_any_of_them_like_transformers(models, free_run):
    reference, model = models
    ids, mask, new = free_run
    first, second = only_in(new[0], new[1], new[2]), only_in(new[1], new[0], new[2])
    for eos in ([first, second], (second, first)):
        ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=PAD)
        assert_same(ours, theirs(reference, ids, mask, eos_token_id=list(eos), pad_token_id=PAD))
        for row, token in ((0, first), (1, second)):  # each row stopped at its own end token, then padding
            stop = ours[row, WIDTH:].tolist().index(token)
            assert set(ours[row, WIDTH + stop + 1:].tolist()) <= {PAD}
        assert torch.equal(ours[2, WIDTH:], new[2])  # row 2 has neither
        # no pad given: the first end token fills, as in transformers
        ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos)
        assert_same(ours, theirs(reference, ids, mask, eos_token_id=list(eos)))
    one = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[first])
    assert_same(one, model.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=first))


def test_a_config_list_skips_end_tokens_outside_the_vocabulary(models, free_run, monkeypatch):
    """generation_config.eos_token_id [50256, t]: rows stop at t, and the fill is t, the first end token the model
    can write.
    (transformers fills with 50256 and then fails with an IndexError feeding it back; ours matches its output
    for the end token t alone.)"""
    reference, model = models
    ids, mask, new = free_run
    eos = only_in(new[1], new[0], new[2])
    monkeypatch.setattr(model, "generation_config", dataclasses.replace(model.generation_config,
                                                                         eos_token_id=[OUTSIDE, eos]))
    ours = model.generate(ids, attention_mask=mask, max_new_tokens=NEW)
    assert_same(ours, theirs(reference, ids, mask, eos_token_id=eos))


@pytest.mark.parametrize("kwargs, message", [
    (dict(eos_token_id="5"), r"eos_token_id='5': '5' is not a token id; give an id \(int >= 0\), a list"),
    (dict(eos_token_id=5.0), r"eos_token_id=5.0: 5.0 is not a token id"),
    (dict(eos_token_id=True), r"eos_token_id=True: True is not a token id"),
    (dict(eos_token_id=-1), r"eos_token_id=-1: -1 is not a token id"),
    (dict(eos_token_id=[5, None]), r"eos_token_id=\[5, None\]: None is not a token id"),
    (dict(eos_token_id=[]), r"eos_token_id is empty: give an id"),
    (dict(eos_token_id=[5, 100]), r"eos_token_id=100 is out of range: must be 0 <= id < vocab_size = 100"),
    (dict(eos_token_id=torch.tensor(5)), r"eos_token_id=tensor\(5\): tensor\(5\) is not a token id"),
    (dict(pad_token_id=[0]), r"pad_token_id=\[0\]: \[0\] is not a token id; give an id \(int >= 0\)$"),
    (dict(pad_token_id=False), r"pad_token_id=False: False is not a token id"),
    (dict(pad_token_id=-1), r"pad_token_id=-1: -1 is not a token id"),
    # an argument is checked even where nothing can stop (the config's end token 50256 never comes)
    (dict(pad_token_id=100), r"pad_token_id=100 is out of range: must be 0 <= id < vocab_size = 100$"),
], ids=["str", "float", "bool", "negative", "list-with-None", "empty-list", "list-out-of-range", "tensor",
        "pad-list", "pad-bool", "pad-negative", "pad-out-of-range"])
def test_bad_end_and_pad_ids_are_refused_by_name(models, kwargs, message):
    ids, mask = left_padded()
    with pytest.raises(ValueError, match=message):
        models[1].generate(ids, attention_mask=mask, max_new_tokens=NEW, **kwargs)


def test_the_configs_ids_are_checked_where_they_are_used(models, free_run, monkeypatch):
    reference, model = models
    ids, mask, new = free_run

    def generate_with(**config):
        monkeypatch.setattr(model, "generation_config", dataclasses.replace(model.generation_config, **config))
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW)

    # a pad outside the vocabulary that would fill a stopped row: refused, naming it as the config's
    with pytest.raises(ValueError, match=r"pad_token_id=100 \(the generation config's\) is out of range: .*; pass "
                                         r"pad_token_id"):
        generate_with(eos_token_id=only_in(new[0], new[1], new[2]), pad_token_id=100)
    # the same pad where no row can stop (the end token 50256 never comes): never written, so not in the way
    assert torch.equal(generate_with(eos_token_id=OUTSIDE, pad_token_id=100)[:, WIDTH:], new)
    with pytest.raises(ValueError, match=r"eos_token_id=-1 \(the generation config's\): -1 is not a token id"):
        generate_with(eos_token_id=-1)


# --------------------------------------------------------------------------------------------------- padding


def test_left_padding_and_unpadded_prompts_still_match_transformers(models, free_run):
    reference, model = models
    ids, mask, new = free_run
    assert_same(torch.cat([ids, new], dim=1), theirs(reference, ids, mask))
    for row, length in enumerate((6, 3, 1)):  # each left-padded row continues as its prompt alone does
        alone = model.generate(ids[row:row + 1, WIDTH - length:], max_new_tokens=NEW)
        assert torch.equal(alone[0, length:], new[row]), row
    full, _ = left_padded((6, 6, 6))
    ones = torch.ones_like(full)
    ours = model.generate(full, attention_mask=ones, max_new_tokens=NEW)
    assert_same(ours, theirs(reference, full, ones))
    assert torch.equal(ours, model.generate(full, max_new_tokens=NEW))


def right_padded() -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded prompts with their tokens moved to the left: padding on the right, rows 1 and 2."""
    ids, mask = left_padded()
    order = torch.argsort(mask, dim=1, descending=True, stable=True)
    return ids.gather(1, order), mask.gather(1, order)


def test_right_padding_is_refused_naming_the_row(models):
    """transformers only warns and generates after the padding; we refuse and say how to pad."""
    model = models[1]
    ids, mask = right_padded()
    assert mask[1].tolist() == [1, 1, 1, 0, 0, 0]
    with pytest.raises(ValueError, match=r'attention_mask row 1 has padding \(0\) at column 3, after a token: .* '
                                         r'pad on the left \(tokenizer.padding_side = "left"\)'):
        model.generate(ids, attention_mask=mask, max_new_tokens=NEW)
    with pytest.raises(ValueError, match=r"attention_mask row 0 has padding \(0\) at column 1"):
        model.generate(ids[2:], attention_mask=mask[2:], max_new_tokens=NEW)  # a batch of one as well


def test_a_gap_in_the_mask_is_refused_and_a_row_of_padding_too(models):
    model = models[1]
    ids, mask = left_padded()
    gap = mask.clone()
    gap[0, 2] = 0
    with pytest.raises(ValueError, match=r"attention_mask row 0 has padding \(0\) at column 2, after a token"):
        model.generate(ids, attention_mask=gap, max_new_tokens=NEW)
    empty = mask.clone()
    empty[2] = 0
    with pytest.raises(ValueError, match=r"attention_mask row 2 is all padding \(0\): it has no token"):
        model.generate(ids, attention_mask=empty, max_new_tokens=NEW)
    # bool masks are read the same way
    with pytest.raises(ValueError, match=r"attention_mask row 0 has padding \(0\) at column 2"):
        model.generate(ids, attention_mask=gap.bool(), max_new_tokens=NEW)
