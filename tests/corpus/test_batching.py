"""Documents to sequences (SAELens' packing, or one per document), shards' blocks and forward batches."""

import random

import pytest

from scratch_models.corpus.batching import Sequence, Tokenized, batches, blocks, packed, per_document
from scratch_models.corpus.reading import Corpus, CorpusError, Document


def tokenized(docs, special=(0,)):
    return [Tokenized(Document(i, ids=ids), ids, [t in special for t in ids], [0] * len(ids))
            for i, ids in enumerate(docs)]


def test_packing_follows_saelens_by_hand():
    """context 5, BOS = separator = 0: BOS opens every sequence, a separator goes between documents, neither where
    the next token already is 0; a document goes on after the next sequence's BOS; an empty one is skipped and
    counted; the last, short sequence is kept."""
    counts = {}
    out = list(packed(tokenized([[1, 2, 3], [4, 5, 6, 7, 8, 9], [0, 10], [], [11]]), 5, 0, 0, counts))
    assert [s.ids for s in out] == [[0, 1, 2, 3, 0], [0, 4, 5, 6, 7], [0, 8, 9, 0, 10], [0, 11]]
    assert [s.document for s in out] == [[0, 0, 0, 0, 1], [1] * 5, [1, 1, 1, 2, 2], [4, 4]]
    assert [s.position for s in out] == [[-1, 0, 1, 2, -1], [-1, 0, 1, 2, 3], [-1, 4, 5, 0, 1], [-1, 0]]
    assert [s.special for s in out][2] == [True, False, False, True, False]  # the document's own 0 is special too
    assert counts == {"empty": 1}


def test_packing_without_bos_or_separator():
    docs = tokenized([[1, 2], [3, 4, 5]])
    assert [s.ids for s in packed(docs, 3, None, None, {})] == [[1, 2, 3], [4, 5]]
    assert [s.ids for s in packed(docs, 3, None, 0, {})] == [[1, 2, 0], [3, 4, 5]]
    assert [s.ids for s in packed(docs, 3, 0, None, {})] == [[0, 1, 2], [0, 3, 4], [0, 5]]


def test_packing_equals_saelens_own_function():
    """Against sae_lens.tokenization_and_batching.concat_and_batch_sequences on random documents (SAELens drops
    the last, short sequence; harvest keeps it)."""
    sae = pytest.importorskip("sae_lens.tokenization_and_batching",
                              reason="sae-lens is not installed (it needs transformer-lens < 4, which the peers "
                                     "extra's >= 4.3 excludes: install it in a venv of its own)")
    import torch

    rng = random.Random(0)
    docs = [[rng.randrange(0, 6) for _ in range(rng.randrange(0, 12))] for _ in range(60)]
    for context, bos, separator in ((7, 0, 0), (4, 1, 0), (16, None, 0), (5, 0, None)):
        theirs = [s.tolist() for s in sae.concat_and_batch_sequences(
            iter(torch.tensor(d, dtype=torch.long) for d in docs), context, begin_batch_token_id=bos,
            sequence_separator_token_id=separator)]
        ours = [s.ids for s in packed(tokenized(docs), context, bos, separator, {})]
        assert ours[:len(theirs)] == theirs
        assert len(ours) == len(theirs) or len(ours) == len(theirs) + 1 and len(ours[-1]) < context


def test_per_document_refuses_a_document_longer_than_the_model(tmp_path):
    corpus = Corpus(["a", "b"])
    docs = tokenized([[1, 2], [1, 2, 3, 4]])
    with pytest.raises(CorpusError, match=r"the given list of texts, row 1: 4 tokens, longer than the 3 this model "
                                          r"reads \(config.json n_positions=3\).*pack the corpus"):
        list(per_document(docs, 3, "n_positions", corpus, False, {}, causal=True))
    # BERT: packing is refused for it, so it is not offered; splitting the document is
    with pytest.raises(CorpusError, match=r"row 1: 4 tokens, longer than the 3 this model reads \(config.json "
                                          r"max_position_embeddings=3\): split it into documents of at most 3 tokens"
                                          r".*packing is for causal models") as refused:
        list(per_document(docs, 3, "max_position_embeddings", corpus, False, {}, causal=False))
    assert "batching 'pack'" not in str(refused.value)
    counts = {}
    out = list(per_document(tokenized([[5], [], [1, 0]]), 3, "n_positions", corpus, False, counts, causal=True))
    assert [s.document for s in out] == [[0], [2, 2]] and counts == {"empty": 1}
    assert out[1].position == [0, 1] and out[1].special == [False, True]


def sequence(n, doc=0):
    return Sequence([1] * n, [doc] * n, list(range(n)), [False] * n)


def test_blocks_cut_by_rows_and_batches_sort_by_length():
    seqs = [sequence(n, i) for i, n in enumerate([3, 9, 1, 4, 7, 2, 8])]
    cut = list(blocks(seqs, len, 10))
    assert [[s.document[0] for s in b] for b in cut] == [[0, 1], [2, 3, 4], [5, 6]]
    got = list(batches(seqs, 3, by_length=True))
    assert [[len(s) for s in b] for b in got] == [[9, 8, 7], [4, 3, 2], [1]]
    # packed: order kept, a change of length ends a batch
    packed_seqs = [sequence(4)] * 5 + [sequence(2)]
    assert [[len(s) for s in b] for b in batches(packed_seqs, 2, by_length=False)] == [[4, 4], [4, 4], [4], [2]]
