"""packer.sources.corpus: a corpus's documents, found in every kind of file, every problem reported by path and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from packer.records import Skipped
from packer.sources.corpus import CorpusConfig, corpus_files, read_documents
from packer.spec.errors import DecodeError, InputError


def _read(root: Path, **config) -> tuple[list[tuple[str, str]], list[Skipped]]:
    skipped: list[Skipped] = []
    docs = read_documents(corpus_files(root), CorpusConfig(**config), skipped.append, root)
    return [(d.where, d.text) for d in docs], skipped


def test_text_files_are_documents_in_path_order_or_lines(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "two.txt").write_text("second\r\nfile\n")
    (tmp_path / "a.txt").write_bytes("\ufefffirst file".encode())
    (tmp_path / ".hidden.txt").write_text("never read")
    (tmp_path / "notes.csv").write_text("not a corpus file")
    docs, skipped = _read(tmp_path)
    assert docs == [("a.txt", "first file"), ("b/two.txt", "second\nfile\n")]
    assert skipped == []
    docs, _ = _read(tmp_path, documents="lines")
    assert docs == [("a.txt:1", "first file"), ("b/two.txt:1", "second"), ("b/two.txt:2", "file")]


def test_jsonl_lines_with_problems_are_reported_by_line_and_the_rest_read(tmp_path):
    lines = [
        json.dumps({"text": "one"}),
        "{not json",
        json.dumps({"body": "no text key"}),
        json.dumps({"text": 7}),
        json.dumps({"text": "   "}),
        "",
        json.dumps({"text": "six"}),
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    docs, skipped = _read(tmp_path)
    assert docs == [("c.jsonl:1", "one"), ("c.jsonl:7", "six")]
    assert [s.path for s in skipped] == ["c.jsonl:2", "c.jsonl:3", "c.jsonl:4", "c.jsonl:5"]
    assert skipped[0].reason.startswith("is not JSON")
    assert "--text-key" in skipped[1].reason
    assert "int, not a string" in skipped[2].reason
    assert skipped[3].reason == "the document is empty"
    docs, skipped = _read(tmp_path, text_key="body")
    assert docs == [("c.jsonl:3", "no text key")]
    with pytest.raises(DecodeError, match="c.jsonl:2"):
        _read(tmp_path, strict=True)


def test_undecodable_file_and_line_are_reported(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    (tmp_path / "lines.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n{"text": "fine"}\n')
    docs, skipped = _read(tmp_path)
    assert docs == [("lines.jsonl:1", "ok"), ("lines.jsonl:3", "fine")]
    assert [s.path for s in skipped] == ["bad.txt", "lines.jsonl:2"]
    assert all("does not decode as utf-8" in s.reason for s in skipped)
    docs, skipped = _read(tmp_path, encoding="latin-1")
    assert ("bad.txt", "caf\xe9") in docs and skipped == []


def test_compressed_files_are_read_and_damaged_ones_reported(tmp_path):
    import zstandard

    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "from gzip"}) + "\n")
    (tmp_path / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"from zstd"))
    (tmp_path / "c.txt.gz").write_bytes(b"not gzip at all")
    docs, skipped = _read(tmp_path)
    assert docs == [("a.jsonl.gz:1", "from gzip"), ("b.txt.zst", "from zstd")]
    assert [s.path for s in skipped] == ["c.txt.gz"] and "cannot be read" in skipped[0].reason


def test_parquet_and_saved_hugging_face_dataset(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["p one", None, "p three"], "n": [1, 2, 3]}), tmp_path / "t.parquet")
    docs, skipped = _read(tmp_path)
    assert docs == [("t.parquet:1", "p one"), ("t.parquet:3", "p three")]
    assert [s.path for s in skipped] == ["t.parquet:2"]
    saved = tmp_path / "hf"
    datasets.Dataset.from_dict({"content": ["h one", "h two"]}).save_to_disk(str(saved))
    docs, _ = _read(saved, text_key="content")
    assert [t for _, t in docs] == ["h one", "h two"]
    docs, skipped = _read(saved)
    assert docs == [] and "has no column 'text'" in skipped[0].reason


def test_a_folder_without_corpus_files_is_refused(tmp_path):
    (tmp_path / "x.png").write_bytes(b"")
    with pytest.raises(InputError, match="holds no corpus files"):
        corpus_files(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        corpus_files(tmp_path / "missing")
