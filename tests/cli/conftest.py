"""Small checkpoints the command-line tests share: random BERTs with heads and MiniLM's tokenizer files, one of
them with vocab.txt only, beside the session's tiny GPT-2."""

import shutil

import pytest
import transformers

from helpers import randomize_
from weight_mapping import embedded_checkpoint

MINILM = embedded_checkpoint()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@pytest.fixture(scope="session")
def small(tmp_path_factory, tiny_gpt2) -> dict[str, str]:
    """name -> directory: "mlm" (BertForMaskedLM), "classifier" (BertForSequenceClassification, labels neg / pos),
    "vocab_only" (the mlm's weights beside vocab.txt alone: no tokenizer.json), "gpt2" (GPT2LMHeadModel)."""
    root = tmp_path_factory.mktemp("small")
    config = dict(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
                  max_position_embeddings=64)
    for name, cls, extra in (("mlm", transformers.BertForMaskedLM, {}),
                             ("classifier", transformers.BertForSequenceClassification,
                              {"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}})):
        randomize_(cls(transformers.BertConfig(**config, **extra)), 0.3).save_pretrained(root / name)
        for file in TOKENIZER_FILES:
            shutil.copy(MINILM / file, root / name)
    shutil.copytree(root / "mlm", root / "vocab_only")
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (root / "vocab_only" / file).unlink()
    return {"gpt2": str(tiny_gpt2[0]), **{name: str(root / name) for name in ("mlm", "classifier", "vocab_only")}}
