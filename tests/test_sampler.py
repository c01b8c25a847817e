"""EpochBatchSampler: exact coverage per epoch, disjoint ranks, equal batch counts, resume."""

from __future__ import annotations

import itertools

import pytest

from readers.sampler import EpochBatchSampler


@pytest.mark.parametrize("size,world,batch",
                         list(itertools.product([2, 7, 10, 11, 64, 65, 100], [1, 2, 3, 4], [2, 5, 64])))
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
    per_rank = [EpochBatchSampler(size, batch, rank=r, world_size=world, drop_last=True).batches(0)
                for r in range(world)]
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
