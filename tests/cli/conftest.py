"""Small checkpoints the command-line tests share: random BERTs with heads and MiniLM's tokenizer files, one of
them with vocab.txt only, beside the session's tiny GPT-2; and every registered family's LM with a tokenizer."""

import shutil

import pytest
import transformers

from helpers import byte_level_bpe, randomize_, reference, save
from scratch_models.registry.families import FAMILIES
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


# what the byte-level BPE of family_checkpoints is trained on: the texts the command-line tests run
TRAINING_TEXTS = ("The meaning of life is to learn", "Once upon a time there lived a cat", "The meaning of life is",
                  "The meaning of time is")


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory) -> dict[str, str]:
    """family -> a directory holding its LM (the family's tiny config with 64 positions, random large weights, saved
    by transformers) and a tokenizer: a byte-level BPE of 300 ids with an end-of-text token trained on
    TRAINING_TEXTS, as GPT-2's and Pythia's are, for a causal family; MiniLM's WordPiece for a masked one."""
    out = {}
    for name, family in FAMILIES.items():
        directory = tmp_path_factory.mktemp(name)
        if family.causal:
            tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(list(TRAINING_TEXTS) * 5,
                                                                                             300),
                                                             eos_token="<|endoftext|>")
            tokenizer.save_pretrained(directory)
            eos = tokenizer.eos_token_id
            changes = dict(vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos)
        else:
            tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
            tokenizer.save_pretrained(directory)
            changes = dict(vocab_size=tokenizer.vocab_size)
        changes[family.positions_field] = 64
        save(reference(name, **changes), directory)
        out[name] = str(directory)
    return out
