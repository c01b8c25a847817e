"""Columns of per-sample values: equal to the lists they pack, in a few bytes a value."""

import json
import pickle

import numpy as np
import pytest

from packer.columns import HexColumn, IntColumn, StrColumn
from packer.records import ShardResult


def test_strings_of_varying_length():
    values = ["cat/1.jpg", "dög/é.png", "", "a"]
    col = StrColumn.of(values)
    assert col == values and list(col) == values and len(col) == 4
    assert col[1] == "dög/é.png" and col[-1] == "a" and col[1:3] == values[1:3]
    assert col.offsets is not None  # values of several lengths: bounded by offsets
    with pytest.raises(IndexError):
        col[4]


def test_digests_need_no_offsets():
    digests = [f"{i:032x}" for i in range(1000)]
    col = StrColumn.of(digests)
    assert col.offsets is None and col.width == 32
    assert col == digests and col.blob == "".join(digests).encode()
    assert len(col.blob) == 32 * 1000


def test_hex_digests_are_held_as_their_bytes():
    digests = [f"{i:032x}" for i in range(1000)]
    col = HexColumn.of(digests)
    assert isinstance(col, HexColumn) and col.width == 16 and len(col.raw) == 16 * 1000
    assert col == digests and col[7] == digests[7] and col[-1] == digests[-1] and col[2:4] == digests[2:4]
    assert pickle.loads(pickle.dumps(col)) == digests


@pytest.mark.parametrize("values", [["ABCD", "abcd"], ["abc", "def"], ["ab", "abcd"], ["zz", "yy"], [None, "ab"]])
def test_other_digests_stay_strings(values):
    """Digests an older packer recorded, or anything else, are kept as they are, never changed."""
    if None in values:
        with pytest.raises(TypeError):
            HexColumn.of(values)
        return
    col = HexColumn.of(values)
    assert isinstance(col, StrColumn) and col == values


def test_empty_and_refused_values():
    assert StrColumn.of([]) == [] and len(StrColumn.of([])) == 0
    with pytest.raises(TypeError, match="int 3"):
        StrColumn.of(["a", 3])


def test_int_column():
    col = IntColumn.of([3, -1, 7])
    assert col == [3, -1, 7] and col[1] == -1 and col[1:] == [-1, 7] and col.values.dtype == np.int32
    assert IntColumn.of([2**40]).values.dtype == np.int64 and IntColumn.of([2**40]) == [2**40]
    assert np.asarray(col, dtype=np.int64).tolist() == [3, -1, 7]
    assert pickle.loads(pickle.dumps(col)) == [3, -1, 7]


def test_packed_result_round_trips_through_its_record():
    """A result as the parent holds it, and as --resume reads it back from its JSON record."""
    r = ShardResult(
        "shard-00000", 2, [], keys=["a/1.jpg", "b/é.jpg"], labels=[0, 1], digests=["0" * 32, "f" * 32]
    ).packed()
    assert isinstance(r.keys, StrColumn) and isinstance(r.labels, IntColumn) and isinstance(r.digests, HexColumn)
    d = r.to_dict()
    assert (d["keys_nul"], d["count"], d["digests_hex"]) == ("a/1.jpg\0b/é.jpg", 2, "0" * 32 + "f" * 32)
    back = ShardResult.from_dict(d)
    assert back.keys == r.keys and back.labels == r.labels and back.digests == r.digests
    assert pickle.loads(pickle.dumps(r)).keys == ["a/1.jpg", "b/é.jpg"]


@pytest.mark.parametrize(
    "keys, labels, digests",
    [
        ([], [], []),
        ([""], [0], ["ab" * 16]),
        (["a\0b", "c"], [1, 2], ["ab" * 16, "cd" * 16]),  # a key with a NUL (a Parquet column): a list
        (["x", "y"], [2**40, -1], ["sha-256-ish", "other"]),  # past int32, digests of another kind: lists
    ],
)
def test_records_of_every_kind_round_trip(keys, labels, digests):
    r = ShardResult("s", len(keys), [], keys=keys, labels=labels, digests=digests).packed()
    back = ShardResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert (list(back.keys), list(back.labels), list(back.digests)) == (keys, labels, digests)


def test_records_of_older_packers_are_read():
    """0.7.0 and before wrote JSON lists: their interrupted runs still resume."""
    d = ShardResult("s", 2, [], keys=["a", "b"], labels=[0, 1], digests=["0" * 32, "1" * 32]).packed().to_dict()
    for new in ("keys_nul", "count", "labels_i32", "digests_hex"):
        d.pop(new)
    d.update(keys=["a", "b"], labels=[0, 1], digests=["0" * 32, "1" * 32])
    back = ShardResult.from_dict(d)
    assert back.keys == ["a", "b"] and back.labels == [0, 1] and back.digests == ["0" * 32, "1" * 32]


def test_results_kept_in_their_records(tmp_path, monkeypatch):
    """After its record is written, the parent holds a shard's result without its per-sample values:
    they are read back from the record when asked for, and duplicates are found the same way."""
    from packer import recorded_columns
    from packer.output.assemble import _add_labels, class_counts, find_duplicates
    from packer.output.files import record_shard
    from packer.recorded_columns import RecordedColumn

    def result(name, keys, digests):
        return ShardResult(
            name, len(keys), [], keys=keys, labels=[k.startswith("b") for k in keys], digests=digests
        ).packed()

    held = [
        result("shard-00000", ["a/1", "a/2"], ["1" * 32, "2" * 32]),
        result("shard-00001", ["b/1", "b/2"], ["3" * 32, "1" * 32]),
    ]
    kept = [result(r.name, list(r.keys), list(r.digests)) for r in held]
    kept = [record_shard(tmp_path, r) for r in kept]
    assert all(isinstance(c, RecordedColumn) for r in kept for c in (r.keys, r.labels, r.digests))
    assert kept[1].keys == ["b/1", "b/2"] and kept[1].labels == [1, 1] and kept[0].digests[1] == "2" * 32
    assert find_duplicates(kept) == find_duplicates(held) == [["a/1", "b/2"]]
    assert class_counts(kept, 2) == class_counts(held, 2) == [2, 2]
    recorded_columns._LastRecord.cache_clear()
    recorded_columns._recorded.cache_clear()
    parsed = []
    real = recorded_columns.json.loads
    monkeypatch.setattr(recorded_columns.json, "loads", lambda text: parsed.append(1) or real(text))
    counts = np.zeros(2, np.int64)
    assert find_duplicates(kept, lambda r: _add_labels(counts, r)) == [["a/1", "b/2"]]
    assert counts.tolist() == [2, 2]
    assert len(parsed) == 2  # labels and digests from the side files; a record parsed only for a duplicate's keys
    record_shard(tmp_path, result("shard-00000", ["a/1"], ["1" * 32]))  # the record replaced behind its back
    with pytest.raises(ValueError, match="no longer holds the 2 samples"):
        list(kept[0].keys)


@pytest.mark.parametrize("values", [[], ["a"], ["ab", "cd", "ef"], ["a", "", "dög/é", "xyz"], [""], ["", ""]])
def test_joined_by_nul_equals_the_join(values):
    assert StrColumn.of(values).joined_by_nul() == "\0".join(values)
    assert StrColumn.from_joined("\0".join(values), len(values)) == values
    assert StrColumn.of(["a\0b", "c"]).joined_by_nul() is None


def test_joined_values_must_match_their_count():
    with pytest.raises(ValueError, match="2 values where 3"):
        StrColumn.from_joined("a\0b", 3)
    with pytest.raises(ValueError, match="none were counted"):
        StrColumn.from_joined("a", 0)
