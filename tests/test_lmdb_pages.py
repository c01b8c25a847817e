"""packer.spec.lmdb_pages: the checksum of what LMDB follows to find a record, on real LMDB files written
with the ``lmdb`` library: the same for the same bytes, changed by damage to a meta, branch or leaf page,
unchanged by a value's own bytes, and a number (never an exception) for a file that is not LMDB."""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import pytest

from packer.spec.lmdb_pages import structure_crc32

PAGE = 4096
IMAGES = [bytes([i]) * 9000 for i in range(4)]  # each in its own run of overflow pages


def write_lmdb(path: Path, keys: int = 600) -> Path:
    """``keys`` small records (several leaf pages under one branch page) and four large ones."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 26, lock=False)
    with env.begin(write=True) as txn:
        for i in range(keys):
            txn.put(b"%08d.key" % i, b"k" * 40)
        for i, image in enumerate(IMAGES):
            txn.put(b"%08d.image" % i, image)
    env.close()
    return path


def tree_pages(path: Path) -> dict[int, int]:
    """Page number -> flags (0x01 branch, 0x02 leaf) of each page whose header names it; in a file
    written in one transaction, every one is in the tree."""
    data = path.read_bytes()
    pages = {}
    for number in range(2, len(data) // PAGE):
        at = number * PAGE
        flags = int.from_bytes(data[at + 10 : at + 12], "little")
        if int.from_bytes(data[at : at + 8], "little") == number and flags in (0x01, 0x02):
            pages[number] = flags
    return pages


def flipped(path: Path, at: int, out: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    out.write_bytes(bytes(data))
    return out


@pytest.fixture
def db(tmp_path) -> Path:
    return write_lmdb(tmp_path / "shard.lmdb")


def test_the_file_has_the_pages_this_test_damages(db):
    env = lmdb.open(str(db), subdir=False, readonly=True, lock=False)
    stat = env.stat()
    env.close()
    assert stat["psize"] == PAGE and stat["depth"] == 2 and stat["overflow_pages"] > 0
    pages = tree_pages(db)
    assert list(pages.values()).count(0x01) == stat["branch_pages"] == 1
    assert list(pages.values()).count(0x02) == stat["leaf_pages"] > 1


def test_the_checksum_is_stable_for_the_same_bytes_anywhere(db, tmp_path):
    first = structure_crc32(db)
    assert structure_crc32(db) == first and structure_crc32(str(db)) == first
    shutil.copyfile(db, tmp_path / "elsewhere.lmdb")
    assert structure_crc32(tmp_path / "elsewhere.lmdb") == first


def test_another_database_has_another_checksum(db, tmp_path):
    assert structure_crc32(write_lmdb(tmp_path / "fewer.lmdb", keys=599)) != structure_crc32(db)


def test_a_flipped_byte_of_a_page_lmdb_follows_changes_it(db, tmp_path):
    intact = structure_crc32(db)
    places = {"meta 0 root": 128, "meta 1 root": PAGE + 128, "meta 1 txnid": PAGE + 144}
    for number, flags in tree_pages(db).items():
        kind = "branch" if flags == 0x01 else "leaf"
        places[f"{kind} {number} header"] = number * PAGE + 12  # its node pointers' end
        places[f"{kind} {number} last node"] = number * PAGE + PAGE - 1
    for name, at in places.items():
        assert structure_crc32(flipped(db, at, tmp_path / "damaged.lmdb")) != intact, name


def test_a_flipped_byte_of_a_stored_value_is_left_to_the_sample_checksum(db, tmp_path):
    data = db.read_bytes()
    inside = data.index(IMAGES[2]) + 4500
    assert structure_crc32(flipped(db, inside, tmp_path / "pixels.lmdb")) == structure_crc32(db)


def test_a_root_past_the_end_of_the_file_is_recorded_not_followed(db, tmp_path):
    data = bytearray(db.read_bytes())
    for meta in (0, PAGE):
        data[meta + 128 : meta + 136] = (1 << 40).to_bytes(8, "little")
    (tmp_path / "far.lmdb").write_bytes(bytes(data))
    assert structure_crc32(tmp_path / "far.lmdb") != structure_crc32(db)


def test_an_empty_database_and_a_file_cut_short_give_a_checksum(db, tmp_path):
    empty = lmdb.open(str(tmp_path / "empty.lmdb"), subdir=False, map_size=1 << 20, lock=False)
    with empty.begin(write=True) as txn:
        txn.put(b"a", b"1")
        txn.delete(b"a")
    empty.close()
    assert structure_crc32(tmp_path / "empty.lmdb") != structure_crc32(db)
    (tmp_path / "cut.lmdb").write_bytes(db.read_bytes()[: PAGE + 100])  # less than its two meta pages
    assert structure_crc32(tmp_path / "cut.lmdb") != structure_crc32(db)


@pytest.mark.parametrize(
    "content",
    [b"", b"not an lmdb file", bytes(3 * PAGE), (b"\0" * 40 + (1000).to_bytes(4, "little")) * 300],
    ids=["empty", "text", "zeros", "page size not a power of two"],
)
def test_a_file_that_is_not_lmdb_gets_a_checksum_no_lmdb_file_has(db, tmp_path, content):
    path = tmp_path / "other.lmdb"
    path.write_bytes(content)
    assert structure_crc32(path) == structure_crc32(path) != structure_crc32(db)


def test_a_file_that_cannot_be_read_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        structure_crc32(tmp_path / "missing.lmdb")
