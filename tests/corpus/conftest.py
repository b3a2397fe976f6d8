"""Fixtures of the corpus tests: small corpora in every format harvest reads, and models to run over them."""

import pytest

pytest.importorskip("datasets", reason="scratch_models.corpus needs Hugging Face datasets (pip install -e '.[test]')")


@pytest.fixture(scope="session")
def minilm():
    from scratch_models import BertModel

    return BertModel.from_pretrained("minilm")


@pytest.fixture(scope="session")
def tiny_gpt2_model(tiny_gpt2):
    from scratch_models import GPT2Model

    return GPT2Model.from_pretrained(tiny_gpt2[0])
