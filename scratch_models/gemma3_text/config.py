"""Gemma 3's language model: config.json fields (gemma-3-270m, 1b; the text_config of the multimodal 4b, 12b, 27b).

Every field defaults as transformers' Gemma3TextConfig has it: the multimodal files' text_config gives only what
differs (gemma-3-4b: hidden 2560, 34 layers, a window of 1024, linear rope scaling), so the defaults are data.

Layers are local (sliding_attention: the last sliding_window tokens) or global (full_attention). transformers 4
wrote no `layer_types` (every sliding_window_pattern-th layer is global, 6 by default: five local, then one global),
a rotary base per kind (`rope_local_base_freq` for the local layers, `rope_theta` for the global ones) and a
`rope_scaling` that applies to the global layers only; transformers 5 writes `layer_types` and `rope_parameters`
with one entry per kind. Both are read; the config is kept, and saved, in transformers 4's names plus layer_types,
which every transformers version reads.

A multimodal checkpoint (model_type `gemma3`, Gemma3ForConditionalGeneration) is read as its text_config, with
the top level's tie_word_embeddings (the LM head's); its vision_config describes the vision tower, which is not
built (weight_mapping/gemma3.py leaves its tensors out, and the loading notes say so).
"""

import dataclasses
import reprlib

from ..parts.config import (ConfigError, ModelConfig, require_activation, require_grouped_heads, require_positive,
                      require_probability, require_problem_type, require_sane_sizes, require_token_id_list, set_fields)
from ..parts.rotary import rope_fields

LAYER_TYPES = ("sliding_attention", "full_attention")
MULTIMODAL = "gemma3"  # Gemma3ForConditionalGeneration's model_type


@dataclasses.dataclass(frozen=True)
class Gemma3TextConfig(ModelConfig):
    model_type = "gemma3_text"

    vocab_size: int = 262_208
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4  # grouped-query attention (gemma-3-270m and 1b: one key/value head)
    head_dim: int = 256  # given, not hidden / heads (gemma-3-1b: 4 heads of 256 over a hidden of 1152)
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131_072
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # the global layers' rotary base
    rope_scaling: dict | None = None  # the global layers' scaling (gemma-3-4b and up: linear, factor 8)
    rope_local_base_freq: float = 10_000.0  # the local layers' rotary base (never scaled)
    attention_bias: bool = False
    attention_dropout: float = 0.0
    # the scores are q·k / sqrt(query_pre_attn_scalar): 256 in gemma-3-1b, 168 in 27b
    query_pre_attn_scalar: int = 256
    sliding_window: int = 4096  # a local layer's query sees itself and the sliding_window - 1 keys before it
    sliding_window_pattern: int = 6  # without layer_types: layer i is global when (i + 1) % pattern == 0
    layer_types: list | None = None
    final_logit_softcapping: float | None = None  # logits = cap · tanh(scores / cap); null (every release): none
    # transformers' Gemma 3 keeps this field and never applies it: only null is read, so no file computes otherwise
    attn_logit_softcapping: float | None = None
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list | None = 1
    tie_word_embeddings: bool = True
    # Gemma3TextForSequenceClassification (transformers' generic sequence classifier)
    id2label: dict | None = None
    problem_type: str | None = None

    def __post_init__(self):
        if self.layer_types is None and self.sliding_window_pattern > 0:  # transformers' default: every pattern-th
            # layer global (a pattern below 1 is refused by validate)
            types = [LAYER_TYPES[(i + 1) % self.sliding_window_pattern == 0] for i in range(self.num_hidden_layers)]
            object.__setattr__(self, "layer_types", types)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Gemma3TextConfig":
        """As ModelConfig.from_dict, with the rotary settings read from either spelling (the module docstring) and a
        multimodal config read as its language model's."""
        if not isinstance(raw, dict):
            return super().from_dict(raw, source)
        if raw.get("model_type") == MULTIMODAL:
            raw = _language_model(raw, source)
        if raw.get("model_type", cls.model_type) != cls.model_type:  # another architecture: said before its fields
            return super().from_dict(raw, source)
        if raw.get("use_bidirectional_attention"):
            raise ConfigError(f"{source}: use_bidirectional_attention=true (attending both ways, as EmbeddingGemma "
                              "does) is not implemented; Gemma 3 here is causal")
        return super().from_dict(_rope(raw, source), source)

    @classmethod
    def fixed_settings(cls) -> dict:
        return {"is_decoder": (False, "Gemma 3 as the decoder of an encoder is not implemented"),
                "attn_logit_softcapping": (None, "transformers' Gemma 3 keeps the field but caps no attention score, "
                                                 "so a file that sets it computes nothing else there; remove it")}

    def validate(self, source: str) -> None:
        require_positive(self, source, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                         "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                         "rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar",
                         "sliding_window", "sliding_window_pattern")
        require_positive(self, source, *set_fields(self, "final_logit_softcapping"))
        require_sane_sizes(self, source, "num_hidden_layers", ("vocab_size", "hidden_size"),
                           ("intermediate_size", "hidden_size"), ("hidden_size", "hidden_size"))
        require_probability(self, source, "attention_dropout")
        require_problem_type(self, source)
        require_grouped_heads(self, source)
        if self.head_dim % 2:
            raise ConfigError(f"{source}: head_dim {self.head_dim} is odd; the rotary embedding turns pairs of "
                              "dimensions")
        if len(self.layer_types) != self.num_hidden_layers or not all(kind in LAYER_TYPES for kind in self.layer_types):
            raise ConfigError(f"{source}: layer_types {reprlib.repr(list(self.layer_types))} should name one of "
                              f"{', '.join(LAYER_TYPES)} for each of the {self.num_hidden_layers} layers")
        require_token_id_list(self, source, "eos_token_id")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: pad_token_id {self.pad_token_id} is not an id of the vocabulary "
                              f"0..{self.vocab_size - 1} (the embedding's padding row, which training leaves "
                              "alone)")
        require_activation(self, source, "hidden_activation")


def _language_model(raw: dict, source: str) -> dict:
    """A multimodal config.json (Gemma3ForConditionalGeneration) as its language model's: text_config, with the top
    level's tie_word_embeddings, which ties the LM head."""
    text = raw.get("text_config")
    if text is None:
        text = {}  # transformers' default text config
    if not isinstance(text, dict):
        raise ConfigError(f"{source}: field 'text_config' should be an object, got {reprlib.repr(text)}")
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise ConfigError(f"{source}: text_config's model_type is {reprlib.repr(text['model_type'])}; Gemma 3's "
                          "language model is 'gemma3_text'")
    tied = {"tie_word_embeddings": raw["tie_word_embeddings"]} if "tie_word_embeddings" in raw else {}
    return text | {"model_type": "gemma3_text"} | tied


def _rope(raw: dict, source: str) -> dict:
    """`raw` with the rotary settings as rope_theta and rope_scaling (the global layers') and rope_local_base_freq,
    read from the rope_parameters of transformers 5 ({"full_attention": {...}, "sliding_attention": {...}}, which win,
    as there) or the flat fields of transformers 4. A scaling of the local layers is refused: no release has one."""
    parameters = raw.get("rope_parameters")
    raw = {key: value for key, value in raw.items() if key != "rope_parameters"}
    if parameters is not None and (not isinstance(parameters, dict) or not set(parameters) <= set(LAYER_TYPES)):
        raise ConfigError(f"{source}: field 'rope_parameters' should hold an object for each of "
                          f"{', '.join(LAYER_TYPES)}, got {reprlib.repr(parameters)}")
    parameters = parameters or {}
    full = {"rope_theta": raw.get("rope_theta", 1_000_000.0)}
    full |= {"rope_parameters": parameters["full_attention"]} if parameters.get("full_attention") else {
        "rope_scaling": raw.get("rope_scaling")}
    full = rope_fields(full, source)
    local = {"rope_theta": raw.get("rope_local_base_freq", 10_000.0)}
    local |= {"rope_parameters": parameters["sliding_attention"]} if parameters.get("sliding_attention") else {}
    local = rope_fields(local, source)
    if local["rope_scaling"] is not None:
        raise ConfigError(f"{source}: rope_parameters scales the sliding_attention layers' rotary embedding "
                          f"({reprlib.repr(local['rope_scaling'])}); Gemma 3 here scales the global layers' only")
    return raw | {"rope_theta": full["rope_theta"], "rope_scaling": full["rope_scaling"],
                  "rope_local_base_freq": local["rope_theta"]}
