"""Llama parity with transformers' Llama classes, and what every family built from Llama's model (Mistral, Qwen2,
Qwen3: LLAMA_LIKE, read from the registry) shares: the released files' layouts (transformers 5's, transformers 4's
config names, a sharded index, the Llama 2 conversions' .bin with rotary buffers), Llama's variants (biases, head_dim
given, multi-query, rope scalings), every task class against transformers' of the same name (the question answering
class's `transformer.` prefix), save_pretrained read back by transformers, the KV cache and generation across
sliding windows, half precision, config refusals, loading in bfloat16 without a float32 copy, and Llama 3.1 8B's
shapes on the meta device.

The tests every family passes (training, edges, compiled, exports, analysis, the command line) run on these
families too, from their declarations; these are what only they have.
"""

import json

import pytest
import torch
import transformers

from helpers import (assert_parity, check_causal_lm, each_device, fused_attention, padded_batch, reference, save,
                     write_weights)
from scratch_models import ConfigError, LlamaConfig, LlamaForCausalLM, LlamaModel
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import EXPERTS, TOLERANCES, verify
from weight_mapping import CheckpointError

LLAMA_LIKE = [name for name, family in FAMILIES.items() if issubclass(family.base, LlamaModel)]
each_llama_like = pytest.mark.parametrize("family", LLAMA_LIKE)

# what changes the numbers, away from the tiny config's Llama 3.2-like settings (tied, six query heads of 8 over
# two key/value heads, llama3 rope scaling)
VARIANTS = {
    "llama 3.2-like": {},
    "llama 2-like: biases, untied, multi-head": dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                                                     num_key_value_heads=6, rope_scaling=None, rope_theta=10000.0),
    "head_dim 12, multi-query, linear rope": dict(head_dim=12, num_key_value_heads=1,
                                                  rope_scaling={"rope_type": "linear", "factor": 3.0}),
}
# Llama 3.1 8B's config.json as the hub has it (transformers 4.43 wrote it)
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
               "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
               "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}
# SmolLM-135M's (a Llama: 30 layers, 9 heads of 64 over 3 key/value heads, tied), for a full-size parity run
SMOLLM_135M = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
               "initializer_range": 0.02, "intermediate_size": 1536, "max_position_embeddings": 2048,
               "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
               "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
               "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
               "use_cache": True, "vocab_size": 49152}


def assert_bitwise_unless_experts(ours: torch.Tensor, theirs: torch.Tensor, what: str, family: str) -> None:
    """Our output against transformers': bit for bit, except for a mixture of experts, whose experts transformers
    computes from a fused gate_up matrix, so its SiLU reads a strided half of that product, a scalar loop that
    rounds otherwise than the vectorised one ours runs on a dense tensor (ulps): there the derived bound."""
    if FAMILIES[family].table.experts_field:
        assert_parity(ours, theirs, what)
    else:
        assert torch.equal(ours, theirs), what


def transformers_4_config(directory) -> dict:
    """config.json as transformers 4 wrote it: rope_theta and rope_scaling beside the other fields (rope_scaling's
    type under "type" where it has one, as Llama 2's files spell it), torch_dtype; no rope_parameters."""
    config = json.loads((directory / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type")
    config["rope_scaling"] = None if kind == "default" else rope | ({"rope_type": kind} if kind == "llama3" else
                                                                   {"type": kind})
    if "dtype" in config:
        config["torch_dtype"] = config.pop("dtype")
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return config


def write_llama_2_bin(model, directory):
    """The Llama 2 conversions' layout: pytorch_model.bin holding each layer's rotary inv_freq buffer too."""
    state = dict(model.state_dict())
    config = model.config
    dim = config.head_dim
    for i in range(config.num_hidden_layers):
        state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))
    if config.tie_word_embeddings:
        del state["lm_head.weight"]
    model.config.save_pretrained(directory)
    write_weights(state, directory, "bin")
    transformers_4_config(directory)


# ------------------------------------------------------------------------------------------------ layouts


@each_device
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("layout", ["transformers 5", "transformers 4 names", "llama 2 bin", "sharded"])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    theirs = reference("llama", **VARIANTS[variant])
    if layout == "llama 2 bin":
        write_llama_2_bin(theirs, tmp_path)
    else:
        save(theirs, tmp_path, "sharded" if layout == "sharded" else "transformers")
        if layout == "transformers 4 names":
            transformers_4_config(tmp_path)
    worst = check_causal_lm("llama", theirs, tmp_path, padded_batch("llama"), device)
    info = LlamaForCausalLM.from_pretrained(tmp_path).loading_info
    assert info.prefixed
    if layout == "llama 2 bin":
        assert set(info.ignored) == {f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(2)}
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_config_reads_transformers_4_and_5_names_alike(tmp_path):
    save(reference("llama"), tmp_path)
    modern = LlamaConfig.from_json_file(tmp_path / "config.json")
    old = transformers_4_config(tmp_path)
    assert "rope_parameters" not in old and LlamaConfig.from_json_file(tmp_path / "config.json") == modern
    assert modern.rope_scaling["rope_type"] == "llama3" and modern.rope_theta == 500.0
    llama_31 = LlamaConfig.from_dict(LLAMA_31_8B)
    assert llama_31.eos_token_id == [128001, 128008, 128009] and llama_31.head_dim == 128
    assert LlamaConfig.from_dict(llama_31.to_dict()) == llama_31


@each_llama_like
def test_save_pretrained_is_read_back_bitwise_by_transformers(tmp_path, family):
    """Ours saved: transformers 5 loads every class with nothing missing or unexpected, the same tensors bit for
    bit and the same logits; legacy=True writes the released layout (the same, `model.` on every base key)."""
    declared = FAMILIES[family]
    inputs = padded_batch(family)
    for cls in declared.heads:
        theirs = reference(family, cls.__name__, attention="sdpa", **({"pad_token_id": 0} if
                                                                       cls.reads_last_token else {}))
        model = cls.from_pretrained(save(theirs, tmp_path / f"in-{cls.__name__}"))
        out = tmp_path / f"out-{cls.__name__}"
        model.save_pretrained(out)
        their_class = getattr(transformers, cls.__name__)
        back, info = their_class.from_pretrained(out, output_loading_info=True,
                                                 attn_implementation=fused_attention(their_class),
                                                 experts_implementation=EXPERTS)
        assert not any(info.values()), (cls.__name__, info)
        theirs_state = theirs.state_dict()
        assert all(torch.equal(tensor, theirs_state[key]) for key, tensor in back.state_dict().items())
        with torch.no_grad():
            field = "start_logits" if "QuestionAnswering" in cls.__name__ else "logits"
            assert_bitwise_unless_experts(model(**inputs)[field], back.eval()(**inputs)[field], cls.__name__, family)
    legacy = tmp_path / "legacy"
    declared.lm.from_pretrained(tmp_path / f"out-{declared.lm.__name__}").save_pretrained(legacy, legacy=True)
    from safetensors import safe_open

    with safe_open(str(legacy / "model.safetensors"), "pt") as f:
        assert all(key.startswith("model.") for key in f.keys() if not key.startswith("lm_head."))


# ------------------------------------------------------------------------------------------------- task heads


def heads_batch(family: str, pad: int) -> tuple[dict, dict]:
    """A padded batch whose padding holds `pad` (the sequence classifier finds each row's last token by it), and
    labels for each head."""
    inputs = padded_batch(family)
    real = inputs["attention_mask"][:3]
    inputs = {"input_ids": inputs["input_ids"][:3].clamp(min=pad + 1).masked_fill(real == 0, pad),
              "attention_mask": real}
    labels = {"SequenceClassification": dict(labels=torch.tensor([0, 2, 1])),
              "TokenClassification": dict(labels=torch.randint(4, real.shape, generator=torch.Generator()
                                                               .manual_seed(0)).masked_fill(real == 0, -100)),
              "QuestionAnswering": dict(start_positions=torch.tensor([1, 5, 2]), end_positions=torch.tensor([3, 8, 7]))}
    return inputs, labels


@each_llama_like
@pytest.mark.parametrize("head, bias", [("SequenceClassification", True), ("TokenClassification", True),
                                        ("TokenClassification", False), ("QuestionAnswering", True)],
                         ids=["sequence", "token", "token without bias", "question answering"])
def test_task_heads_match_transformers_outputs_and_losses(tmp_path, family, head, bias):
    """transformers 5's generic classes: both classifiers are `score` (the token classifier's with a bias unless
    token_classification_bias is false, its dropout classifier_dropout), the question answering class of Llama and
    Qwen keeps its base model as `transformer`. Loaded with nothing left over, the same outputs and losses."""
    declared = FAMILIES[family]
    ours = next((cls for cls in declared.heads if cls.__name__.endswith(f"For{head}")), None)
    if ours is None:
        pytest.skip(f"transformers gives {declared.title} no {head} class")
    labels = 3 if head == "SequenceClassification" else 4
    changes = dict(id2label={i: f"class {i}" for i in range(labels)}, pad_token_id=0, classifier_dropout=0.25,
                   token_classification_bias=bias)
    theirs = reference(family, ours.__name__, attention="sdpa", **changes)
    directory = save(theirs, tmp_path)
    model = ours.from_pretrained(directory)
    assert not model.loading_info.ignored
    prefix = getattr(theirs, "base_model_prefix")
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        assert any(key.startswith(f"{prefix}.layers.") for key in f.keys())
    assert model.checkpoint_prefixed in (True, f"{prefix}.") and (prefix == "model") == (model.checkpoint_prefixed
                                                                                          is True)
    if head == "TokenClassification":
        assert (model.score.bias is not None) == bias and model.dropout.p == theirs.dropout.p == 0.25
    inputs, labels = heads_batch(family, pad=0)
    with torch.no_grad():
        mine, reference_out = model(**inputs, **labels[head]), theirs(**inputs, **labels[head])
    for field in ("start_logits", "end_logits") if head == "QuestionAnswering" else ("logits",):
        assert_parity(mine[field], reference_out[field], field)
    assert_parity(mine.loss, reference_out.loss, "loss")


# ---------------------------------------------------------------------------------- KV cache and generation


@pytest.fixture(scope="module")
def generating(tmp_path_factory):
    """family -> (transformers' LM with SDPA, ours) from the same weights."""
    out = {}
    for family in LLAMA_LIKE:
        theirs = reference(family, attention="sdpa")
        out[family] = theirs, FAMILIES[family].lm.from_pretrained(save(theirs, tmp_path_factory.mktemp(family)))
    return out


def left_padded_prompts(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 35, (4, 7), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(4, 7, dtype=torch.long)
    for row, length in enumerate((7, 3, 5, 1)):
        mask[row, 7 - length:] = 1
    return ids.masked_fill(mask == 0, 0), mask


@each_llama_like
def test_cache_step_by_step_equals_one_forward_across_the_window(generating, family):
    """Keys are cached turned, each at its own position; a sliding-window layer's step sees the last window of the
    cached keys only (the window is shorter than these 11 tokens), as the whole sequence's forward pass does."""
    _, model = generating[family]
    inputs = padded_batch(family)
    ids, mask = inputs["input_ids"][:3], inputs["attention_mask"][:3]
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        first = model(ids[:, :3], attention_mask=mask[:, :3], use_cache=True)
        steps = [first.logits] + [model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                                        past_key_values=first.past_key_values).logits for t in range(3, 11)]
    seen = FAMILIES[family].sighted(mask)
    assert_parity(torch.cat(steps, dim=1)[seen], full[seen], "logits, cached")


@pytest.mark.parametrize("family, window", [
    ("mistral", {"sliding_window": 2}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 2, "max_window_layers": 0}),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 2, "max_window_layers": 0}),
])
def test_a_right_padded_query_past_the_window_is_blind_as_the_family_declares(family, window):
    """Two keys seen, itself included: after three real tokens the fifth query on sees padding only, where our
    attention gives 0 and transformers' eager an even spread (verify and the eager comparisons skip it)."""
    declared = FAMILIES[family]
    config = declared.tiny(**window)
    assert all(config.sliding_layers)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]])
    assert declared.sighted(mask, config).tolist() == [[True] * 4 + [False] * 3, [True] * 7]
    assert declared.sighted(mask, declared.tiny(sliding_window=None)).all()


@each_llama_like
@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "seeded sampling"])
def test_generation_matches_transformers_token_for_token(generating, family, sampling):
    """Left-padded prompts of lengths 7, 3, 5 and 1, 14 new tokens: past the sliding windows, where transformers'
    cache keeps the last window of keys only and ours keeps them all and masks the rest."""
    theirs, model = generating[family]
    ids, mask = left_padded_prompts()
    options = dict(do_sample=True, temperature=0.9, top_k=10, top_p=0.9) if sampling else {}
    torch.manual_seed(11)
    with torch.no_grad():
        expected = theirs.generate(ids, attention_mask=mask, max_new_tokens=14, pad_token_id=0, eos_token_id=None,
                                   **({"do_sample": False} | options))
    torch.manual_seed(11)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=14, eos_token_id=None, **options),
                       expected)


# -------------------------------------------------------------------------------------------- half precision


@each_llama_like
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, family, dtype):
    """The parity report on a padded batch, in half precision against transformers in that dtype: RMSNorm in
    float32 and cast, the explicit path's softmax in float32, as transformers' eager attention takes it."""
    save(reference(family), tmp_path)
    report = verify(str(tmp_path), inputs=padded_batch(family), dtype=dtype)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


@each_llama_like
def test_float32_report_is_bitwise_on_every_row(tmp_path, family):
    save(reference(family), tmp_path)
    report = verify(str(tmp_path), inputs=padded_batch(family))
    assert report.passed, report.format()
    names = [c.name for c in report.rows]
    assert "layers.1.attn.probs" in names and "ln_f" in names
    if FAMILIES[family].table.experts_field is None:
        assert "layers.1.mlp.up" in names and max(c.max_abs for c in report.rows) == 0.0
    else:  # bitwise up to the first mixture's output (see assert_bitwise_unless_experts), its routing bitwise everywhere
        first = next(n for n, name in enumerate(names) if name.endswith("mlp.routing_weights")) + 1
        assert max(c.max_abs for c in report.rows[:first]) == 0.0, report.format()
        assert all(c.max_abs == 0.0 for c in report.rows if c.name.endswith("mlp.chosen")), report.format()


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("changes, message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": "32"}}, "'yarn' has 'beta_fast', which "
                                                                                "should be a positive number"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "'longrope' needs 'short_factor'"),
    ({"rope_scaling": {"rope_type": "proportional", "factor": 4.0}}, "rope type 'proportional' is not supported"),
    ({"num_key_value_heads": 5}, "num_attention_heads 32 is not a multiple of num_key_value_heads 5"),
    ({"num_attention_heads": 7, "num_key_value_heads": 7}, "hidden_size 4096 is not divisible by "
                                                           "num_attention_heads 7, and no head_dim is given"),
    ({"head_dim": 127}, "head_dim 127 is odd"),
    ({"eos_token_id": [128001, "end"]}, "field 'eos_token_id' lists"),
    ({"eos_token_id": "end"}, "field 'eos_token_id' should be int or list or null"),
    ({"hidden_act": "xielu"}, "hidden_act='xielu' is not supported"),
    ({"model_type": "mistral"}, "model_type is 'mistral', but LlamaConfig needs 'llama'"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        LlamaConfig.from_dict(LLAMA_31_8B | changes, source="config.json")


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes"])
def test_a_quantized_llama_is_refused_at_load_naming_its_method(tmp_path, method):
    """Its tensors (qweight, qzeros, scales; or bitsandbytes' packed uint8 with their quant states) are not Llama's
    weights: refused from config.json, before anything is read, saying what it is."""
    save(reference("llama"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"a quantized checkpoint \(quantization_config, quant_method "
                                              rf"'{method}'\).*supported: .*llama"):
        LlamaForCausalLM.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------------ size


def meta_parameter_count(family: str, raw: dict) -> int:
    """Our LM and transformers' of the same name built on the meta device from config.json `raw`: every tensor has
    the shape transformers' has under the same name (through the mapping table), and the parameter counts are equal;
    returns it."""
    declared = FAMILIES[family]
    config = declared.config_class.from_dict(raw)
    their_config = getattr(transformers, declared.config_class.__name__)(**{k: v for k, v in raw.items()
                                                                           if k != "architectures"})
    with torch.device("meta"):
        ours = declared.lm(config)
        theirs = getattr(transformers, declared.lm.__name__)(their_config)
    table = declared.table
    names = table.tensor_names(getattr(config, table.layers_field))
    our_shapes = {name: tensor.shape for name, tensor in ours.state_dict().items()}
    tied = set(table.aliases) if config.tie_word_embeddings else set()  # their state dict holds a tied one twice
    their_shapes = {names[table.normalize(key)]: tensor.shape for key, tensor in theirs.state_dict().items()
                    if table.normalize(key) not in tied}
    assert our_shapes == their_shapes
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    return count


def test_llama_31_8b_on_the_meta_device_has_transformers_shapes_and_parameter_count():
    """Built on the meta device from Llama 3.1 8B's config.json: transformers' shapes, 8.03 billion parameters."""
    assert meta_parameter_count("llama", LLAMA_31_8B) == 8_030_261_248


def test_loading_in_bfloat16_never_makes_a_float32_copy(tmp_path):
    """A bfloat16 file loaded as it is stored, and a float32 file loaded with dtype=bfloat16: no float32 tensor of
    a weight's size is created in memory on the way (watched at torch's dispatcher; the model is first built on the
    meta device, in float32 shapes that hold no memory, and the float32 file is read through views of its mapped
    memory), and the weights come out bfloat16. The rotary frequencies,
    [head_dim / 2] float32 as transformers keeps them, are smaller than any weight."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Float32Watch(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # a view of a tensor it was given (the file's memory-mapped float32 tensors, read as views) is no copy
            given = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                     if isinstance(t, torch.Tensor) and not t.is_meta}
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if (isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32 and tensor.numel() >= 37
                        and not tensor.is_meta  # the model is first built on the meta device: shapes, no memory
                        and tensor.untyped_storage().data_ptr() not in given):
                    self.seen.append((str(func), tuple(tensor.shape)))
            return out

    theirs = reference("llama", tie_word_embeddings=False)
    save(theirs.to(torch.bfloat16), tmp_path / "bf16")
    save(theirs.float(), tmp_path / "fp32")
    for directory, dtype in ((tmp_path / "bf16", None), (tmp_path / "fp32", torch.bfloat16)):
        with Float32Watch() as watch:
            model = LlamaForCausalLM.from_pretrained(directory, dtype=dtype)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert not watch.seen, watch.seen


@pytest.mark.slow
def test_full_smollm_135m_config(tmp_path):
    """SmolLM-135M's own config.json (a Llama: 30 layers, 576 wide, 9 heads of 64 over 3 key/value heads, tied),
    random weights at init's scale, sharded as the hub keeps large files."""
    torch.manual_seed(0)
    config = {k: v for k, v in SMOLLM_135M.items() if k not in ("architectures", "torch_dtype")}
    theirs = transformers.LlamaForCausalLM._from_config(transformers.LlamaConfig(**config),
                                                        attn_implementation="eager").eval()
    save(theirs, tmp_path, "sharded")
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM_135M))
    inputs = padded_batch("llama", seq=19, vocab=SMOLLM_135M["vocab_size"])
    worst = check_causal_lm("llama", theirs, tmp_path, inputs)
    assert {"hidden_states", "attentions", "logits", "table rows"} <= set(worst)  # each within its bound
    print(f"SmolLM-135M config: worst |diff| {worst}")
