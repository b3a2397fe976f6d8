"""What only Mistral has beside Llama (whose tests, tests/models/test_llama.py, run on Mistral too): its released
configs (v0.1's sliding window of 4096, v0.3's none, Nemo's head_dim), the window itself against transformers, and
the fields transformers' Mistral ignores."""

import json

import torch

from helpers import check_causal_lm, padded_batch, reference, save
from scratch_models import MistralConfig, MistralForCausalLM
from test_llama import meta_parameter_count

# Mistral 7B v0.1's config.json as the hub has it (transformers 4.34 wrote it), and what v0.3 and Nemo change
MISTRAL_7B_V01 = {"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
                  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
                  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
                  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                  "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                  "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}
MISTRAL_7B_V03 = MISTRAL_7B_V01 | {"rope_theta": 1000000.0, "sliding_window": None, "vocab_size": 32768}
MISTRAL_NEMO = MISTRAL_7B_V03 | {"hidden_size": 5120, "head_dim": 128, "num_hidden_layers": 40,
                                 "vocab_size": 131072, "max_position_embeddings": 1024000}


def test_released_configs_read_as_transformers_reads_them():
    v01, v03, nemo = (MistralConfig.from_dict(raw) for raw in (MISTRAL_7B_V01, MISTRAL_7B_V03, MISTRAL_NEMO))
    assert v01.sliding_window == 4096 and all(v01.sliding_layers)
    assert v03.sliding_window is None and not any(v03.sliding_layers)
    assert nemo.head_dim == 128 != nemo.hidden_size // nemo.num_attention_heads
    # left out, the window is transformers' default, Mistral 7B v0.1's
    assert MistralConfig.from_dict({k: v for k, v in MISTRAL_7B_V01.items() if k != "sliding_window"}).sliding_window \
        == 4096
    assert meta_parameter_count("mistral", MISTRAL_7B_V01) == 7_241_732_096
    assert meta_parameter_count("mistral", MISTRAL_NEMO) == 12_247_782_400


def test_the_sliding_window_hides_the_keys_further_back_as_transformers_does(tmp_path):
    """Every layer's queries see themselves and the 4 keys before (sliding_window 5 over 11 tokens): probabilities
    0 further back, as transformers' eager attention gives them; with no window every earlier key is seen."""
    for window in (5, None):
        theirs = reference("mistral", sliding_window=window)
        directory = save(theirs, tmp_path / str(window))
        check_causal_lm("mistral", theirs, directory, padded_batch("mistral"))
        with torch.no_grad():
            probs = MistralForCausalLM.from_pretrained(directory)(torch.arange(1, 12)[None],
                                                                  output_attentions=True).attentions
        far = torch.ones(11, 11, dtype=torch.bool).tril(-(window or 11))
        assert all(not bool(p[..., far].any()) for p in probs)
        assert all(bool((p[..., ~far & torch.ones(11, 11, dtype=torch.bool).tril()] > 0).all()) for p in probs)


def test_fields_transformers_mistral_ignores_are_ignored(tmp_path):
    """transformers' Mistral has no biases whatever attention_bias says, and reads one window for every layer
    whatever layer_types says (it warns): so do we, and the numbers stay transformers'."""
    theirs = reference("mistral")
    save(theirs, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"attention_bias": True, "mlp_bias": True,
                                                               "layer_types": ["full_attention"] * 2}))
    model = MistralForCausalLM.from_pretrained(tmp_path)
    assert model.layers[0].attn.q_proj.bias is None and all(model.config.sliding_layers)
    check_causal_lm("mistral", theirs, tmp_path, padded_batch("mistral"))
