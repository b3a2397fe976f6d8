"""GPT-2's task heads against transformers 5: GPT2ForSequenceClassification (single-label, multi-label,
regression), GPT2ForTokenClassification, GPT2ForQuestionAnswering and GPT2DoubleHeadsModel, each built by
transformers with large random weights and written in every layout (its own save, .bin, sharded safetensors).

Outputs and losses within assert_parity's bound (fp32 CPU); our fused path against transformers' SDPA
everywhere, our explicit path against its eager attention where a query sees a key (at a left-padding query that
sees none, eager spreads evenly while we and SDPA give 0). Training (dropout 0): the loss, and every parameter's
gradient within GRAD_TOL (test_training.py) of its largest, on both of our paths against SDPA. Then: base classes
loading head checkpoints as transformers does, missing heads as errors, the sequence classifier's choice of token,
the exports, the table's compared rows, bad arguments.
"""

import contextlib
import json

import pytest
import torch
import transformers
from safetensors import safe_open

from helpers import assert_parity, randomize_, sighted, write_weights
from scratch_models import (GPT2DoubleHeadsModel, GPT2ForQuestionAnswering, GPT2ForSequenceClassification,
                            GPT2ForTokenClassification, GPT2LMHeadModel, GPT2Model)
from scratch_models import ConfigError, GPT2Config
from scratch_models_cli.verify import compare_modules
from test_export import assert_transformers_layout, export
from test_training import GRAD_TOL, paired_parameters
from weight_mapping import GPT2, CheckpointError

PAD = 98  # GPT-2 has no pad token: fine-tuning pads with eos, as here; real tokens are drawn from 0..97
CONFIG = dict(vocab_size=99, n_positions=32, n_embd=48, n_layer=2, n_head=3, bos_token_id=PAD, eos_token_id=PAD,
              pad_token_id=PAD)
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0, classifier_dropout=0.0)

# case -> (our class, config changes); the labels of each case are made in `case_inputs`
CASES = {
    "sequence-single": (GPT2ForSequenceClassification, dict(num_labels=3)),
    "sequence-multi": (GPT2ForSequenceClassification, dict(num_labels=3)),
    "sequence-regression": (GPT2ForSequenceClassification, dict(num_labels=1)),
    "sequence-regression-3": (GPT2ForSequenceClassification, dict(num_labels=3, problem_type="regression")),
    "token": (GPT2ForTokenClassification, dict(num_labels=3)),
    "qa": (GPT2ForQuestionAnswering, {}),
    "double": (GPT2DoubleHeadsModel, {}),
}
OUTPUTS = {GPT2ForSequenceClassification: ("logits",), GPT2ForTokenClassification: ("logits",),
           GPT2ForQuestionAnswering: ("start_logits", "end_logits"), GPT2DoubleHeadsModel: ("logits", "mc_logits")}
LOSSES = {GPT2DoubleHeadsModel: ("loss", "mc_loss")}
HEAD_CASES = ["sequence-single", "token", "qa", "double"]  # one per class
# Parameters whose exact gradient is 0: a number added to every score of a softmax leaves it as it was, so
# a bias of the QA head (added to every position's start or end score), ln_f's bias there (which reaches every
# position alike through it), and the multiple-choice head's bias (added to every choice's score) learn nothing.
ZERO_GRADIENT = {GPT2ForQuestionAnswering: ("qa_outputs.bias", "transformer.ln_f.bias"),
                 GPT2DoubleHeadsModel: ("multiple_choice_head.summary.bias",)}
# (output field, output class) of the outputs with a position axis
PER_POSITION = {("logits", "TokenClassifierOutput"), ("start_logits", "QuestionAnsweringModelOutput"),
                ("end_logits", "QuestionAnsweringModelOutput"), ("logits", "GPT2DoubleHeadsModelOutput")}


def reference(case: str, attention: str = "sdpa", std: float = 0.3, **changes):
    """transformers' class of `case`, weights redrawn with `std` (init's 0.02 hides slips)."""
    our_class, config = CASES[case]
    torch.manual_seed(0)
    model = getattr(transformers, our_class.__name__)._from_config(
        transformers.GPT2Config(**(CONFIG | config | changes)), attn_implementation=attention)
    return randomize_(model, std).eval()


def save(model, directory, layout: str):
    """`layout`: what transformers' save_pretrained writes, its state dict as one .bin (tied lm_head included), or
    as three safetensors shards with an index."""
    if layout == "transformers":
        model.save_pretrained(directory)
    else:
        model.config.save_pretrained(directory)
        write_weights(model.state_dict(), directory, "bin" if layout == "bin" else "safetensors",
                      shards=3 if layout == "sharded" else 1)
    return directory


def padded_rows(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Four rows of 10: the pad id inside a real row (as eos), right-padded, left-padded, one pad on the right."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(PAD, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.long)
    mask[1, 7:], mask[2, :4], mask[3, 9:] = 0, 0, 0
    ids = ids.masked_fill(mask == 0, PAD)
    ids[0, 5] = PAD  # attended, and not where the row is read
    return ids, mask


def case_inputs(case: str, seed: int = 1) -> dict:
    our_class, _ = CASES[case]
    g = torch.Generator().manual_seed(seed + 100)
    if our_class is GPT2DoubleHeadsModel:  # 2 examples x 3 choices x 8 tokens; one choice right-, one left-padded
        ids = torch.randint(PAD, (2, 3, 8), generator=g)
        mask = torch.ones(2, 3, 8, dtype=torch.long)
        mask[0, 1, 6:], mask[1, 2, :3] = 0, 0
        ids = ids.masked_fill(mask == 0, PAD)
        mc_token_ids = torch.tensor([[7, 5, 7], [4, 7, 7]])  # a real token of each choice
        labels = ids.masked_fill(mask == 0, -100)
        labels[..., 1:] = labels[..., 1:].masked_fill(mask[..., :-1] == 0, -100)  # predicted from a real token
        return dict(input_ids=ids, attention_mask=mask, mc_token_ids=mc_token_ids, labels=labels,
                    mc_labels=torch.tensor([2, 0]))
    ids, mask = padded_rows(seed)
    inputs = dict(input_ids=ids, attention_mask=mask)
    if our_class is GPT2ForQuestionAnswering:
        # transformers clamps positions to 0..s and does not score s: 40 is "not scored" (a negative one is refused)
        return inputs | dict(start_positions=torch.tensor([1, 3, 0, 40]), end_positions=torch.tensor([4, 6, 8, 9]))
    labels = {
        "sequence-single": torch.tensor([2, 0, 1, 2]),
        "sequence-multi": torch.randint(2, (4, 3), generator=g).float(),
        "sequence-regression": torch.randn(4, generator=g),
        "sequence-regression-3": torch.randn(4, 3, generator=g),
        "token": torch.randint(3, (4, 10), generator=g).masked_fill(mask == 0, -100),
    }[case]
    return inputs | dict(labels=labels)


@contextlib.contextmanager
def attention(model, implementation: str):
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def compare_outputs(ours, theirs, fields, what: str, seen: torch.Tensor | None = None) -> float:
    """Each output field within 1e-5 + 1e-5*|theirs|; with `seen` ([b, s] or [b, c, s]), the outputs per position
    only where the query sees a key (outputs read at chosen real tokens, [b, L] and [b, c], are kept whole)."""
    worst = 0.0
    for field in fields:
        a, b = getattr(ours, field).detach(), getattr(theirs, field).detach()
        if seen is not None and (field, type(ours).__name__) in PER_POSITION:
            a, b = a[seen], b[seen]
        worst = max(worst, assert_parity(a, b, f"{field}, {what}"))
    return worst


def total_loss(output, our_class) -> torch.Tensor:
    return sum(getattr(output, field) for field in LOSSES.get(our_class, ("loss",)))


# ------------------------------------------------------------------------------------ parity, every layout


@pytest.mark.parametrize("layout", ["transformers", "bin", "sharded"])
@pytest.mark.parametrize("case", list(CASES))
def test_outputs_losses_and_gradients_match_transformers(tmp_path, case, layout):
    our_class, _ = CASES[case]
    theirs = reference(case, **NO_DROPOUT)
    directory = save(theirs, tmp_path, layout)
    ours = our_class.from_pretrained(directory)
    inputs = case_inputs(case)
    fields, losses = OUTPUTS[our_class], LOSSES.get(our_class, ("loss",))
    seen = sighted("gpt2", inputs["attention_mask"])
    worst = {}
    with torch.no_grad():
        ref = theirs(**inputs, output_hidden_states=True)
        with attention(theirs, "eager"):
            ref_eager = theirs(**inputs, output_attentions=True)
        fused = ours(**inputs, output_hidden_states=True)
        explicit = ours(**inputs, output_attentions=True)
    worst["outputs, fused vs SDPA"] = compare_outputs(fused, ref, fields + losses, "our fused path against SDPA")
    # the base model's, as transformers returns them (GPT2DoubleHeadsModel: b·c rows, the last one [b, c, s, h])
    assert len(fused.hidden_states) == len(ref.hidden_states) == CONFIG["n_layer"] + 1
    for i, (a, b) in enumerate(zip(fused.hidden_states, ref.hidden_states)):
        assert_parity(a, b, f"hidden_states[{i}]")
    worst["outputs, explicit vs eager"] = compare_outputs(explicit, ref_eager, fields, "our explicit path against "
                                                          "eager, where a query sees a key", seen)
    worst["losses, explicit vs SDPA"] = compare_outputs(explicit, ref, losses, "our explicit path against SDPA")
    assert all(0.01 < float(getattr(ref, loss)) < 100 for loss in losses)

    # training, dropout off: both of our paths against transformers' SDPA, loss and every gradient
    theirs.train()
    total_loss(theirs(**inputs), our_class).backward()
    for explicit_path in (False, True):
        ours = our_class.from_pretrained(directory).train()
        out = ours(**inputs, output_attentions=explicit_path)
        total_loss(out, our_class).backward()
        path = "explicit" if explicit_path else "fused"
        worst[f"train losses, {path}"] = compare_outputs(out, ref, losses, f"train mode, {path} path")
        pairs = paired_parameters("gpt2", ours, theirs)
        top = max(float(their.grad.abs().max()) for _, their in pairs.values())
        for name, (our_parameter, their_parameter) in pairs.items():
            # a parameter whose exact gradient is 0 holds rounding noise on both sides: held to the largest one
            scale = top if name in ZERO_GRADIENT.get(our_class, ()) else float(their_parameter.grad.abs().max())
            assert scale > 0, f"{name}: no gradient reached it"
            diff = float((our_parameter.grad - their_parameter.grad).abs().max())
            assert diff <= GRAD_TOL * scale, f"{path} {name}: gradient |diff| {diff:.3e} > {GRAD_TOL:.0e} * {scale:.3e}"
            worst[f"{path} gradients"] = max(worst.get(f"{path} gradients", 0.0), diff / scale)
    print(f"{case} {layout}: worst {worst}")


# ------------------------------------------------------------------------------------ loading across classes


def file_keys(directory) -> set[str]:
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("case", HEAD_CASES)
def test_base_classes_load_head_checkpoints_as_transformers_does(tmp_path, case):
    """GPT2Model and GPT2LMHeadModel read a head's checkpoint (base prefix stripped, the head listed as ignored),
    as transformers' classes do (the head reported unexpected), and compute the same."""
    directory = save(reference(case), tmp_path, "transformers")
    head = {key for key in file_keys(directory) if not key.startswith("transformer.")}
    assert head
    ids, mask = padded_rows()
    for our_class in (GPT2Model, GPT2LMHeadModel):
        ours = our_class.from_pretrained(directory)
        theirs, info = getattr(transformers, our_class.__name__).from_pretrained(directory, output_loading_info=True)
        assert set(info["unexpected_keys"]) == head and not info["missing_keys"] and not info["mismatched_keys"]
        assert ours.loading_info.ignored == {key: f"not part of {our_class.__name__}" for key in head}
        assert ours.loading_info.prefixed
        with torch.no_grad():
            out, ref = ours(ids, attention_mask=mask), theirs.eval()(ids, attention_mask=mask)
        field = "logits" if our_class is GPT2LMHeadModel else "last_hidden_state"
        assert_parity(getattr(out, field), getattr(ref, field), f"{our_class.__name__} {field}")


def test_a_head_the_checkpoint_lacks_is_an_error_naming_its_tensors(tmp_path):
    """No random init behind the user's back: a base or LM checkpoint, or another head's, does not load into a
    class with a head; the error names each missing tensor with its shape."""
    seq = save(reference("sequence-single"), tmp_path / "seq", "transformers")
    base_only, lm = tmp_path / "base", tmp_path / "lm"  # no prefix; `transformer.` and no head of its own
    GPT2Model.from_pretrained(seq).save_pretrained(base_only)
    GPT2LMHeadModel.from_pretrained(seq).save_pretrained(lm)
    missing = {
        GPT2ForSequenceClassification: ["score.weight (3, 48)"],
        GPT2ForTokenClassification: ["classifier.weight (3, 48)", "classifier.bias (3,)"],
        GPT2ForQuestionAnswering: ["qa_outputs.weight (2, 48)", "qa_outputs.bias (2,)"],
        GPT2DoubleHeadsModel: ["multiple_choice_head.summary.weight (1, 48)", "multiple_choice_head.summary.bias (1,)"],
    }
    for our_class, names in missing.items():
        for directory in (base_only, lm):
            with pytest.raises(CheckpointError) as e:
                our_class.from_pretrained(directory)
            assert f"{len(names)} tensor(s) missing from the checkpoint" in str(e.value)
            assert all(name in str(e.value) for name in names), str(e.value)
    # another head's checkpoint (config num_labels 3): the score head is skipped, the classifier is missing
    with pytest.raises(CheckpointError, match=r"classifier.weight \(3, 48\)") as e:
        GPT2ForTokenClassification.from_pretrained(seq)
    assert "score.weight" not in str(e.value)
    # a config that names 2 classes beside a 3-class head: the shapes are reported
    config = GPT2Config.from_json_file(seq / "config.json").to_dict() | {"id2label": {"0": "no", "1": "yes"},
                                                                         "label2id": {"no": 0, "yes": 1}}
    (seq / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"score.weight: \(3, 48\) in the checkpoint, \(2, 48\) expected"):
        GPT2ForSequenceClassification.from_pretrained(seq)


# ------------------------------------------------------------------------------------ sequence classification


def test_the_sequence_is_read_at_its_rightmost_real_token(tmp_path):
    """transformers' rule, from input_ids alone: the rightmost token that is not pad_token_id, 0 if there is none."""
    theirs = reference("sequence-single")
    ours = GPT2ForSequenceClassification.from_pretrained(save(theirs, tmp_path, "transformers"))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10],              # nothing padded: the last token
                        [5, 6, 7, PAD, PAD, PAD],         # right-padded
                        [PAD, PAD, 5, 6, 7, 8],           # left-padded: the last column
                        [5, PAD, 6, 7, PAD, PAD],         # the pad id inside (as eos), then padding
                        [PAD, PAD, PAD, PAD, PAD, PAD]])  # nothing but padding: position 0
    assert ours.last_tokens(ids).tolist() == [5, 2, 5, 3, 0]
    mask = (ids != PAD).long()
    mask[3, 1] = 1
    with torch.no_grad():
        out, ref = ours(ids, attention_mask=mask), theirs(ids, attention_mask=mask)
    assert_parity(out.logits, ref.logits, "logits")


def test_without_a_pad_token_only_one_row_is_classified(tmp_path):
    theirs = reference("sequence-single", pad_token_id=None)
    ours = GPT2ForSequenceClassification.from_pretrained(save(theirs, tmp_path, "transformers"))
    assert ours.config.pad_token_id is None
    ids = torch.randint(PAD, (2, 7), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match=r"config.pad_token_id is not set.*batch sizes > 1 \(got 2\)"):
        ours(ids)
    with pytest.raises(ValueError, match="Cannot handle batch sizes > 1 if no padding token is defined"):
        theirs(ids)
    with torch.no_grad():  # one row: read at its last position
        assert_parity(ours(ids[:1]).logits, theirs(ids[:1]).logits, "logits")


def test_sequence_classification_keeps_a_kv_cache(tmp_path):
    """As transformers' output, ours carries the cache: a continued sequence is classified as the whole one."""
    ours = GPT2ForSequenceClassification.from_pretrained(save(reference("sequence-single"), tmp_path, "transformers"))
    ids = torch.randint(PAD, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = ours(ids)
        first = ours(ids[:, :6], use_cache=True)
        cache = first.past_key_values
        assert cache.length == 6 and cache.batch_size == 2
        with pytest.raises(ValueError, match=r"labels\[0\] = 3 is out of range"):
            ours(ids[:, 6:], past_key_values=cache, labels=torch.tensor([3, 0]))
        assert cache.length == 6  # a refused call leaves the cache as it was
        rest = ours(ids[:, 6:], past_key_values=cache)
    assert rest.past_key_values is cache and cache.length == 9
    assert_parity(rest.logits, whole.logits, "logits, continued")


# ------------------------------------------------------------------------------------ exports


@pytest.mark.parametrize("case", list(CASES))
def test_exports_load_into_transformers_cleanly_and_compute_the_same(tmp_path, case):
    """save_pretrained writes transformers' layout for the class (its own save holds the same keys and tensors)
    and a config.json that rebuilds the head (labels, problem_type, pad token, summary fields)."""
    our_class, _ = CASES[case]
    model = our_class.from_pretrained(save(reference(case), tmp_path / "in", "bin"))
    theirs, back = export(model, tmp_path / "out", getattr(transformers, our_class.__name__))
    assert_transformers_layout(tmp_path / "out", theirs, tmp_path)
    for field in ("pad_token_id", "problem_type", "summary_type", "summary_first_dropout"):
        assert getattr(theirs.config, field) == getattr(model.config, field), field
    if our_class is not GPT2DoubleHeadsModel:  # which sets num_labels to 1 whatever the config says
        assert theirs.config.num_labels == model.config.num_labels
    inputs = {k: v for k, v in case_inputs(case).items() if k in ("input_ids", "attention_mask", "mc_token_ids")}
    with torch.no_grad():  # transformers as export loads it (eager): our explicit path, where queries see keys
        out, ref = model(**inputs, output_attentions=True), theirs(**inputs, output_attentions=True)
    compare_outputs(out, ref, OUTPUTS[our_class], "export", sighted("gpt2", inputs["attention_mask"]))


# ------------------------------------------------------------------------------------ table, hooks, config


@pytest.mark.parametrize("case", HEAD_CASES)
def test_compared_table_rows_match_transformers_modules(case, tmp_path):
    """The mapping table's compared rows that a class has (its hook point and transformers' module), hooked on both
    sides as the parity report does, base and head."""
    our_class, _ = CASES[case]
    theirs = reference(case, attention="eager")
    ours = our_class.from_pretrained(save(theirs, tmp_path, "transformers"))
    modules = dict(theirs.named_modules())
    rows = [row for row in GPT2.compared(CONFIG["n_layer"], with_heads=True)
            if row.ours in ours.hook_names() and GPT2.checkpoint_module(row, prefixed=True) in modules]
    head_rows = {row.ours for row in rows if row.head}
    assert head_rows == {GPT2ForSequenceClassification: {"token_logits"}, GPT2ForTokenClassification: set(),
                         GPT2ForQuestionAnswering: {"span_logits"}, GPT2DoubleHeadsModel: {"logits"}}[our_class]
    inputs = {k: v for k, v in case_inputs(case).items() if k in ("input_ids", "attention_mask")}
    if our_class is GPT2DoubleHeadsModel:  # [b, c, s] inputs: the rows' [b, s, ...] shapes hold b·c rows; no padding
        inputs = dict(input_ids=inputs["input_ids"].clamp(max=PAD - 1))
    seen = sighted("gpt2", inputs["attention_mask"]) if "attention_mask" in inputs else None
    compared = compare_modules(GPT2, ours, theirs, rows, inputs, prefixed=True, sighted=seen)
    assert [c.name for c in compared] == [row.ours for row in rows]
    failed = [f"{c.name}: max |diff| {c.max_abs:.3e}" for c in compared if not c.passed]
    assert not failed, failed


def test_hook_points_on_the_heads(tmp_path):
    ours = GPT2ForSequenceClassification.from_pretrained(save(reference("sequence-single"), tmp_path, "transformers"))
    ids, mask = padded_rows()
    out, cache = ours.run_with_cache(ids, attention_mask=mask, names=["token_logits", "logits"])
    assert cache["token_logits"].shape == (4, 10, 3) and torch.equal(cache["logits"], out.logits)
    assert torch.equal(cache["token_logits"][torch.arange(4), ours.last_tokens(ids)], out.logits)
    # an edit at the read position is the output
    edited = ours.run_with_hooks(ids, attention_mask=mask, hooks=[("token_logits", lambda t, name: t * 0)])
    assert not edited.logits.any()
    docs = {name: doc for name, doc in GPT2DoubleHeadsModel(GPT2Config(**CONFIG)).hook_docs().items()
            if "." not in name}
    assert docs["logits"].startswith("[b, c, s, V]") and docs["mc_logits"].startswith("[b, c]")


def test_token_classifier_dropout_is_chosen_as_transformers_chooses_it():
    for changes in ({}, dict(hidden_dropout=0.2), dict(hidden_dropout=0.2, classifier_dropout=0.3)):
        ours = GPT2ForTokenClassification(GPT2Config.from_dict(CONFIG | changes))
        theirs = transformers.GPT2ForTokenClassification(transformers.GPT2Config(**CONFIG, **changes))
        assert ours.dropout.p == theirs.dropout.p, changes


def test_double_heads_summary_settings(tmp_path):
    """A tanh after the multiple-choice projection (summary_activation) is built; the summaries GPT-2's checkpoints
    never use are refused by name."""
    theirs = reference("double", summary_activation="tanh")
    ours = GPT2DoubleHeadsModel.from_pretrained(save(theirs, tmp_path, "transformers"))
    inputs = case_inputs("double")
    inputs = {k: inputs[k] for k in ("input_ids", "attention_mask", "mc_token_ids")}
    with torch.no_grad():
        assert_parity(ours(**inputs).mc_logits, theirs(**inputs).mc_logits, "mc_logits with tanh")
    for field, value in (("summary_type", "mean"), ("summary_use_proj", False), ("summary_proj_to_labels", False),
                         ("summary_activation", "softmax")):
        with pytest.raises(ConfigError, match=f"{field}={value!r} is not supported"):
            GPT2DoubleHeadsModel(GPT2Config.from_dict(CONFIG | {field: value}))
        GPT2Model(GPT2Config.from_dict(CONFIG | {field: value}))  # the base model does not read them
    with pytest.raises(ConfigError, match="'summary_first_dropout' must be in"):
        GPT2Config.from_dict(CONFIG | {"summary_first_dropout": 1.5})


# ------------------------------------------------------------------------------------ bad arguments


@pytest.fixture(scope="module")
def models():
    config = GPT2Config.from_dict(CONFIG | {"num_labels": 3})
    torch.manual_seed(0)
    return {cls: cls(config).eval() for cls in (GPT2ForSequenceClassification, GPT2ForTokenClassification,
                                                GPT2ForQuestionAnswering, GPT2DoubleHeadsModel)}


def test_bad_labels_and_arguments_name_themselves(models):
    ids, mask = padded_rows()
    seq, token = models[GPT2ForSequenceClassification], models[GPT2ForTokenClassification]
    qa, double = models[GPT2ForQuestionAnswering], models[GPT2DoubleHeadsModel]
    cases = [
        (seq, dict(labels=torch.tensor([0, 1, 3, 0])), r"labels\[2\] = 3 is out of range: must be 0 <= id < "
                                                       r"num_labels = 3 \(or -100"),
        (seq, dict(labels=torch.tensor([0, 1])), r"labels has shape \(2,\), expected \(4,\)"),
        (seq, dict(labels=torch.ones(4, 2)), r"labels for multi_label_classification have shape \(4, 2\), "
                                             r"expected \(4, 3\)"),
        (seq, dict(labels=torch.ones(4, 3, dtype=torch.bool)), "must be floating point .*got torch.bool"),
        (seq, dict(labels=[0, 1, 2, 0]), "labels must be a torch.Tensor"),
        (token, dict(labels=torch.zeros(4, 9, dtype=torch.long)), r"labels has shape \(4, 9\), expected \(4, 10\)"),
        (token, dict(labels=torch.full((4, 10), 5)), "num_labels = 3"),
        (qa, dict(start_positions=torch.zeros(4, dtype=torch.long)), "give both start_positions and end_positions"),
        (qa, dict(start_positions=torch.zeros(4), end_positions=torch.zeros(4)), "must be an integer tensor"),
        (qa, dict(start_positions=torch.zeros(3, dtype=torch.long), end_positions=torch.zeros(3, dtype=torch.long)),
         r"start_positions has shape \(3,\)"),
    ]
    for model, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            model(ids, attention_mask=mask, **kwargs)
    with torch.no_grad():  # class indices of another integer dtype are read as torch.long (CE wants it)
        labels = torch.tensor([0, 1, 2, 0])
        assert torch.equal(seq(ids, attention_mask=mask, labels=labels.int()).loss,
                           seq(ids, attention_mask=mask, labels=labels).loss)
    # regression takes integer values as torch's mean squared error does (transformers too)
    regression = GPT2ForSequenceClassification(GPT2Config.from_dict(CONFIG | {"num_labels": 1})).eval()
    with torch.no_grad():
        assert torch.equal(regression(ids, labels=torch.tensor([0, 1, 1, 0])).loss,
                           regression(ids, labels=torch.tensor([0.0, 1.0, 1.0, 0.0])).loss)

    choices = torch.randint(PAD, (2, 3, 8), generator=torch.Generator().manual_seed(5))
    double_cases = [
        (dict(input_ids=choices[0]), r"input_ids must be a non-empty 3-D tensor \[batch, choices, seq\], got \(3, 8\)"),
        (dict(mc_token_ids=torch.full((2, 3), 8)), r"mc_token_ids\[0, 0\] = 8 is out of range: must be 0 <= id < "
                                                   r"the sequence length = 8"),
        (dict(mc_token_ids=torch.zeros(2, dtype=torch.long)), r"mc_token_ids has shape \(2,\), expected \(2, 3\)"),
        (dict(mc_labels=torch.tensor([0, 3])), r"mc_labels\[1\] = 3 is out of range: must be 0 <= id < the number "
                                               r"of choices = 3"),
        (dict(labels=choices[:, :2]), r"labels has shape \(2, 2, 8\), expected \(2, 3, 8\)"),
        (dict(attention_mask=torch.ones(6, 8)), r"attention_mask has shape \(6, 8\), expected \(2, 3, 8\)"),
        (dict(position_ids=torch.arange(8)[None]), r"position_ids has shape \(1, 8\), expected \(2, 3, 8\)"),
    ]
    for kwargs, message in double_cases:
        with pytest.raises(ValueError, match=message):
            double(**({"input_ids": choices} | kwargs))
    with torch.no_grad():  # the defaults: the last token of each choice, and a cache over b·c rows
        out = double(choices, use_cache=True)
        last = double(choices, mc_token_ids=torch.full((2, 3), 7))
    assert torch.equal(out.mc_logits, last.mc_logits) and out.past_key_values.batch_size == 6
