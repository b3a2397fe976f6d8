"""Tied weights: the LM head / MLM decoder and the word embeddings, as config.json's tie_word_embeddings and the file
say, loaded as transformers 5 loads them.

transformers 5 (modeling_utils.py, PreTrainedModel.get_expanded_tied_weights_keys and tie_weights) ties the pairs of
a class's `_tied_weights_keys` only while config.tie_word_embeddings is true: GPT-2's lm_head.weight to
transformer.wte.weight; BERT's cls.predictions.decoder.weight to bert.embeddings.word_embeddings.weight and
cls.predictions.decoder.bias to cls.predictions.bias. Where the config ties a pair and the file holds both tensors
with different values, it warns and keeps them apart, pair by pair. Untied, BERT's decoder adds its own bias and
cls.predictions.bias is left unused. A tensor of an untied pair that the file lacks it initialises at random (and
reports missing); we refuse it, naming the tensor.
"""

import json

import pytest
import torch
import transformers

from helpers import assert_parity, randomize_, write_weights
from scratch_models import (BertForMaskedLM, BertForPreTraining, BertModel, GPT2DoubleHeadsModel, GPT2LMHeadModel,
                            GPT2Model)
from scratch_models import BertConfig, ConfigError, GPT2Config
from test_export import assert_transformers_layout, export, file_tensors
from test_training import GRAD_TOL, paired_parameters
from weight_mapping import CheckpointError

CONFIGS = {
    "gpt2": dict(vocab_size=37, n_positions=16, n_embd=24, n_layer=2, n_head=3, bos_token_id=36, eos_token_id=36,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0),
    "bert": dict(vocab_size=37, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=11,
                 max_position_embeddings=16, type_vocab_size=2, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0),
}
OURS = {model.__name__: model for model in (GPT2LMHeadModel, GPT2DoubleHeadsModel, BertForMaskedLM,
                                            BertForPreTraining)}
FAMILY = {name: "gpt2" if name.startswith("GPT2") else "bert" for name in OURS}
OUTPUTS = {"GPT2LMHeadModel": ("logits",), "GPT2DoubleHeadsModel": ("logits", "mc_logits"),
           "BertForMaskedLM": ("logits",), "BertForPreTraining": ("prediction_logits", "seq_relationship_logits")}
LOSSES = {"GPT2DoubleHeadsModel": ("loss", "mc_loss")}
# a bias added to every choice's score learns nothing: its exact gradient is 0, rounding noise on both sides
ZERO_GRADIENT = ("multiple_choice_head.summary.bias",)
# the output matrix and the input embeddings, in transformers' names and ours
OUTPUT_MATRIX = {"gpt2": ("lm_head.weight", "lm_head.weight"),
                 "bert": ("cls.predictions.decoder.weight", "mlm_head.decoder.weight")}
EMBEDDINGS = {"gpt2": ("transformer.wte.weight", "embeddings.wte.weight"),
              "bert": ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight")}
CLASSES = pytest.mark.parametrize("class_name", list(OURS))


def reference(class_name: str, tie: bool, seed: int = 0):
    """transformers' class, weights redrawn (an untied model's output matrix and decoder bias on their own)."""
    torch.manual_seed(seed)
    config_class = transformers.GPT2Config if FAMILY[class_name] == "gpt2" else transformers.BertConfig
    config = config_class(**CONFIGS[FAMILY[class_name]], tie_word_embeddings=tie)
    return randomize_(getattr(transformers, class_name)._from_config(config), 0.3, seed).eval()


def inputs(class_name: str, seed: int = 1) -> dict:
    """Padded rows with every label the class takes; GPT-2 scores only tokens predicted from a real one."""
    g = torch.Generator().manual_seed(seed)
    vocab = CONFIGS[FAMILY[class_name]]["vocab_size"]
    if class_name == "GPT2DoubleHeadsModel":  # 2 examples x 3 choices x 8 tokens
        ids = torch.randint(vocab - 1, (2, 3, 8), generator=g)
        mask = torch.ones(2, 3, 8, dtype=torch.long)
        mask[0, 1, 6:], mask[1, 2, :3] = 0, 0
        labels = ids.masked_fill(mask == 0, -100)
        labels[..., 1:] = labels[..., 1:].masked_fill(mask[..., :-1] == 0, -100)
        return dict(input_ids=ids, attention_mask=mask, mc_token_ids=torch.tensor([[7, 5, 7], [4, 7, 7]]),
                    labels=labels, mc_labels=torch.tensor([2, 0]))
    ids = torch.randint(vocab - 1, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:], mask[2, :3] = 0, 0
    labels = ids.masked_fill(mask == 0, -100)
    if FAMILY[class_name] == "gpt2":
        labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
        return dict(input_ids=ids, attention_mask=mask, labels=labels)
    labels[:, torch.arange(10) % 3 != 0] = -100
    batch = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.randint(2, (3, 10), generator=g),
                 labels=labels)
    return batch | (dict(next_sentence_label=torch.tensor([0, 1, 0])) if class_name == "BertForPreTraining" else {})


def write(directory, theirs, state: dict, tie: bool):
    """`state` as model.safetensors beside theirs' config.json with tie_word_embeddings set to `tie`."""
    write_weights(state, directory, "safetensors")
    config = theirs.config.to_dict() | {"tie_word_embeddings": tie}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def output_matrix(model, class_name: str) -> torch.nn.Parameter:
    return dict(model.named_parameters())[OUTPUT_MATRIX[FAMILY[class_name]][1]]


def assert_same_numbers(ours, theirs, class_name: str, what: str, gradients: bool = True) -> dict:
    """Outputs and losses within assert_parity's bound, and with `gradients` every parameter's
    gradient within GRAD_TOL of its largest (a parameter no gradient reaches, BERT's unused cls.predictions.bias when
    untied, has none on either side; one whose gradient is exactly 0 is held to the largest of all)."""
    batch = inputs(class_name)
    losses = LOSSES.get(class_name, ("loss",))
    ours.train(), theirs.train()  # dropout is off: train mode only lets the gradients flow
    out, ref = ours(**batch), theirs(**batch)
    worst = {}
    for field in OUTPUTS[class_name] + losses:
        worst[field] = assert_parity(getattr(out, field).detach(), getattr(ref, field).detach(), f"{what}: {field}")
    if not gradients:
        return worst
    sum(getattr(out, field) for field in losses).backward()
    sum(getattr(ref, field) for field in losses).backward()
    pairs = paired_parameters(FAMILY[class_name], ours, theirs)
    top = max(float(their.grad.abs().max()) for _, their in pairs.values() if their.grad is not None)
    for name, (our_parameter, their_parameter) in pairs.items():
        if their_parameter.grad is None:
            assert our_parameter.grad is None, f"{what}: {name} has a gradient here only"
            continue
        scale = top if name in ZERO_GRADIENT else float(their_parameter.grad.abs().max())
        diff = float((our_parameter.grad - their_parameter.grad).abs().max())
        assert diff <= GRAD_TOL * scale, f"{what}: {name} gradient |diff| {diff:.3e} > {GRAD_TOL:.0e} * {scale:.3e}"
        worst["gradient / max |gradient|"] = max(worst.get("gradient / max |gradient|", 0.0), diff / scale)
    return worst


# ------------------------------------------------------------------------------------------- config unties them


@CLASSES
def test_untied_config_loads_the_head_as_its_own_tensor(tmp_path, class_name):
    """tie_word_embeddings false, as transformers saves such a model: the output matrix (and BERT's decoder bias) is
    a parameter of its own; outputs, losses and every gradient equal transformers', the output matrix's and the
    embeddings' apart."""
    theirs = reference(class_name, tie=False)
    theirs.save_pretrained(tmp_path)
    ours = OURS[class_name].from_pretrained(tmp_path)
    assert ours.config.tie_word_embeddings is False
    assert not ours.loading_info.ignored and not ours.loading_info.notes
    family = FAMILY[class_name]
    matrix, embeddings = output_matrix(ours, class_name), dict(ours.named_parameters())[EMBEDDINGS[family][1]]
    assert matrix is not embeddings and not torch.equal(matrix, embeddings)
    assert torch.equal(matrix, theirs.get_parameter(OUTPUT_MATRIX[family][0]))
    worst = assert_same_numbers(ours, theirs, class_name, f"{class_name}, untied")
    # the two matrices learn apart: the output matrix from the scores, the embeddings from the inputs
    assert not torch.equal(matrix.grad, embeddings.grad)
    print(f"{class_name} untied: worst {worst}")


def test_untied_bert_decoder_adds_its_own_bias_and_leaves_cls_predictions_bias_unused(tmp_path):
    theirs = reference("BertForMaskedLM", tie=False)
    theirs.save_pretrained(tmp_path)
    ours = BertForMaskedLM.from_pretrained(tmp_path)
    assert torch.equal(ours.mlm_head.decoder.bias, theirs.cls.predictions.decoder.bias)
    assert torch.equal(ours.mlm_head.bias, theirs.cls.predictions.bias)  # kept, as transformers keeps it
    with torch.no_grad():
        ours.mlm_head.bias.add_(100.0)  # unused: nothing changes
        theirs.cls.predictions.bias.add_(100.0)
    assert_same_numbers(ours, theirs, "BertForMaskedLM", "cls.predictions.bias shifted", gradients=False)


def test_untied_config_without_the_head_tensor_is_an_error_naming_it(tmp_path):
    """transformers initialises the missing tensor at random (BERT's decoder bias at 0) and reports it missing;
    we refuse."""
    gpt2 = reference("GPT2LMHeadModel", tie=False)
    state = {k: v for k, v in gpt2.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) missing[\s\S]*lm_head\.weight \(37, 24\)"):
        GPT2LMHeadModel.from_pretrained(write(tmp_path / "gpt2", gpt2, state, tie=False))
    bert = reference("BertForMaskedLM", tie=False)
    state = {k: v for k, v in bert.state_dict().items() if k != "cls.predictions.decoder.bias"}
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) missing[\s\S]*cls\.predictions\.decoder\.bias \(37,\)"):
        BertForMaskedLM.from_pretrained(write(tmp_path / "bert", bert, state, tie=False))


@pytest.mark.parametrize("our_class, hf_class, head_class", [(GPT2Model, "GPT2Model", "GPT2LMHeadModel"),
                                                             (BertModel, "BertModel", "BertForMaskedLM")])
@pytest.mark.parametrize("tie", [False, True], ids=["untied config", "tied config, different tensors"])
def test_base_class_ignores_the_untied_head_tensor(tmp_path, our_class, hf_class, head_class, tie):
    """The base model of an untied checkpoint: the head's tensors, its own matrix included, are not part of it (as
    transformers reports them unexpected), never duplicates; the encoder computes what transformers' does."""
    theirs = reference(head_class, tie=False)
    directory = write(tmp_path, theirs, theirs.state_dict(), tie)
    ours = our_class.from_pretrained(directory)
    base, info = getattr(transformers, hf_class).from_pretrained(directory, output_loading_info=True)
    assert set(ours.loading_info.ignored) == set(info["unexpected_keys"])
    assert OUTPUT_MATRIX[FAMILY[head_class]][0] in ours.loading_info.ignored
    assert set(ours.loading_info.ignored.values()) == {f"not part of {hf_class}"}
    assert not ours.loading_info.notes and ours.config.tie_word_embeddings is tie
    batch = {k: v for k, v in inputs(head_class).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        assert_parity(ours(**batch).last_hidden_state, base.eval()(**batch).last_hidden_state, "last_hidden_state")


# ------------------------------------------------------------------------- config ties them, the file does not


# file layout -> what the file holds of the untied pair(s); every other tensor is the untied model's
DIFFERENT = {
    "the output matrix differs": {},
    "BERT: the decoder weight differs, no decoder bias": {"drop": "cls.predictions.decoder.bias"},
    "BERT: only the decoder bias differs": {"equal": "cls.predictions.decoder.weight"},
}
TIED_CASES = [(name, layout) for name in OURS for layout in DIFFERENT
              if FAMILY[name] == "bert" or not layout.startswith("BERT")]


def tied_config_different_tensors(tmp_path, class_name: str, layout: str):
    """The untied model's tensors under a config.json that ties them; transformers' model as it loads the file."""
    untied = reference(class_name, tie=False)
    state = dict(untied.state_dict())
    change = DIFFERENT[layout]
    if "drop" in change:
        del state[change["drop"]]
    if "equal" in change:
        state[change["equal"]] = state[EMBEDDINGS["bert"][0]]
    directory = write(tmp_path, untied, state, tie=True)
    theirs = getattr(transformers, class_name).from_pretrained(directory).eval()
    assert theirs.config.tie_word_embeddings is True
    return theirs, directory, state


@pytest.mark.parametrize("class_name, layout", TIED_CASES)
def test_tied_config_with_two_different_tensors_loads_untied_as_transformers_does(tmp_path, class_name, layout):
    theirs, directory, state = tied_config_different_tensors(tmp_path, class_name, layout)
    family = FAMILY[class_name]
    # transformers keeps the pair that differs apart, and ties the other
    matrix_key, embeddings_key = OUTPUT_MATRIX[family][0], EMBEDDINGS[family][0]
    their_matrix = theirs.get_parameter(matrix_key)
    assert (their_matrix is theirs.get_parameter(embeddings_key)) == ("equal" in DIFFERENT[layout])
    assert torch.equal(their_matrix, state[matrix_key])
    if family == "bert":
        bias_tied = theirs.cls.predictions.decoder.bias is theirs.cls.predictions.bias
        assert bias_tied == ("drop" in DIFFERENT[layout])

    ours = OURS[class_name].from_pretrained(directory)
    info = ours.loading_info
    assert ours.config.tie_word_embeddings is False  # built untied, and saved so
    assert output_matrix(ours, class_name) is not dict(ours.named_parameters())[EMBEDDINGS[family][1]]
    assert not any("duplicate" in why for why in info.ignored.values())
    differing = [key for key in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "lm_head.weight")
                 if key in state and (key != "cls.predictions.decoder.weight" or "equal" not in DIFFERENT[layout])]
    twin = {"lm_head.weight": "transformer.wte.weight", "cls.predictions.decoder.bias": "cls.predictions.bias",
            "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"}
    assert sorted(info.notes) == sorted(f"config.json ties {key} to {twin[key]}, but the file holds two different "
                                        "tensors: loaded untied, as transformers 5 does" for key in differing)
    assert all(note in info.summary() for note in info.notes)
    if "drop" in DIFFERENT[layout]:  # the tied bias the file lacks is read from its twin, as transformers ties it
        assert info.loaded["mlm_head.decoder.bias"] == "cls.predictions.bias"
    memory = [parameter.data_ptr() for parameter in ours.parameters()]
    assert len(set(memory)) == len(memory), "two parameters share memory"  # one key read twice is two tensors
    mixed = family == "bert" and bool(DIFFERENT[layout])  # transformers ties one pair, we hold it as two tensors
    worst = assert_same_numbers(ours, theirs, class_name, f"{class_name}, {layout}", gradients=not mixed)
    if mixed:  # the gradient of transformers' one tied parameter is the sum of our two tensors'
        batch = inputs(class_name)
        ours(**batch).loss.backward()
        theirs(**batch).loss.backward()
        head, their_head = ours.mlm_head, theirs.cls.predictions
        tied_weight = "equal" in DIFFERENT[layout]
        our_weight_grad = head.decoder.weight.grad
        if tied_weight:  # transformers' decoder weight is the word embeddings: both uses' gradients in one
            our_weight_grad = our_weight_grad + ours.embeddings.word_embeddings.weight.grad
        assert head.bias.grad is None  # untied, cls.predictions.bias is unused; transformers' tied one is decoder.bias
        grads = {"decoder.weight": (our_weight_grad, their_head.decoder.weight.grad),
                 "decoder.bias": (head.decoder.bias.grad, their_head.decoder.bias.grad)}
        for name, (grad, their_grad) in grads.items():
            diff, scale = float((grad - their_grad).abs().max()), float(their_grad.abs().max())
            assert diff <= GRAD_TOL * scale, f"{layout}: {name} gradient |diff| {diff:.3e} > {GRAD_TOL:.0e} * {scale:.3e}"
            worst[f"{name} gradient / max |gradient|"] = diff / scale
    print(f"{class_name}, tied config, {layout}: worst {worst}")


@CLASSES
def test_tied_config_with_equal_tensors_stays_tied(tmp_path, class_name):
    """transformers' state dict as a .bin holds both names of each tied pair, equal: one parameter, duplicates."""
    theirs = reference(class_name, tie=True)
    theirs.config.save_pretrained(tmp_path)
    write_weights(theirs.state_dict(), tmp_path, "bin")
    ours = OURS[class_name].from_pretrained(tmp_path)
    assert ours.config.tie_word_embeddings is True and not ours.loading_info.notes
    if FAMILY[class_name] == "gpt2":
        assert ours.lm_head.weight is ours.embeddings.wte.weight  # the tied head is the embeddings, as transformers'
        assert ours.loading_info.ignored == {"lm_head.weight": "duplicate of wte.weight (tied)"}
    else:
        assert ours.mlm_head.decoder is None
        assert {key: why for key, why in ours.loading_info.ignored.items() if "decoder" in key} == {
            "cls.predictions.decoder.weight": "duplicate of embeddings.word_embeddings.weight (tied)",
            "cls.predictions.decoder.bias": "duplicate of cls.predictions.bias (tied)"}
    assert not any(name.startswith(("lm_head.", "mlm_head.decoder.")) for name, _ in ours.named_parameters())
    worst = assert_same_numbers(ours, theirs, class_name, f"{class_name}, tied")
    print(f"{class_name} tied .bin: worst {worst}")


# ------------------------------------------------------------------------------------------------------ export


@CLASSES
@pytest.mark.parametrize("source", ["untied config", "tied config, different tensors"])
def test_export_of_an_untied_model_round_trips_through_transformers(tmp_path, class_name, source):
    """save_pretrained writes the head's own tensors and tie_word_embeddings false: transformers loads it with
    nothing missing or unexpected (and no warning to give), saves the same keys and tensors, and computes the same;
    ours reads it back bitwise."""
    if source == "untied config":
        reference(class_name, tie=False).save_pretrained(tmp_path / "in")
        model = OURS[class_name].from_pretrained(tmp_path / "in")
    else:
        _, directory, _ = tied_config_different_tensors(tmp_path / "in", class_name, "the output matrix differs")
        model = OURS[class_name].from_pretrained(directory)
    theirs, back = export(model, tmp_path / "out", getattr(transformers, class_name))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert theirs.config.tie_word_embeddings is False and back.config.tie_word_embeddings is False
    family = FAMILY[class_name]
    assert theirs.get_parameter(OUTPUT_MATRIX[family][0]) is not theirs.get_parameter(EMBEDDINGS[family][0])
    assert_transformers_layout(tmp_path / "out", theirs, tmp_path)
    assert OUTPUT_MATRIX[family][0] in file_tensors(tmp_path / "out")
    theirs.set_attn_implementation("sdpa")  # export loads it eager; our default path computes as SDPA does
    assert_same_numbers(model, theirs, class_name, f"{class_name} export", gradients=False)


def test_legacy_export_of_an_untied_bert_writes_its_own_decoder(tmp_path):
    """legacy=True stores the decoder weight, as bert-base-uncased: an untied model's own, not the embeddings."""
    reference("BertForPreTraining", tie=False).save_pretrained(tmp_path / "in")
    model = BertForPreTraining.from_pretrained(tmp_path / "in")
    theirs, _ = export(model, tmp_path / "out", transformers.BertForPreTraining, legacy=True)
    keys = file_tensors(tmp_path / "out")
    assert torch.equal(keys["cls.predictions.decoder.weight"], model.mlm_head.decoder.weight)
    assert not torch.equal(keys["cls.predictions.decoder.weight"], keys["bert.embeddings.word_embeddings.weight"])
    theirs.set_attn_implementation("sdpa")
    assert_same_numbers(model, theirs, "BertForPreTraining", "legacy export", gradients=False)


# ------------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("config_class, fields", [(GPT2Config, CONFIGS["gpt2"]), (BertConfig, CONFIGS["bert"])])
def test_tie_word_embeddings_is_a_config_field(config_class, fields):
    assert config_class.from_dict(fields).tie_word_embeddings is True
    untied = config_class.from_dict(fields | {"tie_word_embeddings": False})
    assert untied.tie_word_embeddings is False and untied.to_dict()["tie_word_embeddings"] is False
    with pytest.raises(ConfigError, match="field 'tie_word_embeddings' should be bool, got 'no'"):
        config_class.from_dict(fields | {"tie_word_embeddings": "no"})
