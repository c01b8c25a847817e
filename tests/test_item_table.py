"""ItemTable: source items in compact buffers, equal item for item to the SourceItems they stand for."""

import pickle

import numpy as np
import pytest

from packer.config import ConvertConfig
from packer.records import UNLABELLED, ShardTask, SourceItem
from packer.run.resume import plan_fingerprint
from packer.sources.item_table import IMAGES, PAIRED, SINGLE, LabelRuns, TableBuilder

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
    assert part.records is t.records and isinstance(part.rows, range)
    assert list(part) == [expected(i, label) for i, label in [(1, 0), (2, 1), (3, 1)]]
    assert list(part[1:]) == [expected(2, 1), expected(3, 1)]
    shuffled = t.take([4, 0, 2])
    assert [it.index for it in shuffled] == [4, 0, 2] and shuffled.records is t.records
    assert [it.index for it in shuffled.take([2, 0])] == [2, 4]
    assert list(t[::2]) == [t[0], t[2], t[4]]


def test_compact_copies_only_its_records():
    t = images()
    part = t.take([3, 1]).compact()
    assert list(part.records) == [KEYS[3], KEYS[1]] and part.records is not t.records
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


@pytest.mark.parametrize("mode", [IMAGES, SINGLE])
def test_fingerprint_of_a_table_equals_that_of_its_items(mode):
    """The fast path of plan_fingerprint gives the bytes the items give (an interrupted run resumes)."""
    t = numbered(mode)
    config = ConvertConfig(format="npy")
    as_tables = [ShardTask("shard-00000", t[:77]), ShardTask("shard-00001", t[77:])]
    as_tuples = [ShardTask(task.name, tuple(task.items)) for task in as_tables]
    assert plan_fingerprint(config, as_tables) == plan_fingerprint(config, as_tuples)


def numbered(mode=IMAGES, labels=lambda i: i % 3 - 1):
    b = TableBuilder(BASE, mode, ("image",) if mode == IMAGES else ("text",))
    for i, key in enumerate(KEYS * 40):
        b.add(f"{i}/{key}", labels(i))
    return b.build()


def shuffled_fingerprint(t, seed=0):
    t = t.take(np.random.default_rng(seed).permutation(len(t)))
    return plan_fingerprint(
        ConvertConfig(format="npy"), [ShardTask("shard-00000", t[:77]), ShardTask("shard-00001", t[77:])]
    )


def test_fingerprint_of_a_shuffled_plan_holds_its_order_and_every_item():
    """A shuffled plan's shards are hashed as their rows plus the table read in order (reading each
    item where its shard wants it decompresses a block per item): still a fingerprint of the order,
    the keys and the labels."""
    t = numbered()
    assert shuffled_fingerprint(t) == shuffled_fingerprint(numbered())
    assert shuffled_fingerprint(t, seed=1) != shuffled_fingerprint(t)
    assert shuffled_fingerprint(numbered(labels=lambda i: i % 3)) != shuffled_fingerprint(t)
    unshuffled = plan_fingerprint(ConvertConfig(format="npy"), [ShardTask("shard-00000", t)])
    assert shuffled_fingerprint(t) != unshuffled


def test_labels_of_class_folders_are_held_as_runs():
    t = numbered(labels=lambda i: i // 150)
    assert isinstance(t.labels, LabelRuns) and t.labels.starts.tolist() == [0, 150]
    assert [it.label for it in t] == [0] * 150 + [1] * 50
    assert t.take([160, 1]).compact().labels[np.arange(2)].tolist() == [1, 0]


def test_labels_without_runs_stay_an_array():
    t = images(labels=(0, 1, 0, 1, 0))
    assert isinstance(t.labels, np.ndarray) and [it.label for it in t] == [0, 1, 0, 1, 0]


def test_kept_renumbers_and_keeps_labels():
    t = images()
    keep = np.array([True, False, True, False, True])
    kept = t.kept(keep)
    assert [(it.index, it.relpath, it.label) for it in kept] == [(0, KEYS[0], 0), (1, KEYS[2], 1), (2, KEYS[4], 1)]
    runs = numbered(labels=lambda i: i // 150)
    kept = runs.kept(np.arange(200) % 2 == 0)
    assert isinstance(kept.labels, LabelRuns) and kept.labels.starts.tolist() == [0, 75] and len(kept) == 100


def test_label_runs_index_like_the_array_they_stand_for():
    rng = np.random.default_rng(3)
    array = np.repeat(rng.integers(-1, 4, 50), rng.integers(1, 9, 50)).astype(np.int32)
    runs = LabelRuns.of_array(array)
    rows = rng.integers(0, len(array), 300)
    assert runs[rows].tolist() == array[rows].tolist()
    assert [runs[i] for i in range(len(array))] == array.tolist()
    keep = rng.random(len(array)) < 0.5
    assert runs.kept(keep)[np.arange(int(keep.sum()))].tolist() == array[keep].tolist()
    spans = LabelRuns.of_spans([(7, 9, 2), (2, 4, 1)], 12)
    assert spans[np.arange(12)].tolist() == [-1, -1, 1, 1, -1, -1, -1, 2, 2, -1, -1, -1]
    with pytest.raises(IndexError):
        runs[len(array)]
    with pytest.raises(ValueError):
        LabelRuns(np.array([1]), np.array([0]), 5)
