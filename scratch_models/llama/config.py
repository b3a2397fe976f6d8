"""The Llama-like families' config.json fields: what Llama, Mistral, Qwen 2 and Qwen 3 share (LlamaLikeConfig), and
Llama's own (LlamaConfig).

The rotary settings come spelled two ways: transformers 4 wrote `rope_theta` and `rope_scaling`, transformers 5
writes `rope_parameters` {"rope_type", "rope_theta", "factor", ...}. Both are read (parts/rotary.py) and kept, and
saved, as `rope_theta` and `rope_scaling`, which every transformers version reads.
"""

import dataclasses

from ..parts.config import (ConfigError, ModelConfig, generic_token_classifier_dropout, require_activation,
                      require_grouped_heads, require_positive, require_probability, require_problem_type,
                      require_sane_sizes, require_token_id_list, set_fields)
from ..parts.rotary import rope_fields


@dataclasses.dataclass(frozen=True)
class LlamaLikeConfig(ModelConfig):
    """The fields every Llama-like config.json has, with transformers' LlamaConfig defaults (Llama 2 7B's); a variant
    sets its own defaults and answers what its architecture fixes, which transformers' modules hard-code:

        qkv_bias, o_proj_bias   whether q_proj, k_proj, v_proj and o_proj add a bias
        mlp_bias                whether gate_proj, up_proj and down_proj do
        qk_norm                 an RMSNorm over each head's queries and over its keys before the rotation (Qwen 3)
        sliding_window          how many keys (itself included) a query of a sliding-window layer sees; None: no
                                layer has a window (Mistral's and Qwen's config.json may ask for one)
        sliding_layers          per layer, whether it has that window

    Plain class attributes where the variant's config.json has no such field, properties where it has one. As in
    transformers, num_key_value_heads and head_dim left out (or null) are filled in from the other fields.
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    # grouped-query attention: each group of num_attention_heads / num_key_value_heads query heads reads one
    # key/value head; None: one each, plain multi-head attention
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # None: hidden_size / num_attention_heads (Mistral Nemo and Qwen 3 set their own)
    hidden_act: str = "silu"  # of the MLP's gate: SwiGLU
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # None: the default; else a type of parts/rotary.py's ROPE_TYPES
    attention_dropout: float = 0.0
    bos_token_id: int | None = 1
    eos_token_id: int | list | None = 2  # Llama 3.1's instruct files list several end tokens
    pad_token_id: int | None = None
    tie_word_embeddings: bool = False
    # task heads, as transformers' PretrainedConfig has them; the token classifier (transformers 5's generic one)
    # drops out classifier_dropout, else hidden_dropout, else 0.1, and has a bias unless token_classification_bias
    # says otherwise
    id2label: dict | None = None
    problem_type: str | None = None
    classifier_dropout: float | None = None
    hidden_dropout: float | None = None
    token_classification_bias: bool = True

    qkv_bias = o_proj_bias = mlp_bias = qk_norm = False
    sliding_window = None

    def __post_init__(self):
        # the defaults transformers' __post_init__ derives from the other fields (a head_dim that cannot be derived
        # stays None, and validate says why)
        heads = self.num_attention_heads
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", heads)
        if self.head_dim is None and isinstance(heads, int) and heads > 0 and self.hidden_size % heads == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // heads)

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "LlamaLikeConfig":
        """As ModelConfig.from_dict, with transformers 5's `rope_parameters` read into rope_theta and the scaling into
        rope_scaling (parts/rotary.py)."""
        return super().from_dict(rope_fields(raw, source), source)

    @classmethod
    def fixed_settings(cls) -> dict:
        return {"is_decoder": (False, f"{cls.model_type} as the decoder of an encoder is not implemented")}

    def validate(self, source: str) -> None:
        require_positive(self, source, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta")
        require_positive(self, source, *set_fields(self, "num_key_value_heads", "head_dim"))
        require_sane_sizes(self, source, "num_hidden_layers", ("vocab_size", "hidden_size"),
                            ("hidden_size", "hidden_size"), ("intermediate_size", "hidden_size"))
        require_probability(self, source, "attention_dropout")
        require_probability(self, source, *set_fields(self, "classifier_dropout", "hidden_dropout"))
        require_problem_type(self, source)
        require_grouped_heads(self, source)
        if self.head_dim is None:
            raise ConfigError(f"{source}: hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                              f"{self.num_attention_heads}, and no head_dim is given")
        if self.head_dim % 2:
            raise ConfigError(f"{source}: the rotary embedding turns pairs of a head's dimensions, and head_dim "
                              f"{self.head_dim} is odd")
        require_positive(self, source, *set_fields(self, "sliding_window"))
        require_token_id_list(self, source, "eos_token_id")
        require_activation(self, source, "hidden_act")

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer, whether its queries see only the last `sliding_window` keys: every layer where there is a
        window, unless the variant says otherwise (Qwen's layer_types)."""
        return (self.sliding_window is not None,) * self.num_hidden_layers

    @property
    def token_classifier_dropout(self) -> float:
        return generic_token_classifier_dropout(self)


class BiasedByAttentionBias:
    """A config whose config.json says with attention_bias whether q_proj, k_proj, v_proj and o_proj add a bias
    (Llama's, Gemma's, OLMo 2's, Qwen 3's): the variant declares the field, this answers LlamaLikeConfig's
    questions from it."""

    @property
    def qkv_bias(self) -> bool:
        return self.attention_bias

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias


@dataclasses.dataclass(frozen=True)
class LlamaConfig(BiasedByAttentionBias, LlamaLikeConfig):
    """Llama 1, 2 and 3 (and the many checkpoints that reuse its architecture: TinyLlama, SmolLM, Vicuna, ...)."""

    model_type = "llama"

    attention_bias: bool = False  # q_proj, k_proj, v_proj and o_proj add a bias
    mlp_bias: bool = False  # gate_proj, up_proj and down_proj add a bias
