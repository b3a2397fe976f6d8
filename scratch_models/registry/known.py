"""Which model families are built here, and what the models near them that none builds are.

Below both the registry (families.py, which imports each package named here) and a family's declaration (family.py,
which refuses what no family builds before reading a config as its own), so neither needs the other.
"""

import reprlib

from weight_mapping import CheckpointError

# the registered families: a package of scratch_models each, whose name is its config.json model_type
FAMILY_PACKAGES = ("bert", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                   "olmo2", "olmo3", "phi3", "mixtral", "qwen3_moe", "gpt_oss")
# model_type of a bigger (multimodal) model -> the registered family that reads the language model inside it
WRAPPED = {"gemma3": "gemma3_text"}
# the registered families whose MLPs are mixtures of experts (their tables repeat "{e}" rows): an expert count in
# their config.json is their own, in any other a model none of them builds
MIXTURES = ("mixtral", "qwen3_moe", "gpt_oss")
# registered family -> the quantizations (quantization_config's quant_method) its model class reads back to the very
# weights transformers computes with when it dequantizes them (PretrainedModel.unpacked); any other is refused
DEQUANTIZED: dict[str, tuple[str, ...]] = {"gpt_oss": ("mxfp4",)}


# Models near the supported families that none of them builds, by config.json's model_type: what each is, so the
# refusal says it (a mixture of experts, a model that also reads images), rather than "not supported" alone
NOT_BUILT = {
    "qwen2_moe": "Qwen2-MoE, a mixture of experts (each layer's MLP is many experts, a router picking some per token, "
                 "and a shared expert)",
    "llava": "LLaVA, a multimodal model (a vision tower and a projector in front of a language model)",
    "llava_next": "LLaVA-NeXT, a multimodal model (a vision tower and a projector in front of a language model)",
    "qwen2_vl": "Qwen2-VL, a multimodal model (a vision tower beside its language model, rotary positions in three "
                "axes)",
    "qwen2_5_vl": "Qwen2.5-VL, a multimodal model (a vision tower beside its language model, rotary positions in "
                  "three axes)",
    "mllama": "Llama 3.2 Vision, a multimodal model (cross-attention layers reading a vision tower)",
}


def refuse_unbuilt(raw: dict, config_path) -> None:
    """A CheckpointError naming what config.json `raw` describes, and the families that are supported, when it is a
    model none of them builds although its tensors may look like one's: a quantized checkpoint (quantization_config:
    GPTQ, AWQ, bitsandbytes, ... store packed integers and scales in place of the weights), a mixture of experts, a
    multimodal model (a vision or audio tower beside the language model), or a model_type in NOT_BUILT. Refused
    before anything is built or read, so no model is ever half loaded from it. A registered mixture of experts
    (MIXTURES), a quantization its family reads exactly (DEQUANTIZED) and a multimodal file whose language model a
    family reads (WRAPPED) are not refused here."""
    supported = ", ".join(FAMILY_PACKAGES)
    quantization = raw.get("quantization_config")
    model_type = raw.get("model_type") if isinstance(raw.get("model_type"), str) else None
    wrapped = model_type in WRAPPED
    method = quantization.get("quant_method", "unnamed") if isinstance(quantization, dict) else "unnamed"
    if quantization is not None and method not in DEQUANTIZED.get(model_type, ()):
        what = (f"a quantized checkpoint (quantization_config, quant_method {reprlib.repr(method)}): its weights are "
                "stored packed, with scales, which these models do not read; load the checkpoint it was quantized "
                "from (dtype= casts that one while loading)")
    elif isinstance(raw.get("model_type"), str) and raw["model_type"] in NOT_BUILT:  # a wrong kind: said later
        what = f"model_type {raw['model_type']!r} is {NOT_BUILT[raw['model_type']]}"
    elif raw.get("model_type") not in MIXTURES and _counts(raw, "num_local_experts", "num_experts",
                                                             "n_routed_experts"):
        what = "a mixture of experts (config.json counts several experts per layer)"
    elif not wrapped and any(key in raw for key in ("vision_config", "audio_config")):
        what = f"a multimodal model (config.json has a {next(k for k in ('vision_config', 'audio_config') if k in raw)})"
    else:
        return
    raise CheckpointError(f"{config_path}: {what}, which none of the families here builds; supported: {supported}")


def _counts(raw: dict, *fields: str) -> bool:
    return any(isinstance(raw.get(field), int) and not isinstance(raw.get(field), bool) and raw[field] > 1
               for field in fields)
