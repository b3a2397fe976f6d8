"""The registry of model families: a family is a package of scratch_models that declares `FAMILY` (see family.py),
and is registered by its name here, once."""

import importlib
import reprlib

from weight_mapping import EMBEDDED_NAME, Checkpoint, CheckpointError, embedded_checkpoint, read_config_json

from .family import Family, architectures

FAMILY_PACKAGES = ("bert", "gpt2", "gpt_neox", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2")

FAMILIES: dict[str, Family] = {family.name: family for family in
                               (importlib.import_module(f"{__package__}.{name}").FAMILY for name in FAMILY_PACKAGES)}

# model_type of a bigger model (multimodal) -> the family that reads the language model inside it
WRAPPED: dict[str, Family] = {model_type: family for family in FAMILIES.values()
                              for model_type in family.wrapped_model_types}

# Models near the supported families that none of them builds, by config.json's model_type: what each is, so the
# refusal says it (a mixture of experts, a model that also reads images), rather than "not supported" alone
NOT_BUILT = {
    "mixtral": "Mixtral, a mixture of experts (each layer's MLP is several experts, a router picking some per token)",
    "qwen2_moe": "Qwen2-MoE, a mixture of experts (each layer's MLP is many experts, a router picking some per token, "
                 "and a shared expert)",
    "qwen3_moe": "Qwen3-MoE, a mixture of experts (each layer's MLP is many experts, a router picking some per token)",
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
    before anything is built or read, so no model is ever half loaded from it."""
    supported = ", ".join(FAMILIES)
    quantization = raw.get("quantization_config")
    # a multimodal file whose language model a family reads
    wrapped = isinstance(raw.get("model_type"), str) and raw["model_type"] in WRAPPED
    if quantization is not None:
        method = quantization.get("quant_method", "unnamed") if isinstance(quantization, dict) else "unnamed"
        what = (f"a quantized checkpoint (quantization_config, quant_method {reprlib.repr(method)}): its weights are "
                "stored packed, with scales, which these models do not read; load the checkpoint it was quantized "
                "from (dtype= casts that one while loading)")
    elif isinstance(raw.get("model_type"), str) and raw["model_type"] in NOT_BUILT:  # a wrong kind: said later
        what = f"model_type {raw['model_type']!r} is {NOT_BUILT[raw['model_type']]}"
    elif _counts(raw, "num_local_experts", "num_experts", "n_routed_experts"):
        what = "a mixture of experts (config.json counts several experts per layer)"
    elif not wrapped and any(key in raw for key in ("vision_config", "audio_config")):
        what = f"a multimodal model (config.json has a {next(k for k in ('vision_config', 'audio_config') if k in raw)})"
    else:
        return
    raise CheckpointError(f"{config_path}: {what}, which none of the families here builds; supported: {supported}")


def _counts(raw: dict, *fields: str) -> bool:
    return any(isinstance(raw.get(field), int) and not isinstance(raw.get(field), bool) and raw[field] > 1
               for field in fields)


def family_of(checkpoint: Checkpoint) -> Family:
    """The family of an open checkpoint, from its config.json: its model_type, else the family of the class its
    `architectures` names (a config written by hand or by an old tool may lack model_type). A CheckpointError names
    anything else, and says what a model no family builds is (refuse_unbuilt)."""
    raw, config_path = checkpoint.config_json, checkpoint.config_path
    refuse_unbuilt(raw, config_path)
    supported = ", ".join(FAMILIES)
    model_type = raw.get("model_type")
    if model_type is not None:
        if isinstance(model_type, str) and model_type in WRAPPED:
            return WRAPPED[model_type]
        if model_type not in FAMILIES:
            raise CheckpointError(f"{config_path}: model_type {model_type!r} is not supported; supported: {supported}")
        return FAMILIES[model_type]
    named = architectures(raw)
    for family in FAMILIES.values():
        if any(cls.__name__ in named for cls in family.classes):
            return family
    said = f"its architectures name {', '.join(named)}" if named else "and no architectures"
    raise CheckpointError(f"{config_path}: no model_type, {said}, which is none of the supported families' classes "
                          f"({supported})")


def offline_advice(family: Family | None) -> str:
    """What to use offline in place of a hub checkpoint of `family` that is not cached (None: a family not known):
    `scratch-models tiny`, and the embedded real checkpoint where it is of that family."""
    embedded = _embedded_family()
    real = (f"`{EMBEDDED_NAME}`, the real {FAMILIES[embedded].title} all-MiniLM-L6-v2 that comes with this package "
            "(offline)") if embedded in FAMILIES else ""
    if family is None:
        return (f"To try the commands offline, `scratch-models tiny FAMILY DIR` writes a small random model with a "
                f"tokenizer (FAMILY: {', '.join(FAMILIES)}) to use in its place" + (f"; or use {real}" if real else ""))
    return (f"To try it offline, `scratch-models tiny {family.name} DIR` writes a small random {family.title} model "
            f"with a tokenizer to use in its place" + (f"; or use {real}" if embedded == family.name else ""))


def _embedded_family() -> str | None:
    """The model_type of the embedded checkpoint (`minilm`), None where its package is not installed."""
    try:
        return read_config_json(embedded_checkpoint() / "config.json").get("model_type")
    except CheckpointError:
        return None
