"""Gemma 2's config.json fields (gemma-2-2b, 9b, 27b and their -it versions).

transformers 4 wrote the rotary base as `rope_theta` and gave no `layer_types` (a layer slides when its index is
even); transformers 5 writes `rope_parameters` and `layer_types`. Both are read (parts/rotary.py for the first);
the rotary settings are kept, and saved, as `rope_theta` and `rope_scaling`, which every transformers version reads.
The -it checkpoints end text at either of two tokens (`eos_token_id` [1, 107]): a list is kept as it is. Gemma 3
(`gemma3`, `gemma3_text`) is another architecture, the gemma3_text family's, and is refused here by name.
"""

import dataclasses
import reprlib

from ..parts.config import (ConfigError, ModelConfig, generic_token_classifier_dropout, require_activation,
                      require_grouped_heads, require_positive, require_probability, require_problem_type,
                      require_sane_sizes, require_token_id_list, set_fields)
from ..parts.rotary import rope_fields

LAYER_TYPES = ("sliding_attention", "full_attention")
# what transformers names Gemma's later architectures, refused with what they are
LATER_GEMMAS = {"gemma3": "Gemma 3", "gemma3_text": "Gemma 3 (its text model)", "gemma3n": "Gemma 3n",
                "gemma3n_text": "Gemma 3n (its text model)"}


@dataclasses.dataclass(frozen=True)
class Gemma2Config(ModelConfig):
    model_type = "gemma2"

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int = 4  # grouped-query attention: each key/value head serves heads / kv_heads query heads
    head_dim: int = 256  # given, not hidden / heads (gemma-2-2b: 8 heads of 256 over a hidden of 2304)
    # the gate's activation; the hub files also carry `hidden_act`, which transformers' Gemma 2 does not read
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None: the default; else a type of parts/rotary.py's ROPE_TYPES
    attention_bias: bool = False
    attention_dropout: float = 0.0
    # the scores are q·k / sqrt(query_pre_attn_scalar), not / sqrt(head_dim): 224 in gemma-2-9b, 144 in 27b
    query_pre_attn_scalar: int = 256
    # a sliding layer's query sees itself and the sliding_window - 1 keys before it; null: the whole past
    sliding_window: int | None = 4096
    layer_types: list | None = None  # per layer, sliding_attention or full_attention; null: alternating
    attn_logit_softcapping: float | None = 50.0  # scores become cap · tanh(scores / cap); null: not capped
    final_logit_softcapping: float | None = 30.0  # the logits, likewise
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list | None = 1  # the -it files list two
    tie_word_embeddings: bool = True
    # task heads, as transformers' PretrainedConfig has them; the token classifier (transformers 5's generic one)
    # drops out classifier_dropout, else hidden_dropout, else 0.1, and has a bias unless token_classification_bias
    # says otherwise
    id2label: dict | None = None
    problem_type: str | None = None
    classifier_dropout: float | None = None
    hidden_dropout: float | None = None
    token_classification_bias: bool = True

    def __post_init__(self):
        if self.layer_types is None:  # transformers' default: layers 0, 2, 4, ... slide
            types = [LAYER_TYPES[i % 2] for i in range(self.num_hidden_layers)]
            object.__setattr__(self, "layer_types", types)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Gemma2Config":
        """As ModelConfig.from_dict, with transformers 5's `rope_parameters` read into rope_theta and rope_scaling
        (parts/rotary.py). A Gemma 3 config is refused, naming it."""
        if not isinstance(raw, dict):
            return super().from_dict(raw, source)
        if raw.get("model_type") in LATER_GEMMAS:
            raise ConfigError(f"{source}: model_type is {raw['model_type']!r} ({LATER_GEMMAS[raw['model_type']]}), "
                              "another architecture than Gemma 2 (norms on the queries and keys, local and global "
                              "rotary bases, no soft-capping): load it with the gemma3_text family "
                              "(Gemma3ForCausalLM); the gemma2 family reads model_type 'gemma2' (gemma-2-2b, 9b, 27b)")
        if raw.get("use_bidirectional_attention"):
            raise ConfigError(f"{source}: use_bidirectional_attention=true (attending both ways, as EmbeddingGemma "
                              "does) is not implemented; Gemma 2 here is causal")
        return super().from_dict(rope_fields(raw, source), source)

    @classmethod
    def fixed_settings(cls) -> dict:
        return {"is_decoder": (False, "Gemma 2 as the decoder of an encoder is not implemented")}

    def validate(self, source: str) -> None:
        require_positive(self, source, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                          "rms_norm_eps", "rope_theta", "query_pre_attn_scalar")
        require_positive(self, source,
                         *set_fields(self, "sliding_window", "attn_logit_softcapping", "final_logit_softcapping"))
        require_sane_sizes(self, source, "num_hidden_layers", ("vocab_size", "hidden_size"),
                            ("intermediate_size", "hidden_size"), ("hidden_size", "hidden_size"))
        require_probability(self, source, "attention_dropout")
        require_probability(self, source, *set_fields(self, "classifier_dropout", "hidden_dropout"))
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

    @property
    def token_classifier_dropout(self) -> float:
        return generic_token_classifier_dropout(self)

