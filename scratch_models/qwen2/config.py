"""Qwen2's config.json fields: Llama's (LlamaLikeConfig) with Qwen 2's defaults, and its sliding window with the
layers it applies to, read as transformers 5 reads them."""

import dataclasses

from ..llama.config import LlamaLikeConfig
from ..parts.config import LAYER_TYPES, require_layer_types


@dataclasses.dataclass(frozen=True)
class Qwen2Config(LlamaLikeConfig):
    """Qwen 2 and Qwen 2.5 as transformers' Qwen2Config reads them: q_proj, k_proj and v_proj always add a bias and
    o_proj and the MLP never do (transformers' modules fix them; config.json has no field for them).

    The sliding window: with use_sliding_window, the layers from max_window_layers on see only the last
    sliding_window keys, unless layer_types names each layer's kind ("full_attention" or "sliding_attention");
    without it sliding_window is null and no layer has a window, whatever layer_types says (as transformers'
    __post_init__ sets them, and as it saves them). The released checkpoints set use_sliding_window false."""

    model_type = "qwen2"

    vocab_size: int = 151936
    intermediate_size: int = 22016
    num_key_value_heads: int | None = 32
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    layer_types: list | None = None

    qkv_bias = True

    def __post_init__(self):
        super().__post_init__()
        if not self.use_sliding_window:
            object.__setattr__(self, "sliding_window", None)
        if self.layer_types is None and isinstance(self.num_hidden_layers, int):
            object.__setattr__(self, "layer_types", [
                LAYER_TYPES[self.sliding_window is not None and i >= self.max_window_layers]
                for i in range(self.num_hidden_layers)])

    def validate(self, source: str) -> None:
        super().validate(source)
        require_layer_types(self, source, "there is no window: sliding_window is null or use_sliding_window false")

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        return tuple(kind == "sliding_attention" for kind in self.layer_types)
