"""GPT-NeoX's config.json fields (the Pythia suite, gpt-neox-20b).

The Pythia files name the rotary embedding's settings `rotary_pct` and `rotary_emb_base`; transformers 5 writes
them as `rope_parameters` {"partial_rotary_factor", "rope_theta", "rope_type", ...}. Both are read
(parts/rotary.py); they are kept, and saved, under the first names and `rope_scaling`, which every transformers
version reads.
"""

import dataclasses

from ..parts.config import (ConfigError, ModelConfig, require_activation, require_positive, require_probability,
                      require_problem_type, require_sane_sizes)
from ..parts.rotary import rope_fields


@dataclasses.dataclass(frozen=True)
class GPTNeoXConfig(ModelConfig):
    model_type = "gpt_neox"

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 2048
    # the rotary embedding turns the first rotary_pct of each head's dimensions, by angles position * base^(-2j/n)
    rotary_pct: float = 0.25
    rotary_emb_base: float = 10000.0
    rope_scaling: dict | None = None  # None: the default; else a type of parts/rotary.py's ROPE_TYPES
    layer_norm_eps: float = 1e-5
    # attention and MLP both read the layer's input, and both outputs are added to it (every Pythia model); false:
    # the MLP reads the stream after attention, as in GPT-2
    use_parallel_residual: bool = True
    attention_bias: bool = True  # query_key_value and dense have biases
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    bos_token_id: int | None = 0
    eos_token_id: int | list | None = 2  # several end tokens: any of them ends a text
    pad_token_id: int | None = None
    # untied: the LM head (embed_out) is a matrix of its own, as in every Pythia model
    tie_word_embeddings: bool = False
    # task heads, as transformers' PretrainedConfig has them (see BertConfig); classifier_dropout is the token
    # classifier's (transformers' default 0.1)
    id2label: dict | None = None
    problem_type: str | None = None
    classifier_dropout: float = 0.1

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "GPTNeoXConfig":
        """As ModelConfig.from_dict, with transformers 5's `rope_parameters` read into rotary_pct and
        rotary_emb_base (they win over those fields, as in transformers) and the rotary scaling into rope_scaling
        (parts/rotary.py)."""
        return super().from_dict(rope_fields(raw, source, theta="rotary_emb_base", partial="rotary_pct"), source)

    @classmethod
    def fixed_settings(cls) -> dict:
        return {"is_decoder": (False, "GPT-NeoX as the decoder of an encoder is not implemented")}

    def validate(self, source: str) -> None:
        require_positive(self, source, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings", "rotary_pct", "rotary_emb_base",
                          "layer_norm_eps")
        require_sane_sizes(self, source, "num_hidden_layers", ("vocab_size", "hidden_size"),
                            ("hidden_size", "hidden_size"), ("intermediate_size", "hidden_size"))
        require_probability(self, source, "hidden_dropout", "attention_dropout", "classifier_dropout")
        require_problem_type(self, source)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"{source}: hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}")
        if self.rotary_pct > 1:
            raise ConfigError(f"{source}: rotary_pct is {self.rotary_pct}; it is the share of each head's "
                              "dimensions that rotate, at most 1")
        if self.rotary_dim % 2:
            raise ConfigError(f"{source}: the rotary embedding turns pairs of dimensions, and int(head size "
                              f"{self.head_dim} x rotary_pct {self.rotary_pct}) = {self.rotary_dim} is odd")
        require_activation(self, source, "hidden_act")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """How many of each head's dimensions rotate (the first ones), as transformers counts them."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def token_classifier_dropout(self) -> float:
        return self.classifier_dropout
