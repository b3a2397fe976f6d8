"""Per model family: our classes, the transformers classes they are checked against, and default inputs."""

import dataclasses
import json
from pathlib import Path

import torch

from scratch_models import (BertForMaskedLM, BertForMultipleChoice, BertForNextSentencePrediction, BertForPreTraining,
                            BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                            BertModel, GPT2DoubleHeadsModel, GPT2ForQuestionAnswering, GPT2ForSequenceClassification,
                            GPT2ForTokenClassification, GPT2LMHeadModel, GPT2Model)
from scratch_models.analysis.heads import token_groups
from weight_mapping import BERT, GPT2, CheckpointError, MappingTable


@dataclasses.dataclass(frozen=True)
class Family:
    table: MappingTable
    base: type  # our base model
    # our classes with a task head, each compared with transformers' class of the same name; the first is the
    # head of the family's pretrained checkpoints (BertForMaskedLM, GPT2LMHeadModel)
    heads: tuple[type, ...]
    default_texts: tuple[str, ...]
    default_pairs: tuple[str, ...]
    input_names: tuple[str, ...]  # forward arguments both models take
    positions_field: str  # the config field that bounds a sequence's length
    causal: bool  # a query sees the keys up to itself only

    def sighted(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """[b, s] True where the query may see at least one key (GPT-2: a real token at or before it; BERT: any
        real token in its sequence)."""
        real = attention_mask.bool()
        return real.cumsum(-1) > 0 if self.causal else real.any(-1, keepdim=True).expand_as(real)

    def missing_head_tensors(self, checkpoint, config, head: type) -> list[str]:
        """Checkpoint names of `head`'s own tensors (not tied ones) that the checkpoint lacks; all of them when
        the config cannot build that head (BertForQuestionAnswering with other than 2 labels, say)."""
        num_layers = getattr(config, self.table.layers_field)
        with torch.device("meta"):
            base_names = set(self.base(config).state_dict())
            try:
                head_names = set(head(config).state_dict())
            except ValueError:  # ConfigError too
                return [f"({head.__name__} cannot be built from {checkpoint.config_path})"]
        present = {self.table.normalize(k) for k in checkpoint.keys()}
        present |= {self.table.aliases[k] for k in present if k in self.table.aliases}
        return [key for key, ours in self.table.tensor_names(num_layers).items()
                if ours in head_names - base_names and key not in present]

    def head_of(self, checkpoint, *, sequences_only: bool = False) -> type | None:
        """Our class with the checkpoint's head: the class config.json's `architectures` names, if the file holds
        its tensors; else the first of `heads` whose tensors it holds all of; None for a base-model checkpoint.
        `sequences_only`: no class whose inputs are [batch, choices, seq] (multiple choice)."""
        config = self.base.config_class.from_json_file(checkpoint.config_path)
        named = _architectures(checkpoint.config_path)
        candidates = [head for head in self.heads if not (sequences_only and head.__name__ in MULTIPLE_CHOICE)]
        for head in sorted(candidates, key=lambda head: head.__name__ not in named):
            if not self.missing_head_tensors(checkpoint, config, head):
                return head
        return None

    def widest_model(self, checkpoint, *, sequences_only: bool = False) -> type:
        """Our class with the checkpoint's task head when it has one (see head_of), else the base class."""
        return self.head_of(checkpoint, sequences_only=sequences_only) or self.base

    def check_pairs(self, pairs) -> None:
        """Sentence pairs need token types, which only some families have."""
        if pairs and "token_type_ids" not in self.input_names:
            raise ValueError(f"--pair: {self.table.family} has no sentence pairs (no token types)")

    def encode(self, checkpoint, config, texts, pairs) -> tuple[dict, list[str]]:
        """Tokenized texts (or the family's default ones) as model inputs, and lines that say what they are.
        Without a tokenizer beside the checkpoint: random token ids, unless texts were given (an error then)."""
        tokenizer = load_tokenizer(checkpoint)
        if tokenizer is None:
            if texts or pairs:
                raise CheckpointError(f"--text: {checkpoint.source} has no tokenizer ({no_tokenizer(checkpoint)}), so "
                                      "its texts cannot become token ids; leave --text out to compare on random ids")
            inputs = random_inputs(config, self.input_names)
            return inputs, [f"{len(inputs['input_ids'])} rows of random token ids, the second padded "
                            f"(no tokenizer: {no_tokenizer(checkpoint)})"]
        if not texts:
            if pairs:
                raise ValueError("--pair needs --text: each pair is the second segment of one text")
            texts, pairs = self.default_texts, self.default_pairs
        self.check_pairs(pairs)
        texts, pairs = list(texts), list(pairs) if pairs else None
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"--pair given {plural(len(pairs), 'time')} for {len(texts)} --text: give one pair per "
                             "text")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        batch = tokenizer(texts, pairs, padding=True, return_tensors="pt")
        lengths = batch["attention_mask"].sum(-1).tolist()
        said = [quoted(text) + (f" + {quoted(pair)}" if pairs else "") for text, pair in zip(texts, pairs or texts)]
        for line, length in zip(said, lengths):
            self.check_length(config, length, f"--text {line}")
        inputs = {name: batch[name] for name in self.input_names if name in batch}
        padded = ", padded" if len(set(lengths)) > 1 else ""
        what = plural(len(texts), "sentence pair") if pairs else plural(len(texts), "text")
        return inputs, [f"{what}{padded}:"] + [f"  {i}. {line} ({length} tokens)"
                                               for i, (line, length) in enumerate(zip(said, lengths), 1)]

    def key_groups(self, tokenizer, tokens: list[list[str]], attention_mask: torch.Tensor) -> dict:
        """The keys Clark et al.'s shares are taken over, in a batch's rows of tokens: each special token that
        occurs (padding aside), punctuation, and in a causal model each row's first real token."""
        special = [t for t in tokenizer.all_special_tokens if t != tokenizer.pad_token]
        return token_groups(tokens, special, attention_mask, first_token=self.causal)

    def check_length(self, config, length: int, what: str) -> None:
        """A ValueError naming `what` when `length` tokens do not fit the model's position table."""
        limit = getattr(config, self.positions_field)
        if length > limit:
            raise ValueError(f"{what} is {length} tokens long; this model reads at most {limit} "
                             f"(config.json {self.positions_field}={limit}): shorten it")


def require_device(device: str) -> None:
    """--device cuda where there is no CUDA device: a ValueError naming the flag."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")


def at_least_one(flag: str, value: int | None) -> None:
    """A ValueError naming `flag` when its value (None: not given) is below 1."""
    if value is not None and value < 1:
        raise ValueError(f"{flag} must be at least 1, got {value}")


def written_files(staging: Path, out) -> list[Path]:
    """The files a `staged(out)` block wrote into `staging`, as they are named once moved into `out`."""
    return [Path(out).expanduser() / name for name in sorted(f.name for f in staging.iterdir())]


def quoted(text: str, limit: int = 80) -> str:
    """repr(text), its middle cut out past `limit` characters: a message names a long text without repeating it."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit // 2]) + f" ... ({len(text)} characters) ... " + repr(text[-limit // 4:])


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# a tokenizer needs one of these (the others beside it only configure it)
TOKENIZER_VOCABULARIES = ("tokenizer.json", "vocab.txt", "vocab.json")


def load_tokenizer(checkpoint):
    """The tokenizer beside the checkpoint (a hub id's files are fetched beside its weights); None when there is
    none."""
    from transformers import AutoTokenizer

    if not any(file.name in TOKENIZER_VOCABULARIES for file in checkpoint.tokenizer_files):
        return None
    return AutoTokenizer.from_pretrained(checkpoint.directory)


def no_tokenizer(checkpoint) -> str:
    """Why a checkpoint has no tokenizer, in words."""
    return f"none of {', '.join(TOKENIZER_VOCABULARIES)} in {checkpoint.directory}"


def require_tokenizer(checkpoint):
    """`load_tokenizer` for a command that cannot work without one: a CheckpointError when there is none."""
    tokenizer = load_tokenizer(checkpoint)
    if tokenizer is None:
        raise CheckpointError(f"{checkpoint.source}: no tokenizer ({no_tokenizer(checkpoint)})")
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


# classes whose inputs are [batch, choices, seq]: one sequence per (example, choice)
MULTIPLE_CHOICE = {"BertForMultipleChoice", "GPT2DoubleHeadsModel"}


def _architectures(config_path) -> list[str]:
    """config.json's `architectures`: the class names transformers saved it from (none when absent)."""
    names = json.loads(config_path.read_text(encoding="utf-8")).get("architectures")
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


FAMILIES = {
    "bert": Family(
        table=BERT, base=BertModel,
        heads=(BertForMaskedLM, BertForPreTraining, BertForNextSentencePrediction, BertForSequenceClassification,
               BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice),
        default_texts=("The cat sat on the warm mat.", "Time flies like an arrow."),
        default_pairs=("It purred.", "Fruit flies like a banana, and a banana is ripe in June."),
        input_names=("input_ids", "attention_mask", "token_type_ids"),
        positions_field="max_position_embeddings",
        causal=False,
    ),
    "gpt2": Family(
        table=GPT2, base=GPT2Model,
        heads=(GPT2LMHeadModel, GPT2ForSequenceClassification, GPT2ForTokenClassification, GPT2ForQuestionAnswering,
               GPT2DoubleHeadsModel),
        default_texts=("The meaning of life is", "Once upon a time, in a small village by the sea, there lived"),
        default_pairs=(),
        input_names=("input_ids", "attention_mask"),
        positions_field="n_positions",
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
