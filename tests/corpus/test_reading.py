"""Corpora in every format harvest reads, through Hugging Face datasets; bad data named by file and row."""

import datasets
import pytest

from corpus_data import SENTENCES, write_jsonl
from scratch_models.corpus import Corpus, CorpusError


def texts(corpus):
    return [(doc.index, doc.text, doc.pair) for doc in corpus]


@pytest.mark.parametrize("kind", ["txt", "jsonl", "csv", "parquet", "saved", "list", "dataset"])
def test_every_format_gives_the_same_documents_in_order(tmp_path, kind):
    rows = SENTENCES * 3  # more rows than one line of a test would show
    expected = [(i, text, None) for i, text in enumerate(rows)]
    table = datasets.Dataset.from_dict({"text": rows, "other": list(range(len(rows)))})
    data = {"txt": lambda: (tmp_path / "c.txt").write_text("\n".join(rows) + "\n") and tmp_path / "c.txt",
            "jsonl": lambda: write_jsonl(tmp_path / "c.jsonl", [{"text": t, "other": 1} for t in rows]),
            "csv": lambda: table.to_csv(tmp_path / "c.csv") and tmp_path / "c.csv",
            "parquet": lambda: table.to_parquet(tmp_path / "c.parquet") and tmp_path / "c.parquet",
            "saved": lambda: table.save_to_disk(tmp_path / "saved") or tmp_path / "saved",
            "list": lambda: rows, "dataset": lambda: table}[kind]()
    corpus = Corpus(data)
    assert texts(corpus) == expected
    assert texts(corpus) == expected  # read again from the start
    assert not corpus.tokenized


def test_pairs_and_named_columns(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"a": "first", "b": "second"}, {"a": "x", "b": "y"}])
    assert texts(Corpus(path, text_column="a", pair_column="b")) == [(0, "first", "second"), (1, "x", "y")]


def test_pre_tokenized_ids_are_read_when_there_is_no_text(tmp_path):
    path = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    corpus = Corpus(path)
    assert corpus.tokenized and [doc.ids for doc in corpus] == [[1, 2, 3], [4]]
    both = write_jsonl(tmp_path / "both.jsonl", [{"text": "hi", "input_ids": [1]}])
    assert not Corpus(both).tokenized  # the text, tokenized by the model's own tokenizer, is preferred
    assert Corpus(both, ids_column="input_ids").tokenized


def test_empty_file_and_empty_dataset_are_errors_naming_them(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CorpusError, match=r"empty\.jsonl: the file is empty"):
        Corpus(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(CorpusError, match=r"blank\.jsonl"):
        list(Corpus(blank))
    with pytest.raises(CorpusError, match="empty"):
        Corpus([])


def test_missing_column_lists_the_columns_there(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"body": "x"}])
    with pytest.raises(CorpusError, match=r"c\.jsonl.*no column 'text'.*'body'"):
        list(Corpus(path))
    with pytest.raises(CorpusError, match=r"no column 'second'"):
        list(Corpus(path, text_column="body", pair_column="second"))
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"body": ["x"]}).save_to_disk(saved)
    with pytest.raises(CorpusError, match=r"saved: no column 'text'; its columns: 'body'"):
        Corpus(saved)


@pytest.mark.parametrize("value, described", [(None, "NoneType None"), (5, "int 5"), (["a"], "list")])
def test_a_row_that_is_not_text_is_named_by_file_and_row(tmp_path, value, described):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": "fine"}] * 1500 + [{"text": value}])
    with pytest.raises(CorpusError, match=rf"c\.jsonl, row 1500: column 'text' holds {described}"):
        list(Corpus(path))


def test_bad_ids_are_named_by_row(tmp_path):
    path = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [1, 2]}, {"input_ids": ["a"]}])
    with pytest.raises(CorpusError, match=r"ids\.jsonl, row 1: column 'input_ids' holds list"):
        list(Corpus(path))


def test_unreadable_inputs_are_refused_with_what_is_read(tmp_path):
    with pytest.raises(CorpusError, match="no such file"):
        Corpus(tmp_path / "nope.txt")
    (tmp_path / "c.docx").write_text("x")
    with pytest.raises(CorpusError, match=r"unknown kind of file '\.docx'"):
        Corpus(tmp_path / "c.docx")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{not json\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl: cannot be read as json"):
        list(Corpus(tmp_path / "bad.jsonl"))
    splits = tmp_path / "splits"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(splits)
    with pytest.raises(CorpusError, match=r"DatasetDict of splits \(train\); name one split's directory"):
        Corpus(splits)
    (tmp_path / "plain").mkdir()
    with pytest.raises(CorpusError, match="without state.json"):
        Corpus(tmp_path / "plain")


def test_txt_errors_give_the_line(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a\nb\n")
    assert Corpus(path).where(1) == f"{path}, row 1 (line 2)"


def test_fingerprint_changes_with_the_file(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}])
    before = Corpus(path).fingerprint()
    assert Corpus(path).fingerprint() == before
    write_jsonl(path, [{"text": "a"}, {"text": "b"}])
    assert Corpus(path).fingerprint() != before
    assert Corpus(["a"]).fingerprint() != Corpus(["b"]).fingerprint()
