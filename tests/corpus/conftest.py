"""Fixtures of the corpus tests: small corpora in every format harvest reads, and models to run over them."""

import json

import pytest

pytest.importorskip("datasets", reason="scratch_models.corpus needs Hugging Face datasets (pip install -e '.[test]')")

SENTENCES = ["The cat sat on the warm mat.", "Time flies like an arrow.", "Fruit flies like a banana.",
             "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.",
             "It purred.", "A man is playing a guitar on the stage while the crowd is listening."]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def minilm():
    from scratch_models import BertModel

    return BertModel.from_pretrained("minilm")


@pytest.fixture(scope="session")
def tiny_gpt2_model(tiny_gpt2):
    from scratch_models import GPT2Model

    return GPT2Model.from_pretrained(tiny_gpt2[0])
