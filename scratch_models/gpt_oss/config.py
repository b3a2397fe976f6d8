"""GPT-OSS's config.json fields: Llama's (LlamaLikeConfig) with GPT-OSS's defaults (gpt-oss-120b's), its alternating
sliding-window layers, YaRN rope and its mixture of clamped-SwiGLU experts."""

import dataclasses

from ..llama.config import BiasedByAttentionBias, LlamaLikeConfig
from ..mixtral.config import require_experts
from ..parts.config import require_layer_types, require_positive

# transformers' default rope for GPT-OSS (what the releases' config.json spell out too)
YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}


@dataclasses.dataclass(frozen=True)
class GptOssConfig(BiasedByAttentionBias, LlamaLikeConfig):
    """gpt-oss-20b and gpt-oss-120b as transformers' GptOssConfig reads them: grouped-query attention with biases on
    q, k, v and o (attention_bias) and a learned sink logit per head; layers of the kinds layer_types names, by
    default sliding_attention (a window of sliding_window keys) and full_attention in turn, the first sliding; YaRN
    rotary angles (rope_scaling, or transformers 5's rope_parameters; YARN when config.json gives neither); each
    layer's MLP a mixture of num_local_experts experts of width intermediate_size, num_experts_per_tok per token,
    each a SwiGLU whose gate is clamped above and linear branch on both sides at swiglu_limit, its sigmoid's gain
    swiglu_alpha. transformers 5 also reads `num_experts` for num_local_experts; so do we, and save it as
    num_local_experts. The released files' quantization_config (MXFP4 experts) is read by the model class
    (scratch_models/gpt_oss/model.py), not kept: what we save is dequantized.

    output_router_logits: transformers then adds a load-balancing loss to the LM loss; ours has none, so a loss
    asked of such a model is refused (parts/moe.py, refuse_aux_loss)."""

    model_type = "gpt_oss"

    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_hidden_layers: int = 36
    num_attention_heads: int = 64
    num_key_value_heads: int | None = 8
    head_dim: int | None = 64
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    rope_scaling: dict | None = dataclasses.field(default_factory=lambda: dict(YARN))
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    attention_bias: bool = True
    sliding_window: int | None = 128
    layer_types: list | None = None
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    router_aux_loss_coef: float = 0.001
    output_router_logits: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.layer_types is None and isinstance(self.num_hidden_layers, int):
            object.__setattr__(self, "layer_types", [
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(self.num_hidden_layers)])

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config") -> "GptOssConfig":
        if isinstance(raw, dict) and "num_experts" in raw and "num_local_experts" not in raw:
            raw = {("num_local_experts" if k == "num_experts" else k): v for k, v in raw.items()}
        if isinstance(raw, dict) and not {"rope_scaling", "rope_parameters"} & raw.keys():
            raw = raw | {"rope_scaling": dict(YARN)}  # transformers' default, which a hand-written file may leave out
        return super().from_dict(raw, source)

    def validate(self, source: str) -> None:
        super().validate(source)
        require_experts(self, source, "num_local_experts")
        require_positive(self, source, "swiglu_alpha", "swiglu_limit")
        require_layer_types(self, source)

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        return tuple(kind == "sliding_attention" for kind in self.layer_types)
