"""Mistral's config.json fields: Llama's (LlamaLikeConfig) with Mistral 7B's defaults and a sliding window."""

import dataclasses

from ..llama.config import LlamaLikeConfig


@dataclasses.dataclass(frozen=True)
class MistralConfig(LlamaLikeConfig):
    """Mistral 7B and its successors (Mistral Nemo, Ministral's text models, Codestral) as transformers' MistralConfig
    reads them: no biases anywhere (transformers' modules have none; config.json has no field for them), and, where
    sliding_window is set (Mistral 7B v0.1: 4096, the default), every layer's queries see only that many keys."""

    model_type = "mistral"

    intermediate_size: int = 14336
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    sliding_window: int | None = 4096  # None (v0.2 and later): every key before the query
