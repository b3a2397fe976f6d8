"""The registry of model families: a family is a package of scratch_models that declares `FAMILY` (see family.py),
and is registered by its name here, once."""

import importlib

from weight_mapping import Checkpoint, CheckpointError

from .family import Family, architectures

FAMILY_PACKAGES = ("bert", "gpt2", "gpt_neox", "gemma2")

FAMILIES: dict[str, Family] = {family.name: family for family in
                               (importlib.import_module(f"{__package__}.{name}").FAMILY for name in FAMILY_PACKAGES)}


def family_of(checkpoint: Checkpoint) -> Family:
    """The family of an open checkpoint, from its config.json: its model_type, else the family of the class its
    `architectures` names (a config written by hand or by an old tool may lack model_type). A CheckpointError names
    anything else."""
    raw, config_path = checkpoint.config_json, checkpoint.config_path
    supported = ", ".join(FAMILIES)
    model_type = raw.get("model_type")
    if model_type is not None:
        if model_type not in FAMILIES:
            raise CheckpointError(f"{config_path}: model_type {model_type!r} is not supported; supported: {supported}")
        return FAMILIES[model_type]
    named = architectures(raw)
    for family in FAMILIES.values():
        if any(cls.__name__ in named for cls in family.classes):
            return family
    said = f"its architectures name {', '.join(named)}" if named else "and no architectures"
    raise CheckpointError(f"{config_path}: no model_type, {said}, which is none of the supported families' classes "
                          f"({supported})")
