"""`inputs_embeds` in place of input_ids, in every class of every family, as transformers takes it: exactly one of
the two; positions, token types and masks derived as from input_ids; the embeddings' hook points fire from the token
embedding on (`embeddings.word` holds inputs_embeds); the KV cache extends across the two; gradients reach the
embeddings (soft prompts); a sequence classifier reads the last position, as transformers does when it cannot see
padding tokens.
"""

import dataclasses

import pytest
import torch

from helpers import assert_parity, each_family, padded_batch, reference, save
from scratch_models.registry.families import FAMILIES

# a padding id every family's tiny vocabulary has, so sequence classifiers take batches
PAD = 0


def classes(family: str) -> list[str]:
    return [cls.__name__ for cls in FAMILIES[family].classes]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> class name -> (directory, transformers' model with SDPA attention, which gives a query that sees no
    key what ours gives: 0)."""
    out = {}
    for family in FAMILIES:
        out[family] = {}
        for name in classes(family):
            try:
                theirs = reference(family, name, attention="sdpa", pad_token_id=PAD)
            except (ValueError, AttributeError):  # a class this tiny config cannot build
                continue
            out[family][name] = save(theirs, tmp_path_factory.mktemp(name)), theirs
    return out


def batch(family: str, multiple_choice: bool) -> dict:
    """Three rows, full, left-padded and right-padded (as [1, 3, s] choices for a multiple-choice class); no row
    of padding alone, whose output means nothing."""
    inputs = {k: v[:3] for k, v in padded_batch(family, seq=7).items()}
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["input_ids"] == PAD, 1)  # padding only where masked
    return {k: v[None] for k, v in inputs.items()} if multiple_choice else inputs


def tensors(out) -> dict[str, torch.Tensor]:
    return {k: out[k] for k in out.keys() if isinstance(out[k], torch.Tensor)}


CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
# (family, class) of every class that reads each row at its last token that is not padding
LAST_TOKEN_READERS = [(name, cls.__name__) for name, family in FAMILIES.items() for cls in family.classes
                      if cls.reads_last_token]


@each_family
def test_every_class_computes_what_transformers_computes_from_inputs_embeds(saved, family):
    """Random embeddings (not rows of the table) into every class, against transformers' class of the same name on
    the same embeddings; hidden states and every output field."""
    declared = FAMILIES[family]
    for name, (directory, theirs) in saved[family].items():
        ours = next(cls for cls in declared.classes if cls.__name__ == name).from_pretrained(directory)
        inputs = batch(family, ours.multiple_choice)
        ids = inputs.pop("input_ids")
        embeds = torch.randn(*ids.shape, ours.get_input_embeddings().weight.shape[1],
                             generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            try:
                ref = theirs(**inputs, inputs_embeds=embeds, output_hidden_states=True)
            except RuntimeError:  # transformers' class fails on them (GPT2DoubleHeadsModel on [b, c, s, h]): against
                embeds = ours.get_input_embeddings()(ids)  # its run on the ids these embeddings look up
                ref = theirs(**inputs, input_ids=ids, output_hidden_states=True)
            out = ours(inputs_embeds=embeds, **inputs, output_hidden_states=True)
        fields = tensors(out)
        assert fields and set(fields) <= set(tensors(ref)), name
        for field, value in fields.items():
            assert_parity(value, ref[field], f"{name}: {field}")
        for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states, strict=True)):
            assert_parity(a, b, f"{name}: hidden_states[{i}]")


@each_family
def test_inputs_embeds_of_the_table_give_what_input_ids_give_with_hooks_firing_from_the_embeddings_on(saved, family):
    """The token embeddings of input_ids, given as inputs_embeds: every hook point from `embeddings.word` on holds
    what it holds for input_ids, `embeddings.word` is inputs_embeds itself, and a hook there edits the run."""
    declared = FAMILIES[family]
    directory, _ = saved[family][declared.lm.__name__]
    model = declared.lm.from_pretrained(directory)
    inputs = batch(family, False)
    ids = inputs.pop("input_ids")
    embeds = model.get_input_embeddings()(ids).detach()
    _, by_ids = model.run_with_cache(ids, **inputs)
    out, cache = model.run_with_cache(inputs_embeds=embeds, **inputs)
    assert list(cache) == list(by_ids)
    for name in cache:
        assert torch.equal(cache[name], by_ids[name]), name
    assert torch.equal(cache["embeddings.word"], embeds)
    doubled = model.run_with_hooks(inputs_embeds=embeds, **inputs, hooks=[("embeddings.word", lambda t, _: 2 * t)])
    assert torch.equal(doubled.logits, model(inputs_embeds=2 * embeds, **inputs).logits)
    assert not torch.equal(doubled.logits, out.logits)
    if declared.transformer_lens is not None:  # TL's names show one row per sequence, as for ids

        def shapes(**tokens) -> dict:
            seen = {}
            model.run_with_hooks(**tokens, **inputs, fwd_hooks=[
                (lambda name: True, lambda t, hook: seen.setdefault(hook.name, tuple(t.shape)) and None)])
            return seen

        assert shapes(inputs_embeds=embeds) == shapes(input_ids=ids)


@each_family
def test_soft_prompt_gradients_reach_inputs_embeds_as_in_transformers(saved, family):
    """A trainable prompt of embeddings before the tokens' own: the gradient of the loss with respect to it, against
    transformers'; labels scored as from input_ids."""
    declared = FAMILIES[family]
    directory, theirs = saved[family][declared.lm.__name__]
    model = declared.lm.from_pretrained(directory)
    ids = batch(family, False)["input_ids"][:1]
    prompt = torch.randn(1, 3, model.get_input_embeddings().weight.shape[1], generator=torch.Generator().manual_seed(5))
    labels = torch.cat([torch.full((1, 3), -100), ids], dim=1)
    grads, losses = [], []
    for m in (model, theirs):
        soft = prompt.clone().requires_grad_()
        embeds = torch.cat([soft, m.get_input_embeddings()(ids)], dim=1)
        loss = m(inputs_embeds=embeds, labels=labels).loss
        loss.backward()
        grads.append(soft.grad)
        losses.append(loss.detach())
    assert_parity(losses[0], losses[1], "loss")
    assert_parity(grads[0], grads[1], "gradient of the loss with respect to the soft prompt")
    assert grads[0].abs().sum() > 0


@pytest.mark.parametrize("family", CAUSAL)
def test_a_kv_cache_started_from_inputs_embeds_continues_with_input_ids(saved, family):
    """The prompt as embeddings into a cache, then the next tokens as ids: the logits transformers gives the whole
    sequence at once (positions continue after the cached ones)."""
    declared = FAMILIES[family]
    directory, theirs = saved[family][declared.lm.__name__]
    model = declared.lm.from_pretrained(directory)
    ids = batch(family, False)["input_ids"][:1]
    embeds = model.get_input_embeddings()(ids).detach()
    with torch.no_grad():
        first = model(inputs_embeds=embeds[:, :4], use_cache=True)
        rest = model(ids[:, 4:], past_key_values=first.past_key_values)
        whole = theirs(inputs_embeds=embeds)
    assert first.past_key_values.length == 7
    assert_parity(torch.cat([first.logits, rest.logits], dim=1), whole.logits, "logits")


@pytest.mark.parametrize("family, class_name", LAST_TOKEN_READERS)
def test_a_sequence_classifier_reads_the_last_position_of_inputs_embeds(saved, family, class_name):
    """transformers cannot tell padding apart in embeddings: it reads every row at its last position, and so do we,
    warning where the attention_mask shows that position is padding; without a pad_token_id, one row at a time, as
    transformers."""
    directory, theirs = saved[family][class_name]
    ours = next(cls for cls in FAMILIES[family].classes if cls.__name__ == class_name).from_pretrained(directory)
    inputs = batch(family, False)  # its third row is padded on the right
    embeds = ours.get_input_embeddings()(inputs.pop("input_ids")).detach()
    with torch.no_grad():
        with pytest.warns(UserWarning, match=r"last position[\s\S]*marks row 2 as padding"):
            out = ours(inputs_embeds=embeds, **inputs)
        ref = theirs(inputs_embeds=embeds, **inputs)
        alone = ours(inputs_embeds=embeds[2:, :4])  # the padded row without its padding
    assert_parity(out.logits, ref.logits, "logits")
    assert not torch.allclose(out.logits[2], alone.logits[0])  # read at padding, as transformers reads it
    ours.config = dataclasses.replace(ours.config, pad_token_id=None)
    with pytest.raises(ValueError, match="pad_token_id is not set"):
        ours(inputs_embeds=embeds)
    assert ours(inputs_embeds=embeds[:1]).logits.shape == (1, ours.config.num_labels)


@each_family
def test_exactly_one_of_input_ids_and_inputs_embeds_and_bad_embeddings_are_refused_by_name(saved, family):
    declared = FAMILIES[family]
    for cls in (declared.base, declared.lm):
        model = cls.from_pretrained(saved[family][cls.__name__][0])
        hidden = model.get_input_embeddings().weight.shape[1]
        ids = torch.ones(1, 3, dtype=torch.long)
        with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
            model(ids, inputs_embeds=torch.zeros(1, 3, hidden))
        with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
            model()
        for bad, message in ((torch.zeros(1, 3, hidden + 1), rf"\[batch, seq, {hidden}\]"),
                             (torch.zeros(3, hidden), rf"\[batch, seq, {hidden}\]"),
                             (torch.zeros(1, 0, hidden), "empty"),
                             (torch.zeros(1, 3, hidden, dtype=torch.long), "floating point"),
                             (torch.zeros(1, 3, hidden, dtype=torch.float64), "float32")):
            with pytest.raises(ValueError, match=rf"inputs_embeds[\s\S]*{message}"):
                model(inputs_embeds=bad)
