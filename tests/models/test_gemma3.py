"""Gemma 3's language model against transformers' Gemma3 classes: the text checkpoints' layouts and config spellings
(transformers 4's rope_theta, rope_local_base_freq, rope_scaling and sliding_window_pattern without layer_types;
transformers 5's rope_parameters per layer kind and layer_types), the variants that change the numbers, the
multimodal Gemma3ForConditionalGeneration's files (the language model read from their keys in both layouts, the
vision tower left out and said so, text logits equal to the whole model's), the task head, the KV cache past the
window, greedy and seeded generation, half precision and the parity report, the released configs on the meta
device, config refusals.

The tiny config has two layers, local then global (sliding_window_pattern 2), rotary bases 10 and 1000 and linear
scaling on the global layer: a layer turned by the other kind's angles, or a scaling applied to the local layers,
moves every number compared. The tests every family passes (training, edges, compiled, exports, analysis, the
command line) run on Gemma 3 too, from its declaration; these are what only Gemma 3 has.
"""

import dataclasses
import json

import pytest
import torch
import transformers

from helpers import (assert_parity, check_causal_lm, each_device, hub_model_available, randomize_, reference, save,
                     sighted, write_weights)
from scratch_models import ConfigError, Gemma3ForCausalLM, Gemma3TextConfig, Gemma3TextForSequenceClassification
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import TOLERANCES, verify

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = "gemma3_text"
SMALL = FAMILIES[FAMILY].tiny_config
# gemma-3-1b-pt's config.json as transformers 4.50 wrote it
GEMMA_3_1B = {"architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
              "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
              "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
              "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
              "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
              "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
              "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
              "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144}
# gemma-3-270m's (transformers 4.55: layer_types written, the pattern as _sliding_window_pattern)
GEMMA_3_270M = {k: v for k, v in GEMMA_3_1B.items() if k not in ("cache_implementation", "sliding_window_pattern")} | {
    "_sliding_window_pattern": 6, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    "use_bidirectional_attention": False, "transformers_version": "4.55.0.dev0"}
# gemma-3-4b-pt's: the multimodal model, whose text_config gives only what differs from the defaults
GEMMA_3_4B = {"architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
              "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
              "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
              "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                              "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                              "sliding_window": 1024},
              "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
              "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                                "model_type": "siglip_vision_model", "num_attention_heads": 16,
                                "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}
# what changes the numbers, away from the tiny config
VARIANTS = {
    "gemma-3-like": {},
    "no scaling, no cap, every layer local": dict(rope_scaling=None, final_logit_softcapping=None,
                                                  sliding_window_pattern=6),
    "global layers only, multi-head, biases, untied": dict(
        layer_types=["full_attention"] * 2, num_key_value_heads=4, attention_bias=True, tie_word_embeddings=False,
        hidden_activation="gelu", query_pre_attn_scalar=16, rms_norm_eps=1e-3),
}
# a small SigLIP tower for the multimodal checkpoints
VISION = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)


def hf(cls=transformers.Gemma3ForCausalLM, **changes):
    return reference(FAMILY, cls.__name__, **changes)


def hub_config(model) -> dict:
    """config.json in transformers 4's words: the flat rotary fields, sliding_window_pattern, no layer_types."""
    c = model.config
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "attention_bias",
              "query_pre_attn_scalar", "sliding_window", "final_logit_softcapping", "pad_token_id", "bos_token_id",
              "eos_token_id", "hidden_activation", "tie_word_embeddings")
    rope = c.rope_parameters
    scaling = {k: v for k, v in rope["full_attention"].items() if k != "rope_theta"}
    return {k: v for k, v in GEMMA_3_1B.items() if k not in SMALL} | {f: getattr(c, f) for f in fields} | {
        "rope_theta": rope["full_attention"]["rope_theta"], "rope_local_base_freq": rope["sliding_attention"][
            "rope_theta"], "rope_scaling": None if scaling["rope_type"] == "default" else scaling,
        "sliding_window_pattern": SMALL["sliding_window_pattern"]}


def write_hub(model, directory, fmt: str = "safetensors", shards: int = 1):
    """The hub files' layout: `model.` on the base keys, no lm_head (tied)."""
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    write_weights(state, directory, fmt, shards)
    (directory / "config.json").write_text(json.dumps(hub_config(model), indent=2))
    return directory


def padded_inputs(vocab: int = SMALL["vocab_size"], seq: int = 11, seed: int = 1) -> dict:
    """Four rows, longer than the sliding window: full, left-padded (positions count real tokens, as generate gives
    them), right-padded, and all padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab - 1, (4, seq), generator=g)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:], mask[3] = 0, 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, position_ids=positions)


# ------------------------------------------------------------------------------------------------ layouts


CASES = [(variant, "transformers 5") for variant in VARIANTS] + [
    ("gemma-3-like", layout) for layout in ("hub safetensors", "hub bin", "hub sharded")]


@each_device
@pytest.mark.parametrize("variant, layout", CASES, ids=[f"{v}, {layout}" for v, layout in CASES])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    reference_model = hf(**VARIANTS[variant])
    if layout == "transformers 5":
        save(reference_model, tmp_path)
        written = json.loads((tmp_path / "config.json").read_text())
        assert set(written["rope_parameters"]) == {"full_attention", "sliding_attention"} and "layer_types" in written
    else:
        fmt = "bin" if layout.endswith("bin") else "safetensors"
        write_hub(reference_model, tmp_path, fmt, shards=3 if layout.endswith("sharded") else 1)
    worst = check_causal_lm(FAMILY, reference_model, tmp_path, padded_inputs(), device)
    model = Gemma3ForCausalLM.from_pretrained(tmp_path)
    assert model.loading_info.prefixed and not model.loading_info.ignored
    assert (model.lm_head.weight is model.embeddings.embed_tokens.weight) == reference_model.config.tie_word_embeddings
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_each_kind_of_layer_has_its_window_and_its_rotary_base(tmp_path):
    """Layer 0 is local (window 5, base 10), layer 1 global (everything, base 1000 scaled by 2): the
    probabilities show the windows, and the queries are turned by the angles of the layer's kind."""
    model = Gemma3ForCausalLM.from_pretrained(save(hf(), tmp_path))
    assert model.config.layer_types == ["sliding_attention", "full_attention"]
    ids = padded_inputs()["input_ids"][:1]
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, output_attentions=True)
    queries, keys = torch.arange(11)[:, None], torch.arange(11)[None, :]
    window = (keys <= queries) & (keys > queries - 5)
    assert bool((out.attentions[0][0][:, ~window] == 0).all())
    assert bool((out.attentions[1][0][:, keys <= queries] > 0).all())
    positions = torch.arange(11)[None]
    for layer, base, factor in ((0, 10.0, 1.0), (1, 1000.0, 2.0)):
        inv_freq = 1.0 / base ** (torch.arange(0, 16, 2).float() / 16) / factor
        angles = torch.cat([positions[..., None] * inv_freq] * 2, -1)
        q = cache[f"layers.{layer}.attn.q_unrotated"]
        half = torch.cat((-q[..., 8:], q[..., :8]), -1)
        assert torch.allclose(cache[f"layers.{layer}.attn.q"], q * angles.cos() + half * angles.sin(), atol=1e-5)


# --------------------------------------------------------------------------------------------- multimodal


def multimodal(tie: bool = True, **changes):
    """transformers' Gemma3ForConditionalGeneration over the tiny language model and a small vision tower, random."""
    text = FAMILIES[FAMILY].tiny(**changes).to_dict()
    config = transformers.Gemma3Config(text_config=transformers.Gemma3TextConfig(**text), vision_config=VISION,
                                       mm_tokens_per_image=4, boi_token_index=33, eoi_token_index=34,
                                       image_token_index=35, tie_word_embeddings=tie)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration._from_config(config, attn_implementation="eager")
    return randomize_(model, 0.3).eval()


@pytest.mark.parametrize("layout", ["as saved (language_model.model.)", "transformers 5's state dict",
                                    "untied, the head stored"])
def test_the_language_model_of_a_multimodal_checkpoint_loads_without_its_vision_tower(tmp_path, layout):
    """The language model is read from its keys, whichever layout; the vision tower and projector are skipped, each
    tensor for its reason, and the notes say so once; on text the logits are the whole multimodal model's."""
    whole = multimodal(tie=not layout.startswith("untied"))
    whole.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "gemma3" and "vision_config" in written
    if layout == "transformers 5's state dict":  # the names transformers 5 holds in memory, written as they are
        state = {key: value for key, value in whole.state_dict().items() if key != "lm_head.weight"}
        (tmp_path / "model.safetensors").unlink()
        write_weights(state, tmp_path, "safetensors")
    model = Gemma3ForCausalLM.from_pretrained(tmp_path)
    info = model.loading_info
    towers = [key for key in info.ignored if "vision_tower" in key or "multi_modal_projector" in key]
    assert towers and set(info.ignored) == set(towers)
    assert any(note.startswith("left out vision_tower (") and "not built here" in note for note in info.notes)
    assert any(note.startswith("left out multi_modal_projector (") for note in info.notes)
    assert (model.lm_head.weight is model.embeddings.embed_tokens.weight) == whole.config.tie_word_embeddings
    if layout.startswith("untied"):
        assert info.loaded["lm_head.weight"] in ("lm_head.weight", "language_model.lm_head.weight")
    inputs = padded_inputs()
    seen = sighted(FAMILY, inputs["attention_mask"])
    with torch.no_grad():
        ours, theirs = model(**inputs), whole(**inputs)
    # the whole model leaves the final cap out (transformers' Gemma3ForConditionalGeneration applies none)
    cap = model.config.final_logit_softcapping
    assert_parity(ours.logits[seen], (cap * torch.tanh(theirs.logits / cap))[seen], "logits")


def test_a_multimodal_checkpoint_saves_as_the_text_model_transformers_reads(tmp_path):
    """Saved, the language model is Gemma3ForCausalLM's files (model_type gemma3_text), which transformers loads
    with nothing missing or unexpected and computes the same bits with."""
    multimodal().save_pretrained(tmp_path / "in")
    model = Gemma3ForCausalLM.from_pretrained(tmp_path / "in")
    model.save_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "gemma3_text"
    theirs, info = transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True,
                                                                  attn_implementation="eager")
    assert not any(info.values()), info
    inputs = padded_inputs()
    seen = sighted(FAMILY, inputs["attention_mask"])
    with torch.no_grad():
        ours = model(**inputs, output_attentions=True).logits  # the explicit path: eager's operations, in its order
        assert torch.equal(ours[seen], theirs.eval()(**inputs).logits[seen])


def test_verify_compares_a_multimodal_file_with_the_language_model_of_transformers_whole_model(tmp_path):
    """transformers reads the multimodal file only as Gemma3ForConditionalGeneration: the layers are compared with
    its language model, the logits with its own (on text; no final cap, as in every release: that class applies
    none)."""
    multimodal(final_logit_softcapping=None).save_pretrained(tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs())
    assert report.passed, report.format()
    assert {"layers.1.attn.probs", "layers.1.mlp_out", "logits"} <= {
        c.name for c in report.rows}
    assert any("compared with the language model of transformers' Gemma3ForConditionalGeneration" in note
               for note in report.notes)
    assert any("left out vision_tower" in note for note in report.notes)


def test_the_multimodal_config_is_read_as_its_language_model():
    """gemma-3-4b's config.json: the text_config's few fields over transformers' defaults (8 heads of 256 sharing
    4 key/value heads, a vocabulary of 262208), linear scaling by 8 on the global layers, every sixth layer global."""
    ours = Gemma3TextConfig.from_dict(GEMMA_3_4B)
    theirs = transformers.Gemma3Config(**{k: v for k, v in GEMMA_3_4B.items() if k != "torch_dtype"}).text_config
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "sliding_window", "query_pre_attn_scalar", "layer_types",
                  "max_position_embeddings", "rms_norm_eps", "pad_token_id"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_scaling == {"rope_type": "linear", "factor": 8.0} and ours.rope_theta == 1e6
    assert ours.rope_local_base_freq == theirs.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert ours.layer_types[4:7] == ["sliding_attention", "full_attention", "sliding_attention"]


def test_a_multimodal_checkpoint_is_refused_by_other_families_and_other_wrappers_still_refused(tmp_path):
    """Only Gemma 3 reads a `gemma3` file; a multimodal model of another kind is still refused as multimodal."""
    from scratch_models import Gemma2ForCausalLM, LlamaForCausalLM
    from weight_mapping import CheckpointError

    multimodal().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model_type is 'gemma3' \(Gemma 3\)"):
        Gemma2ForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="model_type is 'gemma3', but LlamaConfig needs 'llama'"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "paligemma"}))
    with pytest.raises(CheckpointError, match="a multimodal model"):
        Gemma3ForCausalLM.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------- task head


def test_the_sequence_classifier_matches_transformers(tmp_path):
    """transformers' generic sequence classifier: `score` (no bias) read at each row's last real token."""
    reference_model = hf(transformers.Gemma3TextForSequenceClassification, id2label={0: "a", 1: "b", 2: "c"},
                         pad_token_id=36)
    model = Gemma3TextForSequenceClassification.from_pretrained(save(reference_model, tmp_path))
    assert not model.loading_info.ignored and model.score.bias is None
    inputs = {name: t[:3] for name, t in padded_inputs().items() if name != "position_ids"}
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 36)
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs, mine = reference_model(**inputs, labels=labels), model(**inputs, labels=labels)
    assert_parity(mine.logits, theirs.logits, "logits")
    assert_parity(mine.loss, theirs.loss, "loss")


# ---------------------------------------------------------------------------------- KV cache and generation


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    reference_model = hf(eos_token_id=36, pad_token_id=0)
    return reference_model, write_hub(reference_model, tmp_path_factory.mktemp("gemma3-small"))


def test_cache_step_by_step_equals_one_forward_past_the_window(small):
    """Keys are cached turned (each layer by its own base); a local layer's new token sees only the window's keys."""
    _, directory = small
    model = Gemma3ForCausalLM.from_pretrained(directory)
    inputs = padded_inputs()
    ids, mask, positions = inputs["input_ids"][:3], inputs["attention_mask"][:3], inputs["position_ids"][:3]
    with torch.no_grad():
        full = model(ids, attention_mask=mask, position_ids=positions)
        first = model(ids[:, :3], attention_mask=mask[:, :3], position_ids=positions[:, :3], use_cache=True)
        steps = [first]
        for t in range(3, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=positions[:, t:t + 1],
                               past_key_values=first.past_key_values))
    real = mask.bool()
    assert_parity(torch.cat([s.logits for s in steps], dim=1)[real], full.logits[real], "logits, cached")


def left_padded_prompts():
    """Prompts of lengths 7, 3, 5 and 1, padded on the left."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 36, (4, 7), generator=g)
    mask = torch.zeros(4, 7, dtype=torch.long)
    for row, length in enumerate((7, 3, 5, 1)):
        mask[row, 7 - length:] = 1
    return ids.masked_fill(mask == 0, 0), mask


def test_greedy_generation_matches_transformers_token_for_token(small):
    """Past the sliding window (17 tokens generated after prompts of up to 7), transformers' generate, token for
    token."""
    reference_model, directory = small
    model = Gemma3ForCausalLM.from_pretrained(directory)
    ids, mask = left_padded_prompts()
    with torch.no_grad():
        theirs = reference_model.generate(ids, attention_mask=mask, max_new_tokens=17, do_sample=False,
                                          pad_token_id=0, eos_token_id=None)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=17, eos_token_id=None), theirs)


def test_seeded_sampling_matches_transformers_token_for_token(small):
    reference_model, directory = small
    model = Gemma3ForCausalLM.from_pretrained(directory)
    ids, mask = left_padded_prompts()
    settings = dict(max_new_tokens=12, do_sample=True, temperature=0.8, top_k=12, top_p=0.9, eos_token_id=None)
    torch.manual_seed(7)
    with torch.no_grad():
        theirs = reference_model.generate(ids, attention_mask=mask, pad_token_id=0, **settings)
    torch.manual_seed(7)
    assert torch.equal(model.generate(ids, attention_mask=mask, **settings), theirs)


# -------------------------------------------------------------------------------------------- half precision


@each_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, dtype, device):
    write_hub(hf(), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs(), dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


def test_float32_report_passes_within_the_bound_on_every_row(tmp_path):
    write_hub(hf(), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs())
    assert report.passed, report.format()
    names = {c.name for c in report.rows}
    assert {"layers.0.attn.probs", "layers.1.attn.probs", "layers.1.attn_out", "layers.0.mlp_out", "logits"} <= names
    atol, rtol = TOLERANCES[torch.float32]  # verify's own float32 bound, whatever the scale
    assert max(c.max_abs for c in report.rows) <= atol + rtol


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("config", [GEMMA_3_270M, GEMMA_3_1B, GEMMA_3_4B], ids=["270m", "1b", "4b"])
def test_the_released_configs_build_transformers_shapes_on_the_meta_device(config):
    """Every tensor's name and shape, and the parameter count, as transformers builds them from the same
    config.json (the 4b's language model: its Gemma3ForConditionalGeneration's, vision tower aside)."""
    table = FAMILIES[FAMILY].table
    ours_config = Gemma3TextConfig.from_dict(config)
    fields = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    with torch.device("meta"):
        ours = Gemma3ForCausalLM(ours_config)
        if config["model_type"] == "gemma3":
            theirs = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(**fields))
        else:
            theirs = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**fields))
    names = table.tensor_names(ours_config.num_hidden_layers)
    their_shapes = {table.normalize(k): v.shape for k, v in theirs.state_dict().items()}
    their_shapes = {names[k]: shape for k, shape in their_shapes.items()
                    if k != "lm_head.weight" and table.left_out_part(k) is None}
    assert their_shapes == {name: v.shape for name, v in ours.state_dict().items()}
    count = sum(p.numel() for p in ours.parameters())
    billions = {640: 0.27, 1152: 1.0}.get(ours_config.hidden_size)  # gemma-3-270m, gemma-3-1b, tied
    if billions is not None:
        assert round(count / 1e9, 2) == billions
    assert count == sum(p.numel() for name, p in theirs.named_parameters()
                        if "vision_tower" not in name and "multi_modal_projector" not in name)


def test_config_reads_transformers_4_and_5_names_alike():
    hub = Gemma3TextConfig.from_dict(GEMMA_3_1B)
    modern = transformers.Gemma3TextConfig(**{k: v for k, v in GEMMA_3_1B.items() if k != "torch_dtype"})
    written = Gemma3TextConfig.from_dict(modern.to_dict())
    assert hub == dataclasses.replace(written, id2label=None) and hub.layer_types[4:7] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert Gemma3TextConfig.from_dict(hub.to_dict()) == hub
    back = transformers.Gemma3TextConfig(**hub.to_dict())
    assert back.layer_types == hub.layer_types and back.rope_parameters == modern.rope_parameters
    assert Gemma3TextConfig.from_dict(GEMMA_3_270M).layer_types == GEMMA_3_270M["layer_types"]


@pytest.mark.parametrize("changes, message", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported: transformers' Gemma 3"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "scales the sliding_attention layers' rotary embedding"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "'rope_parameters' should hold an object for "
                                                                        "each of sliding_attention, full_attention"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, "needs a factor of at least 1"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"layer_types": ["sliding_attention"] * 3}, "should name one of sliding_attention, full_attention for each of "
                                                  "the 26 layers"),
    ({"sliding_window_pattern": 0}, "'sliding_window_pattern' must be positive"),
    ({"model_type": "gemma2"}, "model_type is 'gemma2', but Gemma3TextConfig needs 'gemma3_text'"),
    # another architecture's rotary spelling is not read as Gemma 3's: its model_type is named first
    ({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
     "model_type is 'llama', but Gemma3TextConfig needs 'gemma3_text'"),
    ({"model_type": "gemma3", "text_config": {"model_type": "gemma2"}}, "text_config's model_type is 'gemma2'"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        Gemma3TextConfig.from_dict(GEMMA_3_1B | changes, source="config.json")


# ---------------------------------------------------------------------------------------------------- analysis


def test_the_analysis_reads_the_post_norms_of_gemma_3(tmp_path):
    """A head's part of the stream is its result through the post-attention norm; decompose_resid's attention
    part is attn_out; direct logit attribution splits the scores before the final cap; the logit lens caps."""
    model = Gemma3ForCausalLM.from_pretrained(save(hf(), tmp_path))
    inputs = {name: t[:3] for name, t in padded_inputs().items()}
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
    cache.compute_head_results()
    parts = cache.stack_head_results(layer=2)
    assert torch.allclose(parts[4:].sum(0), cache["layers.1.attn_out"], atol=1e-5)
    assert not torch.allclose(cache["layers.1.attn.result"].sum(-2), cache["layers.1.attn_out"], atol=1e-2)
    attrs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=3, pos_slice=-1)
    assert torch.allclose(attrs.sum(0), cache["uncapped_logits"][:, -1, 3], atol=1e-4)
    assert torch.allclose(cache.logit_lens()[-1], out.logits, atol=1e-5)


def test_a_hub_id_reads_as_the_gemma_it_names():
    """Offline, a hub id says its family by its name: the Gemmas share their first word, so the most leading words
    decide."""
    from scratch_models_cli.common import family_named_by

    assert family_named_by("google/gemma-2-9b").name == "gemma2"
    assert family_named_by("google/gemma-3-4b-it").name == FAMILY
    assert family_named_by("google/gemma-7b").name == "gemma"  # Gemma 1's, by its family's name
    assert family_named_by("EleutherAI/pythia-1b").name == "gpt_neox"


@pytest.mark.skipif(not hub_model_available("google/gemma-3-1b-pt"),
                    reason="google/gemma-3-1b-pt is not in the local Hugging Face cache and huggingface.co is "
                           "unreachable (no network to the model hub here)")
def test_hub_gemma_3_1b():
    report = verify("google/gemma-3-1b-pt")
    assert report.passed, report.format()
    model = Gemma3ForCausalLM.from_pretrained("google/gemma-3-1b-pt")
    ids = model.tokenizer("The capital of France is")["input_ids"]
    reference_model = transformers.Gemma3ForCausalLM.from_pretrained("google/gemma-3-1b-pt",
                                                                     attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = reference_model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=8), theirs)
