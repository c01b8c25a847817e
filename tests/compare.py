"""Comparing two outputs as the converter promises them equal (shared by the executor tests)."""

from __future__ import annotations

from pathlib import Path

from test_pipeline import assert_rows_equal, stored

from packer.manifest import read_manifest


def files_of(out: Path) -> dict[str, bytes]:
    """Every file of an output folder, by name."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def assert_same_output(a: Path, b: Path) -> None:
    """Byte for byte for npy, hdf5 and wds; for lmdb (whose files may differ in free pages) the
    same samples and the same manifest but for the files' checksums."""
    ma, mb = read_manifest(a), read_manifest(b)
    if ma.format != "lmdb":
        assert files_of(a) == files_of(b)
        return
    assert_rows_equal(stored(b, mb), stored(a, ma))
    assert ma.to_dict() | {"shards": [(s.name, s.samples) for s in ma.shards]} == \
        mb.to_dict() | {"shards": [(s.name, s.samples) for s in mb.shards]}
