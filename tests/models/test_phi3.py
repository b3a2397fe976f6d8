"""Phi-3 against transformers' Phi3 classes: its files' layout (fused qkv_proj and gate_up_proj, read and written as
they are), config spellings (transformers 4's rope_scaling with the early "su" type, 5's rope_parameters), the
variants that change the numbers (partial rotary as Phi-4-mini, tied head, no window, plain rotary), LongRoPE past
original_max_position_embeddings in a forward pass and in generation (where transformers feeds the sequence again),
the sliding window under the KV cache, both task heads, half precision, and the released configs on the meta device.

The tests every family passes run on Phi-3 too, from its declaration; these are what only Phi-3 has.
"""

import json

import pytest
import torch
import transformers
from safetensors import safe_open

from helpers import assert_parity, check_causal_lm, each_device, padded_batch, reference, save, write_weights
from scratch_models import ConfigError, Phi3Config, Phi3ForCausalLM, Phi3ForSequenceClassification, \
    Phi3ForTokenClassification
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import TOLERANCES, verify

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = FAMILIES["phi3"].tiny_config
# Phi-3-mini-4k-instruct's config.json (transformers 4.40)
PHI_3_MINI_4K = {"architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                 "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
                 "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
                 "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
                 "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
                 "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
                 "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True, "vocab_size": 32064}
# Phi-3-mini-128k-instruct's: LongRoPE, 48 factors each (a head of 96 turned whole), spelled "su" at first release
PHI_3_MINI_128K = PHI_3_MINI_4K | {"max_position_embeddings": 131072, "sliding_window": 262144, "rope_scaling": {
    "type": "su", "short_factor": [1.0 + 0.01 * j for j in range(48)], "long_factor": [1.5 + 0.5 * j for j in range(48)]}}
# Phi-4-mini-instruct's: three quarters of each head of 128 turned (48 pairs), grouped keys, a tied head
PHI_4_MINI = PHI_3_MINI_128K | {"hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
                                "partial_rotary_factor": 0.75, "tie_word_embeddings": True, "vocab_size": 200064,
                                "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999,
                                "rope_scaling": PHI_3_MINI_128K["rope_scaling"] | {"type": "longrope"}}
# LongRoPE from an original length of 16 (the tiny config's sequences of 11 take the short factors, 17 and more the
# long ones), as the 128k releases have it
LONGROPE = dict(original_max_position_embeddings=16, rope_scaling={
    "rope_type": "longrope", "short_factor": [1.0, 1.25, 1.75], "long_factor": [1.5, 3.0, 7.0],
    "original_max_position_embeddings": 16})
VARIANTS = {
    "phi-3-like": {},
    "phi-3-128k-like: LongRoPE": LONGROPE,
    # heads of 16, three quarters of each turned: 6 pairs
    "phi-4-mini-like: tied, three quarters turned, no window": dict(
        original_max_position_embeddings=16, tie_word_embeddings=True, hidden_size=64, partial_rotary_factor=0.75, num_key_value_heads=1, sliding_window=None,
        rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5],
                      "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0], "original_max_position_embeddings": 16}),
    "multi-head, whole heads turned, plain rotary": dict(num_key_value_heads=4, partial_rotary_factor=1.0,
                                                         rope_scaling=None, rms_norm_eps=1e-3),
}


def hf(cls=transformers.Phi3ForCausalLM, **changes):
    return reference("phi3", cls.__name__, **changes)


def write_v4(model, directory, rope_type: str = "su"):
    """transformers 4's files: its state dict, rope_theta and partial_rotary_factor flat, rope_scaling with its type
    under "type" (the first 128k release's "su")."""
    write_weights(model.state_dict(), directory, "safetensors")
    config = model.config.to_dict()
    rope = config.pop("rope_parameters")
    config |= {"rope_theta": rope.pop("rope_theta"), "partial_rotary_factor": rope.pop("partial_rotary_factor")}
    rope.pop("rope_type"), rope.pop("type", None), rope.pop("original_max_position_embeddings", None)
    config["rope_scaling"] = rope | {"type": rope_type} if rope else None
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def padded_inputs(seq: int = 11, seed: int = 1) -> dict:
    inputs = padded_batch("phi3", seq, seed)
    mask = inputs["attention_mask"]
    return inputs | dict(input_ids=inputs["input_ids"].masked_fill(mask == 0, 36),
                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0))


CASES = [(variant, "transformers 5") for variant in VARIANTS] + [("phi-3-128k-like: LongRoPE", "transformers 4")]


@each_device
@pytest.mark.parametrize("variant, layout", CASES, ids=[f"{v}, {layout}" for v, layout in CASES])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    reference_model = hf(**VARIANTS[variant])
    (save if layout == "transformers 5" else write_v4)(reference_model, tmp_path)
    model = Phi3ForCausalLM.from_pretrained(tmp_path)
    their_rope = reference_model.config.rope_parameters
    assert (model.config.rope_scaling or {"rope_type": "default"})["rope_type"] == their_rope["rope_type"]
    assert model.config.rotary_dim == int(model.config.head_dim * their_rope["partial_rotary_factor"])
    worst = check_causal_lm("phi3", reference_model, tmp_path, padded_inputs(), device)
    assert (model.lm_head.weight is model.embeddings.embed_tokens.weight) == reference_model.config.tie_word_embeddings
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_the_fused_projections_save_back_bitwise_under_their_own_names(tmp_path):
    """qkv_proj and gate_up_proj are read as published and written back the same: every key of transformers' file,
    every tensor bitwise, no q_proj or gate_proj invented."""
    save(hf(), tmp_path / "theirs")
    Phi3ForCausalLM.from_pretrained(tmp_path / "theirs").save_pretrained(tmp_path / "ours")

    def tensors(directory):
        with safe_open(str(directory / "model.safetensors"), "pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}

    theirs, ours = tensors(tmp_path / "theirs"), tensors(tmp_path / "ours")
    assert ours.keys() == theirs.keys()
    assert "model.layers.1.self_attn.qkv_proj.weight" in ours and "model.layers.1.mlp.gate_up_proj.weight" in ours
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_the_fused_outputs_split_into_queries_keys_values_and_gate_and_branch(tmp_path):
    """attn.qkv holds the n query heads' dimensions, then the n_kv keys', then the values'; mlp.gate_up the gate,
    then the linear branch; only the first rotary_dim dimensions of q and k turn."""
    model = Phi3ForCausalLM.from_pretrained(save(hf(), tmp_path))
    ids = padded_inputs()["input_ids"][:1]
    names = ["layers.0.attn.qkv", "layers.0.attn.q_unrotated", "layers.0.attn.k_unrotated", "layers.0.attn.v",
             "layers.0.attn.q", "layers.0.mlp.gate_up", "layers.0.mlp.pre_act", "layers.0.mlp.up"]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=names)
    qkv = cache["layers.0.attn.qkv"]
    assert torch.equal(qkv[..., :48].unflatten(-1, (4, 12)).transpose(1, 2), cache["layers.0.attn.q_unrotated"])
    assert torch.equal(qkv[..., 48:72].unflatten(-1, (2, 12)).transpose(1, 2), cache["layers.0.attn.k_unrotated"])
    assert torch.equal(qkv[..., 72:].unflatten(-1, (2, 12)).transpose(1, 2), cache["layers.0.attn.v"])
    q, unturned = cache["layers.0.attn.q"], cache["layers.0.attn.q_unrotated"]
    assert torch.equal(q[..., 6:], unturned[..., 6:]) and not torch.equal(q[..., 1:, :6], unturned[..., 1:, :6])
    gate_up = cache["layers.0.mlp.gate_up"]
    assert torch.equal(gate_up[..., :37], cache["layers.0.mlp.pre_act"])
    assert torch.equal(gate_up[..., 37:], cache["layers.0.mlp.up"])


@pytest.mark.parametrize("cls", [transformers.Phi3ForSequenceClassification, transformers.Phi3ForTokenClassification])
def test_the_task_heads_match_transformers(tmp_path, cls):
    reference_model = hf(cls, id2label={0: "a", 1: "b", 2: "c"})
    ours_class = {"Phi3ForSequenceClassification": Phi3ForSequenceClassification,
                  "Phi3ForTokenClassification": Phi3ForTokenClassification}[cls.__name__]
    model = ours_class.from_pretrained(save(reference_model, tmp_path))
    inputs = {name: t[:3] for name, t in padded_inputs().items() if name != "position_ids"}
    labels = torch.tensor([0, 2, 1]) if "Sequence" in cls.__name__ else torch.randint(
        3, (3, 11), generator=torch.Generator().manual_seed(2)).masked_fill(inputs["attention_mask"] == 0, -100)
    with torch.no_grad():
        theirs, mine = reference_model(**inputs, labels=labels), model(**inputs, labels=labels)
    seen = inputs["attention_mask"].bool() if "Token" in cls.__name__ else slice(None)
    assert_parity(mine.logits[seen], theirs.logits[seen], "logits")
    assert_parity(mine.loss, theirs.loss, "loss")


def left_padded_prompts(width: int, lengths, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 36, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, width - length:] = 1
    return ids.masked_fill(mask == 0, 36), mask


@pytest.mark.parametrize("changes", [LONGROPE, {"original_max_position_embeddings": 16}],
                         ids=["longrope", "plain rotary"])
def test_greedy_generation_past_the_window_and_the_original_length_matches_transformers(tmp_path, changes):
    """Prompts of 9 tokens (left-padded) grow to 21: past the window of 5 and past original_max_position_embeddings
    (16), where transformers forgets its cache and feeds the whole sequence again under LongRoPE's long factors;
    token for token the same."""
    reference_model = hf(**changes)
    model = Phi3ForCausalLM.from_pretrained(save(reference_model, tmp_path))
    ids, mask = left_padded_prompts(9, (9, 4, 6, 2))
    with torch.no_grad():
        theirs = reference_model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                          pad_token_id=36, eos_token_id=None)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None), theirs)


def test_generation_feeds_the_sequence_again_where_it_crosses_the_original_length(tmp_path):
    """The step after original_max_position_embeddings tokens scores the next token from a fresh pass over all of
    them (every key turned by the long factors), not from keys the short factors turned: its scores are those of one
    forward pass over the whole sequence, bitwise."""
    model = Phi3ForCausalLM.from_pretrained(save(hf(**LONGROPE), tmp_path))
    prompt = torch.randint(2, 36, (1, 14), generator=torch.Generator().manual_seed(3))
    tokens = model.generate(prompt, max_new_tokens=4, eos_token_id=None)
    decoding = model.decoding(torch.ones(1, 17, dtype=torch.long), 17)
    steps = [decoding(tokens[:, :14], torch.arange(14)[None])]
    steps += [decoding(tokens[:, n:n + 1], torch.tensor([[n]])) for n in (14, 15, 16)]
    with torch.no_grad():
        whole = model(tokens[:, :17]).logits[:, -1].float()
    # position 16, the 17th token: the crossing step, computed afresh (kept keys turned by the short factors would
    # be some 1e-1 off)
    assert_parity(steps[-1], whole, "the crossing step's scores against one pass")
    assert decoding.length == 17 and decoding.cache.length == 17


def test_a_compiled_model_generates_across_the_original_length_as_transformers_does(tmp_path):
    """compile_model's wrapper keeps Phi-3's own decoding under LongRoPE (a static cache cannot feed the sequence
    again): the same tokens as transformers past original_max_position_embeddings, and no graph compiled for it."""
    from scratch_models.decoding.compiled import compile_model

    reference_model = hf(**LONGROPE)
    fast = compile_model(Phi3ForCausalLM.from_pretrained(save(reference_model, tmp_path)))
    ids, mask = left_padded_prompts(9, (9, 4, 6, 2))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.no_grad():
        theirs = reference_model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                          pad_token_id=36, eos_token_id=None)
        ours = fast.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(ours, theirs)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_longrope_past_the_original_length_matches_transformers_in_one_pass(tmp_path):
    """22 tokens, past original_max_position_embeddings (16): every position turned by the long factors and the
    scores scaled by LongRoPE's attention factor, sqrt(1 + ln(24 / 16) / ln 16); within it, the short ones."""
    reference_model = hf(**LONGROPE)
    model = Phi3ForCausalLM.from_pretrained(save(reference_model, tmp_path))
    assert model.rotary.attention_factor == pytest.approx((1 + torch.log(torch.tensor(1.5)) /
                                                           torch.log(torch.tensor(16.0))).sqrt().item())
    for length in (22, 16):
        ids = torch.randint(36, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            assert_parity(model(ids).logits, reference_model(ids).logits, f"{length} tokens: logits")
    turned = {}
    for length in (16, 17):
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.zeros(1, length, dtype=torch.long), names=["layers.0.attn.q"])
        turned[length] = cache["layers.0.attn.q"][..., :6, :]
    assert not torch.equal(turned[16], turned[17][..., :16, :])  # the long factors turn every position


@each_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, dtype, device):
    save(hf(), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs(), dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


@pytest.mark.parametrize("config, billions", [(PHI_3_MINI_4K, 3.82), (PHI_3_MINI_128K, 3.82), (PHI_4_MINI, 3.84)],
                         ids=["phi-3-mini-4k", "phi-3-mini-128k", "phi-4-mini"])
def test_the_released_configs_build_transformers_shapes_on_the_meta_device(config, billions):
    ours_config = Phi3Config.from_dict(config)
    # transformers 5 wants the original length inside the scaling, where its from_pretrained puts it
    theirs_config = transformers.Phi3Config(**{k: v for k, v in config.items()
                                               if k not in ("architectures", "torch_dtype")} | (
        {"rope_scaling": config["rope_scaling"] | {"original_max_position_embeddings": 4096}}
        if config["rope_scaling"] else {}))
    assert ours_config.rope_scaling == (None if config["rope_scaling"] is None else {
        "rope_type": "longrope", **{k: theirs_config.rope_parameters[k] for k in (
            "short_factor", "long_factor", "original_max_position_embeddings")}})
    with torch.device("meta"):
        ours, theirs = Phi3ForCausalLM(ours_config), transformers.Phi3ForCausalLM(theirs_config)
    assert ours.rotary.dim == int(theirs_config.hidden_size // theirs_config.num_attention_heads
                                  * theirs_config.rope_parameters["partial_rotary_factor"])
    table = FAMILIES["phi3"].table
    names = table.tensor_names(config["num_hidden_layers"])
    their_state = {k: v for k, v in theirs.state_dict().items()
                   if not (config["tie_word_embeddings"] and k == "lm_head.weight")}
    assert {names[table.normalize(k)]: v.shape for k, v in their_state.items()} == {
        name: v.shape for name, v in ours.state_dict().items() if not (
            config["tie_word_embeddings"] and name == "lm_head.weight")}
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) and round(count / 1e9, 2) == billions


@pytest.mark.parametrize("changes, message", [
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope scaling 'linear' is not one Phi-3 has"),
    ({"partial_rotary_factor": 1.5}, "partial_rotary_factor is 1.5"),
    ({"partial_rotary_factor": 0.3}, r"int\(head_dim 12 x partial_rotary_factor 0.3\) = 3 is not a positive even"),
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6,
                       "original_max_position_embeddings": 16}},
     "6 short_factor entries; the rotary embedding turns 3 pairs"),
    ({"resid_pdrop": 1.0}, "'resid_pdrop' must be in"),
])
def test_config_refusals_name_the_field(changes, message):
    raw = Phi3Config(**SMALL).to_dict() | changes
    with pytest.raises(ConfigError, match=message):
        Phi3Config.from_dict(raw, "config.json")


def test_the_early_su_spelling_and_transformers_5_rope_parameters_read_alike():
    longrope = SMALL | LONGROPE
    v4 = {**longrope, "rope_theta": 500.0, "rope_scaling": longrope["rope_scaling"] | {"type": "su"}}
    del v4["rope_scaling"]["rope_type"]
    v5 = {key: value for key, value in longrope.items() if key not in ("rope_scaling", "partial_rotary_factor")} | {
        "rope_parameters": longrope["rope_scaling"] | {"rope_theta": 500.0, "partial_rotary_factor": 0.5}}
    a, b = Phi3Config.from_dict(v4), Phi3Config.from_dict(v5)
    assert a == b and a.rope_scaling["rope_type"] == "longrope" and a.rope_theta == 500.0 and b.rotary_dim == 6
