"""Gemma's config.json fields (gemma-2b, 7b and their -it versions, CodeGemma, the first release): the Llama-like
fields (scratch_models/llama/config.py) with transformers' GemmaConfig defaults (gemma-7b's).

The hub files say `"hidden_act": "gelu"`, which the releases meant as the tanh approximation: read as
`gelu_pytorch_tanh`, as transformers does (and saved so). Gemma 2 (`gemma2`) and Gemma 3 (`gemma3_text`) are other
families.
"""

import dataclasses

from ..llama.config import BiasedByAttentionBias, LlamaLikeConfig
from ..parts.config import ConfigError


@dataclasses.dataclass(frozen=True)
class GemmaConfig(BiasedByAttentionBias, LlamaLikeConfig):
    model_type = "gemma"

    vocab_size: int = 256_000
    hidden_size: int = 3072
    intermediate_size: int = 24_576
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16  # gemma-2b: 1 (multi-query attention)
    head_dim: int | None = 256  # given, not hidden / heads (gemma-2b: 8 heads of 256 over a hidden of 2048)
    hidden_act: str = "gelu_pytorch_tanh"  # of the MLP's gate: GeGLU
    max_position_embeddings: int = 8192
    attention_bias: bool = False  # q_proj, k_proj, v_proj and o_proj add a bias
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list | None = 1
    tie_word_embeddings: bool = True

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "GemmaConfig":
        if isinstance(raw, dict) and raw.get("hidden_act") == "gelu":  # the releases' legacy value
            raw = raw | {"hidden_act": "gelu_pytorch_tanh"}
        if isinstance(raw, dict) and raw.get("use_bidirectional_attention"):
            raise ConfigError(f"{source}: use_bidirectional_attention=true (attending both ways) is not implemented; "
                              "Gemma here is causal")
        return super().from_dict(raw, source)

    def validate(self, source: str) -> None:
        super().validate(source)
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"{source}: pad_token_id {self.pad_token_id} is not an id of the vocabulary "
                              f"0..{self.vocab_size - 1} (the embedding's padding row, which training leaves alone)")
