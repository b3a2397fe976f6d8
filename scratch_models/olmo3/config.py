"""OLMo 3's config.json fields (Olmo-3-1025-7B, Olmo-3-1125-32B, their -Instruct and -Think versions): OLMo 2's
(scratch_models/olmo2/config.py) with sliding-window layers and a rotary embedding per kind of layer.

Layers are local (sliding_attention: a query sees itself and the sliding_window - 1 keys before it) or global
(full_attention); without `layer_types` every fourth layer is global, the others local, as transformers fills it in.
The rotary settings: transformers 4 wrote `rope_theta` and a `rope_scaling` (the long-context releases: YaRN) that
turns the global layers only, the local ones taking the default rotary embedding of the same base; transformers 5
writes `rope_parameters` with one entry per kind. Both are read; the config is kept, and saved, in transformers 4's
names plus layer_types, which every transformers version reads. A file whose local layers have a scaling or a base of
their own (no release has one) is refused, as those names cannot say it. One difference with transformers 5: given a
flat rope_theta other than 500000 it turns the local layers by 500000 all the same (its convert_rope_params_to_dict
reads the field once); here both kinds take the file's base. Every release has 500000.
"""

import dataclasses
import reprlib

from ..olmo2.config import Olmo2Config
from ..parts.config import LAYER_TYPES, ConfigError, require_layer_types
from ..parts.rotary import rope_fields



@dataclasses.dataclass(frozen=True)
class Olmo3Config(Olmo2Config):
    model_type = "olmo3"

    rope_theta: float = 500000.0
    sliding_window: int | None = 4096
    layer_types: list | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None and isinstance(self.num_hidden_layers, int):  # transformers' default: 3 to 1
            object.__setattr__(self, "layer_types", [
                "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(self.num_hidden_layers)])

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Olmo3Config":
        """As Olmo2Config.from_dict, with transformers 5's per-kind rope_parameters read into rope_theta and
        rope_scaling (the global layers')."""
        if isinstance(raw, dict) and isinstance(raw.get("rope_parameters"), dict) and (
                set(raw["rope_parameters"]) & set(LAYER_TYPES)):
            raw = _per_kind(raw, source)
        return super().from_dict(raw, source)

    def validate(self, source: str) -> None:
        super().validate(source)
        require_layer_types(self, source)

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        return tuple(kind == "sliding_attention" for kind in self.layer_types)


def _per_kind(raw: dict, source: str) -> dict:
    """`raw` with transformers 5's rope_parameters {"sliding_attention": {...}, "full_attention": {...}} as
    rope_theta and rope_scaling (the global layers', which win, as there); the local layers' must be the default
    rotary embedding of the same base."""
    parameters = raw["rope_parameters"]
    if not set(parameters) <= set(LAYER_TYPES) or not all(isinstance(p, dict) for p in parameters.values()):
        raise ConfigError(f"{source}: field 'rope_parameters' should hold an object for each of "
                          f"{', '.join(LAYER_TYPES)}, got {reprlib.repr(parameters)}")
    rest = {key: value for key, value in raw.items() if key not in ("rope_parameters", "rope_scaling")}
    theta = raw.get("rope_theta", Olmo3Config.rope_theta)
    full = rope_fields(rest | {"rope_theta": theta, "rope_parameters": parameters.get("full_attention") or {}}, source)
    local = rope_fields({"rope_theta": theta, "rope_parameters": parameters.get("sliding_attention") or {}}, source)
    if local["rope_scaling"] is not None or local["rope_theta"] != full["rope_theta"]:
        raise ConfigError(f"{source}: rope_parameters gives the sliding_attention layers a rotary embedding of their "
                          f"own ({reprlib.repr(parameters.get('sliding_attention'))}); OLMo 3 here turns them by the "
                          f"default one of the global layers' base ({full['rope_theta']})")
    return full
