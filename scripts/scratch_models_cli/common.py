"""What the commands share: a family's inputs from texts (with transformers' tokenizers), flag checks, wording."""

import contextlib
import warnings
from pathlib import Path

import torch

from scratch_models.analysis.heads import token_groups
from scratch_models.families import family_of_config
from weight_mapping import CheckpointError


@contextlib.contextmanager
def quiet_transformers():
    """transformers, imported and used without its progress bars and load reports, which would bury what the caller
    shows (a command's report, a notebook's cells); its errors still show. The bars and the verbosity are the
    process's: set back on the way out. Also a decorator."""
    with warnings.catch_warnings():
        # tqdm.auto, which transformers imports, warns in a notebook without ipywidgets that it draws text bars
        warnings.filterwarnings("ignore", message="IProgress not found")
        import transformers
    logging = transformers.utils.logging
    bars, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield transformers
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def encode(family, checkpoint, config, texts, pairs) -> tuple[dict, list[str]]:
    """Tokenized texts (or `family`'s default ones) as model inputs, and lines that say what they are.
    Without a tokenizer beside the checkpoint: random token ids, unless texts were given (an error then)."""
    tokenizer = load_tokenizer(checkpoint)
    if tokenizer is None:
        if texts or pairs:
            raise CheckpointError(f"--text: {checkpoint.source} has no tokenizer ({no_tokenizer(checkpoint)}), so "
                                  "its texts cannot become token ids; leave --text out to compare on random ids")
        inputs = random_inputs(config, family.input_names)
        return inputs, [f"{len(inputs['input_ids'])} rows of random token ids, the second padded "
                        f"(no tokenizer: {no_tokenizer(checkpoint)})"]
    if not texts:
        if pairs:
            raise ValueError("--pair needs --text: each pair is the second segment of one text")
        texts, pairs = family.default_texts, family.default_pairs
    family.check_pairs(pairs)
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
        family.check_length(config, length, f"--text {line}")
    inputs = {name: batch[name] for name in family.input_names if name in batch}
    padded = ", padded" if len(set(lengths)) > 1 else ""
    what = plural(len(texts), "sentence pair") if pairs else plural(len(texts), "text")
    return inputs, [f"{what}{padded}:"] + [f"  {i}. {line} ({length} tokens)"
                                           for i, (line, length) in enumerate(zip(said, lengths), 1)]

def key_groups(family, tokenizer, tokens: list[list[str]], attention_mask: torch.Tensor) -> dict:
    """The keys Clark et al.'s shares are taken over, in a batch's rows of tokens: each special token that
    occurs (padding aside), punctuation, and in a causal model each row's first real token."""
    special = [t for t in tokenizer.all_special_tokens if t != tokenizer.pad_token]
    return token_groups(tokens, special, attention_mask, first_token=family.causal)


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


def family_of(checkpoint):
    """The family of a checkpoint (scratch_models.families), from its config.json."""
    return family_of_config(checkpoint.config_path)
