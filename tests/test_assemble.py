"""packer.output.assemble: the duplicate groups and class counts merged from the shards' results."""

from __future__ import annotations

import random

import pytest

from packer.output.assemble import _duplicates_by_dict, class_counts, find_duplicates
from packer.records import ShardResult


def _results(seed: int) -> list[ShardResult]:
    """A few shards whose samples draw their 128-bit digests from a small pool (many duplicates)."""
    rng = random.Random(seed)
    pool = [f"{rng.getrandbits(128):032x}" for _ in range(rng.randint(1, 30))]
    results, key = [], 0
    for s in range(rng.randint(1, 4)):
        n = rng.randint(0, 20)
        keys = [f"{rng.randint(0, 999):03d}/{key + i}.jpg" for i in range(n)]  # stored order is not key order
        results.append(ShardResult(f"shard-{s}", n, [], keys=keys, digests=[rng.choice(pool) for _ in range(n)]))
        key += n
    return results


@pytest.mark.parametrize("seed", range(200))
def test_duplicates_as_the_grouping_by_digest_gives_them(seed):
    """The numpy sort finds exactly the groups a dict of digests gives: keys in stored order within a
    group, the groups sorted (the manifests of earlier packers are unchanged)."""
    results = _results(seed)
    assert find_duplicates(results) == _duplicates_by_dict(results)


@pytest.mark.parametrize("seed", range(40))
def test_duplicates_spilled_to_bucket_files_are_the_same(seed, tmp_path, monkeypatch):
    """Past SPILL_WORDS samples the first words go to bucket files in the scratch folder, searched
    one at a time: the same groups, and the folder left as it was."""
    import packer.output.assemble

    monkeypatch.setattr(packer.output.assemble, "SPILL_WORDS", 3)
    results = _results(seed)
    assert find_duplicates(results, scratch=tmp_path) == _duplicates_by_dict(results)
    assert list(tmp_path.iterdir()) == []


def test_spilled_search_counts_every_shard_even_with_odd_digests(tmp_path, monkeypatch):
    """A shard whose digests are not 128-bit hex sends the search to the dict; ``each`` still sees
    every shard (the class counts are taken there)."""
    import packer.output.assemble

    monkeypatch.setattr(packer.output.assemble, "SPILL_WORDS", 1)
    a = "ab" * 16
    results = [
        ShardResult("s0", 1, [], keys=["odd"], digests=["xy"]),
        ShardResult("s1", 2, [], keys=["a", "b"], digests=[a, a]),
    ]
    seen = []
    for scratch in (None, tmp_path):
        assert find_duplicates(results, seen.append, scratch) == [["a", "b"]]
    assert [r.name for r in seen] == ["s0", "s1"] * 2


def test_duplicates_named():
    a, b, c = "0" * 32, "f" * 32, "0" * 31 + "1"
    results = [
        ShardResult("s0", 3, [], keys=["z.jpg", "y.jpg", "x.jpg"], digests=[a, b, a]),
        ShardResult("s1", 2, [], keys=["w.jpg", "v.jpg"], digests=[c, b]),
    ]
    assert find_duplicates(results) == [["y.jpg", "v.jpg"], ["z.jpg", "x.jpg"]]
    assert find_duplicates([ShardResult("s0", 2, [], keys=["a", "b"], digests=[a, c])]) == []
    assert find_duplicates([]) == []
    # Two digests that share their first 64 bits, around a third: the full 128 bits decide
    x, y = "1" * 16 + "0" * 16, "1" * 16 + "2" * 16
    shared = [ShardResult("s0", 4, [], keys=["a", "b", "c", "d"], digests=[x, y, x, y])]
    assert find_duplicates(shared) == [["a", "c"], ["b", "d"]]
    # Digests of other lengths or case, or fewer keys than digests (none this packer records), are
    # grouped as strings
    assert find_duplicates([ShardResult("s0", 2, [], keys=["a", "b"], digests=["ab", "ab"])]) == [["a", "b"]]
    odd = [ShardResult("s0", 3, [], keys=["a", "b", "c"], digests=["1" * 32, "0" * 30, "0" * 34])]
    assert find_duplicates(odd) == []
    assert find_duplicates([ShardResult("s0", 2, [], keys=["a", "b"], digests=["AB" * 16, "ab" * 16])]) == []
    short = [
        ShardResult("s0", 3, [], keys=["a", "b"], digests=[a, b, a]),
        ShardResult("s1", 1, [], keys=["c"], digests=[a]),
    ]
    assert find_duplicates(short) == _duplicates_by_dict(short) == [["a", "c"]]
    d = "ab" * 16
    without = [
        ShardResult("s0", 1, [], keys=["x"], digests=[]),
        ShardResult("s1", 2, [], keys=["b1", "b2"], digests=[d, d]),
    ]
    assert find_duplicates(without) == find_duplicates(without[::-1]) == [["b1", "b2"]]  # keys, no digests


def test_class_counts():
    results = [ShardResult("s0", 4, [], labels=[0, 2, 2, -1]), ShardResult("s1", 2, [], labels=[2, 1])]
    assert class_counts(results, 3) == [1, 1, 3]
    assert class_counts(results, 4, start=[5, 0, 1]) == [6, 1, 4, 0]
    assert class_counts([ShardResult("s0", 0, [])], 2) == [0, 0]


def test_overlapping_duplicate_groups_are_merged():
    from packer.output.assemble import merged_groups

    groups = [["a", "b"], ["a", "b", "x", "y"], ["x", "y"], ["p", "q"], [], ["q", "r"], ["solo"]]
    assert merged_groups(groups) == [["a", "b", "x", "y"], ["p", "q", "r"]]
    assert merged_groups([]) == []
