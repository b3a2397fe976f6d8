"""OLMo 2 against transformers' Olmo2 classes: its files' layout (transformers' own, the head untied) and config
spellings (transformers 4's rope_theta, 5's rope_parameters), the variants that change the numbers, the sequence
classifier, the KV cache and greedy generation, half precision, the released configs on the meta device; and what
post-norm placement means for the analysis: nothing normalises what a sublayer reads, so a part of the stream reaches
the next layer as it is, and a head's part is its result through the post-attention norm.

The tests every family passes run on OLMo 2 too, from its declaration; these are what only OLMo 2 has.
"""

import json

import pytest
import torch
import transformers

from helpers import (assert_parity, check_causal_lm, each_device, reference, save, sighted, write_weights)
from scratch_models import Olmo2Config, Olmo2ForCausalLM, Olmo2ForSequenceClassification
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import TOLERANCES, verify

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = FAMILIES["olmo2"].tiny_config
# OLMo-2-0425-1B's config.json (transformers 4.51)
OLMO_2_1B = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
             "bos_token_id": None, "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048,
             "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
             "model_type": "olmo2", "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 16,
             "pad_token_id": 100277, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000,
             "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": "4.51.3",
             "use_cache": True, "vocab_size": 100352}
OLMO_2_7B = OLMO_2_1B | {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                         "num_hidden_layers": 32, "num_key_value_heads": 32, "rope_theta": 500000}
VARIANTS = {
    "olmo-2-like": {},
    "multi-head, biases, tied, scaled rope": dict(num_key_value_heads=4, attention_bias=True, tie_word_embeddings=True,
                                                  rope_scaling={"rope_type": "linear", "factor": 2.0},
                                                  rms_norm_eps=1e-3),
}


def hf(cls=transformers.Olmo2ForCausalLM, **changes):
    return reference("olmo2", cls.__name__, **changes)


def write_v4(model, directory):
    """transformers 4's files: its state dict (the untied head included), rope_theta flat."""
    write_weights(model.state_dict(), directory, "safetensors")
    config = model.config.to_dict()
    rope = config.pop("rope_parameters")
    config |= {"rope_theta": rope["rope_theta"], "rope_scaling": None if rope["rope_type"] == "default" else rope}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def padded_inputs(vocab: int = SMALL["vocab_size"], seq: int = 11, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab - 1, (4, seq), generator=g)
    mask = torch.ones(4, seq, dtype=torch.long)
    mask[1, :4], mask[2, seq - 3:], mask[3] = 0, 0, 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, position_ids=positions)


CASES = [(variant, "transformers 5") for variant in VARIANTS] + [("olmo-2-like", "transformers 4")]


@each_device
@pytest.mark.parametrize("variant, layout", CASES, ids=[f"{v}, {layout}" for v, layout in CASES])
def test_checkpoint_layouts_and_variants_match_transformers(tmp_path, variant, layout, device):
    reference_model = hf(**VARIANTS[variant])
    (save if layout == "transformers 5" else write_v4)(reference_model, tmp_path)
    worst = check_causal_lm("olmo2", reference_model, tmp_path, padded_inputs(), device)
    model = Olmo2ForCausalLM.from_pretrained(tmp_path)
    assert (model.lm_head.weight is model.embeddings.embed_tokens.weight) == reference_model.config.tie_word_embeddings
    print(f"{variant}, {layout}: worst |diff| {worst}")


def test_the_sublayers_read_the_stream_unnormalised_and_q_norm_spans_every_head(tmp_path):
    """Post-norm placement: the attention's projections read layers.0's input itself; q_norm divides the whole
    projection by one root mean square per token (not one per head)."""
    model = Olmo2ForCausalLM.from_pretrained(save(hf(), tmp_path))
    ids = padded_inputs()["input_ids"][:1]
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=["layers.0.attn.q_norm.scale", "layers.0.attn.q_unnormalized",
                                                    "embeddings.out", "layers.1.resid_mid", "layers.0.out",
                                                    "layers.1.attn_out"])
    attn = model.layers[0].attn
    q = cache["layers.0.attn.q_unnormalized"]  # [b, s, n, d]
    assert torch.allclose(q.flatten(-2), attn.q_proj(cache["embeddings.out"]), atol=1e-6)
    assert cache["layers.0.attn.q_norm.scale"].shape == (1, 11, 1, 1)
    assert torch.allclose(cache["layers.0.attn.q_norm.scale"].flatten(-2),
                          (q.flatten(-2).pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    assert torch.allclose(cache["layers.1.resid_mid"], cache["layers.0.out"] + cache["layers.1.attn_out"], atol=1e-6)


def test_the_analysis_reads_the_post_norms(tmp_path):
    """A head's part of the stream is its result through the post-attention norm; apply_ln_to_stack at a layer
    leaves the parts as they are (no norm reads them) and through the final norm scales them."""
    model = Olmo2ForCausalLM.from_pretrained(save(hf(), tmp_path))
    inputs = {name: t[:3] for name, t in padded_inputs().items()}
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs)
    cache.compute_head_results()
    parts = cache.stack_head_results(layer=1)
    assert torch.allclose(parts.sum(0), cache["layers.0.attn_out"], atol=1e-5)
    stack = cache.decompose_resid(layer=1)
    assert torch.equal(cache.apply_ln_to_stack(stack, layer=1), stack)
    assert torch.allclose(stack.sum(0), cache["layers.0.out"], atol=1e-5)
    final = cache.apply_ln_to_stack(cache.decompose_resid(), layer=None)
    assert torch.allclose(final.sum(0), cache["ln_f"], atol=1e-5)
    assert torch.allclose(cache.logit_lens()[-1], out.logits, atol=1e-4)


def test_the_sequence_classifier_matches_transformers(tmp_path):
    reference_model = hf(transformers.Olmo2ForSequenceClassification, id2label={0: "a", 1: "b", 2: "c"},
                         pad_token_id=36)
    model = Olmo2ForSequenceClassification.from_pretrained(save(reference_model, tmp_path))
    inputs = {name: t[:3] for name, t in padded_inputs().items() if name != "position_ids"}
    inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 36)
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        theirs, mine = reference_model(**inputs, labels=labels), model(**inputs, labels=labels)
    assert_parity(mine.logits, theirs.logits, "logits")
    assert_parity(mine.loss, theirs.loss, "loss")


def test_greedy_generation_matches_transformers_token_for_token(tmp_path):
    reference_model = hf(eos_token_id=36, pad_token_id=0)
    model = Olmo2ForCausalLM.from_pretrained(save(reference_model, tmp_path))
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
    """OLMo 2 turns its half-precision queries and keys by float32 angles and rounds after (Llama rounds the angles
    first): done Llama's way, the probabilities are a bfloat16 ulp off transformers' and the MLP, which reads the
    stream unnormalised, carries that past the bound."""
    save(hf(), tmp_path)
    report = verify(str(tmp_path), inputs=padded_inputs(), dtype=dtype, device=device)
    assert report.passed, report.format()
    atol, rtol = TOLERANCES[getattr(torch, dtype)]
    assert all((c.atol, c.rtol) == (atol, rtol) for c in report.rows if not c.name.endswith("logits"))


@pytest.mark.parametrize("config, billions", [(OLMO_2_1B, 1.48), (OLMO_2_7B, 7.3)], ids=["1b", "7b"])
def test_the_released_configs_build_transformers_shapes_on_the_meta_device(config, billions):
    ours_config = Olmo2Config.from_dict(config)
    theirs_config = transformers.Olmo2Config(**{k: v for k, v in config.items()
                                                if k not in ("architectures", "torch_dtype")})
    with torch.device("meta"):
        ours, theirs = Olmo2ForCausalLM(ours_config), transformers.Olmo2ForCausalLM(theirs_config)
    table = FAMILIES["olmo2"].table
    names = table.tensor_names(config["num_hidden_layers"])
    assert {names[table.normalize(k)]: v.shape for k, v in theirs.state_dict().items()} == {
        name: v.shape for name, v in ours.state_dict().items()}
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters()) and round(count / 1e9, 2) == billions
