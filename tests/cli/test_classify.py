"""`scratch-models classify`: the checkpoint's own head and labels, with the numbers transformers gives, on every
registered family's classifiers of each kind (a score per label, a label per token, an answer span), as its
declaration lists them, with the family's tokenizer (conftest's family_checkpoints)."""

import shutil
from pathlib import Path

import pytest
import torch
import transformers

from helpers import assert_parity, each_family, magnitude, reference, save
from scratch_models.registry.families import FAMILIES
from scratch_models_cli.classify import classify
from scratch_models_cli.cli import main
from weight_mapping import TOKENIZER_FILES, embedded_checkpoint

MINILM = embedded_checkpoint()
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def classifiers(kind: str) -> list:
    """(family, class name) of every class a family declares as a classifier of `kind`."""
    return [(name, cls) for name, family in FAMILIES.items() for cls, declared in family.classifiers.items()
            if declared == kind]


def head(directory: Path, family_checkpoints, family: str, class_name: str, **changes):
    """transformers' `class_name` of the family's tiny config with large random weights, saved beside the family's
    tokenizer; with that tokenizer."""
    source = Path(family_checkpoints[family])
    directory.mkdir()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, directory / name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = reference(family, class_name, attention="sdpa", vocab_size=len(tokenizer),
                      **{FAMILIES[family].positions_field: 64} | changes)
    save(model, directory)
    return model, tokenizer


@pytest.mark.parametrize("family, class_name", classifiers("labels"))
@pytest.mark.parametrize("problem_type, expected", [
    (None, lambda logits: logits.softmax(-1)),
    ("multi_label_classification", lambda logits: logits.sigmoid()),
])
def test_sequence_labels_and_probabilities_match_transformers(tmp_path, capsys, family_checkpoints, family,
                                                              class_name, problem_type, expected):
    theirs, tokenizer = head(tmp_path / "head", family_checkpoints, family, class_name, id2label=LABELS,
                             problem_type=problem_type)
    result = classify(str(tmp_path / "head"), "What a lovely day.")
    with torch.no_grad():
        logits = theirs(**tokenizer("What a lovely day.", return_tensors="pt")).logits[0]
        scores = expected(logits)
    assert result.head == class_name and result.kind == "labels"
    assert [label for label, _ in result.rows] == [LABELS[int(i)] for i in scores.argsort(descending=True)]
    # a probability's error is at most its logits' (softmax and sigmoid change by at most half as much)
    assert_parity(torch.tensor([score for _, score in result.rows]), scores.sort(descending=True).values, "scores",
                  scale=magnitude(logits))
    assert main(["classify", str(tmp_path / "head"), "What a lovely day.", "--top-k", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"{class_name}: scores, best first" and len(printed) == 3
    assert printed[1].split()[0] == result.rows[0][0]
    if not FAMILIES[family].pairs:  # a sentence pair needs token types; only a question's context goes without
        with pytest.raises(ValueError, match=f"--pair: {family} has no sentence pairs"):
            classify(str(tmp_path / "head"), "What a lovely day.", pair="Or is it?")


@pytest.mark.parametrize("family, class_name", classifiers("tokens"))
def test_token_labels_match_transformers(tmp_path, family_checkpoints, family, class_name):
    names = ["O", "PER", "LOC"]
    theirs, tokenizer = head(tmp_path / "head", family_checkpoints, family, class_name,
                             id2label=dict(enumerate(names)))
    text = "Ada Lovelace lived in London."
    result = classify(str(tmp_path / "head"), text)
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = theirs(**batch).logits[0]
        probabilities = logits.softmax(-1)
    tokens = [tokenizer.decode([i]) for i in batch["input_ids"][0].tolist()]  # each token as decode([id]) gives it
    assert result.kind == "tokens"
    assert [row[0] for row in result.rows] == [f"{token} {names[int(i)]}" for token, i in
                                               zip(tokens, probabilities.argmax(-1))]
    assert_parity(torch.tensor([row[1] for row in result.rows]), probabilities.max(-1).values, "probabilities",
                  scale=magnitude(logits))


@pytest.mark.parametrize("family, class_name", classifiers("span"))
def test_question_answering_span_is_the_best_allowed_one(tmp_path, capsys, family_checkpoints, family, class_name):
    """A question and its context are two segments in every family, token types or not (transformers' question
    answering reads GPT-2's and GPT-NeoX's the same way)."""
    theirs, tokenizer = head(tmp_path / "head", family_checkpoints, family, class_name,
                             id2label={0: "LABEL_0", 1: "LABEL_1"})
    question, context = "Where did she live?", "Ada Lovelace lived in London with her mother."
    result = classify(str(tmp_path / "head"), question, pair=context)
    batch = tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        out = theirs(**batch)
    context_ids = [i for i, s in enumerate(batch.sequence_ids(0)) if s == 1]
    best = max(((a, b) for a in context_ids for b in context_ids if a <= b < a + 30),
               key=lambda ab: float(out.start_logits[0, ab[0]] + out.end_logits[0, ab[1]]))
    answer, probability = result.rows[0]
    assert result.kind == "span"
    assert answer == tokenizer.decode(batch["input_ids"][0, best[0]:best[1] + 1])
    assert_parity(torch.tensor([probability]), out.start_logits[0].softmax(-1)[best[0]][None]
                  * out.end_logits[0].softmax(-1)[best[1]], "span probability",
                  scale=2 * magnitude(torch.cat([out.start_logits, out.end_logits])))  # a product of two
    assert main(["classify", str(tmp_path / "head"), question]) == 2
    assert "give the question as the text and the context as --pair" in capsys.readouterr().err


@each_family
def test_a_checkpoint_without_a_classifier_is_refused_by_name(capsys, family_checkpoints, family):
    assert main(["classify", family_checkpoints[family], "text"]) == 2
    assert f"its head is {FAMILIES[family].lm.__name__}, not a classifier" in capsys.readouterr().err


def test_a_base_model_checkpoint_is_refused_by_name(capsys):
    assert main(["classify", str(MINILM), "text"]) == 2
    assert "its head is BertModel, not a classifier" in capsys.readouterr().err
