"""packer.run.plan: shard planning, shard names, the per-sample size estimate."""

import pytest
from conftest import write_image
from helpers import sizes

from packer.config import DEFAULT_SHARD_BYTES, ShardSize
from packer.records import SourceItem
from packer.run.plan import estimate_sample_bytes, plan_shards, shard_name
from packer.spec.sample_layout import SampleLayout

MiB = 1024**2


def items(n):
    return [SourceItem(i, f"/src/{i}.png", f"{i}.png", i % 2) for i in range(n)]


def flat(tasks):
    return [i for t in tasks for i in t.items]


def test_shard_name():
    assert shard_name(0) == "shard-00000"
    assert shard_name(42) == "shard-00042"


def test_plan_sample_count_last_shard_smaller():
    src = items(10)
    tasks = plan_shards(src, ShardSize(samples=4), sample_bytes=100, workers=3)
    assert sizes(tasks) == [4, 4, 2]
    assert [t.name for t in tasks] == ["shard-00000", "shard-00001", "shard-00002"]
    assert flat(tasks) == src


def test_plan_sample_count_exact_multiple():
    assert sizes(plan_shards(items(8), ShardSize(samples=4), 1)) == [4, 4]
    assert sizes(plan_shards(items(3), ShardSize(samples=100), 1)) == [3]


def test_plan_byte_size():
    src = items(10)
    tasks = plan_shards(src, ShardSize(bytes=1000), sample_bytes=300)
    assert sizes(tasks) == [3, 3, 3, 1]
    assert flat(tasks) == src


def test_plan_byte_size_smaller_than_a_sample():
    assert sizes(plan_shards(items(3), ShardSize(bytes=10), sample_bytes=300)) == [1, 1, 1]


@pytest.mark.parametrize(
    "n, workers, sample_bytes, expected",
    [
        (10, 1, 100, [10]),
        (10, 4, 100, [3, 3, 2, 2]),
        (10, 2, 100, [5, 5]),
        (3, 4, 100, [1, 1, 1]),
        (1, 8, 100, [1]),
        (100, 3, 10 * MiB, [17, 17, 17, 17, 16, 16]),  # 1000 MiB -> 4 shards -> 6 for 3 workers
        (100, 1, 10 * MiB, [25, 25, 25, 25]),
    ],
)
def test_plan_auto(n, workers, sample_bytes, expected):
    src = items(n)
    tasks = plan_shards(src, ShardSize(), sample_bytes, workers)
    assert sizes(tasks) == expected
    assert flat(tasks) == src
    assert [t.name for t in tasks] == [shard_name(i) for i in range(len(tasks))]


@pytest.mark.parametrize("n", [1, 2, 5, 7, 16, 33, 100, 257])
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("sample_bytes", [1, 150_528, 3 * MiB, 40 * MiB])
def test_plan_auto_properties(n, workers, sample_bytes):
    src = items(n)
    tasks = plan_shards(src, ShardSize(), sample_bytes, workers)
    s = sizes(tasks)
    assert flat(tasks) == src
    assert 1 <= len(tasks) <= n
    assert len(tasks) % workers == 0 or len(tasks) == n
    assert max(s) - min(s) <= 1
    assert min(s) >= 1


def test_plan_auto_respects_256_mib():
    tasks = plan_shards(items(5), ShardSize(), sample_bytes=100 * MiB, workers=1)
    assert max(sizes(tasks)) * 100 * MiB <= DEFAULT_SHARD_BYTES


def test_plan_empty():
    assert plan_shards([], ShardSize(), 100, 4) == []
    assert plan_shards([], ShardSize(samples=3), 100) == []
    assert plan_shards([], ShardSize(bytes=3), 100) == []


def test_estimate_sample_bytes(tmp_path):
    assert estimate_sample_bytes(SampleLayout("uint8", (12, 16, 3), 3), []) == 12 * 16 * 3
    assert estimate_sample_bytes(SampleLayout("float32", (2, 2, 1), 1), []) == 16
    a = write_image(tmp_path / "a.png", (10, 20))
    b = write_image(tmp_path / "b.jpg", (30, 40))
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    src = [SourceItem(0, str(a), "a.png"), SourceItem(1, str(b), "b.jpg"), SourceItem(2, str(junk), "junk.png")]
    # exact stored sizes from the headers (the unreadable file is left out of the mean)
    assert estimate_sample_bytes(SampleLayout("uint8", None, 3), src) == (10 * 20 * 3 + 30 * 40 * 3) / 2
    assert estimate_sample_bytes(SampleLayout("float16", None, 1), src[:1]) == 10 * 20 * 2
    assert estimate_sample_bytes(SampleLayout("uint8", None, 3), []) == 1024**2


@pytest.mark.parametrize(
    "n, workers, expected",
    [
        (100_000, 2, [12_500] * 8),  # 4 shards per worker: a Ctrl-C at 70% keeps 5 of 8 for --resume
        (10_000, 4, [1250] * 8),  # 16 would be under 1000 samples: 10, rounded down to 8
        (3_900, 2, [1950, 1950]),  # 3 of 1300, rounded down to 2: never under 1000 samples
        (1_000_000, 32, [15_625] * 64),  # 128 wanted, 64 at most (readers keep 64 shards open)
        (1_000_000, 100, [10_000] * 100),  # more workers than 64: one shard each, as before
        (2_000, 2, [1000, 1000]),  # small outputs stay one shard per worker
        (5_000, 1, [1250] * 4),
    ],
)
def test_plan_auto_gives_each_worker_several_shards(n, workers, expected):
    assert sizes(plan_shards(items(n), ShardSize(), 3000, workers)) == expected
