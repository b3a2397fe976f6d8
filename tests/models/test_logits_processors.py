"""generate's logits processors (repetition_penalty, no_repeat_ngram_size, min_new_tokens / min_length) and warpers
(min_p, typical_p) against transformers': each function bitwise against transformers' processor on the same
scores, and generate token for token, greedy and seeded sampling, from a generation_config.json that sets them
(Qwen2.5-Instruct's real one, which generate used to refuse for its repetition_penalty of 1.05)."""

import json

import pytest
import torch
import transformers
from transformers.generation import logits_process

from helpers import each_family, reference, save
from scratch_models.registry.families import FAMILIES
from scratch_models.decoding.generation import penalize, warp

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 37  # every family's tiny config
CAUSAL = [name for name, family in FAMILIES.items() if family.causal]
# Qwen2.5-7B-Instruct's generation_config.json, its end and pad tokens moved inside the tiny vocabulary
QWEN25_INSTRUCT = {"bos_token_id": 35, "pad_token_id": 35, "do_sample": True, "eos_token_id": [36, 35],
                   "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                   "transformers_version": "4.37.0"}


def scores_and_tokens(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, VOCAB, generator=g) * 3
    tokens = torch.randint(VOCAB, (3, 14), generator=g)
    tokens[1, -4:] = tokens[1, 2:6]  # a repeated 4-gram, so every n-gram size up to 5 bans something
    return scores, tokens


@pytest.mark.parametrize("penalty", [1.05, 1.7, 0.6])
def test_repetition_penalty_is_transformers_bitwise_with_left_padding_ignored(penalty):
    scores, tokens = scores_and_tokens()
    padding = torch.tensor([0, 3, 13])
    theirs = logits_process.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=padding)
    ours = penalize(scores, tokens, padding, None, repetition_penalty=penalty)
    assert torch.equal(ours, theirs(tokens, scores.clone()))
    assert not torch.equal(ours, scores)
    # a token only in a row's padding keeps its score
    only_padding = set(tokens[2, :13].tolist()) - {int(tokens[2, 13])}
    assert all(ours[2, t] == scores[2, t] for t in only_padding)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 20])
def test_no_repeat_ngram_is_transformers_bitwise(n):
    scores, tokens = scores_and_tokens(1)
    theirs = logits_process.NoRepeatNGramLogitsProcessor(n)(tokens, scores.clone())
    ours = penalize(scores, tokens, torch.zeros(3, dtype=torch.long), None, no_repeat_ngram_size=n)
    assert torch.equal(ours, theirs)
    if n <= 5:
        assert bool(ours.isinf().any())


def test_min_length_holds_back_every_end_token_until_reached():
    scores, tokens = scores_and_tokens(2)
    eos = torch.tensor([4, 9])
    for min_length in (14, 15):
        theirs = logits_process.MinLengthLogitsProcessor(min_length, eos)(tokens, scores.clone())
        ours = penalize(scores, tokens, torch.zeros(3, dtype=torch.long), eos, min_length=min_length)
        assert torch.equal(ours, theirs)
    assert bool(ours[:, [4, 9]].isinf().all()) and not bool(ours[:, :4].isinf().any())


@pytest.mark.parametrize("min_p, typical_p", [(0.05, 1.0), (0.3, 1.0), (None, 0.5), (None, 0.95), (0.1, 0.7)])
def test_min_p_and_typical_p_are_transformers_warpers_bitwise(min_p, typical_p):
    scores, tokens = scores_and_tokens(3)
    theirs = logits_process.TopKLogitsWarper(20)(tokens, scores / 0.7)
    if min_p is not None:
        theirs = logits_process.MinPLogitsWarper(min_p)(tokens, theirs)
    if typical_p < 1.0:
        theirs = logits_process.TypicalLogitsWarper(typical_p)(tokens, theirs)
    ours = warp(scores, 0.7, 20, None, min_p, typical_p)
    assert torch.equal(ours, theirs)
    assert ours.isinf().sum() > warp(scores, 0.7, 20).isinf().sum()  # each removed tokens top-k kept


def write(family: str, directory, generation: dict, seed: int = 0):
    save(reference(family, seed=seed), directory)
    (directory / "generation_config.json").write_text(json.dumps(generation))
    lm = FAMILIES[family].lm
    theirs = getattr(transformers, lm.__name__).from_pretrained(directory, attn_implementation="eager").eval()
    return lm.from_pretrained(directory), theirs


PROMPT = torch.tensor([[3, 7, 1, 9, 4, 4, 7], [0, 0, 2, 2, 5, 8, 6]])
MASK = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])


def run(model, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(PROMPT, attention_mask=MASK, **kwargs)


@pytest.mark.parametrize("family", CAUSAL)
def test_qwen25_instruct_generation_config_samples_as_transformers_does(family, tmp_path):
    """The file's repetition penalty with its temperature, top-k and top-p; the same seed draws the same tokens,
    left-padded row included. Greedy with the file's penalty too, and the penalty changes what greedy picks."""
    ours, theirs = write(family, tmp_path, QWEN25_INSTRUCT)
    assert ours.generation_config.repetition_penalty == 1.05 and not ours.generation_config.unsupported
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        mine = run(ours, max_new_tokens=12)
        torch.manual_seed(seed)
        assert torch.equal(mine, run(theirs, max_new_tokens=12)), seed
    greedy = dict(do_sample=False, max_new_tokens=16, repetition_penalty=3.0)
    mine = run(ours, **greedy)
    assert torch.equal(mine, run(theirs, **greedy))
    assert not torch.equal(mine, run(ours, **greedy | {"repetition_penalty": 1.0}))


SETTINGS = {
    "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
    "min_new_tokens": dict(min_new_tokens=10),
    "min_length": dict(min_length=15),
    "everything greedy": dict(repetition_penalty=1.3, no_repeat_ngram_size=3, min_new_tokens=4),
}


@each_family
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_each_processor_from_the_file_is_transformers_token_for_token(family, setting, tmp_path):
    """Greedy; for min_new_tokens and min_length with an end token the rows would otherwise reach early, for the
    others with none (so their repeats show)."""
    if family not in CAUSAL:
        return
    end = None
    if setting.startswith("min"):
        probe, _ = write(family, tmp_path / "probe", {"eos_token_id": None})
        end = int(run(probe, do_sample=False, max_new_tokens=2, eos_token_id=None)[0, -1])  # row 0's second token
    ours, theirs = write(family, tmp_path / "ckpt", {"eos_token_id": end, "pad_token_id": 0, "do_sample": False,
                                                     "max_new_tokens": 14} | SETTINGS[setting])
    mine, expected = run(ours), run(theirs)
    assert torch.equal(mine, expected), (mine, expected)
    without = run(ours, **{name: value for name, value in [("no_repeat_ngram_size", 0), ("min_new_tokens", None),
                                                            ("min_length", 0), ("repetition_penalty", 1.0)]})
    assert not torch.equal(mine, without)  # the setting changed the tokens


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_min_p_and_typical_p_from_the_file_sample_as_transformers_does(family, tmp_path):
    ours, theirs = write(family, tmp_path, {"do_sample": True, "min_p": 0.1, "typical_p": 0.9, "top_k": 0,
                                            "temperature": 1.3, "eos_token_id": None})
    for seed in (0, 1):
        torch.manual_seed(seed)
        mine = run(ours, max_new_tokens=10)
        torch.manual_seed(seed)
        assert torch.equal(mine, run(theirs, max_new_tokens=10)), seed


@pytest.mark.parametrize("changes, message", [
    (dict(repetition_penalty=0.0), "repetition_penalty must be a number > 0 .1: no penalty., got 0.0"),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be an integer >= 0 .0: off., got -1"),
    (dict(min_new_tokens=2.5), "min_new_tokens must be an integer >= 0 or None, got 2.5"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\] or None, got 1.5"),
    (dict(typical_p=0.0), r"typical_p must be in \(0, 1\] .1: off., got 0.0"),
    (dict(freq_penalty=0.5), "freq_penalty .TransformerLens'. is not implemented here"),
])
def test_bad_settings_are_refused_naming_them(changes, message):
    declared = FAMILIES["llama"]
    model = declared.lm(declared.tiny())
    with pytest.raises(ValueError, match=message):
        model.generate(PROMPT, max_new_tokens=2, **changes)


def test_a_setting_still_not_implemented_is_refused_by_name(tmp_path):
    ours, _ = write("llama", tmp_path, QWEN25_INSTRUCT | {"num_beams": 4})
    with pytest.raises(ValueError, match="generation_config.json sets num_beams=4, which generate does not"):
        run(ours)
