"""GPT-2 parity with transformers: every real checkpoint layout written from a randomly initialised transformers
model (small odd configs with large weights for breadth, the full gpt2 config for truth), the hub's gpt2 when it is
cached, and CUDA when there is one.

The tests every family passes (the KV cache and generation in test_generation.py, training, edges, compiled,
exports, analysis, the command line) run on GPT-2 too, from its declaration; these are what only GPT-2 has."""

import contextlib
import json

import pytest
import torch
import transformers

from helpers import (assert_parity, check_causal_lm, hub_model_available, model_sizes, randomize_, sighted,
                     write_weights)
from scratch_models import ConfigError, GPT2Config
from scratch_models.gpt2.model import GPT2LMHeadModel, GPT2Model
from weight_mapping import CheckpointError

SMALL = dict(vocab_size=101, n_positions=40, n_embd=96, n_layer=2, n_head=3, bos_token_id=100, eos_token_id=100)
# every config field that changes the numbers, away from its default
VARIANT = SMALL | dict(n_inner=77, activation_function="gelu_pytorch_tanh", layer_norm_epsilon=1e-3,
                       scale_attn_by_inverse_layer_idx=True)
GPT2_FULL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
PAD = 0  # the id left padding is filled with; the mask says what is padding, the id never matters


def hf_lm(seed: int, std: float, **config) -> transformers.GPT2LMHeadModel:
    """transformers' GPT2LMHeadModel with eager attention (it returns attention probabilities), weights redrawn."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel._from_config(transformers.GPT2Config(**config),
                                                      attn_implementation="eager").eval()
    return randomize_(model, std, seed)


def hub_state(model: transformers.GPT2LMHeadModel, masked_bias: bool = False) -> dict:
    """The hub's gpt2 layout: no prefix, a causal-mask buffer per block (and the old masked_bias), no lm_head."""
    n = model.config.n_positions
    state = {k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    for i in range(model.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        if masked_bias:
            state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return state


def hub_config(model: transformers.GPT2LMHeadModel) -> dict:
    """config.json as the hub's gpt2 has it: no n_inner, no scale_attn_* fields, head-summary fields, n_ctx."""
    c = model.config
    return {"activation_function": c.activation_function, "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
            "bos_token_id": c.bos_token_id, "embd_pdrop": 0.1, "eos_token_id": c.eos_token_id,
            "initializer_range": 0.02, "layer_norm_epsilon": c.layer_norm_epsilon, "model_type": "gpt2",
            "n_ctx": c.n_positions, "n_embd": c.n_embd, "n_head": c.n_head, "n_layer": c.n_layer,
            "n_positions": c.n_positions, "resid_pdrop": 0.1, "summary_activation": None,
            "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
            "summary_use_proj": True,
            "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
            "vocab_size": c.vocab_size}


def write_checkpoint(model, directory, state: dict, fmt: str, shards: int = 1, config: dict | None = None):
    write_weights(state, directory, fmt, shards)
    if config is None:
        model.config.save_pretrained(directory)  # transformers' own config.json (n_inner: null and all)
    else:
        (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def padded_inputs(vocab: int, seed: int = 1, seq: int = 11) -> dict:
    """Three rows: full, left-padded (as for generation), right-padded; positions count real tokens only."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (3, seq), generator=g)
    mask = torch.ones(3, seq, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, seq - 3:] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return dict(input_ids=ids, attention_mask=mask, position_ids=positions)


# ---------------------------------------------------------------------------------------------- small, odd configs


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small model in the hub's layout (safetensors), with its transformers reference."""
    reference = hf_lm(0, 0.3, **SMALL)
    directory = tmp_path_factory.mktemp("gpt2-small-hub")
    write_checkpoint(reference, directory, hub_state(reference), "safetensors", config=hub_config(reference))
    return reference, directory


@pytest.mark.parametrize("config", [SMALL, VARIANT], ids=["gpt2-like", "variant"])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_hub_layout(tmp_path, config, fmt):
    reference = hf_lm(3, 0.3, **config)
    hub = hub_config(reference) | {k: config[k] for k in config.keys() - hub_config(reference).keys()}
    write_checkpoint(reference, tmp_path, hub_state(reference, masked_bias=fmt == "bin"), fmt, config=hub)
    worst = check_causal_lm("gpt2", reference, tmp_path, padded_inputs(config["vocab_size"]))
    info = GPT2LMHeadModel.from_pretrained(tmp_path).loading_info
    assert not info.prefixed
    assert set(info.ignored) == ({f"h.{i}.attn.bias" for i in range(2)}
                                 | ({f"h.{i}.attn.masked_bias" for i in range(2)} if fmt == "bin" else set()))
    print(f"hub layout, {fmt}: worst |diff| {worst}")


def test_transformers_layout_with_only_lm_head(tmp_path, small):
    """A tied pair saved under the head's name only (wte dropped): wte is read from lm_head.weight."""
    reference, _ = small
    state = dict(reference.state_dict())
    del state["transformer.wte.weight"]
    write_checkpoint(reference, tmp_path, state, "safetensors")
    model = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert model.loading_info.loaded["embeddings.wte.weight"] == "lm_head.weight"
    assert torch.equal(model.embeddings.wte.weight, reference.lm_head.weight)
    check_causal_lm("gpt2", reference, tmp_path, padded_inputs(SMALL["vocab_size"]))


@contextlib.contextmanager
def sdpa(reference):
    """`reference` with transformers' default SDPA attention for the block: like ours, a query that sees no key
    (left padding) gets 0 there, so outputs compare at every position."""
    reference.set_attn_implementation("sdpa")
    try:
        yield reference
    finally:
        reference.set_attn_implementation("eager")


def test_default_positions_match_transformers_forward(small):
    """No position_ids: 0..s-1 whatever the padding, as transformers' forward (not generate) counts them."""
    reference, directory = small
    inputs = padded_inputs(SMALL["vocab_size"])
    del inputs["position_ids"]
    with torch.no_grad(), sdpa(reference):
        ref = reference(**inputs)
        out = GPT2LMHeadModel.from_pretrained(directory)(**inputs)
    assert_parity(out.logits, ref.logits, "logits, default positions")


def test_loss_matches_transformers(small):
    """The usual labels (pads -100): the first real token of a left-padded row is scored from a padding query that
    sees no key, which both of our paths and transformers' default SDPA attention give 0."""
    reference, directory = small
    inputs = padded_inputs(SMALL["vocab_size"])
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    model = GPT2LMHeadModel.from_pretrained(directory)
    with torch.no_grad(), sdpa(reference):
        ref = reference(**inputs, labels=labels)
        out = model(**inputs, labels=labels)
        explicit = model(**inputs, labels=labels, output_attentions=True)
    assert 1.0 < float(ref.loss) < 100.0
    assert_parity(out.loss, ref.loss, "loss")
    assert_parity(explicit.loss, ref.loss, "loss, explicit attention")


def test_hook_points_in_forward_order_and_edits_match_transformers(small):
    reference, directory = small
    model = GPT2LMHeadModel.from_pretrained(directory)
    inputs = padded_inputs(SMALL["vocab_size"])
    fired = []
    with torch.no_grad():
        model.run_with_hooks(**inputs, hooks=[(name, lambda t, name: fired.append(name))
                                              for name in model.hook_names()])
    assert fired == model.hook_names()
    assert fired[:6] == ["embeddings.word", "embeddings.position", "embeddings.out", "layers.0.norm_1.scale",
                         "layers.0.norm_1.normalized", "layers.0.ln_1"]
    assert fired[-2:] == ["ln_f", "logits"]

    # knock out block 1's attention on both sides: the edit must mean the same thing
    handle = reference.transformer.h[1].attn.register_forward_hook(lambda m, a, out: (torch.zeros_like(out[0]), out[1]))
    try:
        with torch.no_grad(), sdpa(reference):
            ref = reference(**inputs)
            out = model.run_with_hooks(**inputs, hooks=[("layers.1.attn.proj", lambda t, name: torch.zeros_like(t))])
            clean = model(**inputs)
    finally:
        handle.remove()
    assert_parity(out.logits, ref.logits, "logits with block 1's attention zeroed")
    assert float((clean.logits - out.logits).abs().max()) > 1.0


# ------------------------------------------------------------------------------------------------ the full config


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The full gpt2 config (124M parameters), randomly initialised once for the module."""
    return hf_lm(7, 0.05, **GPT2_FULL)


@pytest.mark.slow
def test_full_gpt2_config_transformers_layout(tmp_path, full):
    """The full config against transformers once, from the .bin layout with lm_head.weight; the sharded
    safetensors layout without lm_head.weight then loads to the same logits, bit for bit (the one full-size parity
    run; both layouts load at full size)."""
    state = dict(full.state_dict())  # transformer.* plus lm_head.weight, as save_pretrained(.bin) writes it
    write_checkpoint(full, tmp_path / "bin", state, "bin")
    del state["lm_head.weight"]
    write_checkpoint(full, tmp_path / "sharded", state, "safetensors", shards=3)
    assert len(json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())["weight_map"]) == \
        len(state)
    inputs = padded_inputs(GPT2_FULL["vocab_size"], seq=13)
    worst = check_causal_lm("gpt2", full, tmp_path / "bin", inputs)
    with torch.no_grad():
        logits = [GPT2LMHeadModel.from_pretrained(tmp_path / layout)(**inputs).logits for layout in ("bin", "sharded")]
    assert torch.equal(*logits)
    for layout, ignored in (("bin", {"lm_head.weight": "duplicate of wte.weight (tied)"}), ("sharded", {})):
        info = GPT2Model.from_pretrained(tmp_path / layout).loading_info
        assert info.prefixed
        assert info.ignored == ignored
        assert len(info.loaded) == 2 + 12 * 12 + 2
    print(f"full gpt2 config: worst |diff| {worst}")


# ------------------------------------------------------------------------------ the causal kernel, initialisation


def test_unpadded_forward_uses_the_kernels_causal_mode_and_matches_both_paths(small, monkeypatch):
    """Without padding no mask is built: SDPA applies causality itself (as transformers asks of it), and the
    explicit path builds the same triangle; both agree with transformers."""
    from scratch_models.parts import attention as attention_module

    reference, directory = small
    model = GPT2LMHeadModel.from_pretrained(directory)
    ids = torch.randint(100, (2, 9), generator=torch.Generator().manual_seed(3))
    calls = []
    real = attention_module.F.scaled_dot_product_attention
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append((k.get("attn_mask"), k["is_causal"])) or real(*a, **k))
    with torch.no_grad():
        fused = model(ids, attention_mask=torch.ones_like(ids)).logits
        explicit = model(ids, output_attentions=True)
        ref = reference(ids, output_attentions=True)
    assert calls == [(None, True)] * SMALL["n_layer"]
    assert_parity(fused, ref.logits, "logits, fused causal")
    assert_parity(explicit.logits, ref.logits, "logits, explicit")
    assert_parity(explicit.attentions[1], ref.attentions[1], "attentions")


def test_loading_skips_random_init_and_leaves_torch_init_alone(small):
    _, directory = small
    original = torch.nn.init.normal_
    GPT2LMHeadModel.from_pretrained(directory)
    assert torch.nn.init.normal_ is original
    fresh = GPT2LMHeadModel(GPT2Config(**SMALL))  # built from a config: initialised as GPT-2 is
    assert 0.015 < float(fresh.layers[0].attn.c_attn.weight.detach().std()) < 0.025


# ------------------------------------------------------------------------------------- configs and bad inputs


def test_config_fields_and_refusals():
    config = GPT2Config.from_dict(GPT2_FULL | {"n_inner": None, "eos_token_id": None, "model_type": "gpt2"})
    assert config.inner_dim == 3072 and config.eos_token_id is None and config.head_dim == 64
    with pytest.raises(ConfigError, match="reorder_and_upcast_attn"):
        GPT2Config.from_dict(GPT2_FULL | {"reorder_and_upcast_attn": True})
    with pytest.raises(ConfigError, match="'n_inner' should be int or null"):
        GPT2Config.from_dict(GPT2_FULL | {"n_inner": "3072"})
    with pytest.raises(ConfigError, match="'scale_attn_weights' should be bool"):
        GPT2Config.from_dict(GPT2_FULL | {"scale_attn_weights": 1})
    with pytest.raises(ConfigError, match="not divisible"):
        GPT2Config.from_dict(GPT2_FULL | {"n_head": 7})
    with pytest.raises(ConfigError, match="model_type is 'bert'"):
        GPT2Config.from_dict(GPT2_FULL | {"model_type": "bert"})


def test_bad_checkpoints_and_inputs(tmp_path, small):
    reference, directory = small
    state = hub_state(reference)
    del state["h.1.mlp.c_fc.bias"]
    state["h.2.attn.c_attn.weight"] = torch.zeros(96, 288)  # a third block in a two-block model
    write_checkpoint(reference, tmp_path, state, "safetensors", config=hub_config(reference))
    with pytest.raises(CheckpointError) as e:
        GPT2LMHeadModel.from_pretrained(tmp_path)
    assert "h.1.mlp.c_fc.bias (384,)" in str(e.value)
    assert "h.2.attn.c_attn.weight (96, 288)" in str(e.value)

    model = GPT2LMHeadModel.from_pretrained(directory)
    with pytest.raises(ValueError, match=r"input_ids\[0, 1\] = 101 is out of range"):
        model(torch.tensor([[1, 101]]))
    with pytest.raises(ValueError, match="n_positions=40"):
        model(torch.ones(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        model(torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))


# ------------------------------------------------------------------------------------- real weights, CUDA


def left_padded_prompts(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Four prompts of lengths 7, 3, 5, 1, left-padded to 7."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 100, (4, 7), generator=g)
    mask = torch.zeros(4, 7, dtype=torch.long)
    for row, length in enumerate((7, 3, 5, 1)):
        mask[row, 7 - length:] = 1
    return ids.masked_fill(mask == 0, PAD), mask


@pytest.mark.skipif(not hub_model_available("gpt2"), reason="gpt2 is not in the local Hugging Face cache and "
                    "huggingface.co is unreachable (no network to the model hub here)")
def test_hub_gpt2():
    reference = transformers.GPT2LMHeadModel.from_pretrained("gpt2", attn_implementation="eager").eval()
    model = GPT2LMHeadModel.from_pretrained("gpt2")
    assert set(model.loading_info.ignored) >= {f"h.{i}.attn.bias" for i in range(12)}
    ids, mask = left_padded_prompts()
    ids = ids * 500 + 11  # spread over the vocabulary
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        ref = reference(ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                        output_attentions=True)
        out = model(ids, attention_mask=mask, position_ids=positions, output_hidden_states=True,
                    output_attentions=True)
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    seen = sighted("gpt2", mask)  # left padding: eager attention compares where a query sees a key
    sizes = model_sizes(model.config)
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_parity(a[seen], b[seen], f"hidden_states[{i}]", **sizes)
    for i, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        assert_parity(a.transpose(1, 2)[seen], b.transpose(1, 2)[seen], f"attentions[{i}]", **sizes)
    assert_parity(out.logits[seen], ref.logits[seen], "logits", **sizes)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=10, pad_token_id=PAD), theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cuda_parity(small, dtype):
    reference, directory = small
    reference = hf_lm(0, 0.3, **SMALL).to("cuda", dtype)  # a copy: the module fixture stays on the CPU
    model = GPT2LMHeadModel.from_pretrained(directory, dtype=dtype, device="cuda")
    assert model.embeddings.wte.weight.dtype == dtype
    inputs = {k: v.cuda() for k, v in padded_inputs(SMALL["vocab_size"]).items()}
    # float32 rounds in its sums; half precision in each value it stores (its sums accumulate in float32), one
    # rounding a stage
    sizes = model_sizes(model.config)
    sizes = sizes if dtype == torch.float32 else dict(sizes, terms=1)
    with torch.no_grad():
        ref = reference(**inputs, output_hidden_states=True, output_attentions=True)
        out = model(**inputs, output_hidden_states=True, output_attentions=True)
        with sdpa(reference):
            ref_fused = reference(**inputs)
        fused = model(**inputs)
    seen = sighted("gpt2", inputs["attention_mask"])  # eager attention compares where a query sees a key
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_parity(a[seen], b[seen], f"{dtype} hidden_states[{i}]", **sizes)
    for i, (a, b) in enumerate(zip(out.attentions, ref.attentions)):
        assert_parity(a.transpose(1, 2)[seen], b.transpose(1, 2)[seen], f"{dtype} attentions[{i}]", **sizes)
    assert_parity(out.logits[seen], ref.logits[seen], f"{dtype} logits", **sizes)
    assert bool(fused.logits.isfinite().all())
    assert_parity(fused.logits, ref_fused.logits, f"{dtype} logits, fused against SDPA", **sizes)
    if dtype == torch.float32:
        ids, mask = (t.cuda() for t in left_padded_prompts())
        with torch.no_grad():
            theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD)
        assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=PAD), theirs)
