"""generate's defaults come from the checkpoint as transformers reads them (issue 30, item 4): generation_config.json
where there is one, else config.json's special tokens, with transformers' defaults for the rest; and config.json may
name several end tokens. Token for token against transformers' generate called with nothing but the prompt, for
every registered causal family."""

import json

import pytest
import torch
import transformers

from helpers import each_family, reference, save
from scratch_models.registry.families import FAMILIES
from scratch_models.decoding.generation import GenerationConfig

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = torch.tensor([[3, 7, 1, 9, 4], [2, 2, 5, 8, 6]])
VOCAB = 37  # every family's tiny config


def causal(family: str):
    if not FAMILIES[family].causal:
        assert not hasattr(FAMILIES[family].lm, "generate")  # nothing to check: this family does not generate
        return False
    return True


def write(family: str, directory, generation: dict | None = None, seed: int = 0, **config):
    """The family's tiny LM with `config` changes (weights drawn from `seed`), and a generation_config.json holding
    `generation` (none: no file, as a checkpoint saved before transformers wrote one)."""
    save(reference(family, seed=seed, **config), directory)
    path = directory / "generation_config.json"
    if generation is None:
        path.unlink()
    else:
        path.write_text(json.dumps(generation))
    return directory


def both(family: str, directory) -> tuple:
    lm = FAMILIES[family].lm
    theirs = getattr(transformers, lm.__name__).from_pretrained(directory, attn_implementation="eager").eval()
    return lm.from_pretrained(directory), theirs


def free_tokens(model) -> torch.Tensor:
    """What greedy decoding makes of the prompts with nothing to stop it."""
    return model.generate(PROMPT, max_new_tokens=12, eos_token_id=None, do_sample=False)[:, PROMPT.shape[1]:]


def generated(model, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(PROMPT, **kwargs)


@each_family
def test_generation_config_json_sets_the_defaults_as_in_transformers(family, tmp_path):
    """An end token of its own (other than config.json's, which would never stop a row here), a pad and a length:
    generate() with the prompt alone gives transformers' tokens; config.json's end token is not read."""
    if not causal(family):
        return
    # weights under which a token one row generates before its last step and the other never does (a random tiny
    # model may settle both rows on the same few tokens)
    for seed in range(6):
        ours, _ = both(family, write(family, tmp_path / f"probe{seed}", generation={}, seed=seed))
        free = free_tokens(ours)
        found = next(((a, int(t)) for a, b in ((0, 1), (1, 0)) for t in free[a, :-1] if int(t) not in free[b]), None)
        if found is not None:
            break
    else:
        pytest.fail(f"no seed in 0..5 gives {family}'s two rows a token of their own")
    row, stop = found
    at = free[row].tolist().index(stop)
    directory = write(family, tmp_path / "ckpt", generation={"eos_token_id": stop, "pad_token_id": 0,
                                                             "max_new_tokens": 9}, seed=seed, eos_token_id=VOCAB - 1)
    ours, theirs = both(family, directory)
    assert ours.generation_config.eos_token_id == stop and ours.generation_config.max_new_tokens == 9
    mine = generated(ours)
    assert torch.equal(mine, generated(theirs))
    assert mine.shape[1] == PROMPT.shape[1] + 9 and bool((mine[row, PROMPT.shape[1] + at + 1:] == 0).all())
    # arguments still win
    assert torch.equal(generated(ours, max_new_tokens=3, eos_token_id=None),
                       generated(theirs, max_new_tokens=3, eos_token_id=None))


@each_family
def test_sampling_settings_and_max_length_come_from_the_file(family, tmp_path):
    """do_sample, temperature and top_p from the file, transformers' top_k=50 with them; max_length counts the
    prompt. The same seed draws the same tokens."""
    if not causal(family):
        return
    directory = write(family, tmp_path, generation={"do_sample": True, "temperature": 0.7, "top_p": 0.9,
                                                    "max_length": PROMPT.shape[1] + 6})
    ours, theirs = both(family, directory)
    assert ours.generation_config.top_k is None  # the file names none: transformers' default applies
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        mine = generated(ours)
        torch.manual_seed(seed)
        assert torch.equal(mine, generated(theirs)), seed
    assert mine.shape[1] == PROMPT.shape[1] + 6


@each_family
def test_without_a_generation_config_json_config_json_s_tokens_count(family, tmp_path):
    """config.json's end tokens, a list of them included (transformers accepts one; ours refused it): a row stops
    at either."""
    if not causal(family):
        return
    probe, _ = both(family, write(family, tmp_path / "probe"))
    free = free_tokens(probe)
    ends = [int(free[0, 2]), int(free[1, 4])]
    directory = write(family, tmp_path / "ckpt", eos_token_id=ends)
    ours, theirs = both(family, directory)
    assert list(ours.config.eos_token_id) == ends and ours.generation_config.source == "config.json"
    mine = generated(ours, max_new_tokens=8)
    assert torch.equal(mine, generated(theirs, max_new_tokens=8))
    assert mine.shape[1] < PROMPT.shape[1] + 8  # both rows stopped
    saved = ours.save_pretrained(tmp_path / "saved")
    assert json.loads(saved[0].read_text())["eos_token_id"] == ends


@each_family
def test_settings_generate_does_not_implement_are_refused_not_ignored(family, tmp_path):
    if not causal(family):
        return
    directory = write(family, tmp_path, generation={"epsilon_cutoff": 0.01, "do_sample": True, "num_beams": 1})
    ours, theirs = both(family, directory)
    with pytest.raises(ValueError, match=r"generation_config.json sets epsilon_cutoff=0.01, which generate does "
                                         r"not implement"):
        generated(ours)
    ours.generation_config.unsupported.clear()
    theirs.generation_config.epsilon_cutoff = 0.0
    torch.manual_seed(0)
    mine = generated(ours)
    torch.manual_seed(0)
    assert torch.equal(mine, generated(theirs))
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": "50"}))
    with pytest.raises(ValueError, match="generation_config.json: top_k should be int, got '50'"):
        FAMILIES[family].lm.from_pretrained(tmp_path)


@each_family
def test_a_model_built_in_python_takes_its_config_s_tokens(family):
    if not causal(family):
        return
    declared = FAMILIES[family]
    model = declared.lm(declared.tiny(eos_token_id=5, pad_token_id=6))
    assert model.generation_config == GenerationConfig(eos_token_id=5, pad_token_id=6)
    with pytest.raises(TypeError,
                       match="generation_config must be a scratch_models.decoding.generation.GenerationConfig"):
        model.generation_config = {"eos_token_id": 5}
