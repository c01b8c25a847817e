"""The hostile corpus through every format: good files all arrive, bad ones are each reported."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FORMATS
from hostile import GOOD, MAX_PIXELS, make_hostile_corpus

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.output.report import REPORT_NAME
from packer.pixels import read
from packer.pixels.preprocess import load_image
from packer.pixels.read import read_source
from packer.spec.errors import DecodeError
from packer.spec.manifest import read_manifest
from readers import open_dataset

PRE = PreprocessConfig(size=(24, 16), max_pixels=MAX_PIXELS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("hostile") / "src"
    return root, make_hostile_corpus(root)


@pytest.mark.parametrize("fmt", FORMATS)
def test_good_files_arrive_and_every_bad_file_is_reported(corpus, tmp_path, fmt):
    root, expect = corpus
    out = tmp_path / fmt
    result = convert(root, out, ConvertConfig(fmt, PRE), workers=2)
    m = read_manifest(out)
    good = sorted(k for k, v in expect.items() if v == GOOD)
    bad = {k: v for k, v in expect.items() if v != GOOD}

    ds = open_dataset(out, return_meta=True, normalize=False)
    keys = [meta["key"] for _, _, meta in ds] if fmt == "wds" else [ds[i][2]["key"] for i in range(len(ds))]
    assert keys == good
    reasons = {s["path"]: s["reason"] for s in m.skipped}
    assert sorted(reasons) == sorted(bad)
    for path, prefix in bad.items():
        assert reasons[path].startswith(prefix), (path, reasons[path])
    assert m.samples + len(m.skipped) == len(expect) == m.source["files"]
    assert len(result.skipped) == len(bad)
    assert m.classes == ["bad", "empty_class", "good"] and m.class_counts == [0, 0, len(good)]
    assert m.duplicates == [["good/dup_a.png", "good/dup_b.png"], ["good/image.bmp", "good/link.png"]]
    assert m.source["ignored"] == {".txt": 1}  # hidden files, AppleDouble and Thumbs.db are litter
    report = (out / REPORT_NAME).read_text()
    assert "empty_class" in report and "bad/fifo.jpg: not a regular file" in report


def test_every_good_file_is_stored_exactly_as_preprocessed(corpus, tmp_path):
    root, expect = corpus
    out = tmp_path / "npy"
    convert(root, out, ConvertConfig("npy", PRE), workers=1)
    ds = open_dataset(out, return_meta=True, normalize=False)
    for i in range(len(ds)):
        image, _, meta = ds[i]
        want = load_image(root / meta["key"], PRE)
        assert np.array_equal(image.permute(1, 2, 0).numpy(), want), meta["key"]


def test_hostile_details(corpus):
    root, _ = corpus
    pre = PreprocessConfig(size=None, resize="none", max_pixels=MAX_PIXELS)
    assert load_image(root / "good/exif_rotated.jpg", pre).shape == (48, 32, 3)  # rotated: 32 wide, 48 high
    assert load_image(root / "good/wide_5000x10.png", PRE).shape == (16, 24, 3)
    assert load_image(root / "good/tiny_1x1.png", PRE).shape == (16, 24, 3)
    gray = load_image(root / "good/gray16.png", PreprocessConfig(size=None, resize="none", mode="L"))
    assert gray.max() == 255 and gray.min() == 0  # scaled from 16 bits, not clipped
    first = load_image(root / "good/animated.gif", pre)
    assert first.shape == (32, 48, 3)


def test_unreadable_file_reason(tmp_path, monkeypatch):
    path = tmp_path / "locked.jpg"
    path.write_bytes(b"\xff\xd8\xff")

    def deny(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(read.os, "open", deny)  # as root, a mode of 000 would not stop the read
    with pytest.raises(DecodeError, match="cannot read file: Permission denied"):
        read_source(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not hasattr(socket, "AF_UNIX"), reason="POSIX FIFOs and sockets")
def test_read_source_refuses_what_is_not_a_regular_file(tmp_path):
    fifo, sock, folder = tmp_path / "fifo.jpg", tmp_path / "sock.jpg", tmp_path / "folder.jpg"
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    folder.mkdir()
    (tmp_path / "link.jpg").symlink_to(fifo)

    def hung(*args):
        pytest.fail("read_source waited on a FIFO")

    previous = signal.signal(signal.SIGALRM, hung)  # a FIFO opened for reading would wait for a writer
    signal.alarm(10)
    try:
        for path in (fifo, sock, folder, tmp_path / "link.jpg"):
            with pytest.raises(DecodeError, match="not a regular file"):
                read_source(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        server.close()


def test_read_source_reads_a_file_that_changed_size_to_its_end(monkeypatch):
    """The first read is sized from fstat; a file that grew or shrank since is still read to its end,
    and one that grew past the limit is read no further than a chunk past it."""
    monkeypatch.setattr(read, "READ_CHUNK", 4)
    for content, size, limit, expect in (
        (b"abcdefgh", 3, None, b"abcdefgh"),
        (b"abc", 2, None, b"abc"),
        (b"abc", 3, None, b"abc"),
        (b"abcdefghijklmnop", 3, 6, b"abcdefgh"),
        (b"abcdefghij", 9, None, b"abcdefghij"),
    ):
        r, w = os.pipe()
        os.write(w, content)
        os.close(w)
        try:
            assert read._read_to_end(r, size, limit) == expect
        finally:
            os.close(r)


def test_read_source_returns_the_whole_file_and_checks_its_size(tmp_path):
    path = tmp_path / "a.jpg"
    data = bytes(range(256)) * 1000
    path.write_bytes(data)
    assert read_source(path) == data
    with pytest.raises(DecodeError, match="file too large: 256,000 bytes"):
        read_source(path, max_bytes=255_999)
    path.write_bytes(b"")
    with pytest.raises(DecodeError, match="empty file"):
        read_source(path)


def test_strict_stops_at_first_bad_file_and_writes_nothing(corpus, tmp_path):
    root, _ = corpus
    out = tmp_path / "strict"
    result = CliRunner().invoke(
        cli,
        [
            "convert",
            str(root),
            "-f",
            "lmdb",
            "-o",
            str(out),
            "--strict",
            "-q",
            "--size",
            "24x16",
            "--max-pixels",
            str(MAX_PIXELS),
        ],
    )
    assert result.exit_code == 1
    assert "--strict" in result.output and "bad/" in result.output
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_summary_counts_per_reason(corpus, tmp_path):
    root, expect = corpus
    result = CliRunner().invoke(
        cli,
        [
            "convert",
            str(root),
            "-f",
            "wds",
            "-o",
            str(tmp_path / "o"),
            "-q",
            "--size",
            "24x16",
            "--max-pixels",
            str(MAX_PIXELS),
        ],
    )
    assert result.exit_code == 0, result.output
    bad = len([v for v in expect.values() if v != GOOD])
    assert f"skipped {bad} file(s)" in result.output
    for kind in ("1 x empty file", "2 x corrupt or truncated image", "1 x too many pixels", "1 x not a regular file"):
        assert kind in result.output
    assert "1 class(es) have no samples" not in result.output  # two: bad and empty_class
    assert "2 class(es) have no samples: bad, empty_class" in result.output
    assert "identical bytes" in result.output
