"""EpochBatchSampler and LengthBucketSampler: exact coverage per epoch, disjoint ranks, equal batch counts,
resume; bucketing pads less."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from readers.loading.length_sampler import LengthBucketSampler, padding_ratio
from readers.loading.sampler import EpochBatchSampler


@pytest.mark.parametrize(
    "size,world,batch", list(itertools.product([2, 7, 10, 11, 64, 65, 100], [1, 2, 3, 4], [2, 5, 64]))
)
def test_ranks_cover_every_index_once_with_equal_batch_counts(size, world, batch):
    if size < world:
        pytest.skip("fewer samples than ranks")
    samplers = [EpochBatchSampler(size, batch, rank=r, world_size=world, seed=3) for r in range(world)]
    per_rank = [s.batches(4) for s in samplers]
    assert {len(b) for b in per_rank} == {len(samplers[0])}
    assert all(1 <= len(x) <= batch for b in per_rank for x in b)
    seen = [i for b in per_rank for x in b for i in x]
    assert sorted(seen) == list(range(size))


@pytest.mark.parametrize("size,world,batch", [(11, 2, 5), (100, 3, 8), (64, 4, 16)])
def test_drop_last_gives_full_batches_and_no_repeats(size, world, batch):
    per_rank = [
        EpochBatchSampler(size, batch, rank=r, world_size=world, drop_last=True).batches(0) for r in range(world)
    ]
    assert {len(b) for b in per_rank} == {size // world // batch}
    assert all(len(x) == batch for b in per_rank for x in b)
    seen = [i for b in per_rank for x in b for i in x]
    assert len(seen) == len(set(seen))


def test_order_repeats_for_seed_and_epoch_and_changes_with_epoch():
    a, b = EpochBatchSampler(50, 8, seed=1), EpochBatchSampler(50, 8, seed=1)
    assert a.batches(3) == b.batches(3)
    assert a.batches(3) != a.batches(4)
    assert a.batches(3) != EpochBatchSampler(50, 8, seed=2).batches(3)
    assert EpochBatchSampler(10, 3, shuffle=False).batches(0) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_iteration_follows_set_epoch_and_resumes_mid_epoch():
    s = EpochBatchSampler(30, 4, seed=9)
    s.set_epoch(2)
    full = list(s)
    assert full == s.batches(2)
    state = s.state_dict(consumed=3)
    t = EpochBatchSampler(30, 4, seed=9)
    t.load_state_dict(state)
    assert list(t) == full[3:]
    assert list(t) == full  # the skip applies to one pass only
    assert s.state_dict(consumed=len(s)) | {} == {**state, "epoch": 3, "batches": 0}


def test_resume_refuses_a_state_of_another_setup():
    state = EpochBatchSampler(30, 4, seed=9).state_dict(consumed=1)
    with pytest.raises(ValueError, match="batch_size"):
        EpochBatchSampler(30, 5, seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        EpochBatchSampler(30, 4, seed=1).load_state_dict(state)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        EpochBatchSampler(3, 2, world_size=4)
    with pytest.raises(ValueError):
        EpochBatchSampler(10, 0)
    with pytest.raises(ValueError, match="drop_last"):
        EpochBatchSampler(5, 1, rank=1, world_size=2).batches(0)


def lognormal_lengths(size: int, seed: int = 0) -> np.ndarray:
    """Token counts shaped like real text: most short, a long tail."""
    return np.maximum(1, np.random.default_rng(seed).lognormal(4.5, 0.8, size)).astype(np.int64)


@pytest.mark.parametrize("size,batch", [(1, 4), (10, 3), (100, 8), (1000, 32), (1001, 32)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_bucket_sampler_covers_every_index_once_per_epoch(size, batch, shuffle):
    s = LengthBucketSampler(lognormal_lengths(size), batch, shuffle=shuffle, seed=5, bucket_batches=3)
    for epoch in range(3):
        got = s.batches(epoch)
        assert len(got) == len(s) == -(-size // batch)
        assert all(1 <= len(x) <= batch for x in got)
        assert sorted(i for x in got for i in x) == list(range(size))


def test_bucket_batches_hold_similar_lengths_from_one_pool():
    lengths = lognormal_lengths(640)
    s = LengthBucketSampler(lengths, 16, seed=2, bucket_batches=5)
    for x in s.batches(0):
        assert lengths[x].tolist() == sorted(lengths[x].tolist())  # cut from a pool sorted by length
    pool = set(s.order(0)[: 16 * 5])  # the first pool of epoch 0 becomes 5 whole batches
    inside = [x for x in s.batches(0) if set(x) <= pool]
    assert len(inside) == 5 and {i for x in inside for i in x} == pool


def test_bucket_order_repeats_for_seed_and_epoch_and_changes_with_epoch():
    lengths = lognormal_lengths(500)
    a, b = LengthBucketSampler(lengths, 8, seed=1), LengthBucketSampler(lengths, 8, seed=1)
    assert a.batches(3) == b.batches(3)
    assert a.batches(3) != a.batches(4)
    assert a.batches(3) != LengthBucketSampler(lengths, 8, seed=2).batches(3)
    assert LengthBucketSampler(lengths, 8, shuffle=False).batches(0) == LengthBucketSampler(
        lengths, 8, shuffle=False
    ).batches(7)


def test_bucket_sampler_without_shuffle_sorts_pools_in_index_order():
    lengths = [5, 1, 4, 1, 3, 9, 2, 7, 6, 8]
    s = LengthBucketSampler(lengths, 2, shuffle=False, bucket_batches=2)
    # pools [0..3] and [4..7] and [8, 9], each sorted by length (ties in index order), cut in pairs
    assert s.batches(0) == [[1, 3], [2, 0], [6, 4], [7, 5], [8, 9]]


@pytest.mark.parametrize(
    "size,world,batch", list(itertools.product([2, 5, 7, 11, 64, 101, 1001], [2, 3, 4], [2, 5, 32]))
)
def test_bucket_ranks_cover_every_index_once_with_equal_batch_counts(size, world, batch):
    if size < world:
        pytest.skip("fewer samples than ranks")
    lengths = lognormal_lengths(size, seed=size)
    samplers = [
        LengthBucketSampler(lengths, batch, rank=r, world_size=world, seed=3, bucket_batches=4) for r in range(world)
    ]
    per_rank = [s.batches(1) for s in samplers]
    assert len({len(s) for s in samplers}) == 1
    assert [len(b) for b in per_rank] == [len(samplers[0])] * world
    assert [len(list(s)) for s in samplers] == [len(samplers[0])] * world
    assert all(1 <= len(x) <= batch for b in per_rank for x in b)
    seen = [i for b in per_rank for x in b for i in x]
    assert sorted(seen) == list(range(size))


def test_split_batches_stay_length_sorted():
    lengths = lognormal_lengths(7 * 32 + 1)  # 8 batches over 3 ranks: one batch is split
    got = LengthBucketSampler(lengths, 32, world_size=3, rank=0, seed=0).all_batches(0)
    assert len(got) == 9 and sorted(len(x) for x in got)[:3] == [1, 16, 16]
    assert all(lengths[x].tolist() == sorted(lengths[x].tolist()) for x in got)


@pytest.mark.parametrize("size,world,batch", [(11, 2, 5), (100, 3, 8), (64, 4, 16), (1001, 3, 32)])
def test_bucket_drop_last_gives_full_batches_equal_counts_and_no_repeats(size, world, batch):
    lengths = lognormal_lengths(size)
    samplers = [LengthBucketSampler(lengths, batch, rank=r, world_size=world, drop_last=True) for r in range(world)]
    per_rank = [s.batches(0) for s in samplers]
    assert [len(b) for b in per_rank] == [size // world // batch] * world == [len(s) for s in samplers]
    assert all(len(x) == batch for b in per_rank for x in b)
    seen = [i for b in per_rank for x in b for i in x]
    assert len(seen) == len(set(seen)) == world * (size // world // batch) * batch


def test_bucket_sampler_resumes_mid_epoch():
    lengths = lognormal_lengths(300)
    s = LengthBucketSampler(lengths, 8, seed=9, world_size=2, rank=1)
    s.set_epoch(2)
    full = list(s)
    assert full == s.batches(2)
    for k in (0, 5, len(full) - 1):
        t = LengthBucketSampler(lengths, 8, seed=9, world_size=2, rank=1)
        t.load_state_dict(s.state_dict(consumed=k))
        assert list(t) == full[k:]
        assert list(t) == full  # the skip applies to one pass only
    assert s.state_dict(consumed=len(s))["epoch"] == 3


def test_bucket_resume_refuses_a_state_of_another_setup():
    lengths = lognormal_lengths(300)
    state = LengthBucketSampler(lengths, 8, seed=9).state_dict(consumed=1)
    for other, key in [
        (dict(batch_size=4), "batch_size"),
        (dict(seed=1), "seed"),
        (dict(bucket_batches=10), "bucket_batches"),
        (dict(world_size=2, rank=0), "world_size"),
    ]:
        with pytest.raises(ValueError, match=key):
            LengthBucketSampler(lengths, **{"batch_size": 8, "seed": 9, **other}).load_state_dict(state)
    with pytest.raises(ValueError, match="size"):
        LengthBucketSampler(lengths[:-1], 8, seed=9).load_state_dict(state)


def test_bucketing_pads_far_less_than_random_batches():
    lengths = lognormal_lengths(20_000)
    bucketed = padding_ratio(LengthBucketSampler(lengths, 32, seed=0).batches(0), lengths)
    shuffled = padding_ratio(EpochBatchSampler(len(lengths), 32, seed=0).batches(0), lengths)
    assert bucketed < shuffled / 2
    assert bucketed < 0.25 and shuffled > 0.6


def test_padding_ratio_counts_padded_slots():
    assert padding_ratio([[0, 1], [2]], [4, 2, 3]) == pytest.approx(2 / 11)
    assert padding_ratio([], [1]) == 0.0


def test_bucket_sampler_takes_rank_and_world_from_torch_distributed(monkeypatch):
    import readers.loading.length_sampler as length_sampler

    monkeypatch.setattr(length_sampler, "distributed_rank", lambda: (2, 3))
    s = LengthBucketSampler(lognormal_lengths(50), 4, seed=0)
    assert (s.rank, s.world_size) == (2, 3)
    assert LengthBucketSampler(lognormal_lengths(50), 4, rank=0, world_size=1).world_size == 1


def test_bucket_sampler_refuses_bad_arguments():
    with pytest.raises(ValueError, match="ranks"):
        LengthBucketSampler([3, 4], 2, world_size=3, rank=0)
    with pytest.raises(ValueError, match="drop_last"):
        LengthBucketSampler([1, 2, 3], 1, world_size=2, rank=0)
    with pytest.raises(ValueError, match="1-D"):
        LengthBucketSampler([[1, 2]], 2)
    with pytest.raises(ValueError, match="1-D"):
        LengthBucketSampler([1.5, 2.0], 2)
    with pytest.raises(ValueError, match="negative"):
        LengthBucketSampler([1, -2], 2)
    with pytest.raises(ValueError, match="bucket_batches"):
        LengthBucketSampler([1, 2], 2, bucket_batches=0)
    assert len(LengthBucketSampler([1, 2, 3, 4], 1, world_size=2, rank=1).batches(0)) == 2


def test_epoch_start_does_not_build_the_order(monkeypatch):
    """10 million samples: the first batch comes with one chunk of the epoch's order evaluated, not
    the whole of it (a list of 10^7 ints, as torch.randperm made it before)."""
    from readers.loading.permutation import Permutation

    evaluated: list[int] = []
    real = Permutation.__getitem__
    monkeypatch.setattr(Permutation, "__getitem__", lambda self, p: evaluated.append(np.size(p)) or real(self, p))
    s = EpochBatchSampler(10_000_000, 256, seed=5, rank=1, world_size=8)
    s.set_epoch(3)
    first = next(iter(s))
    assert evaluated == [16384]  # 64 batches of 256: one chunk
    monkeypatch.setattr(Permutation, "__getitem__", real)
    assert len(first) == 256 and first.epoch == 3
    perm = s.permutation(3)
    assert first == perm[np.arange(256) * 8 + 1].tolist()  # positions 1, 9, 17, ... of the epoch's order
    assert len(set(first)) == 256 and all(0 <= i < 10_000_000 for i in first)


def test_lazy_batches_equal_the_whole_order_cut_up():
    """The batches evaluated chunk by chunk are the epoch's order split over ranks and cut as before."""
    size, batch, world = 40_003, 7, 3
    for rank in range(world):
        s = EpochBatchSampler(size, batch, seed=2, rank=rank, world_size=world)
        mine = s.order(1)[rank::world]
        got = s.batches(1)
        assert [i for b in got for i in b] == mine
        assert len(got) == len(s) and all(len(b) == batch for b in got[:-2])
        s.set_epoch(1)
        s.load_state_dict(s.state_dict(consumed=1500))
        assert [list(b) for b in s] == got[1500:]


def test_a_mid_epoch_state_of_the_old_order_is_refused():
    """States saved by packer 0.6 (torch.randperm order) cannot continue mid-epoch: samples would
    repeat; at an epoch boundary they can."""
    s = EpochBatchSampler(100, 8, seed=1)
    old = {k: v for k, v in s.state_dict(consumed=3).items() if k != "order"}
    with pytest.raises(ValueError, match="another order"):
        s.load_state_dict(old)
    s.load_state_dict({**old, "epoch": 1, "batches": 0})
    assert s.epoch == 1 and s.start == 0


def _consume(samplers: list[EpochBatchSampler], epoch: int, batches: int) -> list[int]:
    """The indices every rank's first ``batches`` batches of ``epoch`` hold."""
    return [i for s in samplers for x in s.batches(epoch)[:batches] for i in x]


@pytest.mark.parametrize("size,drop_last", [(101, False), (120, False), (101, True)])
@pytest.mark.parametrize("saved_on,resumed_on", list(itertools.product([1, 2, 3, 4], [1, 2, 3, 4])))
def test_a_state_resumes_on_another_rank_count_with_the_same_global_batch(size, drop_last, saved_on, resumed_on):
    """Global batch 12 on 1, 2, 3 or 4 ranks: after k batches on N ranks, M ranks see the rest of the
    epoch, every sample not yet seen exactly once; the next epoch is a run on M ranks' own."""
    glob = 12

    def ranks(world: int) -> list[EpochBatchSampler]:
        return [
            EpochBatchSampler(size, glob // world, seed=5, rank=r, world_size=world, drop_last=drop_last)
            for r in range(world)
        ]

    saved = ranks(saved_on)
    for k in (0, 1, 4):
        seen = _consume(saved, 2, k)
        state = saved[0].state_dict(consumed=k) | {"epoch": 2}
        resumed = ranks(resumed_on)
        rest = []
        for s in resumed:
            s.load_state_dict(state)
            rest += [i for x in s for i in x]
        assert not set(seen) & set(rest) and len(seen) + len(rest) == len(set(seen) | set(rest))
        kept = len(resumed[0]) * glob if drop_last else size  # drop_last leaves the epoch's tail out
        assert len(seen) == k * glob and len(seen) + len(rest) == (kept if drop_last else size)
        if not drop_last:
            assert sorted(seen + rest) == list(range(size))
        else:  # the first kept positions of the one order, as an uninterrupted run on M ranks reads them
            assert sorted(seen + rest) == sorted(_consume(resumed, 2, len(resumed[0])))
        for s, fresh in zip(resumed, ranks(resumed_on)):  # the next epoch: as a run on M ranks has it
            assert s.batches(3) == fresh.batches(3)


def test_a_state_of_another_global_batch_is_refused_with_the_batch_that_fits():
    state = EpochBatchSampler(100, 6, rank=0, world_size=2).state_dict(consumed=2)
    with pytest.raises(ValueError, match=r"global batch of 6 x 2 ranks = 12 samples.*\(batch_size=4 here\)"):
        EpochBatchSampler(100, 6, rank=0, world_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match="12 samples do not split evenly over 5 ranks"):
        EpochBatchSampler(100, 2, rank=0, world_size=5).load_state_dict(state)


def test_a_state_among_the_uneven_last_batches_resumes_only_on_its_own_rank_count():
    # 25 samples on 2 ranks in batches of 4: rank 1 has 12 samples for 4 batches, so its third batch
    # gives one to its fourth; after 3 batches the samples seen are not the first 24 of the order.
    saved = [EpochBatchSampler(25, 4, rank=r, world_size=2) for r in range(2)]
    assert len(saved[0]) == 4 and [len(x) for x in saved[1].batches(0)] == [4, 4, 3, 1]
    state = saved[0].state_dict(consumed=3)
    with pytest.raises(ValueError, match="last batches of the epoch.*Resume on 2 ranks, or at the next epoch"):
        EpochBatchSampler(25, 2, rank=0, world_size=4).load_state_dict(state)
    EpochBatchSampler(25, 4, rank=1, world_size=2).load_state_dict(state)  # its own rank count continues
    earlier = saved[0].state_dict(consumed=2)  # before the uneven batches: any rank count with 8 a batch
    EpochBatchSampler(25, 2, rank=3, world_size=4).load_state_dict(earlier)


def test_the_length_buckets_refuse_another_rank_count_saying_why():
    lengths = lognormal_lengths(300)
    state = LengthBucketSampler(lengths, 8, seed=9, rank=0, world_size=2).state_dict(consumed=1)
    with pytest.raises(ValueError, match="groups the samples of each rank's batches itself"):
        LengthBucketSampler(lengths, 16, seed=9, rank=0, world_size=1).load_state_dict(state)
