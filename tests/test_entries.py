"""packer.spec.entries: the manifest's entries for a variable-length field (``TextField``) and for one
file of a shard (``FileEntry``), each read back as it was written."""

from __future__ import annotations

import json

import pytest

from packer.spec.entries import FileEntry, TextField
from packer.spec.field_kinds import KINDS

# one field of every kind, as the converter makes them (a name of the kind's own where it has one)
FIELDS = {
    "text": TextField("text", "text", encoding="cp1252", allow_missing=True),
    "tokens": TextField("text", "tokens", {"file": "bpe.json", "vocab_size": 512, "pad_id": 0}, "utf-8"),
    "json": TextField("json", "json", allow_missing=True),
    "detection": TextField("target", "detection"),
    "mask": TextField("mask", "mask", info={"ignore_index": 255, "source": "masks"}),
    "geometry": TextField("geometry", "geometry"),
}
SHA = "ab" * 32


def test_every_kind_has_a_field_here():
    assert set(FIELDS) == set(KINDS)


@pytest.mark.parametrize("kind", list(FIELDS))
def test_a_field_reads_back_from_its_manifest_entry_through_json(kind):
    field = FIELDS[kind]
    entry = json.loads(json.dumps(field.to_dict()))
    assert entry["kind"] == kind
    assert TextField.from_dict(field.name, entry) == field


@pytest.mark.parametrize("kind", ["text", "tokens", "json"])
def test_fields_read_from_files_record_how_they_were_read(kind):
    read = TextField(FIELDS[kind].name, kind, FIELDS[kind].tokenizer, "latin-1", allow_missing=True)
    entry = read.to_dict()
    assert (entry["source_encoding"], entry["missing"]) == ("latin-1", "stored empty")
    skipped = TextField(read.name, kind, read.tokenizer).to_dict()
    assert (skipped["source_encoding"], skipped["missing"]) == ("utf-8", "skipped")
    assert TextField.from_dict(read.name, skipped).allow_missing is False


def test_an_entry_without_the_source_keys_reads_as_utf8_and_skipped():
    old = {"kind": "text", "dtype": "str", "encoding": "utf-8", "shape": []}  # written before they were recorded
    assert TextField.from_dict("text", old) == TextField("text", "text", None, "utf-8", False)


def test_only_a_mask_keeps_its_record_and_only_its_own_keys():
    entry = {**FIELDS["mask"].to_dict(), "unrelated": 1}
    assert TextField.from_dict("mask", entry).info == {"ignore_index": 255, "source": "masks"}
    assert all(TextField.from_dict(f.name, f.to_dict()).info is None for k, f in FIELDS.items() if k != "mask")


def test_tokens_are_four_bytes_each_and_every_other_kind_one():
    assert {k: f.itemsize for k, f in FIELDS.items()} == {
        "text": 1,
        "tokens": 4,
        "json": 1,
        "detection": 1,
        "mask": 1,
        "geometry": 1,
    }
    assert FIELDS["tokens"].kind_of is KINDS["tokens"]


def test_a_file_entry_records_its_structure_checksum_only_when_it_has_one():
    plain = FileEntry("shard-00000-0123456789ab.images.npy", 30848, SHA)
    assert plain.to_dict() == {"path": "shard-00000-0123456789ab.images.npy", "bytes": 30848, "sha256": SHA}
    lmdb = FileEntry("shard-00000-0123456789ab.lmdb", 1 << 20, SHA, 0)  # a checksum of 0 is still one
    assert lmdb.to_dict()["structure_crc32"] == 0
    for entry in (plain, lmdb, FileEntry("a.lmdb", 8192, SHA, 0xFFFFFFFF)):
        assert FileEntry.from_dict(json.loads(json.dumps(entry.to_dict()))) == entry
