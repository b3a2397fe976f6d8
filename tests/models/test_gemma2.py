"""Gemma 2 parity with transformers' Gemma2 classes: the hub files' layout and config spellings (transformers 4's
rope_theta and hidden_act beside hidden_activation, no layer_types, an eos list) and transformers 5's
(rope_parameters, layer_types), the variants that change the numbers (no caps; given layer types with no sliding
layer, plain multi-head attention, biases, an untied head), the task heads, the KV cache across the sliding window,
greedy and seeded generation, half precision, the embedding scale in each dtype; gemma-2's real per-layer sizes for
truth; the 2b, 9b and 27b configs on the meta device; Gemma 3 refused by name; the hub's gemma-2-2b when cached.

transformers' Gemma 2 has no SDPA path (SDPA cannot soft-cap the scores), so its eager attention is the reference
of both our paths: with the scores capped ours always takes the explicit path, as transformers does; without a cap
our fused path (torch's SDPA kernel) is held to its eager attention within assert_parity's bound, the blind queries
zeroed (helpers.blind_zeroed).

The tests every family passes (training, edges, compiled, exports, analysis, the command line) run on Gemma 2 too,
from its declaration; these are what only Gemma 2 has.
"""

import json

import pytest
import torch
import transformers

from helpers import (assert_parity, blind_zeroed, check_causal_lm, each_device, hub_model_available,
                     randomize_, save, sighted, write_weights)
from scratch_models import (ConfigError, Gemma2Config, Gemma2ForCausalLM, Gemma2ForSequenceClassification,
                            Gemma2ForTokenClassification, Gemma2Model)
from scratch_models.registry.families import FAMILIES
from scratch_models.gemma2.model import Gemma2Embeddings
from scratch_models_cli.verify import TOLERANCES, verify
from weight_mapping import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = FAMILIES["gemma2"].tiny_config
# gemma-2-2b's config.json as transformers 4.42 wrote it (the -it model's two end tokens)
GEMMA_2_2B = {"architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
              "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
              "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
              "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
              "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
              "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True,
              "vocab_size": 256000}
# the larger releases differ in these (transformers' documented configs)
GEMMA_2_9B = GEMMA_2_2B | {"hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
                           "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 224}
GEMMA_2_27B = GEMMA_2_2B | {"hidden_size": 4608, "intermediate_size": 36864, "num_attention_heads": 32,
                            "num_hidden_layers": 46, "num_key_value_heads": 16, "head_dim": 128,
                            "query_pre_attn_scalar": 144}
# what changes the numbers, away from the tiny config's gemma-2-like settings
VARIANTS = {
    "gemma-2-like": {},
    "no caps": dict(attn_logit_softcapping=None, final_logit_softcapping=None),
    # (a sliding layer without a window, sliding_window null, is none that transformers runs)
    "no sliding layer, multi-head, biases, untied": dict(
        layer_types=["full_attention", "full_attention"], num_key_value_heads=4, attention_bias=True,
        tie_word_embeddings=False, hidden_activation="gelu", query_pre_attn_scalar=16, rms_norm_eps=1e-3,
        rope_theta=500.0),
}


def hf(cls=transformers.Gemma2ForCausalLM, seed: int = 0, std: float = 0.3, **config):
    """transformers' class with eager attention (its only one here), weights redrawn."""
    torch.manual_seed(seed)
    model = cls._from_config(transformers.Gemma2Config(**(SMALL | config)), attn_implementation="eager")
    return randomize_(model, std, seed).eval()


def hub_config(model) -> dict:
    """config.json in transformers 4's words: rope_theta, hidden_act beside hidden_activation, no layer_types
    (the default alternation, which the tiny config keeps), an eos list, cache_implementation."""
    c = model.config
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "attention_bias",
              "query_pre_attn_scalar", "sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
              "pad_token_id", "bos_token_id", "hidden_activation", "tie_word_embeddings")
    return {k: v for k, v in GEMMA_2_2B.items() if k not in SMALL} | {f: getattr(c, f) for f in fields} | {
        "rope_theta": c.rope_parameters["rope_theta"], "hidden_act": c.hidden_activation,
        "eos_token_id": [c.eos_token_id, 35]}


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


# each variant in transformers 5's layout (the only one that writes layer_types), each hub layout on the released
# models' settings: the numbers depend on the variant, the loading on the layout
CASES = [(variant, "transformers 5") for variant in VARIANTS] + [
    ("gemma-2-like", layout) for layout in ("hub safetensors", "hub bin", "hub sharded")]


@each_device
@pytest.mark.parametrize("variant, layout", CASES, ids=[f"{v}, {layout}" for v, layout in CASES])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    reference = hf(**VARIANTS[variant])
    if layout == "transformers 5":
        save(reference, tmp_path)
        written = json.loads((tmp_path / "config.json").read_text())
        assert "rope_parameters" in written and "layer_types" in written
    else:
        fmt = "bin" if layout.endswith("bin") else "safetensors"
        write_hub(reference, tmp_path, fmt, shards=3 if layout.endswith("sharded") else 1)
    worst = check_causal_lm("gemma2", reference, tmp_path, padded_inputs(), device)
    model = Gemma2ForCausalLM.from_pretrained(tmp_path)
    assert model.loading_info.prefixed and not model.loading_info.ignored
    assert (model.lm_head.weight is model.embeddings.embed_tokens.weight) == reference.config.tie_word_embeddings
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_the_capped_model_is_transformers_bitwise_on_every_row(tmp_path):
    """With the scores capped both sides compute the same eager operations in the same order: every hidden state,
    probability and logit at the queries that see a key is transformers' to the last bit, not just within 1e-5."""
    reference = hf()
    model = Gemma2ForCausalLM.from_pretrained(save(reference, tmp_path))
    inputs = padded_inputs()
    with torch.no_grad():
        ours = model(**inputs, output_hidden_states=True, output_attentions=True)
        theirs = reference(**inputs, output_hidden_states=True, output_attentions=True)
    seen = sighted("gemma2", inputs["attention_mask"])
    assert torch.equal(ours.logits[seen], theirs.logits[seen])
    assert all(torch.equal(a[seen], b[seen]) for a, b in zip(ours.hidden_states, theirs.hidden_states))
    assert all(torch.equal(a.transpose(1, 2)[seen], b.transpose(1, 2)[seen])
               for a, b in zip(ours.attentions, theirs.attentions))


def test_a_sliding_layer_sees_its_window_and_a_full_one_everything(tmp_path):
    """Layer 0 slides (window 5: a query sees itself and the 4 keys before it), layer 1 attends to the whole past;
    given layer_types swap them."""
    inputs = {name: t[:1] for name, t in padded_inputs().items()}
    for types, sliding in ((None, 0), (["full_attention", "sliding_attention"], 1)):
        model = Gemma2ForCausalLM.from_pretrained(save(hf(layer_types=types), tmp_path / str(sliding)))
        with torch.no_grad():
            probs = model(**inputs, output_attentions=True).attentions
        queries, keys = torch.arange(11)[:, None], torch.arange(11)[None, :]
        window = (keys <= queries) & (keys > queries - 5)
        assert bool((probs[sliding][0][:, ~window] == 0).all()) and bool((probs[sliding][0][:, window] > 0).all())
        assert bool((probs[1 - sliding][0][:, keys <= queries] > 0).all())


def test_base_model_of_a_hub_checkpoint_leaves_no_head_and_saves_for_transformers(tmp_path):
    reference = hf()
    write_hub(reference, tmp_path / "in")
    base = Gemma2Model.from_pretrained(tmp_path / "in")
    assert not base.loading_info.ignored  # the tied head is not in the file
    base.save_pretrained(tmp_path / "out")
    theirs, info = transformers.Gemma2Model.from_pretrained(tmp_path / "out", output_loading_info=True,
                                                            attn_implementation="eager")
    assert not any(info.values()), info
    inputs = padded_inputs()
    seen = sighted("gemma2", inputs["attention_mask"])
    with torch.no_grad():
        assert torch.equal(base(**inputs).last_hidden_state[seen], theirs.eval()(**inputs).last_hidden_state[seen])


def test_save_pretrained_round_trips_through_transformers_in_both_layouts(tmp_path):
    """Ours saved: transformers 5 loads it with nothing missing or unexpected and computes the same bits; legacy=True
    writes the hub files' names (model. on every key, no lm_head), which both read back; the lists in the config
    (layer_types, eos_token_id) survive."""
    reference = hf(eos_token_id=[36, 35])
    model = Gemma2ForCausalLM.from_pretrained(save(reference, tmp_path / "in"))
    assert model.config.eos_token_id == [36, 35]
    inputs = padded_inputs()
    seen = sighted("gemma2", inputs["attention_mask"])
    from safetensors import safe_open

    for legacy in (False, True):
        out = tmp_path / f"out-{legacy}"
        model.save_pretrained(out, legacy=legacy)
        theirs, info = transformers.Gemma2ForCausalLM.from_pretrained(out, output_loading_info=True,
                                                                      attn_implementation="eager")
        assert not any(info.values()), info
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert all(k.startswith("model.") for k in keys) and "lm_head.weight" not in keys
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits[seen], theirs.eval()(**inputs).logits[seen])
            back = Gemma2ForCausalLM.from_pretrained(out)
        assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    config = json.loads((tmp_path / "out-False" / "config.json").read_text())
    assert config["eos_token_id"] == [36, 35] and config["layer_types"] == ["sliding_attention", "full_attention"]
    assert theirs.config.eos_token_id == [36, 35] and theirs.config.layer_types == config["layer_types"]


def test_the_embedding_scale_is_rounded_to_the_weights_dtype_as_transformers_rounds_it():
    """sqrt(hidden) as a float32 number cast to the weights' dtype (sqrt(3584) is 59.75 in bfloat16, 59.875 in
    float16): the scaled embeddings are transformers' bitwise in three dtypes, at the real models' widths."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding

    ids = torch.randint(37, (2, 5), generator=torch.Generator().manual_seed(0))
    for hidden in (2304, 3584, 4608):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            ours = Gemma2Embeddings(Gemma2Config(**SMALL | dict(hidden_size=hidden)))
            theirs = Gemma2TextScaledWordEmbedding(37, hidden, 0, embed_scale=hidden ** 0.5)
            theirs.load_state_dict({"weight": ours.embed_tokens.weight})
            ours, theirs = ours.to(dtype), theirs.to(dtype)
            with torch.no_grad():
                assert torch.equal(ours(ids, None), theirs(ids)), (hidden, dtype)


@pytest.mark.slow
def test_gemma_2_2b_per_layer_sizes(tmp_path):
    """gemma-2-2b's config.json as the hub has it (hidden 2304, 8 heads of 256 sharing 4 key/value heads, an MLP of
    9216, a window of 4096, the real caps and query scale), two of its 26 layers and a vocabulary of 4096 instead
    of 256000 so that both models fit beside each other here; random weights at init's scale; its file layout."""
    config = GEMMA_2_2B | {"num_hidden_layers": 2, "vocab_size": 4096}
    torch.manual_seed(0)
    reference = transformers.Gemma2ForCausalLM._from_config(
        transformers.Gemma2Config(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}),
        attn_implementation="eager").eval()
    with torch.no_grad():  # init leaves the norms' weights 0, which would hide a missing 1 + w
        for name, p in reference.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.1)
    state = reference.state_dict()
    del state["lm_head.weight"]
    write_weights(state, tmp_path, "safetensors", shards=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    worst = check_causal_lm("gemma2", reference, tmp_path, padded_inputs(4096, seq=19))
    assert len(Gemma2ForCausalLM.from_pretrained(tmp_path).loading_info.loaded) == 1 + 2 * 11 + 1
    print(f"gemma-2-2b per-layer sizes: worst |diff| {worst}")


@pytest.mark.parametrize("config", [GEMMA_2_2B, GEMMA_2_9B, GEMMA_2_27B], ids=["2b", "9b", "27b"])
def test_the_released_configs_build_transformers_shapes_on_the_meta_device(config):
    """Every tensor's name and shape, and the parameter count (2.61 B for gemma-2-2b, tied), as transformers builds
    them from the same config.json."""
    ours_config = Gemma2Config.from_dict(config)
    theirs_config = transformers.Gemma2Config(**{k: v for k, v in config.items()
                                                 if k not in ("architectures", "torch_dtype")})
    with torch.device("meta"):
        ours = Gemma2ForCausalLM(ours_config)
        theirs = transformers.Gemma2ForCausalLM(theirs_config)
    table = FAMILIES["gemma2"].table.tensor_names(config["num_hidden_layers"])
    their_shapes = {FAMILIES["gemma2"].table.normalize(k): v.shape for k, v in theirs.state_dict().items()}
    our_shapes = {name: v.shape for name, v in ours.state_dict().items()}
    assert {table[k]: shape for k, shape in their_shapes.items() if k != "lm_head.weight"} == our_shapes
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    if config is GEMMA_2_2B:
        assert round(count / 1e9, 2) == 2.61


@pytest.mark.skipif(not hub_model_available("google/gemma-2-2b"),
                    reason="google/gemma-2-2b is not in the local Hugging Face cache and huggingface.co is "
                           "unreachable (no network to the model hub here)")
def test_hub_gemma_2_2b():
    report = verify("google/gemma-2-2b")
    assert report.passed, report.format()
    model = Gemma2ForCausalLM.from_pretrained("google/gemma-2-2b")
    ids = model.tokenizer("The capital of France is")["input_ids"]
    reference = transformers.Gemma2ForCausalLM.from_pretrained("google/gemma-2-2b",
                                                               attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = reference.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(ids, max_new_tokens=8), theirs)


# ------------------------------------------------------------------------------------------------- task heads


HEADS = {Gemma2ForSequenceClassification: (dict(num_labels=3, pad_token_id=36), ("logits",)),
         Gemma2ForTokenClassification: (dict(num_labels=4, classifier_dropout=0.0), ("logits",))}


@pytest.mark.parametrize("ours", list(HEADS), ids=lambda cls: cls.__name__)
def test_task_heads_match_transformers_outputs_and_losses(tmp_path, ours):
    """transformers 5's generic heads: the sequence classifier's `score` (no bias) at each row's last token, the
    token classifier's `score` with its bias; compared where the queries see a key (transformers has only eager
    attention, which spreads a blind query evenly), the losses on those tokens."""
    changes, fields = HEADS[ours]
    reference = hf(getattr(transformers, ours.__name__), **changes)
    directory = save(reference, tmp_path)
    model = ours.from_pretrained(directory)
    assert not model.loading_info.ignored
    inputs = padded_inputs()
    del inputs["position_ids"]
    inputs = {name: t[:3] for name, t in inputs.items()}  # the all-padding row has no token to classify
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 36)
    seen = sighted("gemma2", inputs["attention_mask"])
    labels = {Gemma2ForSequenceClassification: dict(labels=torch.tensor([0, 2, 1])),
              Gemma2ForTokenClassification: dict(labels=torch.randint(4, (3, 11)).masked_fill(~seen, -100))}[ours]
    with torch.no_grad():
        theirs, mine = reference(**inputs, **labels), model(**inputs, **labels)
    for field in fields:
        if ours is Gemma2ForTokenClassification:
            assert torch.equal(mine[field][seen], theirs[field][seen])
        else:
            assert torch.equal(mine[field], theirs[field])
    assert_parity(mine.loss, theirs.loss, "loss")
    if ours is Gemma2ForTokenClassification:
        assert model.score.bias is not None and model.dropout.p == 0.0
        assert Gemma2ForTokenClassification(Gemma2Config(**SMALL)).dropout.p == 0.1  # transformers' default


# ---------------------------------------------------------------------------------- KV cache and generation


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    reference = hf(eos_token_id=36, pad_token_id=0)
    return reference, write_hub(reference, tmp_path_factory.mktemp("gemma2-small"))


def test_cache_step_by_step_equals_one_forward_past_the_window(small):
    """Keys are cached turned; a sliding layer's new token sees only the window's keys of the cache."""
    _, directory = small
    model = Gemma2ForCausalLM.from_pretrained(directory)
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
    token; the positions bound it."""
    reference, directory = small
    model = Gemma2ForCausalLM.from_pretrained(directory)
    ids, mask = left_padded_prompts()
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=17, do_sample=False, pad_token_id=0,
                                    eos_token_id=None)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=17, eos_token_id=None), theirs)
    # the last prompt token sits at position 6; the 18th new token is returned but never fed: 18 fit in 24
    assert model.generate(ids, attention_mask=mask, max_new_tokens=18, eos_token_id=None).shape == (4, 25)
    with pytest.raises(ValueError, match="reaches position 24; this model has max_position_embeddings=24"):
        model.generate(ids, attention_mask=mask, max_new_tokens=19)


def test_seeded_sampling_matches_transformers_token_for_token(small):
    """Temperature, top-k and top-p on the capped logits, drawn from torch's global generator seeded alike: the
    tokens transformers' generate samples."""
    reference, directory = small
    model = Gemma2ForCausalLM.from_pretrained(directory)
    ids, mask = left_padded_prompts()
    settings = dict(max_new_tokens=12, do_sample=True, temperature=0.8, top_k=12, top_p=0.9, eos_token_id=None)
    torch.manual_seed(7)
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, pad_token_id=0, **settings)
    torch.manual_seed(7)
    ours = model.generate(ids, attention_mask=mask, **settings)
    assert torch.equal(ours, theirs)
    torch.manual_seed(8)
    assert not torch.equal(model.generate(ids, attention_mask=mask, **settings), ours)


def test_generation_stops_at_either_end_token_of_a_list(small):
    """The -it checkpoints' eos_token_id is a list: a row stops at any of them, as in transformers."""
    reference, directory = small
    model = Gemma2ForCausalLM.from_pretrained(directory)
    ids, mask = left_padded_prompts()
    free = model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=None)[:, 7:]
    ends = [int(free[0, 2]), int(free[1, 4])]
    with torch.no_grad():
        theirs = reference.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
                                    eos_token_id=ends)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=10, eos_token_id=ends), theirs)


# -------------------------------------------------------------------------------------------- half precision


@each_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, dtype, device):
    """The parity report on a padded batch, in half precision against transformers in that dtype: its softmax in
    float32, as transformers' eager Gemma 2 attention takes it."""
    write_hub(hf(), tmp_path)
    inputs = padded_inputs()
    report = verify(str(tmp_path), inputs=inputs, dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


def test_float32_report_passes_within_the_bound_on_every_row(tmp_path):
    write_hub(hf(), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs())
    assert report.passed, report.format()
    names = [c.name for c in report.rows]
    assert {"layers.0.attn.probs", "layers.1.attn_out", "layers.1.mlp.up", "layers.1.mlp_out", "logits"} <= set(names)
    assert all(c.passed for c in report.rows), report.format()  # verify's own fp32 bound, row by row
    assert any("against transformers' eager Gemma2ForCausalLM where queries see a key (it has no SDPA" in note
               for note in report.notes)


def test_the_fused_path_without_caps_is_transformers_eager_within_the_bound(tmp_path):
    """No soft cap: our default path runs torch's fused kernel (grouped, over the sliding window's mask), held to
    transformers' eager attention within assert_parity's bound (they add in another order), the blind queries
    zeroed."""
    reference = hf(**VARIANTS["no caps"])
    model = Gemma2ForCausalLM.from_pretrained(save(reference, tmp_path))
    inputs = padded_inputs()
    reference.set_attn_implementation(blind_zeroed())
    with torch.no_grad():
        fused, theirs = model(**inputs, output_hidden_states=True), reference(**inputs, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(fused.hidden_states, theirs.hidden_states)):
        assert_parity(a, b, f"hidden_states[{i}]")
    assert_parity(fused.logits, theirs.logits, "logits")
    assert model(**inputs, output_attentions=True).attentions is not None


# ---------------------------------------------------------------------------------------------------- config


def test_config_reads_transformers_4_and_5_names_alike():
    hub = Gemma2Config.from_dict(GEMMA_2_2B)
    modern = Gemma2Config.from_dict({k: v for k, v in GEMMA_2_2B.items() if k not in ("rope_theta", "hidden_act")}
                                    | {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                                       "layer_types": ["sliding_attention", "full_attention"] * 13})
    assert hub == modern and hub.eos_token_id == [1, 107] and hub.layer_types[:3] == [
        "sliding_attention", "full_attention", "sliding_attention"]
    assert Gemma2Config.from_dict(hub.to_dict()) == hub
    assert transformers.Gemma2Config(**hub.to_dict()).layer_types == hub.layer_types


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "gemma3"}, r"model_type is 'gemma3' \(Gemma 3\), another architecture"),
    ({"model_type": "gemma3_text"}, r"'gemma3_text' \(Gemma 3 \(its text model\)\).*the gemma3_text family"),
    ({"model_type": "gemma"}, "model_type is 'gemma', but Gemma2Config needs 'gemma2'"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
    ({"rope_parameters": {"rope_type": "proportional", "factor": 2.0}}, "rope type 'proportional' is not supported"),
    ({"num_key_value_heads": 3}, "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
    ({"layer_types": ["sliding_attention"] * 3}, "should name one of sliding_attention, full_attention for each of "
                                                  "the 26 layers"),
    ({"layer_types": ["local"] * 26}, "should name one of"),
    ({"layer_types": "sliding_attention"}, "'layer_types' should be list or null"),
    ({"eos_token_id": [1, "<eos>"]}, "'eos_token_id' lists"),
    ({"eos_token_id": "<eos>"}, "'eos_token_id' should be int or list or null"),
    ({"pad_token_id": 256000}, "pad_token_id 256000 is not an id of the vocabulary"),
    ({"hidden_activation": "gelu_accurate"}, "hidden_activation='gelu_accurate' is not supported"),
    ({"query_pre_attn_scalar": 0}, "'query_pre_attn_scalar' must be positive"),
    ({"attn_logit_softcapping": -1.0}, "'attn_logit_softcapping' must be positive"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        Gemma2Config.from_dict(GEMMA_2_2B | changes, source="config.json")


def test_a_gemma_3_checkpoint_is_refused_at_load_naming_it(tmp_path):
    write_hub(hf(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "gemma3_text"}))
    with pytest.raises((CheckpointError, ConfigError), match="Gemma 3"):  # the families' refusal, before the config's
        Gemma2ForCausalLM.from_pretrained(tmp_path)


def test_a_layer_count_that_disagrees_with_the_file_names_the_tensors(tmp_path):
    write_hub(hf(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match="num_hidden_layers=3"):
        Gemma2ForCausalLM.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------------- analysis


def test_the_analysis_reads_the_post_norms_and_the_cap(tmp_path):
    """What Gemma 2's stream has that the others do not, each where a silent wrong number would hide: a head's part
    of the stream is its result through the post-attention norm (the raw results sum to attn.proj, which is not what
    the layer adds); the attention's part in decompose_resid is attn_out; direct logit attribution splits the scores
    before the soft cap, which the cap bends away from the logits; the logit lens caps as the model does."""
    model = Gemma2ForCausalLM.from_pretrained(save(hf(), tmp_path))
    inputs = {name: t[:3] for name, t in padded_inputs().items()}
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
    cache.compute_head_results()
    raw, parts = cache["layers.0.attn.result"], cache.stack_head_results(layer=1)
    assert_parity(raw.sum(-2), cache["layers.0.attn.proj"], "heads' results")
    assert_parity(parts.sum(0), cache["layers.0.attn_out"], "heads' parts")
    assert not torch.allclose(raw.sum(-2), cache["layers.0.attn_out"], atol=1e-2)
    labels = cache.decompose_resid(layer=1, return_labels=True)[1]
    assert labels == ["embed", "0_attn_out", "0_mlp_out"]
    assert torch.equal(cache.decompose_resid(layer=1)[1], cache["layers.0.attn_out"])
    attrs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=3, pos_slice=-1)
    assert_parity(attrs.sum(0), cache["uncapped_logits"][:, -1, 3], "attributions")
    capped = 4.0 * torch.tanh(attrs.sum(0) / 4.0)
    assert_parity(capped, out.logits[:, -1, 3], "capped attributions")
    assert not torch.allclose(attrs.sum(0), out.logits[:, -1, 3], atol=1e-2)  # the cap bites on this model
    assert_parity(cache.logit_lens()[-1], out.logits, "lens at the last layer")
    assert cache.logit_lens().abs().max() < 4.0
