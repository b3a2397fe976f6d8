"""What the commands share: a checkpoint opened once (`Opened`), its tokenizer, texts as a family's inputs, flag
checks, wording.

Every command names the model as the user gave it (`Opened.source`, `minilm` when left out), in what it prints,
in the files it writes and in its errors.
"""

import contextlib
import dataclasses
import functools
import re
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from scratch_models.analysis.heads import token_groups
from scratch_models.registry.families import FAMILIES, family_of, offline_advice
from scratch_models.registry.family import Family
from scratch_models.registry.tokenizer import SPECIAL_ROLES, Tokenizer
from weight_mapping import EMBEDDED_NAME, Checkpoint, CheckpointError, NotCached, open_checkpoint

# a tokenizer needs one of these (the others beside it only configure it)
TOKENIZER_VOCABULARIES = ("tokenizer.json", "vocab.txt", "vocab.json")


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


@dataclasses.dataclass
class Opened:
    """A checkpoint as one command reads it: its files opened once and its config.json parsed once; every model
    the command builds and its tokenizer come from here."""

    source: str  # as the user gave it: how every message names the model
    checkpoint: Checkpoint
    family: Family
    config: object  # the family's config, from config.json

    def load(self, cls: type, **kwargs):
        """`cls.from_pretrained` on this checkpoint (`dtype`, `device`, ...)."""
        return cls.from_pretrained(self.checkpoint, config=self.config, **kwargs)

    def head(self, *, sequences_only: bool = False) -> type | None:
        """Our class with the checkpoint's task head, None for a base-model checkpoint (Family.head_of)."""
        return self.family.head_of(self.checkpoint, self.config, sequences_only=sequences_only)

    def widest_model(self, *, sequences_only: bool = False) -> type:
        return self.head(sequences_only=sequences_only) or self.family.base

    def missing_head_tensors(self, head: type) -> list[str]:
        return self.family.missing_head_tensors(self.checkpoint, self.config, head)

    @functools.cached_property
    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's tokenizer (scratch_models.Tokenizer), None when none of TOKENIZER_VOCABULARIES is
        beside it. tokenizer.json is read as the models read it; a checkpoint with only vocab files
        (vocab.txt, or vocab.json + merges.txt) gets the same Tokenizer around the pipeline transformers'
        converters build from them."""
        names = {file.name for file in self.checkpoint.tokenizer_files}
        if "tokenizer.json" in names:
            return Tokenizer.from_pretrained(self.checkpoint, token_type_ids=self.family.pairs)
        if not names & set(TOKENIZER_VOCABULARIES):
            return None
        from transformers import AutoTokenizer

        converted = AutoTokenizer.from_pretrained(self.checkpoint.directory)
        special = {role: getattr(converted, f"{role}_token_id") for role in SPECIAL_ROLES
                   if getattr(converted, f"{role}_token_id", None) is not None}
        return Tokenizer.from_backend(converted.backend_tokenizer, special, token_type_ids=self.family.pairs,
                                      source=self.source)

    def require_tokenizer(self) -> Tokenizer:
        """`tokenizer` for a command that cannot work without one: a CheckpointError when there is none."""
        if self.tokenizer is None:
            raise CheckpointError(f"{self.source}: no tokenizer ({self.no_tokenizer()})")
        return self.tokenizer

    def no_tokenizer(self) -> str:
        """Why the checkpoint has no tokenizer, in words."""
        return f"none of {', '.join(TOKENIZER_VOCABULARIES)} in {self.checkpoint.directory}"

    def mask_token(self) -> tuple[int, str]:
        """(id, text) of the tokenizer's mask token; a ValueError when it names none."""
        tokenizer = self.require_tokenizer()
        if "mask" not in tokenizer.special_ids:
            raise ValueError(f"{self.source}: its tokenizer names no mask token")
        return tokenizer.special_ids["mask"], tokenizer.special_tokens["mask"]


# the config.json field that marks a small random stand-in written by `scratch-models tiny` (its value says so)
STAND_IN = "scratch_models_stand_in"


def open_model(source) -> Opened:
    """Open `source` (default: the embedded minilm) once: its files, its family and its config. An `Opened` is
    returned as it is."""
    if isinstance(source, Opened):
        return source
    source = str(source or EMBEDDED_NAME)
    try:
        checkpoint = open_checkpoint(source)
    except NotCached as e:  # no config.json to say the family: the hub id may
        raise e.advised(offline_advice(family_named_by(e.repo_id))) from None
    family = family_of(checkpoint)
    return Opened(source, checkpoint, family, family.config_of(checkpoint))


def say_if_stand_in(opened: Opened) -> None:
    """On stderr, before a command prints what the model predicts: that a stand-in `scratch-models tiny` wrote has
    random weights ('Once upon a time time time' is then no fault of the code)."""
    note = opened.checkpoint.config_json.get(STAND_IN)
    if note:
        print(f"{opened.source}: {note}; what it outputs means nothing", file=sys.stderr)


def family_named_by(repo_id: str) -> Family | None:
    """The family a hub id reads as, without its config.json: the one whose pretrained checkpoint (lm_checkpoint)
    shares the most leading words of its name (`EleutherAI/pythia-1b` as `EleutherAI/pythia-70m`, `gemma-2-9b` as
    `gemma-2-2b` rather than `gemma-3-1b-pt`), a family whose name is a word of it counting half a word more
    (`gpt_neox` in `org/gpt_neox-tiny`, `gemma` in `gemma-7b`); of several, the one whose pretrained checkpoint it
    is; None when no family or several do equally."""
    def name(hub_id: str) -> str:
        return hub_id.rpartition("/")[2].lower()

    def score(family: Family) -> float:
        ours, theirs = re.split(r"[-_.]", name(repo_id)), re.split(r"[-_.]", name(family.lm_checkpoint))
        shared = next((n for n, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        named = re.search(rf"(^|[-_.]){re.escape(family.name)}($|[-_.])", name(repo_id)) is not None
        return shared + 0.5 * named

    scores = {family.name: score(family) for family in FAMILIES.values()}
    best = max(scores.values())
    named = [family for family in FAMILIES.values() if best and scores[family.name] == best]
    # a family's own checkpoint decides between families of one name (Qwen/Qwen3-30B-A3B, Qwen3-MoE's, and Qwen3)
    own = [family for family in named if family.lm_checkpoint.lower() == repo_id.lower()]
    return own[0] if len(own) == 1 else named[0] if len(named) == 1 else None


def encode(opened: Opened, texts: str | list[str], pairs: str | list[str] | None = None, *, names: list[str],
           device="cpu", context: bool = False) -> tuple[dict, list[list[str]]]:
    """Texts (with `pairs`: sentence pairs) as the family's forward inputs, padded on the right, on `device`, and
    each row's tokens as text. One text is a str, its pair a str or None (an empty pair is none, as transformers
    reads one text); a batch is a list. `names[i]` is how a message names text i: one that gives no tokens, or
    more than the model has positions for, is a ValueError naming it. Sentence pairs need a family with token
    types; `context`: the pairs are a question's context, a second segment every family reads."""
    if not context:
        opened.family.check_pairs([pairs] if isinstance(pairs, str) else pairs)
    tokenizer = opened.require_tokenizer()
    batch = tokenizer(texts, pairs, device=device)
    for name, length in zip(names, batch["attention_mask"].sum(-1).tolist()):
        if length == 0:
            raise ValueError(f"{name} gives no tokens: give a text that does")
        opened.family.check_length(opened.config, length, name)
    inputs = {name: batch[name] for name in opened.family.input_names if name in batch}
    return inputs, [tokenizer.str_tokens(row) for row in batch["input_ids"]]


def key_groups(opened: Opened, tokens: list[list[str]], attention_mask: torch.Tensor) -> dict:
    """The keys Clark et al.'s shares are taken over, in a batch's rows of tokens: each special token that
    occurs (padding aside), punctuation, and in a causal model each row's first real token."""
    real = attention_mask.bool().tolist()
    unpadded = [[token if keep else "" for token, keep in zip(row, mask)] for row, mask in zip(tokens, real)]
    return token_groups(unpadded, opened.require_tokenizer().all_special_tokens, attention_mask,
                        first_token=opened.family.causal)


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


def missing_head(opened: Opened, head: type, missing: list[str], command: str) -> str:
    """One line for a command that needs `head` on a checkpoint without it: what is absent, a checkpoint that has
    it, and what does work on this one."""
    family, source = opened.family, opened.source
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    elsewhere = f", such as {family.lm_checkpoint} (fetched from the hub once)" if head is family.lm else ""
    works = ["inspect", "verify"] + (["heads", "patch"] if family.base.__name__ in family.targets else [])
    return (f"{source}: {command} reads {head.__name__}'s head, and this checkpoint has none ({missing[0]}{more} "
            f"absent); give a checkpoint saved with it{elsewhere}. On {source} itself, "
            f"{', '.join(works[:-1])} and {works[-1]} work")


def require_device(device: str) -> None:
    """--device cuda where there is no CUDA device: a ValueError naming the flag."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")


def at_least_one(flag: str, value: int | None) -> None:
    """A ValueError naming `flag` when its value (None: not given) is below 1."""
    if value is not None and value < 1:
        raise ValueError(f"{flag} must be at least 1, got {value}")


def check_writable_directory(flag: str, directory) -> None:
    """Before the work: an OSError naming `flag` when `directory` (which may not exist yet) could not be written,
    so a long run does not end in a write error."""
    path = Path(directory).expanduser()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {directory}: exists and is not a directory")
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"{flag} {directory}: {existing} is a file, not a directory")
    _probe(flag, directory, existing)


def check_writable_file(flag: str, file) -> None:
    """Before the work: an OSError naming `flag` when `file` could not be written (its directory missing or
    read-only, or the path a directory). An existing file is left as it is."""
    path = Path(file).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {file}: is a directory")
    if not path.parent.is_dir():
        problem = "is not a directory" if path.parent.exists() else "does not exist"
        raise FileNotFoundError(f"{flag} {file}: {path.parent} {problem}")
    _probe(flag, file, path.parent)
    if path.exists():
        try:
            open(path, "a").close()  # appends nothing: the file stays as it is until the report is written
        except OSError as e:
            raise PermissionError(f"{flag} {file}: cannot be written ({e.strerror})") from None


def _probe(flag: str, given, directory: Path) -> None:
    """Create and remove a file in `directory`: the one test of writability that holds for every user and mount."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise PermissionError(f"{flag} {given}: cannot write into {directory} ({e.strerror})") from None


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
