"""The registry of model families: a family is a package of scratch_models that declares `FAMILY` (see family.py),
and is registered by its name here, once."""

import importlib
import json
from pathlib import Path

from weight_mapping import CheckpointError

from .family import Family, architectures

FAMILY_PACKAGES = ("bert", "gpt2", "gpt_neox")

FAMILIES: dict[str, Family] = {family.name: family for family in
                               (importlib.import_module(f"{__package__}.{name}").FAMILY for name in FAMILY_PACKAGES)}


def family_of_config(config_path: Path) -> Family:
    """The family of a checkpoint's config.json: its model_type, else the family of the class its `architectures`
    names (a config written by hand or by an old tool may lack model_type). A CheckpointError names anything else."""
    try:
        raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{config_path}: cannot read it as JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object, got {type(raw).__name__}")
    supported = ", ".join(FAMILIES)
    model_type = raw.get("model_type")
    if model_type is not None:
        if model_type not in FAMILIES:
            raise CheckpointError(f"{config_path}: model_type {model_type!r} is not supported; supported: {supported}")
        return FAMILIES[model_type]
    named = architectures(config_path)
    for family in FAMILIES.values():
        if any(cls.__name__ in named for cls in family.classes):
            return family
    said = f"its architectures name {', '.join(named)}" if named else "and no architectures"
    raise CheckpointError(f"{config_path}: no model_type, {said}, which is none of the supported families' classes "
                          f"({supported})")
