"""Columns of per-sample values: equal to the lists they pack, in a few bytes a value."""

import pickle

import numpy as np
import pytest

from packer.columns import IntColumn, StrColumn
from packer.records import ShardResult


def test_strings_of_varying_length():
    values = ["cat/1.jpg", "dög/é.png", "", "a"]
    col = StrColumn.of(values)
    assert col == values and list(col) == values and len(col) == 4
    assert col[1] == "dög/é.png" and col[-1] == "a" and col[1:3] == values[1:3]
    assert col.uniform_width() == 0
    with pytest.raises(IndexError):
        col[4]


def test_digests_need_no_offsets():
    digests = [f"{i:032x}" for i in range(1000)]
    col = StrColumn.of(digests)
    assert col.offsets is None and col.uniform_width() == 32
    assert col == digests and col.joined() == "".join(digests)
    assert len(col.blob) == 32 * 1000


def test_empty_and_refused_values():
    assert StrColumn.of([]) == [] and len(StrColumn.of([])) == 0
    with pytest.raises(TypeError, match="int 3"):
        StrColumn.of(["a", 3])


def test_int_column():
    col = IntColumn.of([3, -1, 7])
    assert col == [3, -1, 7] and col[1] == -1 and col[1:] == [-1, 7]
    assert np.asarray(col, dtype=np.int64).tolist() == [3, -1, 7]
    assert pickle.loads(pickle.dumps(col)) == [3, -1, 7]


def test_packed_result_round_trips_through_its_record():
    """A result as the parent holds it, and as --resume reads it back from its JSON record."""
    r = ShardResult("shard-00000", 2, [], keys=["a/1.jpg", "b/é.jpg"], labels=[0, 1],
                    digests=["0" * 32, "f" * 32]).packed()
    assert isinstance(r.keys, StrColumn) and isinstance(r.labels, IntColumn)
    d = r.to_dict()
    assert (d["keys"], d["labels"], d["digests"]) == (["a/1.jpg", "b/é.jpg"], [0, 1], ["0" * 32, "f" * 32])
    back = ShardResult.from_dict(d)
    assert back.keys == r.keys and back.labels == r.labels and back.digests == r.digests
    assert pickle.loads(pickle.dumps(r)).keys == ["a/1.jpg", "b/é.jpg"]
