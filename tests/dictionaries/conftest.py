"""Fixtures of the dictionary tests."""

import pytest

from dictionary_data import tiny_model


@pytest.fixture
def tiny_lm():
    """GPT-2's tiny config (2 layers, hidden 48) as GPT2LMHeadModel, random, in eval mode."""
    return tiny_model("gpt2")
