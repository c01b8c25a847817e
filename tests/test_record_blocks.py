"""RecordBlocks: records in compressed blocks, read back equal in every way they are read."""

import pickle

import numpy as np
import pytest

from packer.sources.record_blocks import BLOCK, RecordBlocks


def names(n, start=0):
    return [f"c{i % 7:02d}/{'ü' if i % 5 == 0 else ''}{i:07d}.jpg" for i in range(start, start + n)]


def blocks_of(records):
    out = RecordBlocks()
    out.add_all(r.encode("utf-8") for r in records)
    return out


def test_records_read_back_by_position_run_take_and_iteration():
    recs = names(3 * BLOCK + 5)
    b = blocks_of(recs)
    assert len(b) == len(recs) and list(b) == recs
    assert [b.record(i) for i in range(len(recs))] == recs
    assert b.run(BLOCK - 3, 2 * BLOCK + 4) == recs[BLOCK - 3 : 2 * BLOCK + 4]
    rows = np.random.default_rng(0).permutation(len(recs))[:50]
    assert b.take(rows) == [recs[i] for i in rows]
    assert b.take(np.arange(10, 90)) == recs[10:90]
    with pytest.raises(IndexError):
        b.record(len(recs))


def test_sorted_paths_are_held_in_a_few_bytes_each():
    recs = sorted(f"c{i % 100:03d}/{i:07d}.jpg" for i in range(20_000))
    b = blocks_of(recs)
    assert b.nbytes < 5 * len(recs) < sum(map(len, recs)) / 2


def test_extend_joins_whole_blocks_and_cut_ones():
    a, other = blocks_of(names(BLOCK + 3)), blocks_of(names(3 * BLOCK, start=1000))
    a.extend(other, 5, 2 * BLOCK + 7)
    assert list(a) == names(BLOCK + 3) + names(3 * BLOCK, start=1000)[5 : 2 * BLOCK + 7]
    a.add(b"last")
    assert a.record(len(a) - 1) == "last" and len(a) == BLOCK + 3 + 2 * BLOCK + 2 + 1


def test_arrays_and_pickles_round_trip_and_damage_is_refused():
    recs = names(2 * BLOCK + 1)
    b = blocks_of(recs)
    data, ends, rows = b.arrays()
    assert list(RecordBlocks.from_arrays(bytes(data), ends, rows)) == recs
    assert list(pickle.loads(pickle.dumps(b))) == recs
    with pytest.raises(ValueError):
        RecordBlocks.from_arrays(bytes(data)[:-1], ends, rows)
    with pytest.raises(ValueError):
        RecordBlocks.from_arrays(bytes(data), ends, rows[::-1].copy())
    assert len(RecordBlocks.from_arrays(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))) == 0
