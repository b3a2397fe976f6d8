"""The registry of model families: a family is a package of scratch_models that declares `FAMILY` (see family.py),
registered by its name once, in known.py's FAMILY_PACKAGES; here each is imported and found from a checkpoint."""

import importlib

from weight_mapping import EMBEDDED_NAME, Checkpoint, CheckpointError, embedded_checkpoint, read_config_json

from .family import Family, architectures
from .known import FAMILY_PACKAGES, WRAPPED, refuse_unbuilt

FAMILIES: dict[str, Family] = {family.name: family for family in
                               (importlib.import_module(f"scratch_models.{name}").FAMILY for name in FAMILY_PACKAGES)}


def family_of(checkpoint: Checkpoint) -> Family:
    """The family of an open checkpoint, from its config.json: its model_type, else the family of the class its
    `architectures` names (a config written by hand or by an old tool may lack model_type). A CheckpointError names
    anything else, and says what a model no family builds is (refuse_unbuilt)."""
    raw, config_path = checkpoint.config_json, checkpoint.config_path
    model_type = raw.get("model_type")
    refuse_unbuilt(raw, config_path)
    supported = ", ".join(FAMILIES)
    if model_type is not None:
        if isinstance(model_type, str) and model_type in WRAPPED:  # a bigger file one family reads the LM of
            return FAMILIES[WRAPPED[model_type]]
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


def offline_advice(family: Family | None) -> str:
    """What to use offline in place of a hub checkpoint of `family` that is not cached (None: a family not known):
    `scratch-models tiny`, and the embedded real checkpoint where it is of that family."""
    embedded = _embedded_family()
    real = (f"`{EMBEDDED_NAME}`, the real {FAMILIES[embedded].title} all-MiniLM-L6-v2 that comes with this package "
            "(offline)") if embedded in FAMILIES else ""
    if family is None:
        return (f"To try the commands offline, `scratch-models tiny FAMILY DIR` writes a small random model with a "
                f"tokenizer (FAMILY: {', '.join(FAMILIES)}) to use in its place" + (f"; or use {real}" if real else ""))
    return (f"To try it offline, `scratch-models tiny {family.name} DIR` writes a small random {family.title} model "
            f"with a tokenizer to use in its place" + (f"; or use {real}" if embedded == family.name else ""))


def _embedded_family() -> str | None:
    """The model_type of the embedded checkpoint (`minilm`), None where its package is not installed."""
    try:
        return read_config_json(embedded_checkpoint() / "config.json").get("model_type")
    except CheckpointError:
        return None
