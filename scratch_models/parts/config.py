"""Model configurations read from a checkpoint's `config.json`.

Only fields that change what the model computes are kept. Each is checked for type and range when read, so a
bad config fails here, naming the file and the field, rather than deep inside a forward pass. Settings we do
not implement (relative positions, a decoder BERT, cross-attention) are refused rather than silently ignored.
"""

import dataclasses
import math
import reprlib
import types

# defined beside the checkpoint readers, which read config.json
from weight_mapping import ConfigError, read_config_json


# Sizes far past any model of these families: a config beyond them is a typo or a hostile file, refused here
# rather than by torch's overflow error or an allocation of terabytes. The largest real ones: gpt2-xl and
# MegatronBERT have 48 layers; the biggest weight matrix is multilingual BERT's word embeddings, 119547 x 768
# (92 M elements).
MAX_LAYERS = 4096  # four times the deepest transformer trained (DeepNet, 1000 layers); building 4096 takes seconds
MAX_MATRIX = 2**36  # elements in one weight matrix: 256 GiB in float32, more than any accelerator holds
MAX_LABELS = 2**20  # classes of a classification head (ImageNet-21k has 21841)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type = ""

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "ModelConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        found_type = raw.get("model_type")
        if found_type is not None and found_type != cls.model_type:
            raise ConfigError(
                f"{source}: model_type is {reprlib.repr(found_type)}, but {cls.__name__} needs {cls.model_type!r} "
                "(is this a checkpoint of another architecture?)"
            )
        for field, (required, why) in cls.fixed_settings().items():
            if field in raw and raw[field] != required:
                raise ConfigError(f"{source}: {field}={reprlib.repr(raw[field])} is not supported: {why}")
        values = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name not in raw:
                if f.default is dataclasses.MISSING:
                    raise ConfigError(f"{source}: required field {f.name!r} is missing")
                continue
            values[f.name] = _checked(raw[f.name], f, source)
        if values.get("id2label") is not None:
            values["id2label"] = _labels(values["id2label"], raw.get("num_labels"), source)
        elif raw.get("num_labels") is not None:  # a hand-written config may give the count alone, as transformers allows
            values["id2label"] = _labels(None, raw["num_labels"], source)
        config = cls(**values)
        config.validate(source)
        return config

    @classmethod
    def from_json_file(cls, path) -> "ModelConfig":
        return cls.from_dict(read_config_json(path), source=str(path))

    @classmethod
    def fixed_settings(cls) -> dict:
        """field -> (the only value we implement, why); the field may also be absent."""
        return {}

    def validate(self, source: str) -> None:
        pass

    def to_dict(self) -> dict:
        out = {"model_type": self.model_type, **dataclasses.asdict(self)}
        if self.id2label is not None:  # as transformers writes them: both directions, keys as strings
            out["id2label"] = {str(i): label for i, label in self.id2label.items()}
            out["label2id"] = {label: i for i, label in self.id2label.items()}
        return out

    @property
    def num_labels(self) -> int:
        """How many outputs a classification head has: id2label's size, else transformers' default of 2."""
        return len(self.id2label) if self.id2label is not None else 2

    def label(self, index: int) -> str:
        """The name of class `index` (id2label), transformers' LABEL_{i} when the config names none."""
        return self.id2label[index] if self.id2label is not None else f"LABEL_{index}"


def _checked(value, field: dataclasses.Field, source: str):
    """`value` as the field's type (int, float, str, bool, dict, list, or a union of them, `| None` where the field
    may be null in JSON), or a ConfigError naming it. A list field (Llama 3's several end tokens, Qwen 2's
    layer_types) holds a JSON list; what its items must be, the config's validate checks."""
    kinds = field.type.__args__ if isinstance(field.type, types.UnionType) else (field.type,)
    nullable = type(None) in kinds
    if value is None and nullable:
        return None
    kinds = [kind for kind in kinds if kind is not type(None)]
    for kind in kinds:
        if _is(value, kind):
            return float(value) if kind is float else value
    expected = " or ".join([kind.__name__ for kind in kinds] + (["null"] if nullable else []))
    raise ConfigError(f"{source}: field {field.name!r} should be {expected}, got {reprlib.repr(value)}")


def _is(value, kind: type) -> bool:
    if kind in (int, float) and isinstance(value, bool):  # JSON's true is no number
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return kind in (int, str, bool, dict, list) and isinstance(value, kind)


PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def _labels(id2label: dict | None, num_labels, source: str) -> dict[int, str]:
    """config.json's id2label (keys "0".."n-1") as {0: name, ...}; or LABEL_0.. for a bare num_labels."""
    if id2label is None:
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or not 0 < num_labels <= MAX_LABELS:
            raise ConfigError(f"{source}: field 'num_labels' should be an int in 1..{MAX_LABELS}, got "
                              f"{reprlib.repr(num_labels)}")
        return {i: f"LABEL_{i}" for i in range(num_labels)}
    try:
        labels = {int(key): value for key, value in id2label.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: field 'id2label' should map class indices (\"0\", \"1\", ...) to names, "
                          f"got keys {reprlib.repr(list(id2label))}") from None
    if sorted(labels) != list(range(len(labels))) or not 0 < len(labels) <= MAX_LABELS:
        raise ConfigError(f"{source}: field 'id2label' should have the keys 0..n-1 (n at most {MAX_LABELS}), got "
                          f"{reprlib.repr(sorted(labels))}")
    if not all(isinstance(value, str) for value in labels.values()):
        raise ConfigError(f"{source}: field 'id2label' should map to label names (strings)")
    if num_labels is not None and num_labels != len(labels):
        raise ConfigError(f"{source}: num_labels={num_labels!r} but id2label names {len(labels)} classes")
    return dict(sorted(labels.items()))


def set_fields(config, *names: str) -> tuple[str, ...]:
    """Those of the optional fields `names` that are set (not null): the ones a check applies to."""
    return tuple(name for name in names if getattr(config, name) is not None)


def generic_token_classifier_dropout(config) -> float:
    """The dropout of transformers' generic token classification head, as it chooses it: classifier_dropout, else
    hidden_dropout, else 0.1."""
    return next((p for p in (config.classifier_dropout, config.hidden_dropout) if p is not None), 0.1)


def require_positive(config, source: str, *names: str) -> None:
    for name in names:
        if not 0 < getattr(config, name) < math.inf:  # JSON as Python reads it allows NaN and Infinity
            raise ConfigError(f"{source}: field {name!r} must be positive and finite, got {getattr(config, name)}")


def require_sane_sizes(config, source: str, layers: str, *matrices: tuple[str, str]) -> None:
    """`layers` at most MAX_LAYERS, and each weight matrix (rows field, columns field) at most MAX_MATRIX elements."""
    if getattr(config, layers) > MAX_LAYERS:
        raise ConfigError(f"{source}: field {layers!r} is {getattr(config, layers)}, more than the {MAX_LAYERS} "
                          "layers accepted")
    for rows, columns in matrices:
        if getattr(config, rows) is None:  # an unset size derived from others (n_inner: 4 * n_embd)
            continue
        size = getattr(config, rows) * getattr(config, columns)
        if size > MAX_MATRIX:
            raise ConfigError(f"{source}: fields {rows!r} x {columns!r} ({getattr(config, rows)} x "
                              f"{getattr(config, columns)}) make a weight matrix of {size} elements, more than the "
                              f"2**{MAX_MATRIX.bit_length() - 1} accepted")


def require_grouped_heads(config, source: str) -> None:
    """Grouped-query attention's fields: each key/value head serves a whole group of query heads."""
    if config.num_attention_heads % config.num_key_value_heads:
        raise ConfigError(f"{source}: num_attention_heads {config.num_attention_heads} is not a multiple of "
                          f"num_key_value_heads {config.num_key_value_heads}: each key/value head serves a group "
                          "of query heads")


def require_problem_type(config, source: str) -> None:
    if config.problem_type is not None and config.problem_type not in PROBLEM_TYPES:
        raise ConfigError(f"{source}: field 'problem_type' is {config.problem_type!r}; it should be null or one of "
                          f"{', '.join(PROBLEM_TYPES)}")
    if config.problem_type == "single_label_classification" and config.num_labels == 1:
        raise ConfigError(f"{source}: problem_type single_label_classification needs at least 2 labels, id2label "
                          "names 1 (binary classification: 2 labels, or problem_type regression)")


def require_probability(config, source: str, *names: str) -> None:
    for name in names:
        if not 0.0 <= getattr(config, name) < 1.0:
            raise ConfigError(f"{source}: field {name!r} must be in [0, 1), got {getattr(config, name)}")


def require_activation(config, source: str, field: str) -> None:
    """The activation function `field` names is one the models implement (parts/activations.py)."""
    from .activations import get_activation  # parts build on configs

    try:
        get_activation(getattr(config, field), field)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def require_token_id_list(config, source: str, field: str) -> None:
    """A list in `field` (several end tokens) lists token ids."""
    value = getattr(config, field)
    if isinstance(value, list) and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise ConfigError(f"{source}: field {field!r} lists {reprlib.repr(value)}; it should list token ids")


# the kinds of layer a config's layer_types names (transformers' names)
LAYER_TYPES = ("full_attention", "sliding_attention")


def require_layer_types(config, source: str, no_window: str = "sliding_window is null") -> None:
    """config.layer_types is a list naming each layer's kind (LAYER_TYPES), and a sliding layer has a window;
    `no_window` says why there is none."""
    kinds = config.layer_types
    if not isinstance(kinds, list) or len(kinds) != config.num_hidden_layers or not all(
            kind in LAYER_TYPES for kind in kinds):
        raise ConfigError(f"{source}: field 'layer_types' should name each of the {config.num_hidden_layers} "
                          f"layers {' or '.join(LAYER_TYPES)}, got {reprlib.repr(kinds)}")
    if "sliding_attention" in kinds and config.sliding_window is None:
        raise ConfigError(f"{source}: layer_types names sliding_attention layers, but {no_window}")
