"""What only Mixtral has beside Llama's model (whose tests, tests/models/test_llama.py, run on Mixtral too: layouts,
task heads, save_pretrained read back by transformers, generation across its sliding window, half precision, the
parity report): its released config and size, the released files' per-expert keys (transformers 5 fuses them once
loaded) read and written, a missing expert named, and routing that picks transformers' experts even at an exact
tie. The mixture itself is tests/models/test_moe.py's."""

import json

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import check_causal_lm, padded_batch, reference, save
from scratch_models import ConfigError, MixtralConfig, MixtralForCausalLM
from scratch_models.registry.families import FAMILIES
from weight_mapping import CheckpointError

# Mixtral-8x7B-v0.1's config.json as the hub has it (transformers 4.36 wrote it)
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
                "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
                "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
                "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": None,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0",
                "use_cache": True, "vocab_size": 32000}


def meta_parameter_count(family: str, raw: dict) -> int:
    """Our LM and transformers' built on the meta device from config.json `raw`: the same number of parameters
    (transformers 5 holds each layer's experts fused, so the count is compared, not the names); returns it."""
    declared = FAMILIES[family]
    their_config = getattr(transformers, declared.config_class.__name__)(**{k: v for k, v in raw.items()
                                                                           if k != "architectures"})
    with torch.device("meta"):
        ours = declared.lm(declared.config_class.from_dict(raw))
        theirs = getattr(transformers, declared.lm.__name__)(their_config)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    return count


def test_released_config_reads_as_transformers_reads_it():
    config = MixtralConfig.from_dict(MIXTRAL_8X7B)
    assert (config.num_local_experts, config.num_experts_per_tok, config.sliding_window) == (8, 2, None)
    assert meta_parameter_count("mixtral", MIXTRAL_8X7B) == 46_702_792_704
    # transformers 5 also reads num_experts for num_local_experts
    assert MixtralConfig.from_dict({k: v for k, v in MIXTRAL_8X7B.items() if k != "num_local_experts"}
                                   | {"num_experts": 4}).num_local_experts == 4


@pytest.mark.parametrize("changes, message", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 is more than the 8 experts .num_local_experts."),
    ({"num_local_experts": 0}, "field 'num_local_experts' must be positive"),
    ({"router_jitter_noise": 1.5}, r"field 'router_jitter_noise' must be in \[0, 1\)"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        MixtralConfig.from_dict(MIXTRAL_8X7B | changes, source="config.json")


def test_the_files_hold_one_key_per_expert_read_and_written_so(tmp_path):
    """transformers 5 saves block_sparse_moe.experts.{e}.w1/w2/w3 and block_sparse_moe.gate (its modules: one
    fused mlp.experts.gate_up_proj); ours reads those and writes the same keys back, tensor for tensor."""
    theirs = reference("mixtral")
    save(theirs, tmp_path / "in")
    model = MixtralForCausalLM.from_pretrained(tmp_path / "in")
    model.save_pretrained(tmp_path / "out")
    written, read = (load_file(tmp_path / d / "model.safetensors") for d in ("out", "in"))
    assert "model.layers.1.block_sparse_moe.experts.4.w3.weight" in written
    assert not any("gate_up_proj" in key or ".mlp." in key for key in written)
    assert written.keys() == read.keys() and all(torch.equal(written[k], read[k]) for k in read)
    assert torch.equal(model.layers[1].mlp.experts[4].up_proj.weight,
                       theirs.model.layers[1].mlp.experts.gate_up_proj[4, 16:])


def test_a_missing_expert_is_named(tmp_path):
    save(reference("mixtral"), tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) missing[\s\S]*layers\.1\.block_sparse_moe\.experts\.2\."
                                              r"w3\.weight \(16, 48\) \(our layers\.1\.mlp\.experts\.2\.up_proj"):
        MixtralForCausalLM.from_pretrained(tmp_path)


def test_a_file_with_more_experts_than_its_config_names_them(tmp_path):
    save(reference("mixtral"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_local_experts": 4}))
    with pytest.raises(CheckpointError, match=r"block_sparse_moe\.gate\.weight: \(5, 48\) in the checkpoint, "
                                              r"\(4, 48\) expected[\s\S]*6 unexpected[\s\S]*layers\.1\."
                                              r"block_sparse_moe\.experts\.4\.w1\.weight \(16, 48\): expert 4, "
                                              "past config\\.json's num_local_experts=4"):
        MixtralForCausalLM.from_pretrained(tmp_path)


def test_an_exact_tie_between_experts_routes_as_transformers_does(tmp_path):
    """Two experts with the same router row score every token the same: top-k breaks the tie, and ours breaks it as
    transformers' does (the same probabilities into the same torch.topk), so every hook, the chosen experts
    included, matches. (A tie that rounding breaks differently would show as `mlp.chosen` in the report.)"""
    theirs = reference("mixtral")
    with torch.no_grad():
        for layer in theirs.model.layers:
            layer.mlp.gate.weight[3] = layer.mlp.gate.weight[1]
    check_causal_lm("mixtral", theirs, save(theirs, tmp_path), padded_batch("mixtral"))
    model = MixtralForCausalLM.from_pretrained(tmp_path)
    _, cache = model.run_with_cache(**padded_batch("mixtral"), names=["layers.0.mlp.chosen"])
    chosen = cache["layers.0.mlp.chosen"]
    # the tie decides something here: tokens that take one of the two and not the other
    assert bool(((chosen == 1).any(-1) ^ (chosen == 3).any(-1)).any())
