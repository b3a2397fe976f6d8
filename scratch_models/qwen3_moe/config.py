"""Qwen3-MoE's config.json fields: Qwen 3's attention (LlamaLikeConfig with q and k norms) and its experts."""

import dataclasses

from ..llama.config import BiasedByAttentionBias, LlamaLikeConfig
from ..mixtral.config import require_experts
from ..parts.config import ConfigError, require_positive


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(BiasedByAttentionBias, LlamaLikeConfig):
    """Qwen 3's mixtures of experts (Qwen3-30B-A3B, Qwen3-235B-A22B) as transformers' Qwen3MoeConfig reads them:
    Qwen 3's attention (an RMSNorm over each head's queries and keys before the rotation; biases on q, k, v and o
    only where attention_bias says so), and each layer's MLP either a mixture of num_experts gated experts of width
    moe_intermediate_size, each token routed to num_experts_per_tok of them, or a dense gated MLP of width
    intermediate_size: a layer is a mixture unless mlp_only_layers names it, and only every decoder_sparse_step-th
    (layer i where (i + 1) % decoder_sparse_step == 0). The chosen experts' softmax weights are renormalised over
    them only where norm_topk_prob is set (the releases set it). With use_sliding_window every layer sees only the
    last sliding_window keys (transformers' Qwen3-MoE ignores max_window_layers); without it sliding_window is null.
    transformers 5 also reads `num_local_experts` for num_experts; so do we, and save it as num_experts.

    output_router_logits: transformers then adds a load-balancing loss to the LM loss; ours has none, so a loss
    asked of such a model is refused (parts/moe.py, refuse_aux_loss)."""

    model_type = "qwen3_moe"

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 24
    num_key_value_heads: int | None = 4
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    decoder_sparse_step: int = 1
    moe_intermediate_size: int = 768
    num_experts_per_tok: int = 8
    num_experts: int = 128
    norm_topk_prob: bool = False
    mlp_only_layers: list | None = None
    output_router_logits: bool = False

    qk_norm = True

    def __post_init__(self):
        super().__post_init__()
        if not self.use_sliding_window:
            object.__setattr__(self, "sliding_window", None)
        if self.mlp_only_layers is None:
            object.__setattr__(self, "mlp_only_layers", [])

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "Qwen3MoeConfig":
        if isinstance(raw, dict) and "num_local_experts" in raw and "num_experts" not in raw:
            raw = {("num_experts" if k == "num_local_experts" else k): v for k, v in raw.items()}
        return super().from_dict(raw, source)

    def validate(self, source: str) -> None:
        super().validate(source)
        require_experts(self, source, "num_experts")
        require_positive(self, source, "moe_intermediate_size", "decoder_sparse_step")
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.mlp_only_layers):
            raise ConfigError(f"{source}: field 'mlp_only_layers' should list layer indices, got "
                              f"{self.mlp_only_layers!r}")

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer, whether its MLP is the mixture of experts (else a dense gated MLP), as transformers decides."""
        return tuple(i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0
                     for i in range(self.num_hidden_layers))
