"""Per model family: our classes, the transformers classes they are checked against, and default inputs."""

import dataclasses
import json
from pathlib import Path

import torch

from scratch_models import BertForMaskedLM, BertModel, GPT2LMHeadModel, GPT2Model
from weight_mapping import BERT, GPT2, CheckpointError, MappingTable, open_checkpoint


@dataclasses.dataclass(frozen=True)
class Family:
    table: MappingTable
    base: type  # our base model
    head: type  # our model with the task head the checkpoints of this family carry
    hf_base: str  # the transformers class names they are compared with
    hf_head: str
    default_texts: tuple[str, ...]
    default_pairs: tuple[str, ...]
    input_names: tuple[str, ...]  # forward arguments both models take
    causal: bool  # a query sees the keys up to itself only

    def sighted(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """[b, s] True where the query may see at least one key (GPT-2: a real token at or before it; BERT: any
        real token in its sequence)."""
        real = attention_mask.bool()
        return real.cumsum(-1) > 0 if self.causal else real.any(-1, keepdim=True).expand_as(real)

    def missing_head_tensors(self, checkpoint, config) -> list[str]:
        """Checkpoint names of the head's own tensors (not tied ones) that the checkpoint lacks."""
        num_layers = getattr(config, self.table.layers_field)
        with torch.device("meta"):
            base_names = set(self.base(config).state_dict())
            head_names = set(self.head(config).state_dict())
        present = {self.table.normalize(k) for k in checkpoint.keys()}
        present |= {self.table.aliases[k] for k in present if k in self.table.aliases}
        return [key for key, ours in self.table.tensor_names(num_layers).items()
                if ours in head_names - base_names and key not in present]

    def widest_model(self, checkpoint) -> type:
        """Our class with the task head when the checkpoint carries the head's tensors, else the base class."""
        config = self.base.config_class.from_json_file(checkpoint.config_path)
        return self.base if self.missing_head_tensors(checkpoint, config) else self.head

    def check_pairs(self, pairs) -> None:
        """Sentence pairs need token types, which only some families have."""
        if pairs and "token_type_ids" not in self.input_names:
            raise ValueError(f"--pair: {self.table.family} has no sentence pairs (no token types)")

    def encode(self, checkpoint, config, texts, pairs) -> tuple[dict, str]:
        """Tokenized texts (or default ones) as model inputs, or random ids when no tokenizer is at hand."""
        tokenizer = load_tokenizer(checkpoint)
        if tokenizer is None:
            return random_inputs(config, self.input_names), "random token ids: no tokenizer beside the checkpoint"
        if not texts:
            if pairs:
                raise ValueError("--pair needs --text: each pair is the second segment of one text")
            texts, pairs = self.default_texts, self.default_pairs
        self.check_pairs(pairs)
        texts, pairs = list(texts), list(pairs) if pairs else None
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"--pair given {len(pairs)} times for {len(texts)} --text: give one pair per text")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        batch = tokenizer(texts, pairs, padding=True, return_tensors="pt")
        inputs = {name: batch[name] for name in self.input_names if name in batch}
        what = f"{len(texts)} {'sentence pairs' if pairs else 'texts'}"
        return inputs, f"{what}, padded"


def load_tokenizer(checkpoint):
    """The tokenizer beside the checkpoint or, for a hub id, the hub repository's (through the normal cache);
    None when there is none to be had."""
    from transformers import AutoTokenizer

    directory = checkpoint.directory
    if any((directory / name).is_file() for name in ("tokenizer.json", "vocab.txt", "vocab.json")):
        return AutoTokenizer.from_pretrained(directory)
    if Path(checkpoint.source).exists():
        return None
    try:
        return AutoTokenizer.from_pretrained(checkpoint.source)
    except OSError:  # offline and not cached, or the repository has no tokenizer
        return None


def require_tokenizer(model: str):
    """`load_tokenizer` for a command that cannot work without one: a CheckpointError when there is none."""
    tokenizer = load_tokenizer(open_checkpoint(model))
    if tokenizer is None:
        raise CheckpointError(f"{model}: no tokenizer (tokenizer.json, vocab.txt or vocab.json) beside the "
                              "checkpoint, and none cached for a hub id")
    return tokenizer


def random_inputs(config, input_names) -> dict:
    """Two sequences of fixed random ids, the second one padded, so padding is always exercised."""
    generator = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    seq = min(12, getattr(config, "max_position_embeddings", 12))
    input_ids = torch.randint(vocab, (2, seq), generator=generator)
    attention_mask = torch.ones(2, seq, dtype=torch.long)
    attention_mask[1, seq - seq // 3:] = 0
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "token_type_ids" in input_names:
        types = torch.zeros(2, seq, dtype=torch.long)
        types[:, seq // 2:] = 1 if getattr(config, "type_vocab_size", 1) > 1 else 0
        inputs["token_type_ids"] = types
    return inputs


FAMILIES = {
    "bert": Family(
        table=BERT, base=BertModel, head=BertForMaskedLM, hf_base="BertModel", hf_head="BertForMaskedLM",
        default_texts=("The cat sat on the warm mat.", "Time flies like an arrow."),
        default_pairs=("It purred.", "Fruit flies like a banana, and a banana is ripe in June."),
        input_names=("input_ids", "attention_mask", "token_type_ids"),
        causal=False,
    ),
    "gpt2": Family(
        table=GPT2, base=GPT2Model, head=GPT2LMHeadModel, hf_base="GPT2Model", hf_head="GPT2LMHeadModel",
        default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
        default_pairs=(),
        input_names=("input_ids", "attention_mask"),
        causal=True,
    ),
}


def family_of(checkpoint) -> Family:
    try:
        model_type = json.loads(checkpoint.config_path.read_text(encoding="utf-8")).get("model_type")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise CheckpointError(f"{checkpoint.config_path}: cannot read model_type ({e})") from None
    if model_type not in FAMILIES:
        raise CheckpointError(f"{checkpoint.config_path}: model_type {model_type!r} is not supported; "
                              f"supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]
