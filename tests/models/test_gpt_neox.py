"""GPT-NeoX (Pythia) parity with transformers' GPTNeoX classes: the Pythia file layout (prefix, embed_out, the
buffers transformers 4.2x saved, rotary_pct / rotary_emb_base) and transformers 5's (rope_parameters), both
residual layouts, partial and full rotation, biases on and off, tied and untied heads, the task heads, half
precision; the full pythia-70m config for truth, and the hub's pythia-70m when it is cached.

The tests every family passes (the KV cache and generation in test_generation.py, training, edges, compiled,
exports, analysis, the command line) run on GPT-NeoX too, from its declaration; these are what only GPT-NeoX has.
"""

import json

import pytest
import torch
import transformers

from helpers import (assert_parity, check_causal_lm, each_device, hub_model_available, randomize_, save,
                     write_weights)
from scratch_models import (ConfigError, GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXForQuestionAnswering,
                            GPTNeoXForSequenceClassification, GPTNeoXForTokenClassification, GPTNeoXModel)
from scratch_models_cli.verify import TOLERANCES, verify
from weight_mapping import CheckpointError

SMALL = dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
             max_position_embeddings=40, rotary_pct=0.5, bos_token_id=0, eos_token_id=0)
# pythia-70m's config.json, as the hub has it (transformers 4.24.0 wrote it)
PYTHIA_70M = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
              "hidden_size": 512, "initializer_range": 0.02, "intermediate_size": 2048, "layer_norm_eps": 1e-05,
              "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 8,
              "num_hidden_layers": 6, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
              "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
              "use_parallel_residual": True, "vocab_size": 50304}
# what changes the numbers, away from Pythia's settings
VARIANTS = {
    "pythia-like": {},
    "sequential": dict(use_parallel_residual=False),
    "full rotation, no biases, tied": dict(rotary_pct=1.0, attention_bias=False, tie_word_embeddings=True,
                                           hidden_act="gelu_new", layer_norm_eps=1e-3, rotary_emb_base=500.0),
}


def hf(cls=transformers.GPTNeoXForCausalLM, seed: int = 0, std: float = 0.3, **config):
    """transformers' class with eager attention (it returns probabilities), weights redrawn."""
    torch.manual_seed(seed)
    model = cls._from_config(transformers.GPTNeoXConfig(**(SMALL | config)), attn_implementation="eager")
    return randomize_(model, std, seed).eval()


def pythia_state(model) -> dict:
    """The Pythia files' layout: `gpt_neox.` on the base keys, embed_out, and per layer the causal-mask buffer, the
    masking constant and the rotary frequencies that transformers 4.2x saved."""
    state = {key.replace("lm_head.", "embed_out."): tensor for key, tensor in model.state_dict().items()}
    n, config = model.config.max_position_embeddings, model.config
    rotary = int(config.hidden_size // config.num_attention_heads * config.rope_parameters["partial_rotary_factor"])
    for i in range(config.num_hidden_layers):
        state[f"gpt_neox.layers.{i}.attention.bias"] = torch.ones(n, n, dtype=torch.bool).tril().view(1, 1, n, n)
        state[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
        state[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = 1.0 / (10000 ** (
            torch.arange(0, rotary, 2).float() / rotary))
    return state


def pythia_config(model) -> dict:
    """config.json in Pythia's words: rotary_pct and rotary_emb_base, no rope_parameters."""
    c = model.config
    return {k: v for k, v in PYTHIA_70M.items() if k not in SMALL} | {
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_hidden_layers":
        c.num_hidden_layers, "num_attention_heads": c.num_attention_heads, "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings, "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id, "hidden_act": c.hidden_act, "layer_norm_eps": c.layer_norm_eps,
        "rotary_pct": c.rope_parameters["partial_rotary_factor"], "rotary_emb_base": c.rope_parameters["rope_theta"],
        "use_parallel_residual": c.use_parallel_residual, "attention_bias": c.attention_bias,
        "tie_word_embeddings": c.tie_word_embeddings, "torch_dtype": "float32"}


def write_pythia(model, directory, fmt: str = "safetensors", shards: int = 1):
    state = pythia_state(model)
    if model.config.tie_word_embeddings:
        del state["embed_out.weight"]
    write_weights(state, directory, fmt, shards)
    (directory / "config.json").write_text(json.dumps(pythia_config(model), indent=2))
    return directory


def padded_inputs(vocab: int, seq: int = 11, seed: int = 1) -> dict:
    """Three rows: full, left-padded (positions count real tokens, as generate gives them), right-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (3, seq), generator=g)
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:] = 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, position_ids=positions)


# ------------------------------------------------------------------------------------------------ layouts


@each_device
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", ["pythia safetensors", "pythia bin", "pythia sharded", "transformers 5"])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    reference = hf(**VARIANTS[variant])
    if layout == "transformers 5":
        save(reference, tmp_path)
        assert "rope_parameters" in json.loads((tmp_path / "config.json").read_text())
    else:
        fmt = "bin" if layout.endswith("bin") else "safetensors"
        write_pythia(reference, tmp_path, fmt, shards=3 if layout.endswith("sharded") else 1)
    worst = check_causal_lm("gpt_neox", reference, tmp_path, padded_inputs(SMALL["vocab_size"]), device)
    info = GPTNeoXForCausalLM.from_pretrained(tmp_path).loading_info
    assert info.prefixed
    if layout.startswith("pythia"):  # the buffers, each with its reason; nothing else left out
        assert set(info.ignored) == {f"gpt_neox.layers.{i}.attention.{buffer}" for i in range(2)
                                     for buffer in ("bias", "masked_bias", "rotary_emb.inv_freq")}
        assert all(why.startswith("buffer") for why in info.ignored.values())
    else:
        assert not info.ignored
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_base_model_of_a_pythia_checkpoint_leaves_embed_out_out(tmp_path):
    reference = hf()
    write_pythia(reference, tmp_path)
    info = GPTNeoXModel.from_pretrained(tmp_path).loading_info
    assert info.ignored["embed_out.weight"] == "not part of GPTNeoXModel"
    untied = GPTNeoXForCausalLM.from_pretrained(tmp_path)
    assert untied.lm_head is not None and not torch.equal(untied.lm_head.weight, untied.embeddings.embed_in.weight)
    assert torch.equal(untied.lm_head.weight, reference.lm_head.weight)


def test_save_pretrained_round_trips_through_transformers_in_both_layouts(tmp_path):
    """Ours saved: transformers 5 loads it with nothing missing or unexpected and computes the same; legacy=True
    writes the Pythia files' names (gpt_neox. and embed_out), which both read back."""
    reference = hf()
    model = GPTNeoXForCausalLM.from_pretrained(save(reference, tmp_path / "in"))
    inputs = padded_inputs(SMALL["vocab_size"])
    for legacy in (False, True):
        out = tmp_path / f"out-{legacy}"
        model.save_pretrained(out, legacy=legacy)
        theirs, info = transformers.GPTNeoXForCausalLM.from_pretrained(out, output_loading_info=True,
                                                                       attn_implementation="sdpa")
        assert not any(info.values()), info
        from safetensors import safe_open

        with safe_open(str(out / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert "embed_out.weight" in keys and all(k.startswith("gpt_neox.") for k in keys - {"embed_out.weight"})
        with torch.no_grad():
            assert_parity(model(**inputs).logits, theirs.eval()(**inputs).logits, "logits")
            back = GPTNeoXForCausalLM.from_pretrained(out)
        assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    config = json.loads((tmp_path / "out-False" / "config.json").read_text())
    assert (config["rotary_pct"], config["rotary_emb_base"]) == (0.5, 10000.0)
    assert theirs.config.rope_parameters["partial_rotary_factor"] == 0.5


@pytest.mark.slow
def test_full_pythia_70m_config(tmp_path):
    """pythia-70m's own config.json and file layout (512 hidden, 6 layers, 8 heads of 64, a quarter of each
    rotating, vocabulary 50304), random weights at init's scale."""
    torch.manual_seed(0)
    config = {k: v for k, v in PYTHIA_70M.items() if k not in ("architectures", "torch_dtype")}
    reference = transformers.GPTNeoXForCausalLM._from_config(transformers.GPTNeoXConfig(**config),
                                                             attn_implementation="eager").eval()
    write_weights(pythia_state(reference), tmp_path, "safetensors", shards=2)
    (tmp_path / "config.json").write_text(json.dumps(PYTHIA_70M))
    worst = check_causal_lm("gpt_neox", reference, tmp_path, padded_inputs(PYTHIA_70M["vocab_size"], seq=19))
    assert len(GPTNeoXForCausalLM.from_pretrained(tmp_path).loading_info.loaded) == 1 + 6 * 12 + 2 + 1
    print(f"pythia-70m config: worst |diff| {worst}")


@pytest.mark.skipif(not hub_model_available("EleutherAI/pythia-70m"),
                    reason="EleutherAI/pythia-70m is not in the local Hugging Face cache and huggingface.co is "
                           "unreachable (no network to the model hub here)")
def test_hub_pythia_70m():
    report = verify("EleutherAI/pythia-70m")
    assert report.passed, report.format()
    model = GPTNeoXForCausalLM.from_pretrained("EleutherAI/pythia-70m")
    ids = model.tokenizer("The capital of France is")["input_ids"]
    reference = transformers.GPTNeoXForCausalLM.from_pretrained("EleutherAI/pythia-70m").eval()
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=8), theirs)


# ------------------------------------------------------------------------------------------- rotary embedding


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 2.0}, {"rope_type": "llama3", "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8}], ids=lambda s: s["rope_type"])
def test_scaled_rotary_embeddings_match_transformers(tmp_path, scaling):
    """The rotary scalings live in the shared floor (parts/rotary.py, tested there against every initialiser), so
    GPT-NeoX reads them as transformers' GPTNeoX does: written by transformers 5 as rope_parameters, loaded, the
    same numbers on every compared row."""
    reference = hf(rope_scaling=dict(scaling))
    save(reference, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["rope_parameters"]["rope_type"] == scaling["rope_type"]
    check_causal_lm("gpt_neox", reference, tmp_path, padded_inputs(SMALL["vocab_size"]))
    assert GPTNeoXForCausalLM.from_pretrained(tmp_path).config.rope_scaling == scaling


def test_casting_with_to_keeps_the_rotary_angles_in_float32(tmp_path):
    """Our angles come from config.json in float32 at every forward pass, so `.to(bfloat16)` changes the weights
    only: the model equals itself loaded with dtype=bfloat16, and transformers' from_pretrained(dtype=bfloat16),
    whose rotary frequencies stay float32. transformers' own `.to(bfloat16)` rounds its inv_freq buffer to bfloat16
    too, and its logits move: that model is not the one its from_pretrained gives."""
    directory = save(hf(), tmp_path)
    inputs = padded_inputs(SMALL["vocab_size"])
    with torch.no_grad():
        cast = GPTNeoXForCausalLM.from_pretrained(directory).to(torch.bfloat16)(**inputs).logits
        loaded = GPTNeoXForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)(**inputs).logits
        theirs = transformers.GPTNeoXForCausalLM.from_pretrained(directory, dtype=torch.bfloat16,
                                                                 attn_implementation="sdpa").eval()
        their_loaded = theirs(**inputs).logits
        their_cast = transformers.GPTNeoXForCausalLM.from_pretrained(
            directory, attn_implementation="sdpa").eval().to(torch.bfloat16)(**inputs).logits
    assert torch.equal(cast, loaded) and torch.equal(loaded, their_loaded)
    assert theirs.gpt_neox.rotary_emb.inv_freq.dtype == torch.float32
    assert not torch.equal(their_cast, their_loaded)


# ------------------------------------------------------------------------------------------------- task heads


HEADS = {GPTNeoXForSequenceClassification: (dict(num_labels=3, pad_token_id=96), ("logits",)),
         GPTNeoXForTokenClassification: (dict(num_labels=4, classifier_dropout=0.0), ("logits",)),
         GPTNeoXForQuestionAnswering: ({}, ("start_logits", "end_logits"))}


@pytest.mark.parametrize("ours", list(HEADS), ids=lambda cls: cls.__name__)
def test_task_heads_match_transformers_outputs_and_losses(tmp_path, ours):
    changes, fields = HEADS[ours]
    reference = hf(getattr(transformers, ours.__name__), **changes)
    reference.set_attn_implementation("sdpa")
    directory = save(reference, tmp_path)
    model = ours.from_pretrained(directory)
    assert not model.loading_info.ignored
    inputs = padded_inputs(SMALL["vocab_size"] - 1)
    del inputs["position_ids"]
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 96)
    labels = {GPTNeoXForSequenceClassification: dict(labels=torch.tensor([0, 2, 1])),
              GPTNeoXForTokenClassification: dict(labels=torch.randint(4, (3, 11)).masked_fill(
                  inputs["attention_mask"] == 0, -100)),
              GPTNeoXForQuestionAnswering: dict(start_positions=torch.tensor([1, 5, 2]),
                                                end_positions=torch.tensor([3, 9, 7]))}[ours]
    with torch.no_grad():
        theirs, mine = reference(**inputs, **labels), model(**inputs, **labels)
    for field in fields:
        assert_parity(mine[field], theirs[field], field)
    assert_parity(mine.loss, theirs.loss, "loss")


# -------------------------------------------------------------------------------------------- half precision


@each_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, dtype, device):
    """The parity report on a padded batch, in half precision against transformers in that dtype: its softmax in
    float32 on the explicit path, as transformers' eager GPT-NeoX attention takes it."""
    reference = hf()
    write_pythia(reference, tmp_path)
    inputs = padded_inputs(SMALL["vocab_size"])
    report = verify(str(tmp_path), inputs=inputs, dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


def test_float32_report_passes_within_the_bound_on_every_row(tmp_path):
    reference = hf()
    write_pythia(reference, tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs(SMALL["vocab_size"]))
    assert report.passed, report.format()
    names = [c.name for c in report.rows]
    assert "layers.1.attn.probs" in names and "layers.1.mlp.pre_act" in names and "logits" in names
    assert all(c.passed for c in report.rows), report.format()  # verify's own fp32 bound, row by row


# ---------------------------------------------------------------------------------------------------- config


def test_config_reads_pythia_and_transformers_5_names_alike():
    pythia = GPTNeoXConfig.from_dict(PYTHIA_70M)
    modern = GPTNeoXConfig.from_dict({k: v for k, v in PYTHIA_70M.items() if not k.startswith("rotary")}
                                     | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.25}})
    assert pythia == modern and (pythia.rotary_dim, pythia.head_dim) == (16, 64)
    assert GPTNeoXConfig.from_dict(pythia.to_dict()) == pythia


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "proportional", "factor": 2.0}}, "rope type 'proportional' is not supported"),
    ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "'longrope' needs 'short_factor'"),
    ({"rope_scaling": {"type": "dynamic"}}, "rope scaling 'dynamic' needs 'factor'"),
    ({"rotary_pct": 1.5}, "rotary_pct is 1.5"),
    ({"rotary_pct": 0.3}, r"int\(head size 64 x rotary_pct 0.3\) = 19 is odd"),
    ({"rope_parameters": [0.25]}, "'rope_parameters' should be an object"),
    ({"num_attention_heads": 7}, "hidden_size 512 is not divisible by num_attention_heads 7"),
    ({"model_type": "gpt2"}, "model_type is 'gpt2', but GPTNeoXConfig needs 'gpt_neox'"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        GPTNeoXConfig.from_dict(PYTHIA_70M | changes, source="config.json")


def test_a_layer_count_that_disagrees_with_the_file_names_the_tensors(tmp_path):
    reference = hf()
    write_pythia(reference, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match="num_hidden_layers=3"):
        GPTNeoXForCausalLM.from_pretrained(tmp_path)
