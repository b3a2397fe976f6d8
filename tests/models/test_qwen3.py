"""What only Qwen3 has beside Llama (whose tests, tests/models/test_llama.py, run on Qwen3 too): its released config
(head_dim 128, not hidden / heads), the norms of each head's queries and keys before the rotation (against
transformers' q_norm and k_norm, their opt-in statistics, a file without them), attention biases on and off."""

import json

import pytest
import torch

from helpers import assert_parity, check_causal_lm, padded_batch, reference, save
from scratch_models import Qwen3Config, Qwen3ForCausalLM
from test_llama import meta_parameter_count
from weight_mapping import CheckpointError

# Qwen3-0.6B's config.json as the hub has it (transformers 4.51 wrote it)
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
             "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
             "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
             "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
             "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
             "use_sliding_window": False, "vocab_size": 151936}


def test_released_config_reads_as_transformers_reads_it():
    config = Qwen3Config.from_dict(QWEN3_06B)
    assert config.head_dim == 128 != config.hidden_size // config.num_attention_heads
    assert config.qk_norm and not config.qkv_bias and not any(config.sliding_layers)
    assert meta_parameter_count("qwen3", QWEN3_06B) == 596_049_920


@pytest.mark.parametrize("bias", [True, False])
def test_query_and_key_norms_are_transformers_q_norm_and_k_norm(tmp_path, bias):
    """Each head's queries and keys through an RMSNorm over d before the rotation: our attn.q_unrotated is
    transformers' q_norm output (which it computes in [b, s, n, d], transposed), bit for bit; the norm's opt-in
    scale and normalized points are the divisor and the normalised queries, in our layout."""
    theirs = reference("qwen3", attention_bias=bias)
    directory = save(theirs, tmp_path)
    check_causal_lm("qwen3", theirs, directory, padded_batch("qwen3"))
    model = Qwen3ForCausalLM.from_pretrained(directory)
    assert (model.layers[0].attn.o_proj.bias is not None) == bias
    ids = torch.arange(1, 10)[None]
    theirs.set_attn_implementation("sdpa")  # as ours runs without probabilities asked: the same attention kernels
    captured = {}
    handles = [getattr(theirs.model.layers[1].self_attn, name).register_forward_hook(
        lambda module, args, out, name=name: captured.__setitem__(name, out)) for name in ("q_norm", "k_norm")]
    try:
        with torch.no_grad():
            theirs(ids)
            _, cache = model.run_with_cache(ids, names=["layers.1.attn.q_unrotated", "layers.1.attn.k_unrotated"])
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(cache["layers.1.attn.q_unrotated"], captured["q_norm"].transpose(1, 2))
    assert torch.equal(cache["layers.1.attn.k_unrotated"], captured["k_norm"].transpose(1, 2))
    # the opt-in statistics take the norm's readable path (a division where the fused one multiplies by rsqrt): the
    # same numbers to float32's rounding
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["layers.1.attn.q_norm.scale", "layers.1.attn.q_norm.normalized",
                                                    "layers.1.attn.q_unnormalized", "layers.1.attn.q_unrotated"])
    q = cache["layers.1.attn.q_unnormalized"]
    assert_parity(cache["layers.1.attn.q_norm.scale"], q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt(), "scale")
    assert_parity(cache["layers.1.attn.q_norm.normalized"] * model.layers[1].attn.q_norm.weight.detach(),
                  captured["q_norm"].transpose(1, 2), "normalized")


def test_a_file_without_the_query_and_key_norms_names_them(tmp_path):
    """A Qwen 2 file given Qwen 3's config (or a file cut short) lacks q_norm and k_norm: the error names them."""
    theirs = reference("qwen3")
    save(theirs, tmp_path, "safetensors")
    from safetensors.torch import load_file, save_file

    state = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if "_norm." not in k}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"4 tensor\(s\) missing[\s\S]*layers\.0\.self_attn\.q_norm\.weight "
                                              r"\(10,\) \(our layers\.0\.attn\.q_norm\.weight\)"):
        Qwen3ForCausalLM.from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3"
