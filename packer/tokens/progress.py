"""Where a token conversion's tokenizing stands, kept in its staging folder so that ``--resume`` goes
on from there instead of tokenizing the corpus again (the hours of a large corpus).

Tokenizing appends every document's ids to one spill file and its length to another
(``packer.tokens.tokenizing``). Every ``EVERY`` seconds, once a batch is in both files, a record
(``PROGRESS_NAME``) notes how many documents and ids they hold, where the batch's last document
was read (its corpus file and line), and every document or line reported so far. ``--resume``
checks that the corpus files and the options that shape the ids are those of the interrupted run
(``fingerprint``: the files' sizes and SHA-256, the tokenizer's, the added ids, how documents are
read), cuts both files back to the record, and reads on from the document after that one; a
report it makes again is not repeated. Blocks, packing and shards are planned from the ids alone,
so they may change between the two runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from packer.records import Skipped
from packer.sources.corpus import CorpusConfig, Document, document_path, read_documents

PROGRESS_NAME = "corpus.progress.json"
"""The record of a tokenizing's progress in the staging folder, removed before publishing."""
EVERY = 10.0
"""Seconds between two records (and so, at most, the tokenizing a --resume does again)."""


def fingerprint(corpus: list[list], tokenizer: dict, eos: int, bos: Optional[int], reading: CorpusConfig) -> str:
    """What the ids of a tokenizing depend on, hashed: each corpus file's ``[path, bytes, SHA-256]``,
    the tokenizer's record, the added ids and how documents are read."""
    shape = {
        "corpus": corpus,
        "tokenizer": tokenizer.get("sha256"),
        "eos": eos,
        "bos": bos,
        "documents": reading.documents,
        "text_key": reading.text_key,
        "encoding": reading.encoding,
        "strict": reading.strict,
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode("utf-8")).hexdigest()


@dataclass
class Progress:
    """A record of a tokenizing: ``documents`` and ``ids`` in the files, the corpus file (by its
    index) and line of the last document they hold (line 0: a whole file), and the reports so far."""

    documents: int = 0
    ids: int = 0
    file: int = 0
    line: int = -1
    skipped: list[Skipped] = field(default_factory=list)

    @classmethod
    def read(cls, stage: Path) -> Optional["Progress"]:
        """The record in the staging folder ``stage``; None when there is none (or not one of ours)."""
        try:
            d = json.loads((Path(stage) / PROGRESS_NAME).read_text(encoding="utf-8"))
            return cls(
                int(d["documents"]),
                int(d["ids"]),
                int(d["file"]),
                int(d["line"]),
                [Skipped(str(s["path"]), str(s["reason"])) for s in d["skipped"]],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def holds(self, ids: Path, lengths: Path, itemsize: int = 0) -> bool:
        """Whether the files ``ids`` and ``lengths`` hold at least what this records (a crash of the
        machine may have lost pages the record counts); ``itemsize``: the ids' (0: 1 byte at least)."""
        try:
            return ids.stat().st_size >= self.ids * max(itemsize, 1) and lengths.stat().st_size >= 8 * self.documents
        except OSError:
            return self.ids == 0 and self.documents == 0

    def write(self, stage: Path) -> None:
        """Record this in the staging folder ``stage`` (replaced whole: never half written)."""
        path = Path(stage) / PROGRESS_NAME
        data = {
            "documents": self.documents,
            "ids": self.ids,
            "file": self.file,
            "line": self.line,
            "skipped": [s.to_dict() for s in self.skipped],
        }
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)


class Tracker:
    """The documents of ``files`` from where ``start`` left off, their reports given on to ``report``
    once each (those ``start`` holds were given before), and ``written``, which records the progress
    in ``stage`` every ``EVERY`` seconds (and ``finish``, at the end)."""

    def __init__(
        self,
        stage: Path,
        files: list[Path],
        reading: CorpusConfig,
        root: Optional[Path],
        report: Callable[[Skipped], None],
        start: Optional[Progress] = None,
        synced: tuple[str, ...] = (),
    ) -> None:
        self.stage, self.files, self.reading, self.root = Path(stage), files, reading, root
        self.synced = synced  # the files of ``stage`` a record counts
        self.start = start or Progress()
        self.skipped = list(self.start.skipped)
        self._seen = set(self.skipped)  # Skipped is frozen: the reports given already
        self._report = report
        self._index = {document_path(f, root): i for i, f in enumerate(files)}
        self._last = Progress(self.start.documents, self.start.ids, self.start.file, self.start.line)
        self._recorded = time.monotonic()
        for s in self.skipped:
            report(s)  # the interrupted run's, in this run's list too

    def report(self, skipped: Skipped) -> None:
        """Give a document's or a file's report on, unless it was given before the interrupt."""
        if skipped not in self._seen:
            self._seen.add(skipped)
            self.skipped.append(skipped)
            self._report(skipped)

    def documents(self) -> Iterator[Document]:
        """The documents after the last one ``start`` records, in order."""
        first, line = self.start.file, self.start.line
        if line == 0:  # that file was one document: tokenized whole
            first, line = first + 1, -1
        for index in range(first, len(self.files)):
            for doc in read_documents([self.files[index]], self.reading, self.report, self.root):
                if index == first and doc.line <= line:
                    continue  # tokenized before the interrupt
                yield doc

    def written(self, last: Document, documents: int, ids: int) -> None:
        """A batch ending with the document ``last`` is in the files, which now hold ``documents``
        and ``ids``; recorded when ``EVERY`` seconds have passed since the last record."""
        self._last = Progress(documents, ids, self._index[last.path], last.line)
        if time.monotonic() - self._recorded >= EVERY:
            self.finish()

    def finish(self) -> None:
        """Record where the tokenizing stands now, once the files it counts are on the disk (a record
        must never count what a crash of the machine could lose)."""
        for name in self.synced:
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(self.stage / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self._last.skipped = list(self.skipped)
        self._last.write(self.stage)
        self._recorded = time.monotonic()


__all__ = ["Progress", "Tracker", "fingerprint", "PROGRESS_NAME", "EVERY"]
