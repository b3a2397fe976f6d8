"""A checkpoint's own tokenizer, read from its `tokenizer.json` with the `tokenizers` library (no transformers).

    tok = Tokenizer.from_pretrained(path)            # or model.tokenizer, for a model from from_pretrained
    batch = tok(["Time flies.", "Fruit flies like a banana."], ["It does."] * 2)
    batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]   # token types for BERT only

tokenizer.json holds the whole pipeline (normaliser, pre-tokeniser, vocabulary, merges, the template that adds
[CLS] / [SEP] and token types), and transformers' fast tokenizers run that same file, so the ids, special tokens and
token types are transformers' (tested on all-MiniLM-L6-v2 and on a GPT-2 byte-level BPE). The file's own truncation
and padding settings are switched off, as transformers' tokenizer call leaves them off unless asked
(all-MiniLM-L6-v2's file would cut every text at 128 tokens and pad it to 128).

`prepend_bos` has TransformerLens' meaning: None (the default) leaves the template's tokens as they are (transformers'
GPT-2 tokenizer adds no BOS, BERT's adds [CLS]); True makes each sequence start with the BOS token, adding it unless the
template already puts a BOS (or [CLS]) first (`prepends_bos`); False makes none start with it, dropping the one the
template puts first. It also answers what TransformerLens code asks of a transformers tokenizer: `bos_token_id`,
`pad_token_id`, `mask_token_id` ..., `padding_side`, `batch_decode`, `tokenize`, `get_vocab`, `name_or_path`,
`vocab_size` (transformers': the vocabulary without its added tokens; `len(tokenizer)` counts them), and
`__call__(..., return_tensors="pt", padding=True)`.

The tokenizer of a model loaded with `transformer_lens=True` is the one TransformerLens' TransformerBridge sets up
(`use_transformer_lens`): it loads the checkpoint's tokenizer with transformers' `add_bos_token=True`, so a
tokenizer that names a BOS token starts every text with it (GPT-2's, Pythia's; Qwen's names none, BERT's [CLS] is
there already), in `encode` and calls alike (`prepends_bos` then says so, as TL's cfg.tokenizer_prepends_bos); the
EOS token stands in for a missing pad or BOS token; and a call returns transformers' lists, unpadded, unless
`return_tensors="pt"` / `padding=True` (one text: a flat list of ids). Without it (our dialect) a call returns
tensors [b, s], padded, and the template is left as it is.

A checkpoint with only vocab.txt / vocab.json + merges.txt is refused with a NoTokenizerJson (a ValueError) that
says how to write tokenizer.json; `Tokenizer.from_backend` takes a pipeline built elsewhere (the command line builds
one from such files with transformers' converters).
"""

import json
import re
import threading
from pathlib import Path

import torch

from weight_mapping import TOKENIZER_FILES, Checkpoint, open_checkpoint

SPECIAL_ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
_TRUNCATING = threading.Lock()  # held while a call truncates with a tokenizer's truncating copy
VOCAB_FILES = ("vocab.txt", "vocab.json", "merges.txt")


class _DialectDefault:
    """A call's default that differs by dialect: ours, or transformers' for TransformerLens' tokenizer (whose calls
    return lists, unpadded, as a transformers tokenizer's do)."""

    def __init__(self, ours, transformers_):
        self.ours, self.transformers = ours, transformers_

    def __repr__(self) -> str:
        return f"{self.ours!r} (TransformerLens' tokenizer: {self.transformers!r})"

    def of(self, tokenizer: "Tokenizer"):
        return self.transformers if tokenizer.transformer_lens else self.ours


TENSORS, PADDING = _DialectDefault("pt", None), _DialectDefault(True, False)


class NoTokenizerJson(ValueError):
    """The checkpoint has no tokenizer.json (perhaps only vocab files, which transformers' tokenizers read)."""


class Tokenizer:
    """The tokenizer of the checkpoint at `name_or_path` (a directory, a weights file in one, `minilm`, a hub id, or
    a weight_mapping.Checkpoint already open, whose config.json is then not read again).

    Its files are read on first use, so a model carries one at no cost (`model.tokenizer`); `from_pretrained` reads
    them at once. `token_type_ids`: return token types (BERT's segments) from `__call__`; None: when the checkpoint's
    config.json sizes a table of them (`type_vocab_size`, as BERT's does). `backend` is the tokenizers.Tokenizer,
    and `special_ids` maps each role the checkpoint names (bos, eos, unk, sep, pad, cls, mask) to its id."""

    def __init__(self, name_or_path, *, token_type_ids: bool | None = None):
        self._token_type_ids = token_type_ids
        self._loaded = None  # (backend, special_ids, token_type_ids, padding_side, names_bos) once read
        self.transformer_lens = False  # TransformerLens' tokenizer (use_transformer_lens)
        self._padding_side = None  # set, or else tokenizer_config.json's (transformers' default "right")
        if isinstance(name_or_path, Checkpoint):
            # the directory and config.json's contents only: the open weight files stay with the checkpoint
            self.source, self._opened = name_or_path.source, (name_or_path.directory, name_or_path.config_json)
        else:
            self.source, self._opened = name_or_path, None

    @classmethod
    def from_pretrained(cls, name_or_path, *, token_type_ids: bool | None = None) -> "Tokenizer":
        """Read tokenizer.json (and tokenizer_config.json, special_tokens_map.json and config.json where present,
        for the names of the special tokens) now; a hub id's through weight_mapping.open_checkpoint, with the
        weights (HF_HUB_OFFLINE is honoured)."""
        tokenizer = cls(name_or_path, token_type_ids=token_type_ids)
        tokenizer._load()
        return tokenizer

    @classmethod
    def from_backend(cls, backend, special_ids: dict[str, int], *, token_type_ids: bool, source) -> "Tokenizer":
        """A tokenizer around a tokenizers.Tokenizer built elsewhere, with its special tokens' ids by role (see
        SPECIAL_ROLES); `source` names it in messages. Its truncation and padding are switched off, as in a file."""
        unknown = sorted(set(special_ids) - set(SPECIAL_ROLES))
        if unknown:
            raise ValueError(f"special_ids: unknown role(s) {', '.join(unknown)}; the roles are "
                             f"{', '.join(SPECIAL_ROLES)}")
        size = backend.get_vocab_size(with_added_tokens=True)
        for role, i in special_ids.items():
            if not 0 <= i < size:
                raise ValueError(f"{source}: the {role} token's id {i} is outside the vocabulary 0..{size - 1}")
        backend.no_truncation()
        backend.no_padding()
        tokenizer = cls(source, token_type_ids=token_type_ids)
        tokenizer._loaded = (backend, dict(special_ids), token_type_ids, "right", "bos" in special_ids)
        return tokenizer

    @property
    def backend(self):
        return self._load()[0]

    @property
    def special_ids(self) -> dict[str, int]:
        return self._load()[1]

    @property
    def token_type_ids(self) -> bool:
        return self._load()[2]

    def _load(self):
        """(backend, special_ids, token_type_ids, padding_side, names_bos), read once."""
        if self._loaded is None:  # two threads may both read the files; either result is the same
            directory, config_json = self._opened or (_directory(self.source), None)
            self._loaded = _read(directory, self._token_type_ids, config_json, self.source)
        return self._loaded

    @property
    def special_tokens(self) -> dict[str, str]:
        """role -> the special token's text, for each role in `special_ids` ({"mask": "[MASK]", ...})."""
        return {role: self.backend.id_to_token(i) for role, i in self.special_ids.items()}

    @property
    def all_special_tokens(self) -> list[str]:
        """Every special token's text: those of the named roles and the vocabulary's other special tokens, as
        transformers' all_special_tokens."""
        added = [token.content for token in self.backend.get_added_tokens_decoder().values() if token.special]
        return list(dict.fromkeys([*self.special_tokens.values(), *added]))

    @property
    def vocab_size(self) -> int:
        """The vocabulary without its added tokens, as transformers' `vocab_size` counts it (Pythia's 50254 + the
        added <|padding|> ... : `len(tokenizer)` counts every id)."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """Every id the tokenizer can produce, added tokens included (counted once: the tokenizers library counts
        them one by one, 36 ms for GPT-2's vocabulary padded with 48k added tokens, and every decode checks ids
        against it)."""
        if self.__dict__.get("_size") is None:
            self._size = self.backend.get_vocab_size(with_added_tokens=True)
        return self._size

    @property
    def name_or_path(self) -> str:
        """Where the tokenizer was read from (transformers' name_or_path)."""
        return str(self.source)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included (transformers' get_vocab)."""
        return self.backend.get_vocab(with_added_tokens=True)

    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False) -> list[str]:
        """The vocabulary entries of `text` ("Ġupon", "##ing"), no special tokens unless asked (transformers'
        tokenize)."""
        return self.backend.encode(text, _one_pair(pair), add_special_tokens=add_special_tokens).tokens

    def use_transformer_lens(self) -> None:
        """Be the tokenizer TransformerLens' bridge sets up (see the module's doc): transformers' add_bos_token=True
        where the tokenizer names a BOS token, the EOS token for a missing pad or BOS token, lists from a call."""
        self.transformer_lens = True

    @property
    def _adds_bos(self) -> bool:
        """TransformerLens' add_bos_token=True adds a BOS the template does not put first: where the tokenizer's
        own files name one (TL's bridge asks transformers for add_bos_token=True only then)."""
        return self.transformer_lens and self._load()[4] and not self._template_bos

    # transformers' names for the special tokens (None where the checkpoint names none; TransformerLens' tokenizer
    # has the EOS token stand in for a missing pad or BOS token, as TL's bridge sets it up): what TL code asks
    bos_token_id = property(lambda self: self._role_id("bos"))
    eos_token_id = property(lambda self: self.special_ids.get("eos"))
    pad_token_id = property(lambda self: self._role_id("pad"))
    unk_token_id = property(lambda self: self.special_ids.get("unk"))
    sep_token_id = property(lambda self: self.special_ids.get("sep"))
    cls_token_id = property(lambda self: self.special_ids.get("cls"))
    mask_token_id = property(lambda self: self.special_ids.get("mask"))
    bos_token = property(lambda self: self._role_token("bos"))
    eos_token = property(lambda self: self.special_tokens.get("eos"))
    pad_token = property(lambda self: self._role_token("pad"))
    unk_token = property(lambda self: self.special_tokens.get("unk"))
    sep_token = property(lambda self: self.special_tokens.get("sep"))
    cls_token = property(lambda self: self.special_tokens.get("cls"))
    mask_token = property(lambda self: self.special_tokens.get("mask"))

    def _role_id(self, role: str) -> int | None:
        own = self.special_ids.get(role)
        return self.special_ids.get("eos") if own is None and self.transformer_lens else own

    def _role_token(self, role: str) -> str | None:
        i = self._role_id(role)
        return None if i is None else self.backend.id_to_token(i)

    @property
    def padding_side(self) -> str:
        """Where `__call__` pads when not told: tokenizer_config.json's padding_side (transformers' default
        "right"), or what was assigned, as on a transformers tokenizer."""
        return self._padding_side or self._load()[3]

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        self._padding_side = _side(side)

    @property
    def prepends_bos(self) -> bool:
        """Whether a text's ids start with a BOS token (or BERT's [CLS]) unless told otherwise, as TransformerLens
        detects it (cfg.tokenizer_prepends_bos): the first id of a one-letter text, when there is more than one, is
        the bos or cls token. TransformerLens' tokenizer (use_transformer_lens) may add the BOS itself."""
        return self._template_bos or self._adds_bos

    @property
    def _template_bos(self) -> bool:
        """Whether the template puts a BOS token (or [CLS]) first (see prepends_bos)."""
        if self.__dict__.get("_prepends") is None:
            ids = self.backend.encode("a").ids
            leading = {self.special_ids.get("bos"), self.special_ids.get("cls")} - {None}
            self._prepends = len(ids) > 1 and ids[0] in leading
        return self._prepends

    def encode(self, text: str, pair: str | None = None, *, add_special_tokens: bool = True,
               prepend_bos: bool | None = None, return_tensors: str | None = None):
        """The ids of one text (or sentence pair), special tokens as the tokenizer adds them (`prepends_bos`);
        `prepend_bos` as in the module's doc. A list, or with return_tensors="pt" a tensor [1, s], as
        transformers' encode."""
        ids = self.backend.encode(text, _one_pair(pair), add_special_tokens=add_special_tokens).ids
        ids = self._with_bos(ids, prepend_bos, add_special_tokens)[0]
        if return_tensors is None:
            return ids
        if return_tensors != "pt":
            raise ValueError(f"return_tensors={return_tensors!r}: this tokenizer returns lists or torch tensors "
                             "('pt') only")
        return torch.tensor([ids], dtype=torch.long)

    def sequence_ids(self, text: str, pair: str | None = None) -> list[int | None]:
        """For each token of `encode(text, pair)`: 0 for the text's tokens, 1 for the pair's, None for the special
        tokens the template adds (transformers' BatchEncoding.sequence_ids)."""
        return self.backend.encode(text, _one_pair(pair)).sequence_ids

    def __call__(self, text: str | list[str], pair: str | list[str] | None = None, *, padding_side: str | None = None,
                 prepend_bos: bool | None = None, add_special_tokens: bool = True, device=None,
                 return_tensors=TENSORS, padding: bool | str = PADDING, truncation: bool = False,
                 max_length: int | None = None) -> "Encoding":
        """A batch as model inputs: input_ids and attention_mask [b, s] (and token_type_ids for BERT), padded on
        `padding_side` (default `self.padding_side`: "right", transformers' default, or "left", which generate
        needs). One text gives a batch of one. Padding uses the pad token, else (GPT-2, which has none) the
        end-of-text token: the mask marks it either way. `prepend_bos` as in the module's doc.

        transformers' arguments, as TransformerLens passes them: `return_tensors` "pt" (the default here) or None
        (lists, one flat list per key for one text); `padding` True / "longest" (the default here) or "max_length"
        (to `max_length`), False / "do_not_pad" (texts of different lengths then give lists of their own lengths,
        and are refused as tensors); `truncation` cuts each sequence to `max_length` tokens, the special tokens (the
        template's and a BOS added) kept. TransformerLens' tokenizer defaults to transformers' return_tensors=None
        and padding=False."""
        if isinstance(return_tensors, _DialectDefault):
            return_tensors = return_tensors.of(self)
        if isinstance(padding, _DialectDefault):
            padding = padding.of(self)
        if return_tensors not in ("pt", None):
            raise ValueError(f"return_tensors={return_tensors!r}: this tokenizer returns lists (None) or torch tensors "
                             "('pt') only")
        padding_side = self.padding_side if padding_side is None else _side(padding_side)
        pad_to = _padding(padding, max_length)
        if truncation and max_length is None:
            raise ValueError("truncation=True needs max_length (the longest sequence to keep)")
        if isinstance(text, str) and isinstance(pair, str):
            pair = _one_pair(pair)
        texts = [text] if isinstance(text, str) else list(text)
        pairs = None if pair is None else [pair] if isinstance(pair, str) else list(pair)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a non-empty list of strings")
        if pairs is not None and len(pairs) != len(texts):
            raise ValueError(f"{len(pairs)} pairs for {len(texts)} texts: give one pair per text")
        inputs = texts if pairs is None else list(zip(texts, pairs))
        if truncation:
            # a BOS added to the template's tokens counts within max_length, even one prepend_bos=False then drops
            # (as TransformerLens truncates what its tokenizer gives and then takes the BOS away)
            added = add_special_tokens and self.bos_token_id is not None and not self._template_bos and (
                self._adds_bos or bool(prepend_bos))
            if max_length - added < 1:
                raise ValueError(f"max_length={max_length} leaves no room for a token beside the BOS token")
            with _TRUNCATING:  # a copy of the pipeline of its own, so no other call is cut meanwhile
                truncator = self.__dict__.get("_truncator")
                if truncator is None:
                    import tokenizers

                    truncator = self._truncator = tokenizers.Tokenizer.from_str(self.backend.to_str())
                truncator.enable_truncation(max_length - added)
                encodings = truncator.encode_batch(inputs, add_special_tokens=add_special_tokens)
        else:
            encodings = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        rows = [self._with_bos(e.ids, prepend_bos, add_special_tokens, e.type_ids) for e in encodings]
        longest = max(len(ids) for ids, _ in rows)
        if pad_to == "none" and return_tensors is None:  # transformers' lists, each of its own length
            batch = {"input_ids": [ids for ids, _ in rows], "attention_mask": [[1] * len(ids) for ids, _ in rows],
                     "token_type_ids": [types for _, types in rows]}
            return self._as_lists(batch, text)
        if pad_to == "none" and any(len(ids) < longest for ids, _ in rows):
            raise ValueError("these texts have different token counts and padding=False: a batch of them needs "
                             "padding (padding=True)")
        longest = max(longest, pad_to if isinstance(pad_to, int) else 0)
        pad = self._pad() if any(len(ids) < longest for ids, _ in rows) else 0
        batch = {"input_ids": [], "attention_mask": [], "token_type_ids": []}
        for ids, types in rows:
            fill = longest - len(ids)
            for key, values, padding in (("input_ids", ids, pad), ("attention_mask", [1] * len(ids), 0),
                                         ("token_type_ids", types, 0)):
                batch[key].append(values + [padding] * fill if padding_side == "right" else [padding] * fill + values)
        if return_tensors is None:
            return self._as_lists(batch, text)
        if not self.token_type_ids:
            del batch["token_type_ids"]
        # dtype given: a batch of empty texts would otherwise come out as float
        return Encoding({key: torch.tensor(values, dtype=torch.long, device=device) for key, values in batch.items()})

    def _as_lists(self, batch: dict, text) -> "Encoding":
        """transformers' lists: one text gives its own, not a batch of one."""
        return Encoding({key: rows[0] if isinstance(text, str) else rows for key, rows in batch.items()
                         if key != "token_type_ids" or self.token_type_ids})

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        """The text of a sequence of ids (special tokens kept unless skipped); `clean_up_tokenization_spaces` as
        transformers' (" ." -> ".", " n't" -> "n't" ...)."""
        text = self.backend.decode(self._id_list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if clean_up_tokenization_spaces else text

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = False) -> list[str]:
        """The text of each sequence of ids (rows of a [b, s] tensor, or a list of lists)."""
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    def convert_ids_to_tokens(self, ids):
        """The vocabulary's entry for an id, or for each of a list of them (transformers' name)."""
        if isinstance(ids, int) or isinstance(ids, torch.Tensor) and ids.dim() == 0:
            return self.backend.id_to_token(int(ids))
        return [self.backend.id_to_token(i) for i in self._id_list(ids)]

    def convert_tokens_to_ids(self, tokens):
        """The id of a vocabulary entry, or of each of a list of them (None where the vocabulary lacks it)."""
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(token) for token in tokens]

    def str_tokens(self, ids) -> list[str]:
        """Each id decoded on its own ("[CLS]", "##ing", " the"), as transformers' decode([id]) gives it."""
        return [self.backend.decode([i], skip_special_tokens=False) for i in self._id_list(ids)]

    def shown_tokens(self, ids) -> list[str]:
        """As str_tokens, for display, so that the tokens of a context put side by side read as the tokenizer
        decodes the text: a token that holds part of a character (a byte-level BPE's piece of an emoji or a CJK
        character, a byte-fallback `<0xE2>`), which decodes alone to the replacement character �, is shown as its
        bytes instead ("\\xe2\\x80"); a WordPiece token (BERT's) starts with the space that separates words, and a
        continuing piece ("##s") without its marker, so "monday" "##s" "at" shows as " monday" "s" " at"."""
        texts = self.str_tokens(ids)
        for n, i in enumerate(self._id_list(ids)):
            if "\ufffd" in texts[n]:
                raw = _token_bytes(self.backend.id_to_token(i) or "")
                if raw is not None:
                    texts[n] = raw.decode("utf-8", errors="backslashreplace")
        from tokenizers import decoders

        if isinstance(self.backend.decoder, decoders.WordPiece):
            prefix = self.backend.decoder.prefix
            texts = [text.removeprefix(prefix) if text.startswith(prefix) else f" {text}" for text in texts]
        return texts

    def _id_list(self, ids) -> list[int]:
        """ids as a list of ints: one id, a list, or a tensor of one axis (or [1, s]); an id outside the vocabulary,
        which the tokenizers library would decode to nothing, is an error."""
        if isinstance(ids, int) or isinstance(ids, torch.Tensor) and ids.dim() == 0:
            ids = [int(ids)]  # one id, as transformers' decode takes it (its TextStreamer passes one)
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 2 and ids.shape[0] == 1:
                ids = ids[0]
            if ids.dim() != 1:
                raise ValueError(f"expected the ids of one sequence, got a tensor of shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary 0..{len(self) - 1}")
        return ids

    def _with_bos(self, ids: list[int], prepend_bos: bool | None, templated: bool, types: list[int] | None = None):
        """(ids, types) with the sequence made to start, or not, with the BOS token (see the module's doc);
        `templated`: the template's special tokens were added."""
        types = [0] * len(ids) if types is None else types
        if prepend_bos is None and templated and self._adds_bos:
            prepend_bos = True  # TransformerLens' tokenizer adds the BOS token itself
        if prepend_bos is None or prepend_bos == (templated and self._template_bos and bool(ids)):
            return ids, types
        if not prepend_bos:
            return ids[1:], types[1:]
        if self.bos_token_id is None:
            raise ValueError(f"{self.source}: this tokenizer names no BOS token, so prepend_bos=True cannot add one")
        return [self.bos_token_id, *ids], [0, *types]

    def _pad(self) -> int:
        for role in ("pad", "eos"):
            if role in self.special_ids:
                return self.special_ids[role]
        raise ValueError(f"{self.source}: texts of different lengths need padding, and the tokenizer names neither "
                         "a pad nor an end-of-text token")


class Encoding(dict):
    """What the tokenizer's call returns: a dict of tensors (input_ids, attention_mask, ...) that also answers
    `encoding.input_ids`, as transformers' BatchEncoding does."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _side(side: str) -> str:
    if side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {side!r}")
    return side


def _padding(padding, max_length: int | None) -> str | int:
    """transformers' `padding` as "longest", "none", or the length to pad to."""
    if padding in (True, "longest"):
        return "longest"
    if padding in (False, "do_not_pad"):
        return "none"
    if padding == "max_length":
        if max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        return max_length
    raise ValueError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")


# transformers' clean_up_tokenization: the spaces a word-level decode leaves before punctuation and contractions
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
             (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _clean_up(text: str) -> str:
    for before, after in _CLEAN_UP:
        text = text.replace(before, after)
    return text


def _one_pair(pair: str | None) -> str | None:
    """The second segment of one text: an empty one is none, as transformers' tokenizer reads a single text's pair
    (by its truth value; in a batch, an empty pair is a segment of its own, [SEP] and all, there and here)."""
    return pair or None


def _read(directory: Path, token_type_ids: bool | None, config_json: dict | None, source):
    """(tokenizers.Tokenizer, special_ids, token_type_ids) from the files in `directory`; `config_json`: config.json's
    contents, when the caller has read it."""
    import tokenizers

    files = {name: directory / name for name in TOKENIZER_FILES if (directory / name).is_file()}
    path = files.get("tokenizer.json")
    if path is None:
        found = [name for name in VOCAB_FILES if name in files]
        if found:
            raise NoTokenizerJson(f"{source}: no tokenizer.json (only {', '.join(found)}); scratch_models reads "
                                  "tokenizer.json, the `tokenizers` library's file. Write one once with transformers: "
                                  "AutoTokenizer.from_pretrained(directory).save_pretrained(directory)")
        raise NoTokenizerJson(f"{source}: no tokenizer files in {directory} (no tokenizer.json, nor vocab files a "
                              "tokenizer could be built from): the weights were saved without their tokenizer. Take "
                              "the tokenizer of the checkpoint they were made from: copy its tokenizer files into "
                              f"{directory}, or set model.tokenizer = scratch_models.Tokenizer.from_pretrained(that "
                              "checkpoint). Token ids need no tokenizer: model(input_ids)")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises its own exception types for a bad file
        raise ValueError(f"{path}: not a tokenizer.json the tokenizers library can read ({e})") from None
    # transformers' tokenizer call leaves the file's truncation and padding off unless asked
    backend.no_truncation()
    backend.no_padding()
    configs = {name: _json(files[name]) for name in ("tokenizer_config.json", "special_tokens_map.json")
               if name in files}
    # config.json: token types, GPT-2's special token ids
    if config_json is None and (directory / "config.json").is_file():
        config_json = _json(directory / "config.json")
    configs["config.json"] = config_json or {}
    if token_type_ids is None:
        # the model reads token types when its config sizes a table of them (BERT's type_vocab_size)
        token_type_ids = "type_vocab_size" in configs["config.json"]
    side = configs.get("tokenizer_config.json", {}).get("padding_side") or "right"
    special_ids = _special_ids(backend, configs, path)
    return backend, special_ids, token_type_ids, _side(side), _names_bos(configs, special_ids)


def _names_bos(configs: dict[str, dict], special_ids: dict[str, int]) -> bool:
    """Whether transformers' tokenizer of these files has a BOS token: one its files name, or, where
    tokenizer_config.json names no tokenizer class (transformers then takes the model type's own, as for the hub's
    gpt2, whose GPT2Tokenizer defaults to <|endoftext|>), the one config.json names. A class named without a BOS
    (Qwen's, which says null; a generic TokenizersBackend) has none."""
    if "bos" not in special_ids:
        return False
    named = [configs.get(name, {}).get("bos_token") for name in ("tokenizer_config.json", "special_tokens_map.json")]
    return any(isinstance(token, (str, dict)) for token in named) or \
        "tokenizer_class" not in configs.get("tokenizer_config.json", {})


def _directory(name_or_path) -> Path:
    """The directory of a local checkpoint, or of `minilm` or a hub id (whose tokenizer files
    weight_mapping.open_checkpoint fetches with the weights)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path if path.is_dir() else path.parent
    return open_checkpoint(name_or_path).directory


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e})") from None
    return value if isinstance(value, dict) else {}


def _special_ids(backend, configs: dict[str, dict], path: Path) -> dict[str, int]:
    """role -> id: the token tokenizer_config.json or special_tokens_map.json names for the role (a string or
    {"content": ...}), else config.json's {role}_token_id (GPT-2's <|endoftext|> is named only there), pad aside:
    config.json's pad_token_id is the model's (what its classifier skips, what generate fills with), which
    transformers' tokenizer does not take, so a tokenizer whose files name no pad token has none, as there."""
    ids = {}
    for role in SPECIAL_ROLES:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            token = configs.get(name, {}).get(f"{role}_token")
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                found = backend.token_to_id(token)
                if found is None:
                    raise ValueError(f"{path.parent / name}: {role}_token {token!r} is not in the vocabulary")
                ids[role] = found
                break
        else:
            from_config = configs.get("config.json", {}).get(f"{role}_token_id") if role != "pad" else None
            if isinstance(from_config, int) and not isinstance(from_config, bool):
                if not 0 <= from_config < backend.get_vocab_size(with_added_tokens=True):
                    raise ValueError(f"{path.parent / 'config.json'}: {role}_token_id {from_config} is outside the "
                                     f"vocabulary of {path}")
                ids[role] = from_config
    return ids



def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, read backwards: each of the 256 characters a byte-level BPE writes a byte as ->
    that byte (printable Latin-1 bytes stand for themselves, the other 68 for the characters from U+0100 on, in
    byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


BYTE_ALPHABET = _byte_alphabet()
BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _token_bytes(token: str) -> bytes | None:
    """The bytes a vocabulary entry stands for: a byte-fallback token `<0xE2>`, or a byte-level BPE's string of
    alphabet characters; None for anything else."""
    fallback = BYTE_FALLBACK.fullmatch(token)
    if fallback:
        return bytes([int(fallback[1], 16)])
    if token and all(c in BYTE_ALPHABET for c in token):
        return bytes(BYTE_ALPHABET[c] for c in token)
    return None
