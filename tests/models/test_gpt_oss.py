"""What only GPT-OSS has beside Llama's model (whose tests, tests/models/test_llama.py, run on GPT-OSS too: layouts,
task heads, save_pretrained read back by transformers, generation across its sliding window, half precision, the
parity report): its released config and size, attention sinks and its clamped experts met by the tests' inputs,
its experts read from MXFP4 exactly as transformers dequantizes them (bitwise) or refused, export of a model so read,
and routing edits (forbid, ablate, force) that agree with transformers' model edited to the same effect."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from helpers import assert_parity, check_causal_lm, padded_batch, randomize_, reference, write_weights
from scratch_models import GptOssConfig, GptOssForCausalLM
from scratch_models.parts.moe import forbid_experts, force_expert
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import EXPERTS, verify
from test_mixtral import meta_parameter_count
from weight_mapping import CheckpointError
from weight_mapping.mxfp4 import dequantize

# gpt-oss-20b's config.json as the hub has it (transformers 4.55 wrote it), its 24 layer_types in turn
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
               "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
               "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
               "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
               "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
               "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
               "output_router_logits": False, "pad_token_id": 199999,
               "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                                                                  "model.layers.*.mlp.router", "model.embed_tokens",
                                                                  "lm_head"], "quant_method": "mxfp4"},
               "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                                       "original_max_position_embeddings": 4096,
                                                       "rope_type": "yarn", "truncate": False},
               "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
               "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
               "vocab_size": 201088}
# MXFP4 packs 32 values a block along a matrix's input: the tiny config's hidden size and expert width made multiples
MXFP4_SIZES = dict(hidden_size=64, intermediate_size=32, head_dim=16)


def test_released_config_reads_as_transformers_reads_it():
    config = GptOssConfig.from_dict(GPT_OSS_20B)
    assert config.sliding_layers == (True, False) * 12 and config.sliding_window == 128
    assert config.rope_scaling["rope_type"] == "yarn" and config.rope_scaling["truncate"] is False
    assert (config.num_local_experts, config.num_experts_per_tok, config.swiglu_limit) == (32, 4, 7.0)
    count = meta_parameter_count("gpt_oss", GPT_OSS_20B)
    assert round(count / 1e9, 1) == 20.9  # the model card's 21B
    # transformers' defaults: layer_types alternate from a sliding layer, YaRN rope where the file gives none
    bare = GptOssConfig.from_dict({"model_type": "gpt_oss", "num_hidden_layers": 3})
    their_bare = transformers.GptOssConfig(num_hidden_layers=3)
    assert bare.layer_types == their_bare.layer_types
    assert bare.rope_scaling == {k: v for k, v in their_bare.rope_parameters.items() if k != "rope_theta"}


def test_the_tiny_inputs_meet_the_sinks_and_the_clamps(tmp_path):
    """The parity tests mean something for what GPT-OSS adds: the sinks take a share of every row (probabilities
    over the keys sum below 1), and the experts' gates and linear branches pass swiglu_limit (clamped)."""
    theirs = reference("gpt_oss")
    theirs.save_pretrained(tmp_path)
    model = GptOssForCausalLM.from_pretrained(tmp_path)
    limit = model.config.swiglu_limit
    inputs = padded_batch("gpt_oss")
    _, cache = model.run_with_cache(**inputs)
    seen = inputs["attention_mask"].bool()
    assert bool((cache["layers.1.attn.probs"].sum(-1).transpose(1, 2)[seen] < 0.99).all())
    gates = torch.cat([cache[n] for n in cache if n.endswith("pre_act")])
    ups = torch.cat([cache[n] for n in cache if n.endswith(".up")])
    assert gates.max() > limit and ups.min() < -limit and ups.max() > limit


def test_all_full_or_all_sliding_layers_match_transformers(tmp_path):
    for n, kinds in enumerate((["full_attention"] * 2, ["sliding_attention"] * 2)):
        theirs = reference("gpt_oss", layer_types=kinds)
        theirs.save_pretrained(tmp_path / str(n))
        check_causal_lm("gpt_oss", theirs, tmp_path / str(n), padded_batch("gpt_oss"))
        assert GptOssForCausalLM.from_pretrained(tmp_path / str(n)).config.layer_types == kinds


# ------------------------------------------------------------------------------------------------------ MXFP4


@pytest.mark.parametrize("dtype, low, high", [(torch.float32, 0, 253), (torch.bfloat16, 0, 253),
                                              (torch.float16, 100, 141)])
def test_dequantization_is_transformers_bitwise(dtype, low, high):
    """Random bytes for the blocks (every code in both nibbles) and the scales (every one whose values the dtype
    holds: up to 252, in float16 100 to 140): the same tensor as transformers' convert_moe_packed_tensors, bit for
    bit, subnormals included."""
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 40, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(low, high, (3, 40, 4), dtype=torch.uint8, generator=g)
    scales[0, 0, :2] = torch.tensor([low, high - 1])  # the ends of the range, certainly
    ours = dequantize(blocks, scales, dtype)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    assert ours.shape == theirs.shape == (3, 128, 40) and ours.dtype == theirs.dtype == dtype
    assert torch.equal(ours.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       theirs.view(torch.int16 if dtype != torch.float32 else torch.int32))


@pytest.mark.parametrize("scale, dtype, message", [
    (255, torch.float32, "a scale byte is 255, E8M0's NaN"),
    (254, torch.float32, r"MXFP4 values beyond torch.float32's range \(largest 3.40282e\+38\) would load as inf"),
    (160, torch.float16, r"MXFP4 values beyond torch.float16's range \(largest 65504\) would load as inf"),
])
def test_what_cannot_load_exactly_is_refused(scale, dtype, message):
    blocks = torch.full((1, 2, 1, 16), 0x77, dtype=torch.uint8)  # 6.0 in both nibbles
    scales = torch.full((1, 2, 1), 127, dtype=torch.uint8)
    scales[0, 1, 0] = scale
    with pytest.raises(CheckpointError, match=f"the/file: {message}"):
        dequantize(blocks, scales, dtype, name="the/file")


def mxfp4_checkpoint(directory, seed: int = 0):
    """transformers' tiny GPT-OSS (MXFP4_SIZES) written as the releases are: experts' matrices as MXFP4 blocks and
    scales (random, of a size like the other weights'), everything else in bfloat16, config.json's
    quantization_config as published. Returns the directory."""
    theirs = reference("gpt_oss", **MXFP4_SIZES)
    state = {key: tensor.detach().to(torch.bfloat16) for key, tensor in theirs.state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    for key in [key for key in state if key.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = state.pop(key).shape
        state[f"{key}_blocks"] = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), dtype=torch.uint8,
                                               generator=g)
        state[f"{key}_scales"] = torch.randint(119, 126, (experts, outputs, inputs // 32), dtype=torch.uint8,
                                               generator=g)
    theirs.config.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    config |= {"quantization_config": GPT_OSS_20B["quantization_config"], "dtype": "bfloat16"}
    (directory / "config.json").write_text(json.dumps(config))
    write_weights(state, directory, "safetensors")
    return directory


def transformers_dequantized(directory, dtype):
    """transformers' GptOssForCausalLM from an MXFP4 `directory` on this CPU: dequantized (its reference path)."""
    model, info = transformers.GptOssForCausalLM.from_pretrained(
        directory, dtype=dtype, attn_implementation="eager", experts_implementation=EXPERTS,
        quantization_config=transformers.Mxfp4Config(dequantize=True), output_loading_info=True)
    assert not any(info.values()), info
    return model.eval()


def expert_tensors(model) -> dict[str, torch.Tensor]:
    return {key: tensor for key, tensor in model.state_dict().items() if ".experts." in key}


def test_an_mxfp4_checkpoint_loads_to_transformers_weights_and_logits(tmp_path):
    """The released layout read: in the file's dtype (bfloat16) and cast to float32, every expert weight is
    transformers' bit for bit; the parity report on a padded batch (every compared hook and the logits) passes in
    float32 and in bfloat16."""
    directory = mxfp4_checkpoint(tmp_path / "mxfp4")
    for dtype in (None, torch.float32):
        theirs = transformers_dequantized(directory, dtype or torch.bfloat16)
        ours = GptOssForCausalLM.from_pretrained(directory, dtype=dtype)
        their_state = {key.removeprefix("model."): t for key, t in theirs.state_dict().items()}
        for key, tensor in ours.state_dict().items():
            if ".experts." in key:
                assert torch.equal(tensor, their_state[key]), key
        assert {t.dtype for t in ours.state_dict().values()} == {dtype or torch.bfloat16}
        assert ours.loading_info.loaded["layers.1.mlp.experts.down_proj"] == "model.layers.1.mlp.experts.down_proj"
    for dtype in ("float32", "bfloat16"):  # ours from the MXFP4 file against transformers' dequantized, every row
        report = verify(str(directory), inputs=padded_batch("gpt_oss"), dtype=dtype)
        assert report.passed, report.format()
        assert report.rows[-1].name == "logits"


def test_a_model_read_from_mxfp4_exports_its_experts_dequantized(tmp_path):
    """What save_pretrained writes of an MXFP4 read: the experts as plain tensors in the model's dtype (bfloat16
    here), no quantization_config; transformers reads that file to the weights it dequantized itself."""
    directory = mxfp4_checkpoint(tmp_path / "mxfp4")
    GptOssForCausalLM.from_pretrained(directory).save_pretrained(tmp_path / "out")
    written = load_file(tmp_path / "out" / "model.safetensors")
    assert written["model.layers.0.mlp.experts.gate_up_proj"].dtype == torch.bfloat16
    assert not any(key.endswith(("_blocks", "_scales")) for key in written)
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    back, info = transformers.GptOssForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True,
                                                                experts_implementation=EXPERTS)
    assert not any(info.values()), info
    dequantized = expert_tensors(transformers_dequantized(directory, torch.bfloat16))
    assert all(torch.equal(tensor, dequantized[key]) for key, tensor in expert_tensors(back).items())


def test_mxfp4_files_that_do_not_fit_are_refused_by_name(tmp_path):
    directory = mxfp4_checkpoint(tmp_path)
    state = load_file(directory / "model.safetensors")
    nan = dict(state)
    nan["model.layers.1.mlp.experts.down_proj_scales"] = nan["model.layers.1.mlp.experts.down_proj_scales"].clone()
    nan["model.layers.1.mlp.experts.down_proj_scales"][2, 5, 0] = 255
    write_weights(nan, directory, "safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.experts\.down_proj: a scale byte is 255"):
        GptOssForCausalLM.from_pretrained(directory)
    del state["model.layers.0.mlp.experts.gate_up_proj_scales"]
    write_weights(state, directory, "safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.experts\.gate_up_proj_blocks holds MXFP4 "
                                              "blocks, and the file has no model.layers.0.mlp.experts.gate_up_proj_"
                                              "scales"):
        GptOssForCausalLM.from_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(CheckpointError, match="a quantized checkpoint .quantization_config, quant_method 'gptq'."):
        GptOssForCausalLM.from_pretrained(directory)


# ---------------------------------------------------------------------------------------------------- experts


def test_routing_edits_agree_with_transformers_edited_to_the_same_effect(tmp_path):
    """Forbidding an expert (router_logits at -inf) is transformers with that expert's router bias at -inf;
    ablating one (its `proj` zeroed) is transformers with its down_proj and bias zeroed; forcing one weights it by
    the softmax of the chosen logits."""
    theirs = reference("gpt_oss")
    theirs.save_pretrained(tmp_path)
    model = GptOssForCausalLM.from_pretrained(tmp_path)
    inputs = padded_batch("gpt_oss")
    seen = inputs["attention_mask"].bool()
    _, plain = model.run_with_cache(**inputs, names=["layers.0.mlp.chosen", "layers.1.mlp.chosen"])
    assert (plain["layers.0.mlp.chosen"] == 2).any() and (plain["layers.1.mlp.chosen"] == 3).any()
    with torch.no_grad():
        hooks = [("layers.0.mlp.router_logits", forbid_experts(2)),
                 ("layers.1.mlp.experts.3.proj", lambda t, _: torch.zeros_like(t))]
        forbidden = model.run_with_hooks(**inputs, hooks=hooks).logits
        theirs.model.layers[0].mlp.router.bias[2] = float("-inf")
        theirs.model.layers[1].mlp.experts.down_proj[3] = 0
        theirs.model.layers[1].mlp.experts.down_proj_bias[3] = 0
        edited = theirs(**inputs).logits
    assert_parity(forbidden[seen], edited[seen], "forbidden and ablated")
    where = torch.zeros_like(seen)
    where[0, 3:6] = True
    _, cache = model.run_with_cache(**inputs, hooks=[("layers.1.mlp.chosen", force_expert(4, where))],
                                    names=["layers.1.mlp.router_logits", "layers.1.mlp.chosen",
                                           "layers.1.mlp.routing_weights"])
    chosen = cache["layers.1.mlp.chosen"]
    assert bool((chosen[where] == 4).any(-1).all())
    assert_parity(cache["layers.1.mlp.routing_weights"],
                  torch.softmax(cache["layers.1.mlp.router_logits"].gather(-1, chosen), -1), "forced weights")


def test_a_forward_pass_reads_only_the_experts_its_tokens_are_routed_to():
    """The experts no token is routed to hold NaN in the fused tensors: the logits are unchanged, so those slices
    were never read."""
    torch.manual_seed(0)
    model = randomize_(GptOssForCausalLM(FAMILIES["gpt_oss"].tiny()), 0.3).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=[f"layers.{i}.mlp.chosen" for i in range(2)])
        expected = model(ids).logits
        unused = 0
        for i, layer in enumerate(model.layers):
            for e in range(len(layer.mlp.experts)):
                if not (cache[f"layers.{i}.mlp.chosen"] == e).any():
                    unused += 1
                    for tensor in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                        tensor[e] = float("nan")
        assert unused, "some expert is left out on these tokens"
        assert torch.equal(model(ids).logits, expected)
