"""Every tensor a file holds is loaded, or skipped for a stated reason, or named in the one loading error.

Skipped, as transformers skips them (it warns and loads): the buffers a family's table lists, a tied duplicate, and
a part of another class of the family under the same config.json (another task's head, BERT's pooler in a class
built without one). Refused: a tensor the config's model has no place for. transformers drops such a tensor with a
warning and computes with the config's model; a file whose config.json switches off the attention biases it holds
(GPT-NeoX's `attention_bias: false` beside trained `query_key_value.bias`) then gives logits off by 0.2 to 4.
"""

import dataclasses
import re

import pytest
import torch
import transformers

from helpers import each_family, reference, save, write_config
from scratch_models import CheckpointError
from scratch_models.registry.families import FAMILIES


def names(cls, config) -> set[str] | None:
    """Our tensor names in `cls` built from `config`; None where the config cannot build it."""
    try:
        with torch.device("meta"):
            return set(cls(config).state_dict())
    except ValueError:  # ConfigError too: a head this config cannot build (it refuses the setting by name)
        return None


def dropping_settings() -> list:
    """(family, class, field, the value with the tensors, their checkpoint names) for each boolean field of a
    family's config whose flip leaves tensors out of a class built either way: GPT-NeoX's attention_bias
    today, and whatever a family registered later declares. Tied tensors (tie_word_embeddings) are no such case: a
    file may hold both of a tied pair."""
    found = []
    for name, family in FAMILIES.items():
        layers = getattr(family.tiny(), family.table.layers_field)
        ours_to_checkpoint = {ours: key for key, ours in family.table.tensor_names(layers).items()}
        for field in (f.name for f in dataclasses.fields(family.config_class) if f.type is bool):
            default = getattr(family.tiny(), field)
            for value in (default, not default):  # the first class (the base model first) that holds them
                for cls in family.classes:
                    has, lacks = names(cls, family.tiny(**{field: value})), names(cls, family.tiny(**{field: not value}))
                    dropped = set() if None in (has, lacks) else \
                        {ours_to_checkpoint[n] for n in has - lacks} - set(family.table.aliases)
                    if dropped:
                        found.append(pytest.param(name, cls.__name__, field, value, sorted(dropped),
                                                  id=f"{name}-{cls.__name__}-{field}={not value}"))
                        break
    return found


@pytest.mark.parametrize("family, class_name, field, value, dropped", dropping_settings())
def test_a_tensor_the_configs_model_has_no_place_for_is_an_error_naming_it(tmp_path, family, class_name, field,
                                                                             value, dropped):
    """A file written with the tensors, under a config.json whose setting leaves them out: the class refuses it (and
    the base model too, for tensors of the base model), naming each such tensor and why; nothing is loaded."""
    declared = FAMILIES[family]
    theirs = reference(family, class_name, **{field: value})
    save(theirs, tmp_path)
    write_config(declared.tiny(**{field: not value}), tmp_path)
    in_file = {key for key in theirs.state_dict() if declared.table.normalize(key) in dropped}
    assert len(in_file) == len(dropped)
    ours = next(cls for cls in declared.classes if cls.__name__ == class_name)
    layers = getattr(declared.tiny(), declared.table.layers_field)
    in_base = names(declared.base, declared.tiny(**{field: value}))
    base_tensors = {key for key, name in declared.table.tensor_names(layers).items() if name in in_base}
    for cls in (ours, declared.base) if set(dropped) <= base_tensors else (ours,):
        with pytest.raises(CheckpointError) as error:
            cls.from_pretrained(tmp_path)
        message = str(error.value)
        named = set(re.findall(r"^  (\S+) \(", message, re.M))
        assert named == in_file, f"{cls.__name__}: {message}"
        assert f"{len(in_file)} unexpected tensor(s)" in message
        assert "config.json" in message and "leaves it out" in message


def test_pythia_biases_under_attention_bias_false_are_refused_by_name(tmp_path):
    """The case the issue found: trained biases under `attention_bias: false`, as one message."""
    theirs = reference("gpt_neox", attention_bias=True)
    save(theirs, tmp_path)
    write_config(FAMILIES["gpt_neox"].tiny(attention_bias=False), tmp_path)
    with pytest.raises(CheckpointError, match=r"4 unexpected tensor\(s\)[\s\S]*"
                                              r"gpt_neox\.layers\.0\.attention\.query_key_value\.bias \(144,\): our "
                                              r"layers\.0\.attn\.query_key_value has no bias"):
        FAMILIES["gpt_neox"].lm.from_pretrained(tmp_path)


@each_family
def test_other_classes_parts_are_skipped_and_listed_as_transformers_skips_them(tmp_path, family):
    """Every class's checkpoint into the base model and into the LM: where transformers' class of the same name
    misses nothing, ours loads, and what it skips is what transformers reports unexpected, each with its reason."""
    declared = FAMILIES[family]
    for source in declared.classes:
        try:
            theirs = reference(family, source.__name__)
        except (ValueError, AttributeError):  # a class this tiny config cannot build
            continue
        directory = save(theirs, tmp_path / source.__name__)
        for target in (declared.base, declared.lm):
            _, info = getattr(transformers, target.__name__).from_pretrained(directory, output_loading_info=True)
            if info["missing_keys"]:
                continue
            ours = target.from_pretrained(directory)
            skipped = ours.loading_info.ignored
            assert set(skipped) == set(info["unexpected_keys"]), f"{source.__name__} -> {target.__name__}"
            assert all(why == f"not part of {target.__name__}" or "(tied)" in why for why in skipped.values())
