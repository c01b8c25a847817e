"""A text corpus as documents: what ``packer convert CORPUS --pack BLOCK`` tokenizes.

CORPUS is a file or a folder of them (walked in sorted path order, hidden files and folders left
out): ``.txt`` (a file is a document, or with ``documents="lines"`` each non-empty line is),
``.jsonl`` (a line is a document, its ``text_key`` string), ``.parquet`` and the ``.arrow`` files of
a Hugging Face dataset saved with ``save_to_disk`` (the ``text_key`` column), and ``.gz`` or ``.zst``
files of the text ones. Every document comes with where it was found (a path, and a line or row),
so that a problem is reported there: an undecodable file or line, a ``.jsonl`` line that is not JSON
or lacks the key, an empty document. Those are ``Skipped`` and the walk goes on (``strict``: the
first one stops it); nothing is left out without its record.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Optional

from packer.records import Skipped
from packer.spec.errors import DecodeError, InputError

TEXT_SUFFIXES = (".txt", ".text", ".md")
LINES_SUFFIXES = (".jsonl", ".ndjson")
TABLE_SUFFIXES = (".parquet", ".arrow")
COMPRESSED = (".gz", ".zst")
DOCUMENTS = ("file", "lines")
"""What a document of a ``.txt`` file is (``--documents``): the whole file, or each non-empty line."""

BATCH_CHARACTERS = 4 * 1024**2
"""About how much text goes into one batch for the tokenizer: large enough that its threads share
the batch well, small enough to keep a few batches in memory."""


@dataclass(frozen=True)
class CorpusConfig:
    """How a corpus's documents are read: ``documents`` of a ``.txt`` file (``file``, ``lines``), the
    ``text_key`` of ``.jsonl`` lines and table rows, the text files' ``encoding``, and ``strict``."""

    documents: str = "file"
    text_key: str = "text"
    encoding: str = "utf-8"
    strict: bool = False


@dataclass(frozen=True)
class Document:
    """One document's text and where it was found: ``path`` and its 1-based ``line`` (or row), 0 for
    a whole file."""

    text: str
    path: str
    line: int = 0

    @property
    def where(self) -> str:
        """The path, with the line where there is one."""
        return f"{self.path}:{self.line}" if self.line else self.path


def corpus_files(root: Path) -> list[Path]:
    """The files of a corpus, sorted by path; InputError when there are none to read."""
    root = Path(root)
    if not root.exists():
        raise InputError(f"{root} does not exist")
    if root.is_file():
        files = [root]
    else:
        files = []
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            files += [Path(folder) / n for n in sorted(names) if not n.startswith(".") and _kind(n) is not None]
        files.sort()
    if not files or any(_kind(f.name) is None for f in files):
        kinds = ", ".join((*TEXT_SUFFIXES, *LINES_SUFFIXES, *TABLE_SUFFIXES))
        raise InputError(f"{root} holds no corpus files: a corpus is files of {kinds} (or .gz / .zst of the text ones)")
    return files


def _kind(name: str) -> Optional[str]:
    """``text``, ``lines`` or ``table`` for a corpus file's name; None for any other file."""
    lower = name.lower()
    for suffix in COMPRESSED:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            if lower.endswith(TABLE_SUFFIXES):
                return None  # compressed tables are not read: Parquet compresses itself
            break
    if lower.endswith(TEXT_SUFFIXES):
        return "text"
    if lower.endswith(LINES_SUFFIXES):
        return "lines"
    if lower.endswith(TABLE_SUFFIXES):
        return "table"
    return None


def read_documents(
    files: list[Path], config: CorpusConfig, skipped: Callable[[Skipped], None], root: Optional[Path] = None
) -> Iterator[Document]:
    """Every document of ``files`` in order; each problem is given to ``skipped`` (with ``strict``
    raised as a DecodeError instead). Paths are reported relative to ``root`` where given."""
    for path in files:
        name = document_path(path, root)
        try:
            yield from _file_documents(path, name, config, skipped)
        except DecodeError as e:
            if config.strict:
                raise
            skipped(Skipped(e.path, str(e).removeprefix(f"{e.path}: ")))


def document_path(path: Path, root: Optional[Path] = None) -> str:
    """The path the documents of the corpus file ``path`` (and its problems) are reported by: relative
    to the corpus folder ``root`` where given."""
    return os.path.relpath(path, root) if root is not None and Path(root).is_dir() else str(path)


def _file_documents(
    path: Path, name: str, config: CorpusConfig, skipped: Callable[[Skipped], None]
) -> Iterator[Document]:
    kind = _kind(path.name)

    def bad(doc_line: int, reason: str) -> None:
        where = f"{name}:{doc_line}" if doc_line else name
        if config.strict:
            raise DecodeError(where, reason)
        skipped(Skipped(where, reason))

    if kind == "table":
        yield from _table_documents(path, name, config, bad)
        return
    try:
        with _open(path) as raw:
            if kind == "text" and config.documents == "file":
                text = _decode(raw.read(), name, config.encoding).removeprefix("\ufeff").replace("\r\n", "\n")
                if text.strip():
                    yield Document(text, name)
                else:
                    bad(0, "the document is empty")
                return
            decoder = codecs.getincrementaldecoder(config.encoding)()
            for number, data in enumerate(raw, 1):
                try:
                    line = decoder.decode(data, final=False)
                except UnicodeDecodeError as e:
                    decoder.reset()
                    bad(number, f"does not decode as {config.encoding}: {e.reason} at byte {e.start}")
                    continue
                if number == 1:
                    line = line.removeprefix("\ufeff")
                line = line.rstrip("\r\n")
                if kind == "text":
                    if line.strip():
                        yield Document(line, name, number)
                    continue
                yield from _json_line(line, name, number, config.text_key, bad)
    except _read_errors() as e:
        raise DecodeError(name, f"cannot be read: {e}") from None


def _json_line(line: str, name: str, number: int, key: str, bad: Callable[[int, str], None]) -> Iterator[Document]:
    if not line.strip():
        return  # blank lines separate nothing in JSON Lines
    try:
        record = json.loads(line)
    except ValueError as e:
        bad(number, f"is not JSON: {e}")
        return
    if not isinstance(record, dict) or key not in record:
        bad(number, f"has no {key!r} key (pass --text-key with the key that holds the text)")
        return
    yield from _document(record[key], name, number, key, bad)


def _document(text: object, name: str, number: int, key: str, bad: Callable[[int, str], None]) -> Iterator[Document]:
    """The document of a line's or row's ``key`` value, or its problem given to ``bad``."""
    if not isinstance(text, str):
        bad(number, f"its {key!r} is {type(text).__name__}, not a string")
    elif not text.strip():
        bad(number, "the document is empty")
    else:
        yield Document(text, name, number)


def _table_documents(
    path: Path, name: str, config: CorpusConfig, bad: Callable[[int, str], None]
) -> Iterator[Document]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"reading {name} needs pyarrow: pip install 'packer-datasets[parquet]'") from None
    try:
        if path.suffix.lower() == ".parquet":
            batches = pq.ParquetFile(path).iter_batches(columns=[config.text_key], batch_size=4096)
        else:
            batches = iter(pa.ipc.open_stream(pa.memory_map(str(path))))
        row = 0
        for batch in batches:
            if config.text_key not in batch.schema.names:
                raise DecodeError(name, f"has no column {config.text_key!r} (pass --text-key with the text column)")
            for text in batch.column(config.text_key).to_pylist():
                row += 1
                yield from _document(text, name, row, config.text_key, bad)
    except (pa.ArrowException, OSError) as e:
        raise DecodeError(
            name, f"cannot be read as {'Parquet' if path.suffix.lower() == '.parquet' else 'Arrow'}: {e}"
        ) from None


def _decode(data: bytes, name: str, encoding: str) -> str:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise DecodeError(name, f"does not decode as {encoding}: {e.reason} at byte {e.start}") from None


def _read_errors() -> tuple[type[BaseException], ...]:
    """What reading a (compressed) corpus file raises when the file is damaged."""
    try:
        import zstandard
    except ImportError:
        return (OSError, EOFError)
    return (OSError, EOFError, zstandard.ZstdError)


def _open(path: Path) -> IO[bytes]:
    """A corpus file for reading bytes, decompressed as its suffix says."""
    lower = path.name.lower()
    if lower.endswith(".gz"):
        return gzip.open(path, "rb")
    if lower.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise InputError(f"reading {path} needs zstandard: pip install 'packer-datasets[text]'") from None
        raw = open(path, "rb")
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return open(path, "rb")


__all__ = [
    "CorpusConfig",
    "Document",
    "DOCUMENTS",
    "BATCH_CHARACTERS",
    "corpus_files",
    "read_documents",
    "document_path",
]
