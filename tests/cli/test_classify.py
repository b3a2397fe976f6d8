"""`scratch-models classify`: the checkpoint's own head and labels, with the numbers transformers gives."""

import shutil

import pytest
import torch
import transformers

from helpers import randomize_
from scratch_models_cli.classify import classify
from scratch_models_cli.cli import main
from weight_mapping import embedded_checkpoint

MINILM = embedded_checkpoint()
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def bert_head(directory, class_name: str, **config):
    """A random transformers model of `class_name` with MiniLM's vocabulary and tokenizer beside it."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=37, **config)
    model = randomize_(getattr(transformers, class_name)._from_config(config), 0.3).eval()
    model.save_pretrained(directory)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MINILM / name, directory / name)
    return model, transformers.AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("problem_type, expected", [
    (None, lambda logits: logits.softmax(-1)),
    ("multi_label_classification", lambda logits: logits.sigmoid()),
])
def test_sequence_labels_and_probabilities_match_transformers(tmp_path, capsys, problem_type, expected):
    reference, tokenizer = bert_head(tmp_path, "BertForSequenceClassification", id2label=LABELS,
                                     problem_type=problem_type)
    result = classify(str(tmp_path), "What a lovely day.")
    with torch.no_grad():
        scores = expected(reference(**tokenizer("What a lovely day.", return_tensors="pt")).logits[0])
    assert result.head == "BertForSequenceClassification" and result.kind == "labels"
    assert [label for label, _ in result.rows] == [LABELS[int(i)] for i in scores.argsort(descending=True)]
    assert [score for _, score in result.rows] == pytest.approx(sorted(scores.tolist(), reverse=True), abs=1e-6)
    assert main(["classify", str(tmp_path), "What a lovely day.", "--top-k", "2"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "BertForSequenceClassification: scores, best first" and len(printed) == 3
    assert printed[1].split()[0] == result.rows[0][0]


def test_token_labels_match_transformers(tmp_path):
    reference, tokenizer = bert_head(tmp_path, "BertForTokenClassification", id2label={0: "O", 1: "PER", 2: "LOC"})
    text = "Ada Lovelace lived in London."
    result = classify(str(tmp_path), text)
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        probabilities = reference(**batch).logits[0].softmax(-1)
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    assert [row[0] for row in result.rows] == [f"{token} {['O', 'PER', 'LOC'][int(i)]}" for token, i in
                                               zip(tokens, probabilities.argmax(-1))]
    assert [row[1] for row in result.rows] == pytest.approx(probabilities.max(-1).values.tolist(), abs=1e-6)


def test_question_answering_span_is_the_best_allowed_one(tmp_path, capsys):
    reference, tokenizer = bert_head(tmp_path, "BertForQuestionAnswering")
    question, context = "Where did she live?", "Ada Lovelace lived in London with her mother."
    result = classify(str(tmp_path), question, pair=context)
    batch = tokenizer(question, context, return_tensors="pt")
    with torch.no_grad():
        out = reference(**batch)
    context_ids = [i for i, s in enumerate(batch.sequence_ids(0)) if s == 1]
    best = max(((a, b) for a in context_ids for b in context_ids if a <= b < a + 30),
               key=lambda ab: float(out.start_logits[0, ab[0]] + out.end_logits[0, ab[1]]))
    answer, probability = result.rows[0]
    assert answer == tokenizer.decode(batch["input_ids"][0, best[0]:best[1] + 1])
    assert probability == pytest.approx(float(out.start_logits[0].softmax(-1)[best[0]]
                                              * out.end_logits[0].softmax(-1)[best[1]]), abs=1e-6)
    assert main(["classify", str(tmp_path), question]) == 2
    assert "give the question as the text and the context as --pair" in capsys.readouterr().err


def test_a_checkpoint_without_a_classifier_is_refused_by_name(capsys):
    assert main(["classify", str(MINILM), "text"]) == 2
    assert "its head is BertModel, not a classifier" in capsys.readouterr().err
