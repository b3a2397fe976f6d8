"""A corpus as a stream of documents, read by Hugging Face `datasets` (streaming: a file is read in chunks, never
whole).

DATA is one of:
  a .txt file          a document a line (an empty line is an empty document)
  .jsonl / .json, .csv, .parquet
                       a text column (`text` unless named), and a second one for sentence pairs; or a column of
                       token ids (`input_ids`), when there is no text column, or when named as `ids_column`
  a directory that `datasets` saved (Dataset.save_to_disk): the same columns
  in Python also: a list of strings, or a datasets.Dataset / IterableDataset

A document is known by its row, counted from 0 (the harvest's `document` column); errors name the file and the row.
"""

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Iterator

SUFFIXES = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
READ_BATCH = 1024  # rows taken from `datasets` at a time


class CorpusError(ValueError):
    """Data that cannot be read as a corpus: the message names the file (and the row)."""


@dataclasses.dataclass(frozen=True)
class Document:
    index: int  # the row, counted from 0
    text: str | None = None
    pair: str | None = None  # the second segment of a sentence pair
    ids: list[int] | None = None  # pre-tokenized input


class Corpus:
    """The documents of DATA, read in order each time it is iterated.

    `text_column` / `pair_column` name the columns of texts and second segments; `ids_column` a column of token
    ids (pre-tokenized input). With none of them named, a `text` column is read, else an `input_ids` column."""

    def __init__(self, data, *, text_column: str | None = None, pair_column: str | None = None,
                 ids_column: str | None = None):
        if ids_column is not None and (text_column is not None or pair_column is not None):
            raise CorpusError("ids_column reads token ids, text_column and pair_column texts: name one kind")
        self.data = data
        self.name, self._dataset, self.files = _open(data)
        self.column_names = _column_names(self._dataset)
        if ids_column is None and text_column is None and self.column_names is not None and \
                "text" not in self.column_names and "input_ids" in self.column_names:
            ids_column = "input_ids"  # pre-tokenized, as `datasets`' tokenized corpora name it
        self.ids_column = ids_column
        self.text_column = None if ids_column else (text_column or "text")
        self.pair_column = pair_column
        wanted = [c for c in (self.text_column, self.pair_column, self.ids_column) if c]
        if self.column_names is not None:
            for column in wanted:
                if column not in self.column_names:
                    raise CorpusError(f"{self.name}: no column {column!r}; its columns: "
                                      f"{', '.join(map(repr, self.column_names)) or 'none'}")

    @property
    def tokenized(self) -> bool:
        return self.ids_column is not None

    def where(self, index: int) -> str:
        """The document at row `index`, in words for an error message."""
        line = f" (line {index + 1})" if self.files and self.files[0].suffix == ".txt" else ""
        return f"{self.name}, row {index}{line}"

    def __iter__(self) -> Iterator[Document]:
        columns = [c for c in (self.text_column, self.pair_column, self.ids_column) if c]
        index = 0
        for batch in self._dataset.iter(batch_size=READ_BATCH):
            for column in columns:
                if column not in batch:
                    raise CorpusError(f"{self.where(index)}: no column {column!r}; this row has "
                                      f"{', '.join(map(repr, batch)) or 'none'}")
            for row in range(len(batch[columns[0]])):
                values = {column: batch[column][row] for column in columns}
                yield self._document(index, values)
                index += 1
        if index == 0:
            raise CorpusError(f"{self.name}: no rows (empty)")

    def _document(self, index: int, values: dict) -> Document:
        if self.ids_column:
            ids = values[self.ids_column]
            if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                              for i in ids):
                raise CorpusError(f"{self.where(index)}: column {self.ids_column!r} holds {_described(ids)}, "
                                  "not a list of token ids")
            return Document(index, ids=list(ids))
        for column in (self.text_column, self.pair_column):
            if column and not isinstance(values[column], str):
                raise CorpusError(f"{self.where(index)}: column {column!r} holds {_described(values[column])}, "
                                  "not text")
        return Document(index, text=values[self.text_column],
                        pair=values[self.pair_column] if self.pair_column else None)

    def fingerprint(self) -> dict:
        """What identifies the data for a resumed harvest: the files with their sizes and modification times (a
        dataset's own fingerprint for a datasets.Dataset; a hash of the texts for a list), and the columns read.
        None in "source" when nothing identifies it (an IterableDataset built in Python)."""
        if self.files:  # absolute: the same file given relative and absolute is the same data
            source = [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in self.files]
        elif isinstance(self.data, list):
            source = hashlib.sha256(json.dumps(self.data).encode()).hexdigest()
        else:
            source = getattr(self._dataset, "_fingerprint", None)
        return {"source": source, "text_column": self.text_column, "pair_column": self.pair_column,
                "ids_column": self.ids_column}

    def size_bytes(self) -> int | None:
        """The bytes of the data's files (None for data given in Python)."""
        return sum(f.stat().st_size for f in self.files) if self.files else None

    def num_rows(self) -> int | None:
        """The number of documents when it is known without reading them all."""
        return len(self._dataset) if hasattr(self._dataset, "__len__") else None


def _open(data):
    """(a name for messages, a `datasets` Dataset or IterableDataset, the files read)."""
    import datasets

    if isinstance(data, (datasets.Dataset, datasets.IterableDataset)):
        return "the given dataset", data, []
    if isinstance(data, (list, tuple)):
        if not data:
            raise CorpusError("the given list of texts is empty")
        bad = next((i for i, text in enumerate(data) if not isinstance(text, str)), None)
        if bad is not None:
            raise CorpusError(f"the given list of texts, row {bad}: holds {_described(data[bad])}, not text")
        return "the given list of texts", datasets.Dataset.from_dict({"text": list(data)}), []
    path = Path(data).expanduser()
    if path.is_dir():
        return str(path), _load_from_disk(path), sorted(path.glob("*.arrow"))
    if not path.is_file():
        raise CorpusError(f"{path}: no such file or directory")
    builder = SUFFIXES.get(path.suffix.lower())
    if builder is None:
        raise CorpusError(f"{path}: unknown kind of file {path.suffix!r}; read are "
                          f"{', '.join(SUFFIXES)} files and directories saved by `datasets`")
    if path.stat().st_size == 0:
        raise CorpusError(f"{path}: the file is empty")
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True)
    except Exception as e:  # datasets raises many kinds for a file it cannot parse
        raise CorpusError(f"{path}: cannot be read as {builder} ({type(e).__name__}: {e})") from None
    return str(path), _Checked(dataset, path, builder), [path]


class _Checked:
    """A streaming dataset whose parse errors name the file."""

    def __init__(self, dataset, path: Path, builder: str):
        self.dataset, self.path, self.builder = dataset, path, builder

    @property
    def features(self):
        return self.dataset.features

    def iter(self, batch_size: int):
        try:
            yield from self.dataset.iter(batch_size=batch_size)
        except CorpusError:
            raise
        except Exception as e:  # a malformed line, a column of mixed types: datasets' and pyarrow's own kinds
            raise CorpusError(f"{self.path}: cannot be read as {self.builder} ({type(e).__name__}: {e})") from None


def _load_from_disk(path: Path):
    import datasets

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        raise CorpusError(f"{path}: a DatasetDict of splits ({', '.join(splits)}); name one split's directory, "
                          f"e.g. {path / (splits[0] if splits else 'train')}")
    if not (path / "state.json").is_file():
        raise CorpusError(f"{path}: a directory without state.json, so not one `datasets` saved "
                          "(Dataset.save_to_disk); give a file or such a directory")
    try:
        return datasets.load_from_disk(str(path))
    except Exception as e:
        raise CorpusError(f"{path}: datasets.load_from_disk cannot read it ({type(e).__name__}: {e})") from None


def _column_names(dataset) -> list[str] | None:
    features = getattr(dataset, "features", None)
    return list(features) if features is not None else None


def _described(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
