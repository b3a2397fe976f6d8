"""What only Qwen3-MoE has beside Llama's model and Qwen 3's attention (test_llama.py runs on it too): its released
config and size, the layers config.json keeps dense (mlp_only_layers, decoder_sparse_step) as transformers decides
them, the weights renormalised or not (norm_topk_prob), the sliding window transformers' Qwen3-MoE puts in every
layer, and the expert count spelled num_experts or, as transformers 5 saves it, num_local_experts."""

import json

import pytest
import torch
import transformers

from helpers import check_causal_lm, padded_batch, reference, save
from scratch_models import Qwen3MoeConfig, Qwen3MoeForCausalLM
from scratch_models.parts.mlp import GatedMLP
from scratch_models.parts.moe import SparseMoeBlock
from test_mixtral import meta_parameter_count

# Qwen3-30B-A3B's config.json as the hub has it (transformers 4.51 wrote it)
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                 "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
                 "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
                 "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
                 "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
                 "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                 "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
                 "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
                 "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                 "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
                 "vocab_size": 151936}


def test_released_config_reads_as_transformers_reads_it():
    config = Qwen3MoeConfig.from_dict(QWEN3_30B_A3B)
    assert config.head_dim == 128 and config.qk_norm and all(config.sparse_layers)
    assert not any(config.sliding_layers)
    # transformers' Qwen3-MoE ignores max_window_layers: with use_sliding_window every layer has the window
    windowed = Qwen3MoeConfig.from_dict(QWEN3_30B_A3B | {"use_sliding_window": True, "sliding_window": 4096})
    assert all(windowed.sliding_layers) and windowed.sliding_window == 4096
    assert meta_parameter_count("qwen3_moe", QWEN3_30B_A3B) == 30_532_122_624
    saved_by_5 = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"} | {"num_local_experts": 64}
    assert Qwen3MoeConfig.from_dict(saved_by_5).num_experts == 64
    assert Qwen3MoeConfig.from_dict(saved_by_5).to_dict()["num_experts"] == 64


@pytest.mark.parametrize("step, dense, sparse", [
    (1, [0, 3], [False, True, True, False, True]),
    (2, [], [False, True, False, True, False]),
    (3, [1], [False, False, True, False, False]),
])
def test_dense_and_sparse_layers_are_transformers(step, dense, sparse):
    """A layer is a mixture unless mlp_only_layers names it, and only every decoder_sparse_step-th: as
    transformers builds its layers (Qwen3MoeSparseMoeBlock or Qwen3MoeMLP)."""
    theirs = reference("qwen3_moe", std=None, num_hidden_layers=5, decoder_sparse_step=step, mlp_only_layers=dense)
    ours = Qwen3MoeForCausalLM(Qwen3MoeConfig.from_dict(theirs.config.to_dict()))
    assert [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in theirs.model.layers] == sparse
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in ours.layers] == sparse
    assert all(isinstance(layer.mlp, GatedMLP) for layer, moe in zip(ours.layers, sparse) if not moe)


@pytest.mark.parametrize("changes", [
    dict(norm_topk_prob=False),
    dict(use_sliding_window=True, sliding_window=5),
    dict(mlp_only_layers=[], decoder_sparse_step=1),
], ids=["weights not renormalised", "sliding window in every layer", "every layer a mixture"])
def test_variants_match_transformers(tmp_path, changes):
    """Every hook point and output against transformers' on a padded batch: the chosen experts' probabilities as
    they are (transformers' default), a window shorter than the input in every layer, every layer sparse (the
    releases)."""
    theirs = reference("qwen3_moe", **changes)
    directory = save(theirs, tmp_path)
    check_causal_lm("qwen3_moe", theirs, directory, padded_batch("qwen3_moe"))
    config = Qwen3MoeForCausalLM.from_pretrained(directory).config
    assert config.norm_topk_prob == changes.get("norm_topk_prob", True)
    assert all(config.sliding_layers) == ("sliding_window" in changes)


def test_a_dense_layer_holding_experts_is_refused_naming_them(tmp_path):
    """A file whose layer 0 holds experts, under a config that keeps layer 0 dense: the experts are named, with the
    setting that leaves them out."""
    save(reference("qwen3_moe", mlp_only_layers=[]), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"mlp_only_layers": [0]}))
    from weight_mapping import CheckpointError

    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.experts\.0\.gate_proj\.weight \(8, 48\): the "
                                              "model config.json describes has no layers.0.mlp.experts.0"):
        Qwen3MoeForCausalLM.from_pretrained(tmp_path)
