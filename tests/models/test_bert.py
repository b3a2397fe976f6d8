"""BERT parity with transformers: real MiniLM weights, and every real checkpoint layout written from a
randomly initialised transformers model (small odd configs for breadth, the full bert-base config for truth)."""

import pytest
import torch
import transformers

from scratch_models import BertForMaskedLM, BertModel
from helpers import assert_parity, model_sizes, randomize_, write_config, write_weights
SMALL = dict(vocab_size=101, hidden_size=48, num_hidden_layers=1, num_attention_heads=3, intermediate_size=37,
             max_position_embeddings=33, type_vocab_size=3, layer_norm_eps=1e-7)
BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu")


def hf_pretraining_model(seed: int, std: float | None, **config) -> transformers.BertForPreTraining:
    """transformers' BertForPreTraining (base + MLM + NSP heads, as bert-base-uncased was saved), eager."""
    torch.manual_seed(seed)
    model = transformers.BertForPreTraining._from_config(transformers.BertConfig(**config),
                                                         attn_implementation="eager").eval()
    return randomize_(model, std, seed) if std else model


def legacy_state(model: transformers.BertForPreTraining) -> dict:
    """bert-base-uncased's layout: `bert.` prefix, LayerNorm gamma/beta, cls heads, no decoder bias."""
    state = {}
    for key, tensor in model.state_dict().items():
        if key == "cls.predictions.decoder.bias":
            continue
        if ".LayerNorm." in key:
            key = key.replace(".weight", ".gamma").replace(".bias", ".beta")
        state[key] = tensor
    return state


def padded_inputs(vocab: int, type_vocab: int, seed: int = 1) -> dict:
    """Three sequences: full, right-padded, left-padded; token types in every segment."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, :3] = 0
    types = torch.randint(type_vocab, (3, 11), generator=g)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def check_against(reference: transformers.BertForPreTraining, directory, inputs) -> dict:
    """Load `directory` into our BertModel and BertForMaskedLM; compare every output with `reference`."""
    with torch.no_grad():
        ref = reference(**inputs, output_hidden_states=True, output_attentions=True)
        ref_base = reference.bert(**inputs, output_hidden_states=True, output_attentions=True)
        base = BertModel.from_pretrained(directory)
        out = base(**inputs, output_hidden_states=True, output_attentions=True)
        fused = base(**inputs)  # no probabilities asked: the fused SDPA path
        mlm = BertForMaskedLM.from_pretrained(directory)(**inputs)
    worst, sizes = {}, model_sizes(reference.config)
    assert len(out.hidden_states) == len(ref_base.hidden_states) == reference.config.num_hidden_layers + 1
    worst["hidden_states"] = max(assert_parity(a, b, f"hidden_states[{i}]", **sizes)
                                 for i, (a, b) in enumerate(zip(out.hidden_states, ref_base.hidden_states)))
    worst["attentions"] = max(assert_parity(a, b, f"attentions[{i}]", **sizes)
                              for i, (a, b) in enumerate(zip(out.attentions, ref_base.attentions)))
    worst["pooler"] = assert_parity(out.pooler_output, ref_base.pooler_output, "pooler_output", **sizes)
    worst["sdpa last_hidden_state"] = assert_parity(fused.last_hidden_state, ref_base.last_hidden_state,
                                                    "last_hidden_state (SDPA path)", **sizes)
    worst["logits"] = assert_parity(mlm.logits, ref.prediction_logits, "MLM logits", **sizes)
    return worst


LAYOUTS = {
    # name: (state from the pretraining model, format, shards)
    "bert-base-uncased legacy .bin": (legacy_state, "bin", 1),
    "legacy safetensors": (legacy_state, "safetensors", 1),
    "legacy sharded safetensors": (legacy_state, "safetensors", 3),
    "legacy sharded .bin": (legacy_state, "bin", 2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_small_odd_layouts_scaled_weights(tmp_path, layout, act):
    reference = hf_pretraining_model(seed=3, std=0.3, hidden_act=act, **SMALL)
    make_state, fmt, shards = LAYOUTS[layout]
    write_config(reference.config, tmp_path)
    write_weights(make_state(reference), tmp_path, fmt, shards)
    check_against(reference, tmp_path, padded_inputs(SMALL["vocab_size"], SMALL["type_vocab_size"]))


def test_transformers_sharded_save_with_tied_decoder_dropped(tmp_path):
    """transformers' own save_pretrained: modern names, `bert.` prefix, decoder weight and bias left out."""
    reference = hf_pretraining_model(seed=4, std=0.3, **{**SMALL, "num_hidden_layers": 2})
    mlm = transformers.BertForMaskedLM._from_config(reference.config, attn_implementation="eager")
    mlm.load_state_dict(reference.state_dict(), strict=False)
    mlm.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    inputs = padded_inputs(SMALL["vocab_size"], SMALL["type_vocab_size"])
    with torch.no_grad():
        ref_logits = mlm.eval()(**inputs).logits
        ours = BertForMaskedLM.from_pretrained(tmp_path)
        assert_parity(ours(**inputs).logits, ref_logits, "logits")
    assert "cls.predictions.decoder.weight" not in ours.loading_info.loaded.values()


def test_plain_bertmodel_save(tmp_path):
    """A BertModel saved by transformers: no prefix, no heads. Our BertForMaskedLM must refuse it clearly."""
    reference = hf_pretraining_model(seed=5, std=0.3, **SMALL)
    reference.bert.save_pretrained(tmp_path)
    inputs = padded_inputs(SMALL["vocab_size"], SMALL["type_vocab_size"])
    with torch.no_grad():
        ref = reference.bert(**inputs, output_hidden_states=True)
        out = BertModel.from_pretrained(tmp_path)(**inputs, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_parity(a, b, f"hidden_states[{i}]")
    assert_parity(out.pooler_output, ref.pooler_output, "pooler")
    with pytest.raises(ValueError, match=r"cls\.predictions\.transform\.dense\.weight \(48, 48\)"):
        BertForMaskedLM.from_pretrained(tmp_path)


@pytest.fixture(scope="module")
def bert_base_reference():
    return hf_pretraining_model(seed=0, std=None, **BERT_BASE)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_full_size_bert_base_legacy_layout(tmp_path, bert_base_reference, fmt):
    """The FULL bert-base-uncased config and layout (gelu, 12 layers, gamma/beta, `bert.`, cls heads)."""
    write_config(bert_base_reference.config, tmp_path)
    write_weights(legacy_state(bert_base_reference), tmp_path, fmt)
    worst = check_against(bert_base_reference, tmp_path, padded_inputs(30522, 2))
    print(f"bert-base {fmt} worst |diff|:", worst)
    model = BertModel.from_pretrained(tmp_path)
    ignored = model.loading_info.ignored
    assert ignored["cls.seq_relationship.weight"] == "not part of BertModel"
    assert any(key.startswith("cls.predictions.transform") for key in ignored)
    assert model.loading_info.legacy_names == 2 * (1 + 2 * 12) + 2  # every LayerNorm's gamma and beta
    assert not model.training


def test_loading_into_head_model_reports_pooler_and_nsp(tmp_path):
    reference = hf_pretraining_model(seed=6, std=0.3, **SMALL)
    write_config(reference.config, tmp_path)
    write_weights(legacy_state(reference), tmp_path, "safetensors")
    info = BertForMaskedLM.from_pretrained(tmp_path).loading_info
    assert set(info.ignored) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                                 "cls.seq_relationship.weight", "cls.seq_relationship.bias",
                                 "cls.predictions.decoder.weight"}
    assert "tied" in info.ignored["cls.predictions.decoder.weight"]


def test_dtype_and_device_are_applied_while_loading(tmp_path):
    reference = hf_pretraining_model(seed=7, std=0.3, **SMALL)
    reference.bert.save_pretrained(tmp_path)
    model = BertModel.from_pretrained(tmp_path, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert all(p.requires_grad for p in model.parameters())


def test_mlm_checkpoint_into_bertmodel_has_no_invented_pooler(tmp_path):
    """transformers would initialise the missing pooler at random; we build BertModel without one."""
    reference = hf_pretraining_model(seed=8, std=0.3, **SMALL)
    mlm = transformers.BertForMaskedLM._from_config(reference.config)
    mlm.load_state_dict(reference.state_dict(), strict=False)
    mlm.save_pretrained(tmp_path)
    inputs = padded_inputs(SMALL["vocab_size"], SMALL["type_vocab_size"])
    model = BertModel.from_pretrained(tmp_path)
    assert model.pooler is None
    with torch.no_grad():
        out = model(**inputs)
        assert_parity(out.last_hidden_state, reference.bert(**inputs).last_hidden_state, "last_hidden_state")
    assert out.pooler_output is None
    with pytest.raises(ValueError, match=r"pooler\.dense\.weight \(48, 48\)"):
        BertModel.from_pretrained(tmp_path, add_pooling_layer=True)


def test_the_card_shape_embeddings_encoder_pooler_with_short_hook_names():
    """BertEmbeddings -> BertEncoder (owning the layer stack) -> BertPooler, as classes; hook points are named
    from the stack down, as in GPT-2, while parameters keep their full path."""
    from scratch_models import BertConfig
    from scratch_models.bert.model import BertEmbeddings, BertEncoder, BertPooler

    model = BertModel(BertConfig(vocab_size=11, hidden_size=6, num_hidden_layers=2, num_attention_heads=3,
                                 intermediate_size=5))
    assert [type(m) for m in model.children()] == [BertEmbeddings, BertEncoder, BertPooler]
    assert model.layers is model.encoder.layers and len(model.layers) == 2
    names = model.hook_names()
    assert "layers.1.attn.probs" in names and not any(name.startswith("encoder.") for name in names)
    assert names.index("embeddings.out") < names.index("layers.0.attn.q") < names.index("layers.1.out") \
        < names.index("pooler.out")
    assert "encoder.layers.1.attn.query.weight" in model.state_dict()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]), names=["layers.1.out"])
    assert cache["layers.1.out"].shape == (1, 3, 6)
