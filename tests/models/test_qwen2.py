"""What only Qwen2 has beside Llama (whose tests, tests/models/test_llama.py, run on Qwen2 too): its released configs
(Qwen 2.5's tied small models, use_sliding_window off), its always-on q/k/v biases, and its sliding window with the
layers it applies to, read as transformers 5 reads them (use_sliding_window, max_window_layers, layer_types)."""

import json

import pytest
import torch

from helpers import check_causal_lm, padded_batch, reference, save
from scratch_models import ConfigError, Qwen2Config, Qwen2ForCausalLM
from test_llama import meta_parameter_count

# Qwen2.5-0.5B's config.json as the hub has it (transformers 4.40 wrote it)
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
              "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
              "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
              "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
              "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
              "use_sliding_window": False, "vocab_size": 151936}


def test_released_config_reads_as_transformers_reads_it():
    """use_sliding_window false: no window, whatever sliding_window says; written back as transformers 5 writes it
    (sliding_window null, layer_types each layer's)."""
    config = Qwen2Config.from_dict(QWEN25_05B)
    assert config.sliding_window is None and not any(config.sliding_layers)
    assert config.layer_types == ["full_attention"] * 24 and config.qkv_bias and not config.o_proj_bias
    assert Qwen2Config.from_dict(config.to_dict()) == config
    assert meta_parameter_count("qwen2", QWEN25_05B) == 494_032_768


@pytest.mark.parametrize("changes, sliding", [
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), [False, True]),
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=0), [True, True]),
    (dict(use_sliding_window=True, sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
     [True, False]),
    (dict(use_sliding_window=False, sliding_window=4, max_window_layers=0), [False, False]),
], ids=["from max_window_layers", "every layer", "layer_types", "use_sliding_window off"])
def test_the_window_applies_to_the_layers_transformers_gives_it(tmp_path, changes, sliding):
    theirs = reference("qwen2", **changes)
    directory = save(theirs, tmp_path)
    model = Qwen2ForCausalLM.from_pretrained(directory)
    assert [layer.attn.sliding for layer in model.layers] == sliding
    assert model.config.layer_types == theirs.config.layer_types
    check_causal_lm("qwen2", theirs, directory, padded_batch("qwen2"))
    with torch.no_grad():
        probs = model(torch.arange(1, 12)[None], output_attentions=True).attentions
    far = torch.ones(11, 11, dtype=torch.bool).tril(-model.config.sliding_window if any(sliding) else -11)
    assert [not bool(p[..., far].any()) for p in probs] == [s or not far.any() for s in sliding]


def test_biases_are_on_q_k_v_only_whatever_the_config_says(tmp_path):
    theirs = reference("qwen2")
    save(theirs, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"attention_bias": False, "mlp_bias": True}))
    model = Qwen2ForCausalLM.from_pretrained(tmp_path)
    attn = model.layers[0].attn
    assert attn.q_proj.bias is not None and attn.v_proj.bias is not None and attn.o_proj.bias is None
    assert model.layers[0].mlp.up_proj.bias is None
    check_causal_lm("qwen2", theirs, tmp_path, padded_batch("qwen2"))


@pytest.mark.parametrize("changes, message", [
    (dict(use_sliding_window=False, layer_types=["full_attention"] * 23 + ["sliding_attention"]),
     "layer_types names sliding_attention layers, but there is no window"),
    (dict(layer_types=["full_attention"]), "should name each of the 24 layers full_attention or sliding_attention"),
    (dict(layer_types=["full_attention"] * 23 + ["local"]), "should name each of the 24 layers"),
    (dict(use_sliding_window=True, sliding_window=0), "field 'sliding_window' must be positive"),
])
def test_window_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        Qwen2Config.from_dict(QWEN25_05B | changes, source="config.json")
