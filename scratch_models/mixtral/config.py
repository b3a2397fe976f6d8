"""Mixtral's config.json fields: Mistral's (LlamaLikeConfig) with Mixtral's defaults and its experts."""

import dataclasses

from ..llama.config import LlamaLikeConfig
from ..parts.config import ConfigError, require_positive, require_probability


@dataclasses.dataclass(frozen=True)
class MixtralConfig(LlamaLikeConfig):
    """Mixtral 8x7B and 8x22B as transformers' MixtralConfig reads them: Mistral's attention (no biases; a sliding
    window in every layer where sliding_window is set, null in the releases), and each layer's MLP a mixture of
    num_local_experts gated experts of width intermediate_size, each token routed to num_experts_per_tok of them
    (their softmax weights renormalised over the chosen). transformers 5 also reads `num_experts` for
    num_local_experts; so do we, and save it as num_local_experts.

    output_router_logits: transformers then adds a load-balancing loss (router_aux_loss_coef times it) to the LM
    loss; ours has none, so a loss asked of such a model is refused (parts/moe.py, refuse_aux_loss)."""

    model_type = "mixtral"

    intermediate_size: int = 14336
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: int | None = None
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    router_jitter_noise: float = 0.0  # training only: the router's input times noise in [1 - j, 1 + j]
    output_router_logits: bool = False

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "MixtralConfig":
        if isinstance(raw, dict) and "num_experts" in raw and "num_local_experts" not in raw:
            raw = {("num_local_experts" if k == "num_experts" else k): v for k, v in raw.items()}
        return super().from_dict(raw, source)

    def validate(self, source: str) -> None:
        super().validate(source)
        require_experts(self, source, "num_local_experts")
        require_probability(self, source, "router_jitter_noise")


def require_experts(config, source: str, experts_field: str) -> None:
    """A mixture's counts: num_experts_per_tok of the `experts_field` experts, at least one."""
    require_positive(config, source, experts_field, "num_experts_per_tok")
    if config.num_experts_per_tok > getattr(config, experts_field):
        raise ConfigError(f"{source}: num_experts_per_tok {config.num_experts_per_tok} is more than the "
                          f"{getattr(config, experts_field)} experts ({experts_field})")
