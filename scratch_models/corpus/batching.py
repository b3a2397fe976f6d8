"""Documents -> token sequences -> shards' blocks -> forward batches.

Two ways to cut a corpus into sequences:

`pack` (causal models; the default for them): SAELens' convention (its `concat_and_batch_sequences`, as its
ActivationsStore and CacheActivationsRunner use it by default): each document is tokenized alone without special
tokens, and the documents are laid end to end in sequences of exactly `context` tokens. Every sequence begins with
BOS, and a separator (BOS as well) goes between two documents in a sequence; neither is added where the next token
already is that token. A document longer than the room left goes on in the next sequence, after its BOS. The last
sequence of the corpus is kept however short it is (SAELens drops it; so does the SAELens layout here).
TransformerLens' `tokenize_and_concatenate` differs: it joins the texts with EOS into one string, tokenizes that in
a few large pieces and cuts it, so a token can straddle two documents and no token leads back to its document.

`document`: one sequence per document (a sentence pair for BERT), with the special tokens the checkpoint's
tokenizer adds ([CLS] ... [SEP] for BERT; none for GPT-2 unless `prepend_bos`); a document longer than the model's
positions is an error naming it. A shard's sequences are sorted by length before they are cut into batches, so a
batch pads little.

Tokens that packing inserts (BOS, separators) carry position -1 and the document that follows them.
"""

import dataclasses
from typing import Iterable, Iterator

from .reading import Corpus, CorpusError, Document

TOKENIZE_BATCH = 256  # documents checked or tokenized at a time


@dataclasses.dataclass
class Sequence:
    """One row of a forward batch, with where each token came from."""

    ids: list[int]
    document: list[int]  # per token: the row of the corpus it came from
    position: list[int]  # per token: its index in that document's tokens; -1 for a token packing inserted
    special: list[bool]  # per token: a special token (BOS, separator, [CLS], [SEP], ...)
    token_types: list[int] | None = None  # BERT's segments

    def __len__(self):
        return len(self.ids)

    def dropped(self, drop_special: bool | list[int]) -> list[bool]:
        """Per token, whether a harvest with `drop_special` leaves it out: every special token (True), the tokens of
        those ids (a list: SAELens' exclude_special_tokens), or none (False)."""
        if isinstance(drop_special, list):
            ids = set(drop_special)
            return [token in ids for token in self.ids]
        return self.special if drop_special else [False] * len(self.ids)


@dataclasses.dataclass
class Tokenized:
    document: Document
    ids: list[int]
    special: list[bool]
    token_types: list[int]


def tokenize(corpus: Corpus, tokenizer, *, add_special_tokens: bool, prepend_bos: bool,
             vocab_size: int) -> Iterator[Tokenized]:
    """Each document's token ids, in order. Pre-tokenized documents are checked against the vocabulary."""
    special_ids = set(tokenizer.special_ids.values()) if tokenizer is not None else set()
    bos = [tokenizer.special_ids["bos"]] if prepend_bos else []
    for documents in _chunks(corpus, TOKENIZE_BATCH):
        if corpus.tokenized:
            for doc in documents:
                bad = next((i for i in doc.ids if not 0 <= i < vocab_size), None)
                if bad is not None:
                    raise CorpusError(f"{corpus.where(doc.index)}: token id {bad} is outside the vocabulary "
                                      f"0..{vocab_size - 1}")
                ids = bos + doc.ids
                yield Tokenized(doc, ids, [i in special_ids for i in ids], [0] * len(ids))
            continue
        for doc in documents:  # one at a time: encode_batch's threads would take cores from the forward passes
            encoding = tokenizer.backend.encode(doc.text, doc.pair, add_special_tokens=add_special_tokens)
            yield Tokenized(doc, bos + encoding.ids, [True] * len(bos) + [bool(s) for s in
                                                                          encoding.special_tokens_mask],
                            [0] * len(bos) + encoding.type_ids)


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def packed(documents: Iterable[Tokenized], context: int, bos: int | None, separator: int | None,
           counts: dict) -> Iterator[Sequence]:
    """SAELens' packing (see the module's doc): sequences of `context` tokens, the last one perhaps shorter.
    `counts["empty"]` counts the documents without a token."""
    sequence = Sequence([], [], [], [])

    def add(token: int, doc: int, pos: int, special: bool):
        sequence.ids.append(token)
        sequence.document.append(doc)
        sequence.position.append(pos)
        sequence.special.append(special)

    for item in documents:
        tokens, index = item.ids, item.document.index
        if not tokens:
            counts["empty"] = counts.get("empty", 0) + 1
            continue
        offset = 0
        while offset < len(tokens):
            if not sequence.ids:
                if bos is not None and tokens[offset] != bos:
                    add(bos, index, -1, True)
            elif offset == 0 and separator is not None and tokens[0] != separator:
                add(separator, index, -1, True)
            take = min(context - len(sequence), len(tokens) - offset)
            for pos in range(offset, offset + take):
                add(tokens[pos], index, pos, item.special[pos])
            offset += take
            if len(sequence) == context:
                yield sequence
                sequence = Sequence([], [], [], [])
    if sequence.ids:
        yield sequence


def per_document(documents: Iterable[Tokenized], limit: int, limit_name: str, corpus: Corpus, pairs: bool,
                 counts: dict, causal: bool) -> Iterator[Sequence]:
    """One sequence per document (an empty one is skipped and counted in `counts["empty"]`); a document longer
    than `limit` tokens is an error naming it, and saying what works for the model (`causal`: packing does)."""
    for item in documents:
        n = len(item.ids)
        if n == 0:
            counts["empty"] = counts.get("empty", 0) + 1
            continue
        if n > limit:
            if causal and not pairs:
                how = "shorten it, or pack the corpus (batching 'pack': documents end to end, cut every context)"
            else:  # packing would let a token see the next document: this model reads both ways
                how = (f"split it into documents of at most {limit} tokens (a line each in a .txt file), or shorten "
                       "it; packing is for causal models, whose tokens never see the next document")
            raise CorpusError(f"{corpus.where(item.document.index)}: {n} tokens, longer than the {limit} this model "
                              f"reads (config.json {limit_name}={limit}): {how}")
        yield Sequence(item.ids, [item.document.index] * n, list(range(n)), item.special,
                       item.token_types if pairs else None)


def blocks(sequences: Iterable[Sequence], rows_of, rows_per_block: int) -> Iterator[list[Sequence]]:
    """Consecutive sequences, cut whenever a block holds `rows_per_block` rows or more (`rows_of(sequence)`: the
    rows a sequence stores). A block is one shard: where it ends depends on the data and the settings alone, so
    every process and every resumed run cuts the corpus alike."""
    block, rows = [], 0
    for sequence in sequences:
        block.append(sequence)
        rows += rows_of(sequence)
        if rows >= rows_per_block:
            yield block
            block, rows = [], 0
    if block:
        yield block


def batches(block: list[Sequence], batch_size: int, by_length: bool) -> Iterator[list[Sequence]]:
    """A block's sequences in forward batches of at most `batch_size`, each of sequences of one length where
    possible: `by_length` sorts them by length first (longest first, so the first batch shows the memory the
    largest needs), else they keep their order and a batch ends where the length changes (packing's last, short
    sequence runs alone)."""
    order = sorted(block, key=len, reverse=True) if by_length else block
    batch = []
    for sequence in order:
        if batch and (len(batch) == batch_size or not by_length and len(sequence) != len(batch[0])):
            yield batch
            batch = []
        batch.append(sequence)
    if batch:
        yield batch
