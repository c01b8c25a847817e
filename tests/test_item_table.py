"""ItemTable: source items in flat buffers, equal item for item to the SourceItems they stand for."""

import pickle

import numpy as np
import pytest

from packer.config import ConvertConfig
from packer.item_table import IMAGES, PAIRED, SINGLE, TableBuilder
from packer.records import UNLABELLED, ShardTask, SourceItem
from packer.resume import plan_fingerprint

BASE = "/data/src/"
KEYS = ["cat/1.jpg", "cat/2.jpg", "dög/é.png", "dog/4.jpg", "dog/5.jpg"]


def images(labels=(0, 0, 1, 1, 1)):
    b = TableBuilder(BASE)
    for key, label in zip(KEYS, labels):
        b.add(key, label)
    return b.build()


def expected(i, label):
    return SourceItem(i, BASE + KEYS[i], KEYS[i], label)


def test_image_items_are_made_on_access():
    t = images()
    assert len(t) == 5
    assert list(t) == [expected(i, label) for i, label in enumerate([0, 0, 1, 1, 1])]
    assert t[-1] == expected(4, 1) and t[2].relpath == "dög/é.png"
    with pytest.raises(IndexError):
        t[5]


def test_unlabelled_tables_hold_no_labels():
    t = images(labels=(UNLABELLED,) * 5)
    assert t.labels is None and {it.label for it in t} == {UNLABELLED}


def test_text_and_paired_records():
    text = TableBuilder(BASE, SINGLE, ("text",))
    text.add("a/1.txt", 3)
    assert list(text.build()) == [SourceItem(0, BASE + "a/1.txt", "a/1.txt", 3, (("text", BASE + "a/1.txt"),))]
    paired = TableBuilder(BASE, PAIRED, ("image", "text"))
    paired.add("a/1", 0, (("image", "a/1.jpg"), ("text", "a/1.txt")))
    paired.add("a/2", 0, (("image", "a/2.png"),))  # --allow-missing: no text file
    assert list(paired.build()) == [
        SourceItem(0, BASE + "a/1.jpg", "a/1", 0, (("image", BASE + "a/1.jpg"), ("text", BASE + "a/1.txt"))),
        SourceItem(1, BASE + "a/2.png", "a/2", 0, (("image", BASE + "a/2.png"),)),
    ]


def test_slices_and_takes_are_views_that_keep_each_items_index():
    t = images()
    part = t[1:4]
    assert part.blob is t.blob and isinstance(part.rows, range)
    assert list(part) == [expected(i, label) for i, label in [(1, 0), (2, 1), (3, 1)]]
    assert list(part[1:]) == [expected(2, 1), expected(3, 1)]
    shuffled = t.take([4, 0, 2])
    assert [it.index for it in shuffled] == [4, 0, 2] and shuffled.blob is t.blob
    assert [it.index for it in shuffled.take([2, 0])] == [2, 4]
    assert list(t[::2]) == [t[0], t[2], t[4]]


def test_compact_copies_only_its_records():
    t = images()
    part = t.take([3, 1]).compact()
    assert len(part.blob) == len((KEYS[3] + KEYS[1]).encode())
    assert list(part) == [expected(3, 1), expected(1, 0)]
    assert [it.index for it in t.take([3, 1]).compact(renumber=True)] == [0, 1]


def test_pickled_view_carries_its_own_records_only():
    """What spawn and Ray send of a shard's items: its records, not the whole discovery."""
    b = TableBuilder(BASE)
    for i in range(10_000):
        b.add(f"c/{i:06d}.jpg", i % 7)
    t = b.build()
    part = t[5000:5003]
    data = pickle.dumps(part)
    assert len(data) < 2000
    back = pickle.loads(data)
    assert back == part and [it.index for it in back] == [5000, 5001, 5002]


def test_equal_to_lists_and_tuples_of_the_same_items():
    t = images()
    assert t == list(t) and t == tuple(t) and list(t) == t
    assert t[:2] != tuple(t)
    assert t != "not items"


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("mode", [IMAGES, SINGLE])
def test_fingerprint_of_a_table_equals_that_of_its_items(mode, shuffled):
    """The fast path of plan_fingerprint gives the bytes the items give (an interrupted run resumes)."""
    b = TableBuilder(BASE, mode, ("image",) if mode == IMAGES else ("text",))
    for i, key in enumerate(KEYS * 40):
        b.add(f"{i}/{key}", i % 3 - 1)
    t = b.build()
    if shuffled:
        t = t.take(np.random.default_rng(0).permutation(len(t)))
    config = ConvertConfig(format="npy")
    as_tables = [ShardTask("shard-00000", t[:77]), ShardTask("shard-00001", t[77:])]
    as_tuples = [ShardTask(task.name, tuple(task.items)) for task in as_tables]
    assert plan_fingerprint(config, as_tables) == plan_fingerprint(config, as_tuples)
