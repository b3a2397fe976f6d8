"""BERT's task heads against transformers: every class, in every layout, with every loss.

Each transformers model is built from a small odd config with weights redrawn at std 0.3, written as transformers
writes it (safetensors, sharded safetensors) or as a raw state dict (.bin, sharded .bin), and loaded by our class of
the same name. Logits and losses must be within assert_parity's bound (fp32, CPU), and in training (dropout off)
the loss and every parameter's gradient within GRAD_TOL * max |gradient| (test_training.py). Loading a checkpoint
into any other class must do what transformers does, except that a tensor transformers would initialise at random
is an error here.

`pytest -s` prints the worst differences seen, per case.
"""

import re

import pytest
import torch
import transformers

import scratch_models
from helpers import assert_parity, model_sizes, randomize_, write_config, write_weights
from scratch_models import BertModel, CheckpointError
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.verify import compare_modules
from test_bert import BERT_BASE, legacy_state
from test_export import export, file_tensors
from test_training import GRAD_TOL, paired_parameters
from weight_mapping import BERT

SMALL = dict(vocab_size=99, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
             max_position_embeddings=33, type_vocab_size=3, layer_norm_eps=1e-7, hidden_act="gelu")
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)

# case -> (class, config changes). The sequence classifier once per loss; the config's problem_type is left null
# where transformers infers it (regression from one label, single- or multi-label from the labels' dtype).
CASES = {
    "pretraining": ("BertForPreTraining", {}),
    "next sentence": ("BertForNextSentencePrediction", {}),
    "single-label": ("BertForSequenceClassification",
                     dict(id2label={0: "negative", 1: "neutral", 2: "positive"}, classifier_dropout=0.25)),
    "multi-label": ("BertForSequenceClassification", dict(num_labels=3)),
    "regression": ("BertForSequenceClassification", dict(num_labels=1)),
    "regression, 3 outputs": ("BertForSequenceClassification", dict(num_labels=3, problem_type="regression")),
    "token classification": ("BertForTokenClassification", dict(num_labels=3)),
    "question answering": ("BertForQuestionAnswering", {}),
    "multiple choice": ("BertForMultipleChoice", {}),
}
CASE_OF = {"BertForPreTraining": "pretraining", "BertForNextSentencePrediction": "next sentence",
           "BertForSequenceClassification": "single-label", "BertForTokenClassification": "token classification",
           "BertForQuestionAnswering": "question answering", "BertForMultipleChoice": "multiple choice"}
ONE_CASE_PER_CLASS = list(CASE_OF.values())
HEAD_CLASSES = tuple(CASE_OF)
LAYOUTS = ["safetensors", "sharded safetensors", "bin", "sharded bin"]
WORST: dict[str, dict[str, float]] = {}  # case -> what -> worst |diff| seen (gradients: relative to max |grad|)


def reference(class_name: str, seed: int = 0, attention: str = "sdpa", **changes):
    """transformers' `class_name` on SMALL + `changes`, weights redrawn at std 0.3, in eval mode."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(**SMALL | changes)
    model = getattr(transformers, class_name)._from_config(config, attn_implementation=attention)
    return randomize_(model, 0.3, seed).eval()


def save(theirs, directory, layout: str = "safetensors"):
    """`layout`: transformers' own save_pretrained (whole or sharded), or its raw state dict (every tied copy
    included) as .bin files."""
    if layout == "safetensors":
        theirs.save_pretrained(directory)
    elif layout == "sharded safetensors":
        theirs.save_pretrained(directory, max_shard_size="60KB")
        assert len(list(directory.glob("model-*.safetensors"))) > 1
    else:
        write_config(theirs.config, directory)
        write_weights(theirs.state_dict(), directory, "bin", shards=2 if layout == "sharded bin" else 1)
    return directory


def batch(case: str, seed: int = 1) -> dict:
    """Right-padded inputs (full, padded after 7, padded after 4) and the labels of `case`'s loss."""
    g = torch.Generator().manual_seed(seed)
    shape = (2, 3, 9) if case == "multiple choice" else (3, 11)  # multiple choice: [batch, choices, seq]
    ids = torch.randint(1, SMALL["vocab_size"], shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., 1, 7:], mask[..., 2, 4:] = 0, 0
    inputs = dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask,
                  token_type_ids=torch.randint(SMALL["type_vocab_size"], shape, generator=g))
    if case == "pretraining":
        labels = inputs["input_ids"].masked_fill(mask == 0, -100)
        labels[:, torch.arange(11) % 3 != 0] = -100
        return inputs | dict(labels=labels, next_sentence_label=torch.tensor([0, 1, 1]))
    if case == "question answering":  # row 2's start lies past the sequence: not scored
        return inputs | dict(start_positions=torch.tensor([2, 5, 40]), end_positions=torch.tensor([4, 6, 3]))
    labels = {
        "next sentence": lambda: torch.tensor([1, 0, -100]),
        "single-label": lambda: torch.tensor([2, 0, -100]),
        "multi-label": lambda: torch.randint(2, (3, 3), generator=g).float(),
        "regression": lambda: torch.randn(3, generator=g),
        "regression, 3 outputs": lambda: torch.randn(3, 3, generator=g),
        "token classification": lambda: torch.randint(3, (3, 11), generator=g).masked_fill(mask == 0, -100),
        "multiple choice": lambda: torch.tensor([2, 0]),
    }[case]()
    return inputs | dict(labels=labels)


def features(case: str) -> dict:
    """`case`'s inputs without labels."""
    return {k: v for k, v in batch(case).items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def head_fields(out) -> dict[str, torch.Tensor]:
    """The output's tensors other than hidden states and attentions: logits of every kind, and the loss."""
    return {name: getattr(out, name) for name in out.keys() if name not in ("hidden_states", "attentions")}


def record(case: str, what: str, worst: float) -> None:
    WORST.setdefault(case, {})
    WORST[case][what] = max(WORST[case].get(what, 0.0), worst)


@pytest.fixture(scope="module", autouse=True)
def print_worst():
    yield
    for case, worst in WORST.items():
        print(f"\n{case}: " + ", ".join(f"{what} {value:.2e}" for what, value in worst.items()), end="")
    print()


@pytest.mark.parametrize("case, layout", [(case, layout) for case in ONE_CASE_PER_CLASS for layout in LAYOUTS]
                         + [(case, "safetensors") for case in CASES if case not in ONE_CASE_PER_CLASS])
def test_logits_and_loss_match_transformers(tmp_path, case, layout):
    """Eval mode with the configs' dropout (0.1, classifier 0.25), eager attention and output_attentions on both
    sides: every output tensor. The hook point named after each head output holds that output."""
    class_name, changes = CASES[case]
    theirs = reference(class_name, attention="eager", **changes)
    ours = getattr(scratch_models, class_name).from_pretrained(save(theirs, tmp_path, layout))
    inputs = batch(case)
    with torch.no_grad():
        ref = theirs(**inputs, output_hidden_states=True, output_attentions=True)
        out, cache = ours.run_with_cache(**inputs, output_hidden_states=True, output_attentions=True)
    fields = head_fields(out)
    assert fields.keys() == head_fields(ref).keys() and "loss" in fields
    for name, tensor in fields.items():
        record(case, name, assert_parity(tensor, getattr(ref, name), f"{case}: {name}"))
    for what in ("hidden_states", "attentions"):
        for i, (a, b) in enumerate(zip(getattr(out, what), getattr(ref, what), strict=True)):
            record(case, what, assert_parity(a, b, f"{case}: {what}[{i}]"))
    for name in fields.keys() - {"loss"}:  # each head output has the hook point of its name (docs/hook_names.md)
        assert FAMILIES["bert"].output_fields[name] == name and torch.equal(cache[name], fields[name]), name
    if class_name == "BertForSequenceClassification":
        assert ours.config.num_labels == theirs.config.num_labels and ours.config.label(0) == theirs.config.id2label[0]
        assert ours.dropout.p == (changes.get("classifier_dropout") or 0.1)


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_every_gradient_match_transformers(tmp_path, case):
    """Train mode, dropout off; our fused attention against transformers' SDPA. Parameters are paired through the
    mapping table, every one of both models."""
    class_name, changes = CASES[case]
    theirs = reference(class_name, seed=2, **changes | NO_DROPOUT).train()
    ours = getattr(scratch_models, class_name).from_pretrained(save(theirs, tmp_path)).train()
    inputs = batch(case, seed=3)
    ref_loss, loss = theirs(**inputs).loss, ours(**inputs).loss
    assert 0.05 < ref_loss.item() < 100.0
    record(case, "train loss", assert_parity(loss.detach(), ref_loss.detach(), f"{case}: loss"))
    ref_loss.backward()
    loss.backward()
    pairs = paired_parameters("bert", ours, theirs)
    top = max(float(their.grad.abs().max()) for _, their in pairs.values())
    for name, (our_parameter, their_parameter) in pairs.items():
        scale = float(their_parameter.grad.abs().max())
        # A bias that adds one number to every score a softmax reads (each key's, multiple choice's one classifier
        # bias, shared by the choices, and question answering's start/end bias, shared by the positions) has an
        # exact gradient of 0: both sides hold rounding noise, which may be exactly 0 too, so it is held to the
        # largest gradient instead (as in test_training.py).
        if name.endswith("key.bias") or (case == "multiple choice" and name == "classifier.bias") or (
                case == "question answering" and name == "qa_outputs.bias"):
            scale = top
        assert scale > 0, f"{name}: no gradient reached it"
        diff = float((our_parameter.grad - their_parameter.grad).abs().max())
        assert diff <= GRAD_TOL * scale, f"{case} {name}: gradient max |diff| {diff:.3e} > {GRAD_TOL:.0e} * {scale:.3e}"
        record(case, "gradient / max |gradient|", diff / scale)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """class name -> (transformers model, its save_pretrained directory), for the head classes, BertForMaskedLM
    and BertModel."""
    out = {}
    for n, class_name in enumerate((*HEAD_CLASSES, "BertForMaskedLM", "BertModel")):
        changes = dict(num_labels=3) if class_name in ("BertForSequenceClassification",
                                                       "BertForTokenClassification") else {}
        theirs = reference(class_name, seed=10 + n, **changes)
        out[class_name] = theirs, save(theirs, tmp_path_factory.mktemp(class_name))
    return out


def names_in(keys) -> set[str]:
    """Checkpoint keys as the table reads them: no `bert.` prefix, a tied key as the one it duplicates."""
    return {BERT.aliases.get(BERT.normalize(key), BERT.normalize(key)) for key in keys}


@pytest.mark.parametrize("source", [*HEAD_CLASSES, "BertForMaskedLM"])
def test_base_class_loads_the_encoder_of_every_head_checkpoint(checkpoints, source):
    """As transformers' BertModel does: the encoder (and the pooler, where the checkpoint has one) loads, the head
    is reported. Where the checkpoint has no pooler, transformers draws one at random; we build none."""
    _, directory = checkpoints[source]
    theirs, info = transformers.BertModel.from_pretrained(directory, output_loading_info=True,
                                                          attn_implementation="eager")
    ours = BertModel.from_pretrained(directory)
    assert set(ours.loading_info.ignored) == info["unexpected_keys"] != set()
    assert all(why == "not part of BertModel" for why in ours.loading_info.ignored.values())
    inputs = features("single-label")
    with torch.no_grad():
        out, ref = ours(**inputs, output_hidden_states=True), theirs.eval()(**inputs, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(out.hidden_states, ref.hidden_states, strict=True)):
        assert_parity(a, b, f"hidden_states[{i}]")
    if info["missing_keys"]:
        assert info["missing_keys"] == {"pooler.dense.weight", "pooler.dense.bias"} and ours.pooler is None
    else:
        assert_parity(out.pooler_output, ref.pooler_output, "pooler_output")


@pytest.mark.parametrize("source", [*HEAD_CLASSES, "BertForMaskedLM", "BertModel"])
def test_any_checkpoint_into_any_head_class_loads_as_transformers_or_names_what_is_missing(checkpoints, source):
    """Every other class on this checkpoint: where transformers loads every tensor it needs, ours loads the same
    ones, reports the same leftovers and computes the same outputs; where transformers would draw tensors at random
    (missing) or refuses (shape mismatch), ours is an error naming each of them."""
    _, directory = checkpoints[source]
    for target in (*HEAD_CLASSES, "BertForMaskedLM"):
        try:
            theirs, info = getattr(transformers, target).from_pretrained(directory, output_loading_info=True,
                                                                         attn_implementation="eager")
        except RuntimeError as e:  # a tensor of another shape, e.g. a 3-label classifier into multiple choice
            assert "mismatch" in str(e)
            with pytest.raises(CheckpointError, match=r"wrong shape[\s\S]*classifier\.weight: \(\d, 48\) in the "
                                                      r"checkpoint, \(\d, 48\) expected"):
                getattr(scratch_models, target).from_pretrained(directory)
            continue
        if target == "BertForQuestionAnswering" and theirs.config.num_labels != 2:
            with pytest.raises(ValueError, match="needs num_labels = 2"):  # transformers fails at the forward
                scratch_models.BertForQuestionAnswering.from_pretrained(directory)
            continue
        if info["missing_keys"]:
            with pytest.raises(CheckpointError) as error:
                getattr(scratch_models, target).from_pretrained(directory)
            named = set(re.findall(r"^  (\S+) \(", str(error.value), re.M))
            assert named == names_in(info["missing_keys"]), f"{source} -> {target}"
            continue
        ours = getattr(scratch_models, target).from_pretrained(directory)
        assert set(ours.loading_info.ignored) == info["unexpected_keys"], f"{source} -> {target}"
        inputs = features("multiple choice" if target == "BertForMultipleChoice" else "single-label")
        with torch.no_grad():
            out, ref = head_fields(ours(**inputs)), head_fields(theirs.eval()(**inputs))
        for name in out:
            assert_parity(out[name], ref[name], f"{source} -> {target}: {name}")


def test_a_head_the_checkpoint_lacks_is_an_error_naming_its_tensors(checkpoints):
    """transformers would initialise the classifier at random and say so in a log line; we refuse."""
    _, directory = checkpoints["BertModel"]
    with pytest.raises(CheckpointError, match=r"2 tensor\(s\) missing[\s\S]*classifier\.weight \(2, 48\) \(our "
                                              r"classifier\.weight\)\n  classifier\.bias \(2,\)"):
        scratch_models.BertForSequenceClassification.from_pretrained(directory)
    _, directory = checkpoints["BertForTokenClassification"]  # classifier fits; the pooler is missing
    with pytest.raises(CheckpointError, match=r"missing[\s\S]*pooler\.dense\.weight \(48, 48\)"):
        scratch_models.BertForSequenceClassification.from_pretrained(directory)


@pytest.mark.parametrize("class_name", HEAD_CLASSES)
def test_export_loads_cleanly_in_transformers_in_its_own_layout(checkpoints, tmp_path, class_name):
    """save_pretrained: transformers loads the export with nothing missing, unexpected or mismatched, into its class
    of the same name, with the same labels and problem type, writes the same keys when it saves it, and computes the
    same outputs; ours reads it back bitwise."""
    original, directory = checkpoints[class_name]
    model = getattr(scratch_models, class_name).from_pretrained(directory)
    theirs, _ = export(model, tmp_path / "out", getattr(transformers, class_name))
    assert theirs.config.id2label == original.config.id2label and theirs.config.problem_type is None
    theirs.save_pretrained(tmp_path / "theirs")
    ours_file, theirs_file = file_tensors(tmp_path / "out"), file_tensors(tmp_path / "theirs")
    assert sorted(ours_file) == sorted(theirs_file)
    assert all(torch.equal(ours_file[key], theirs_file[key]) for key in ours_file)
    inputs = batch(CASE_OF[class_name])
    with torch.no_grad():
        out, ref = head_fields(model(**inputs)), head_fields(theirs(**inputs))
    assert "loss" in out
    for name in out:
        assert_parity(out[name], ref[name], f"{class_name} export: {name}")


def test_export_keeps_labels_and_problem_type(tmp_path):
    theirs = reference("BertForSequenceClassification", id2label={0: "neg", 1: "pos"},
                       problem_type="multi_label_classification")
    model = scratch_models.BertForSequenceClassification.from_pretrained(save(theirs, tmp_path / "in"))
    back, _ = export(model, tmp_path / "out", transformers.AutoModelForSequenceClassification)
    assert back.config.id2label == {0: "neg", 1: "pos"} and back.config.label2id == {"neg": 0, "pos": 1}
    assert back.config.problem_type == "multi_label_classification"


def test_pretraining_legacy_export_is_bert_base_uncased_layout(tmp_path):
    """BertForPreTraining with legacy=True writes exactly the keys of bert-base-uncased's file, NSP head included."""
    theirs = reference("BertForPreTraining")
    write_config(theirs.config, tmp_path / "in")
    write_weights(legacy_state(theirs), tmp_path / "in", "bin")
    model = scratch_models.BertForPreTraining.from_pretrained(tmp_path / "in")
    assert set(model.loading_info.ignored) == {"cls.predictions.decoder.weight"}  # stored, and tied
    back, _ = export(model, tmp_path / "out", transformers.BertForPreTraining, legacy=True)
    assert sorted(file_tensors(tmp_path / "out")) == sorted(legacy_state(theirs))


@pytest.mark.parametrize("class_name", ["BertForPreTraining", "BertForNextSentencePrediction"])
def test_table_compare_rows_hold(checkpoints, class_name):
    """The table's compared head rows (`cls` and its pick) against transformers' modules, as verify hooks them."""
    theirs, directory = checkpoints[class_name]
    ours = getattr(scratch_models, class_name).from_pretrained(directory)
    rows = [row for row in BERT.compared(SMALL["num_hidden_layers"], with_heads=True)
            if row.head and row.ours in ours.hook_names()]
    assert {row.ours for row in rows} == ({"prediction_logits", "seq_relationship_logits"}
                                          if class_name == "BertForPreTraining" else {"logits"})
    results = compare_modules(BERT, ours, theirs, rows, features("single-label"), prefixed=True)
    assert all(r.passed for r in results), results


def test_labels_that_do_not_fit_are_errors_naming_them(checkpoints):
    def model(class_name):
        return getattr(scratch_models, class_name).from_pretrained(checkpoints[class_name][1])

    inputs = features("single-label")
    classifier = model("BertForSequenceClassification")
    bad = [
        (classifier, dict(labels=torch.tensor([0, 3, 1])), r"labels\[1\] = 3 is out of range: must be 0 <= id < "
                                                           r"num_labels = 3"),
        (classifier, dict(labels=torch.tensor([0, 1])), r"labels has shape \(2,\), expected \(3,\)"),
        (classifier, dict(labels=torch.ones(3)), r"multi_label_classification have shape \(3,\), expected \(3, 3\)"),
        (classifier, dict(labels=torch.ones(3, 3, dtype=torch.uint8)), "must be floating point"),
        (model("BertForTokenClassification"), dict(labels=torch.zeros(3, 10, dtype=torch.long)),
         r"labels has shape \(3, 10\), expected \(3, 11\)"),
        (model("BertForNextSentencePrediction"), dict(labels=torch.tensor([0, 2, 1])),
         r"labels\[1\] = 2 is out of range: must be 0 <= id < classes = 2"),
        (model("BertForPreTraining"), dict(next_sentence_label=torch.tensor([0, 1, 1])), "needs both labels"),
        (model("BertForQuestionAnswering"), dict(start_positions=torch.tensor([0, -1, 2]),
                                                 end_positions=torch.tensor([0, 1, 2])), "negative position, -1"),
        (model("BertForQuestionAnswering"), dict(start_positions=torch.tensor([0, 1, 2])), "needs both"),
        (model("BertForQuestionAnswering"), dict(start_positions=torch.tensor([0., 1., 2.]),
                                                 end_positions=torch.tensor([0, 1, 2])), "integer tensor"),
    ]
    for ours, labels, message in bad:
        with pytest.raises(ValueError, match=message):
            ours(**inputs, **labels)
    # int32 class indices are read as class indices (transformers' choice), then as int64 (where torch's
    # cross-entropy, and so transformers, fails)
    labels = torch.tensor([2, 0, 1])
    assert torch.equal(classifier(**inputs, labels=labels.int()).loss, classifier(**inputs, labels=labels).loss)
    choice = model("BertForMultipleChoice")
    with pytest.raises(ValueError, match=r"input_ids must be 3-D \[batch, num_choices, seq\], got shape \(3, 11\)"):
        choice(**inputs)
    mc = features("multiple choice")
    with pytest.raises(ValueError, match=r"attention_mask must be \[batch, num_choices, seq\] = \(2, 3, 9\)"):
        choice(mc["input_ids"], attention_mask=mc["attention_mask"][:, 0])
    with pytest.raises(ValueError, match=r"labels\[0\] = 3 is out of range: must be 0 <= id < num_choices = 3"):
        choice(**mc, labels=torch.tensor([3, 0]))


def test_question_answering_needs_two_labels(tmp_path):
    save(reference("BertForSequenceClassification", num_labels=3), tmp_path)
    with pytest.raises(ValueError, match="needs num_labels = 2, but the config names 3 labels"):
        scratch_models.BertForQuestionAnswering.from_pretrained(tmp_path)


@pytest.mark.slow
def test_full_size_bert_base_pretraining_in_bert_base_uncased_layout(tmp_path):
    """bert-base-uncased's own class, config and file layout (`bert.`, gamma/beta, the decoder weight stored):
    both heads and the pretraining loss."""
    torch.manual_seed(0)
    theirs = transformers.BertForPreTraining._from_config(transformers.BertConfig(**BERT_BASE)).eval()
    write_config(theirs.config, tmp_path)
    write_weights(legacy_state(theirs), tmp_path, "safetensors")
    ours = scratch_models.BertForPreTraining.from_pretrained(tmp_path)
    assert set(ours.loading_info.ignored) == {"cls.predictions.decoder.weight"}
    inputs = batch("pretraining")
    inputs["token_type_ids"] = inputs["token_type_ids"].clamp(max=1)  # bert-base has two token types
    with torch.no_grad():
        out, ref = head_fields(ours(**inputs)), head_fields(theirs(**inputs))
    for name in out:
        record("bert-base pretraining", name, assert_parity(out[name], ref[name], f"bert-base: {name}", **model_sizes(
            theirs.config, theirs.config.vocab_size)))  # the loss: a log-softmax over the vocabulary
