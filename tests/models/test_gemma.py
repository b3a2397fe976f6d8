"""Gemma (the first release) against transformers' Gemma classes: the hub files' layout and config spelling
(transformers 4.38's `"hidden_act": "gelu"`, which means the tanh approximation), transformers 5's, the variants
that change the numbers (multi-head attention, biases, an untied head), the task heads, the KV cache and greedy
generation, half precision, the released configs on the meta device, config refusals.

Gemma is Llama's model with scaled embeddings and (1 + w) norms: the tests every family passes, and the Llama-like
families' TransformerLens comparison (tests/analysis/test_llama_transformer_lens.py), run on it from its
declaration; these are what only Gemma has.
"""

import json

import pytest
import torch
import transformers

from helpers import (assert_parity, check_causal_lm, each_device, hub_model_available, reference, save, sighted,
                     write_weights)
from scratch_models import (ConfigError, GemmaConfig, GemmaForCausalLM, GemmaForSequenceClassification,
                            GemmaForTokenClassification)
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import TOLERANCES, verify

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = FAMILIES["gemma"].tiny_config
# gemma-2b's config.json as transformers 4.38 wrote it
GEMMA_2B = {"architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 16384, "max_position_embeddings": 8192,
            "model_type": "gemma", "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1,
            "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0,
            "torch_dtype": "bfloat16", "transformers_version": "4.38.0.dev0", "use_cache": True, "vocab_size": 256000}
GEMMA_7B = GEMMA_2B | {"hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
                       "num_hidden_layers": 28, "num_key_value_heads": 16}
VARIANTS = {
    "gemma-2b-like": {},
    "multi-head, biases, untied, a silu gate": dict(num_key_value_heads=4, attention_bias=True,
                                                   tie_word_embeddings=False, hidden_act="silu",
                                                   rms_norm_eps=1e-3),
}


def hf(cls=transformers.GemmaForCausalLM, **changes):
    return reference("gemma", cls.__name__, **changes)


def write_hub(model, directory, fmt: str = "safetensors", shards: int = 1):
    """The hub files: `model.` on the base keys, no lm_head (tied), config.json with the legacy "gelu"."""
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    write_weights(state, directory, fmt, shards)
    c = model.config
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "attention_bias",
              "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings")
    config = {k: v for k, v in GEMMA_2B.items() if k not in SMALL} | {f: getattr(c, f) for f in fields} | {
        "rope_theta": c.rope_parameters["rope_theta"], "hidden_act": "gelu"}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def padded_inputs(vocab: int = SMALL["vocab_size"], seq: int = 11, seed: int = 1) -> dict:
    """Four rows: full, left-padded (positions count real tokens), right-padded, and all padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab - 1, (4, seq), generator=g)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:], mask[3] = 0, 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, position_ids=positions)


CASES = [(variant, "transformers 5") for variant in VARIANTS] + [
    ("gemma-2b-like", layout) for layout in ("hub safetensors", "hub bin", "hub sharded")]


@each_device
@pytest.mark.parametrize("variant, layout", CASES, ids=[f"{v}, {layout}" for v, layout in CASES])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    """The hub layout's "gelu" is the tanh approximation on both sides (the exact GELU moves every number after
    the first MLP)."""
    reference_model = hf(**VARIANTS[variant])
    if layout == "transformers 5":
        save(reference_model, tmp_path)
    else:
        fmt = "bin" if layout.endswith("bin") else "safetensors"
        write_hub(reference_model, tmp_path, fmt, shards=3 if layout.endswith("sharded") else 1)
        assert GemmaForCausalLM.from_pretrained(tmp_path).config.hidden_act == "gelu_pytorch_tanh"
    worst = check_causal_lm("gemma", reference_model, tmp_path, padded_inputs(), device)
    model = GemmaForCausalLM.from_pretrained(tmp_path)
    assert model.loading_info.prefixed and not model.loading_info.ignored
    assert (model.lm_head.weight is model.embeddings.embed_tokens.weight) == reference_model.config.tie_word_embeddings
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_the_embeddings_are_scaled_and_the_norms_scale_by_one_plus_w(tmp_path):
    """What Gemma changes in Llama, each seen at its hook point: embeddings.word is the table's row times
    sqrt(hidden) (in the weights' dtype), and a norm whose stored weight is 0 is the plain RMS normalisation."""
    model = GemmaForCausalLM.from_pretrained(save(hf(), tmp_path))
    ids = padded_inputs()["input_ids"][:1]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids)
        assert torch.equal(cache["embeddings.word"], model.embeddings.embed_tokens.weight[ids] * 48 ** 0.5)
        model.layers[0].norm_1.weight.zero_()
        _, cache = model.run_with_cache(ids)
    x = cache["embeddings.out"]
    assert torch.allclose(cache["layers.0.ln_1"], x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt(), atol=1e-6)


HEADS = {GemmaForSequenceClassification: dict(id2label={0: "a", 1: "b", 2: "c"}, pad_token_id=36),
         GemmaForTokenClassification: dict(id2label={0: "a", 1: "b", 2: "c", 3: "d"}, classifier_dropout=0.0)}


@pytest.mark.parametrize("ours", list(HEADS), ids=lambda cls: cls.__name__)
def test_task_heads_match_transformers_outputs_and_losses(tmp_path, ours):
    reference_model = hf(getattr(transformers, ours.__name__), **HEADS[ours])
    model = ours.from_pretrained(save(reference_model, tmp_path))
    assert not model.loading_info.ignored
    inputs = {name: t[:3] for name, t in padded_inputs().items() if name != "position_ids"}
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 36)
    seen = sighted("gemma", inputs["attention_mask"])
    labels = (torch.tensor([0, 2, 1]) if ours is GemmaForSequenceClassification
              else torch.randint(4, (3, 11)).masked_fill(~seen, -100))
    with torch.no_grad():
        theirs, mine = reference_model(**inputs, labels=labels), model(**inputs, labels=labels)
    assert_parity(mine.logits[seen] if ours is GemmaForTokenClassification else mine.logits,
                  theirs.logits[seen] if ours is GemmaForTokenClassification else theirs.logits, "logits")
    assert_parity(mine.loss, theirs.loss, "loss")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    reference_model = hf(eos_token_id=36, pad_token_id=0)
    return reference_model, write_hub(reference_model, tmp_path_factory.mktemp("gemma-small"))


def test_greedy_generation_and_the_cache_match_transformers(small):
    """Left-padded prompts of lengths 7, 3, 5 and 1, 12 new tokens: transformers' generate, token for token; and
    the cached steps are one forward pass's logits."""
    reference_model, directory = small
    model = GemmaForCausalLM.from_pretrained(directory)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 36, (4, 7), generator=g)
    mask = torch.zeros(4, 7, dtype=torch.long)
    for row, length in enumerate((7, 3, 5, 1)):
        mask[row, 7 - length:] = 1
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        theirs = reference_model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                          pad_token_id=0, eos_token_id=None)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(out, theirs)
    full_mask = torch.cat([mask, torch.ones(4, 12, dtype=torch.long)], 1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        whole = model(out[:, :-1], attention_mask=full_mask[:, :-1], position_ids=positions[:, :-1]).logits
    assert torch.equal(whole[:, 6:].argmax(-1), out[:, 7:])


@each_device
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_report_against_transformers_in_the_same_dtype(tmp_path, dtype, device):
    write_hub(hf(), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs(), dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


@pytest.mark.parametrize("config, billions", [(GEMMA_2B, 2.51), (GEMMA_7B, 8.54)], ids=["2b", "7b"])
def test_the_released_configs_build_transformers_shapes_on_the_meta_device(config, billions):
    ours_config = GemmaConfig.from_dict(config)
    theirs_config = transformers.GemmaConfig(**{k: v for k, v in config.items()
                                                if k not in ("architectures", "torch_dtype")})
    with torch.device("meta"):
        ours, theirs = GemmaForCausalLM(ours_config), transformers.GemmaForCausalLM(theirs_config)
    table = FAMILIES["gemma"].table
    names = table.tensor_names(config["num_hidden_layers"])
    their_shapes = {names[table.normalize(k)]: v.shape for k, v in theirs.state_dict().items() if k != "lm_head.weight"}
    assert their_shapes == {name: v.shape for name, v in ours.state_dict().items()}
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) and round(count / 1e9, 2) == billions
    assert ours_config.hidden_act == theirs_config.hidden_act == "gelu_pytorch_tanh"


@pytest.mark.parametrize("changes, message", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
    ({"model_type": "gemma2"}, "model_type is 'gemma2', but GemmaConfig needs 'gemma'"),
    ({"num_key_value_heads": 3}, "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
    ({"pad_token_id": 256000}, "pad_token_id 256000 is not an id of the vocabulary"),
    ({"hidden_act": "gelu_accurate"}, "hidden_act='gelu_accurate' is not supported"),
])
def test_config_refusals_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        GemmaConfig.from_dict(GEMMA_2B | changes, source="config.json")


@pytest.mark.skipif(not hub_model_available("google/gemma-2b"),
                    reason="google/gemma-2b is not in the local Hugging Face cache and huggingface.co is "
                           "unreachable (no network to the model hub here)")
def test_hub_gemma_2b():
    report = verify("google/gemma-2b")
    assert report.passed, report.format()
