"""OLMo 3 against transformers' Olmo3 classes: OLMo 2's files and post-norm layer with local (sliding-window) and
global layers, each turned by the rotary embedding of its kind (the global one scaled by YaRN, as the long-context
releases): config spellings (transformers 4's flat rope_theta and rope_scaling, 5's per-kind rope_parameters), the
sequence classifier, the KV cache and greedy generation past the window, half precision, the released config on the
meta device.

The tests every family passes run on OLMo 3 too, from its declaration; these are what only OLMo 3 has.
"""

import dataclasses
import json

import pytest
import torch
import transformers

from helpers import assert_parity, check_causal_lm, each_device, padded_batch, reference, save, write_weights
from scratch_models import ConfigError, Olmo3Config, Olmo3ForCausalLM, Olmo3ForSequenceClassification
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import TOLERANCES, verify

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = FAMILIES["olmo3"].tiny_config
# Olmo-3-1025-7B's config.json, as transformers 4.57 wrote it (the long-context YaRN on the global layers)
OLMO_3_7B = {"architectures": ["Olmo3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
             "intermediate_size": 11008, "max_position_embeddings": 65536, "model_type": "olmo3",
             "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277,
             "rms_norm_eps": 1e-06, "rope_theta": 500000, "sliding_window": 4096, "tie_word_embeddings": False,
             "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1, "factor": 8.0,
                              "original_max_position_embeddings": 8192, "rope_type": "yarn"},
             "layer_types": ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(32)],
             "torch_dtype": "bfloat16", "transformers_version": "4.57.0", "use_cache": True, "vocab_size": 100278}
# four layers, so that transformers' default layer_types gives three local ones and a global one (the tiny config's
# two are both local), the global one scaled
GLOBAL = dict(num_hidden_layers=4, rope_scaling={"rope_type": "linear", "factor": 2.0})
# the long-context releases' scaling of the global layers, from an original length of 12
YARN = GLOBAL | dict(rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 12})
VARIANTS = {
    "olmo-3-like: three local layers, a global one": GLOBAL,
    "long-context: YaRN on the global layer": YARN,
    "both layers local": {},
    "grouped heads, biases, layer_types given, plain rotary": dict(
        layer_types=["full_attention", "sliding_attention"], num_key_value_heads=2, attention_bias=True),
}


def hf(cls=transformers.Olmo3ForCausalLM, **changes):
    return reference("olmo3", cls.__name__, **changes)


def write_v4(model, directory):
    """transformers 4's files: its state dict, rope_theta flat and the global layers' scaling as rope_scaling."""
    write_weights(model.state_dict(), directory, "safetensors")
    config = model.config.to_dict()
    rope = config.pop("rope_parameters")
    full = dict(rope["full_attention"])
    config["rope_theta"] = full.pop("rope_theta")
    config["rope_scaling"] = None if full["rope_type"] == "default" else full
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def padded_inputs(seq: int = 11, seed: int = 1) -> dict:
    inputs = padded_batch("olmo3", seq, seed)
    mask = inputs["attention_mask"]
    return inputs | dict(input_ids=inputs["input_ids"].masked_fill(mask == 0, 0),
                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0))


CASES = [(variant, "transformers 5") for variant in VARIANTS] + [
    ("long-context: YaRN on the global layer", "transformers 4")]


@each_device
@pytest.mark.parametrize("variant, layout", CASES, ids=[f"{v}, {layout}" for v, layout in CASES])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    reference_model = hf(**VARIANTS[variant])
    (save if layout == "transformers 5" else write_v4)(reference_model, tmp_path)
    model = Olmo3ForCausalLM.from_pretrained(tmp_path)
    assert model.config.layer_types == reference_model.config.layer_types
    worst = check_causal_lm("olmo3", reference_model, tmp_path, padded_inputs(), device)
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_each_kind_of_layer_has_its_window_and_its_rotary_embedding(tmp_path):
    """Layer 0 (local) sees the last 5 keys and turns q by the default rotary embedding; layer 3 (global) sees every
    key and turns q by YaRN's (its own frequencies, its attention factor)."""
    model = Olmo3ForCausalLM.from_pretrained(save(hf(**YARN), tmp_path))
    ids = padded_inputs()["input_ids"][:1]
    names = [f"layers.{i}.attn.{point}" for i in (0, 3) for point in ("scores", "q", "q_unrotated")]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=names)
    lowest = torch.finfo(torch.float32).min
    assert int((cache["layers.0.attn.scores"][0, 0, -1] > lowest).sum()) == 5
    assert int((cache["layers.3.attn.scores"][0, 0, -1] > lowest).sum()) == 11
    for layer, rotary in ((0, model.rotary_local), (3, model.rotary)):
        cos, sin = rotary(torch.arange(11)[None], torch.float32)
        q = cache[f"layers.{layer}.attn.q_unrotated"]
        turned = q * cos[:, None] + torch.cat((-q[..., 6:], q[..., :6]), -1) * sin[:, None]
        assert torch.equal(turned.to(q.dtype), cache[f"layers.{layer}.attn.q"]), layer
    assert model.rotary.attention_factor > 1 and model.rotary_local.attention_factor == 1


def test_the_sequence_classifier_matches_transformers(tmp_path):
    reference_model = hf(transformers.Olmo3ForSequenceClassification, id2label={0: "a", 1: "b", 2: "c"},
                         pad_token_id=36, **GLOBAL)
    model = Olmo3ForSequenceClassification.from_pretrained(save(reference_model, tmp_path))
    inputs = {name: t[:3] for name, t in padded_inputs().items() if name != "position_ids"}
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 36)
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs, mine = reference_model(**inputs, labels=labels), model(**inputs, labels=labels)
    assert_parity(mine.logits, theirs.logits, "logits")
    assert_parity(mine.loss, theirs.loss, "loss")


def test_greedy_generation_past_the_window_matches_transformers_token_for_token(tmp_path):
    """Left-padded prompts of up to 7 tokens grow to 19: the local layers' window (5) slides over the KV cache, the
    global layer (YaRN) sees it all."""
    reference_model = hf(eos_token_id=36, pad_token_id=0, **YARN)
    model = Olmo3ForCausalLM.from_pretrained(save(reference_model, tmp_path))
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 36, (4, 7), generator=g)
    mask = torch.zeros(4, 7, dtype=torch.long)
    for row, length in enumerate((7, 3, 5, 1)):
        mask[row, 7 - length:] = 1
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        theirs = reference_model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                          pad_token_id=0, eos_token_id=None)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None), theirs)


@each_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, dtype, device):
    save(hf(**YARN), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs(), dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


def test_the_released_config_builds_transformers_shapes_on_the_meta_device():
    ours_config = Olmo3Config.from_dict(OLMO_3_7B)
    theirs_config = transformers.Olmo3Config(**{k: v for k, v in OLMO_3_7B.items()
                                                if k not in ("architectures", "torch_dtype")})
    assert ours_config.rope_scaling["rope_type"] == theirs_config.rope_parameters["full_attention"]["rope_type"]
    assert theirs_config.rope_parameters["sliding_attention"]["rope_type"] == "default"
    with torch.device("meta"):
        ours, theirs = Olmo3ForCausalLM(ours_config), transformers.Olmo3ForCausalLM(theirs_config)
    table = FAMILIES["olmo3"].table
    names = table.tensor_names(OLMO_3_7B["num_hidden_layers"])
    assert {names[table.normalize(k)]: v.shape for k, v in theirs.state_dict().items()} == {
        name: v.shape for name, v in ours.state_dict().items()}
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) and round(count / 1e9, 2) == 7.3
    assert ours.sliding_window == 4096 and sum(ours_config.sliding_layers) == 24


def test_config_reads_transformers_4_and_5_names_alike():
    theirs = transformers.Olmo3Config(**{k: v for k, v in OLMO_3_7B.items() if k not in ("architectures",
                                                                                         "torch_dtype")})
    v5 = Olmo3Config.from_dict(theirs.to_dict())
    v4 = Olmo3Config.from_dict(OLMO_3_7B)
    assert v4 == dataclasses.replace(v5, id2label=None) and v5.rope_theta == 500000 and v5.rope_scaling["factor"] == 8.0


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0},
                          "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}},
     "gives the sliding_attention layers a rotary embedding of their own"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                          "full_attention": {"rope_type": "default", "rope_theta": 500.0}}},
     "gives the sliding_attention layers a rotary embedding of their own"),
    ({"layer_types": ["sliding_attention"]}, "should name each of the 2 layers"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "should name each of the 2 layers"),
    ({"sliding_window": None}, "names sliding_attention layers, but sliding_window is null"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        Olmo3Config.from_dict(Olmo3Config(**SMALL).to_dict() | changes, "config.json")
