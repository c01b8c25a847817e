"""make_loader in training loops: same batches as the reader, defaults, spawn, persistent workers,
mid-epoch resume, the shared batch ring, and DDP with two real processes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import FORMATS, make_tree
from helpers import fresh_processes, rank_result, run_ranks

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from readers import make_loader, open_dataset
from readers.datasets import defaults as loader_defaults

PRE = PreprocessConfig(size=(40, 32))
N = 23


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """23 images in 3 classes, in every format, 6 shards of at most 4 samples."""
    from conftest import make_tree

    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"ant": 8, "bee": 7, "cat": 8})
    out = tmp_path_factory.mktemp("out")
    result = {}
    for fmt in FORMATS:
        convert(root, out / fmt, ConvertConfig(fmt, PRE, ShardSize(samples=4)), workers=2)
        result[fmt] = out / fmt
    result["_src"] = root
    return result


def reference(packed) -> list[torch.Tensor]:
    """Every sample's float32 tensor by index, read one by one by the npy reader."""
    ds = open_dataset(packed["npy"])
    return [ds[i][0] for i in range(len(ds))]


def indices(batches) -> list[list[int]]:
    return [meta["index"].tolist() for *_, meta in batches]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("normalize", [True, False])
def test_batches_hold_exactly_the_samples_the_reader_gives(packed, fmt, normalize):
    ref = reference(packed)
    ds = open_dataset(packed[fmt], normalize=normalize)
    with_meta = make_loader(open_dataset(packed[fmt], return_meta=True), 5, num_workers=2, seed=4)
    order = indices(with_meta)
    loader = make_loader(ds, 5, num_workers=2, seed=4)
    batches = [(x.clone(), y.clone()) for x, y in loader]
    assert len(batches) == len(loader) == len(order) == (5 if fmt != "wds" else 6)  # wds: a partial batch per worker
    for (x, y), idx in zip(batches, order):
        want = torch.stack([ref[i] for i in idx])
        if normalize:
            assert x.dtype == torch.float32 and x.is_contiguous()
            assert torch.allclose(x, want, atol=1e-6)
        else:
            assert x.dtype == torch.uint8 and x.shape == want.shape
            assert torch.allclose(ds.batch_normalizer()(x), want, atol=1e-6)
        assert y.tolist() == [int(open_dataset(packed["npy"])[i][1]) for i in idx]
    assert sorted(i for b in order for i in b) == list(range(N))  # every sample exactly once, every format


@pytest.mark.parametrize("fmt", FORMATS)
def test_workers_in_fresh_processes(packed, fmt):
    """Spawn and forkserver pickle the reader to each worker: it must travel small and work (forkserver
    here, as spawn without importing torch again; test_readers spawns)."""
    loader = make_loader(
        open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, multiprocessing_context=fresh_processes()
    )
    assert sorted(i for b in indices(loader) for i in b) == list(range(N))


@pytest.mark.parametrize("fmt", FORMATS)
def test_persistent_workers_reshuffle_every_epoch_and_repeat_for_a_seed(packed, fmt):
    loader = make_loader(
        open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=11, persistent_workers=True
    )
    epoch0, epoch1 = indices(loader), indices(loader)
    assert epoch0 != epoch1
    again = make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=11)
    assert indices(again) == epoch0
    again.set_epoch(1)
    assert indices(again) == epoch1


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cut", [1, 3])
def test_resume_mid_epoch_equals_an_uninterrupted_run(packed, fmt, cut):
    def fresh():
        return make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=5)

    uninterrupted = fresh()
    full = [indices(uninterrupted), indices(uninterrupted)]
    first = fresh()
    it = iter(first)
    seen = [next(it)[2]["index"].tolist() for _ in range(cut)]
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint would store it
    del it
    resumed = fresh()
    resumed.load_state_dict(state)
    assert seen + indices(resumed) == full[0]
    assert indices(resumed) == full[1]


def test_batches_kept_by_the_caller_are_never_overwritten(packed):
    loader = make_loader(open_dataset(packed["npy"]), 3, num_workers=2, seed=2)
    assert loader.ring is not None
    kept = list(loader)  # every batch held: the ring runs out and workers fall back
    order = loader.sampler.batches(0)
    ref = reference(packed)
    for (x, _), idx in zip(kept, order, strict=True):
        assert torch.allclose(x, torch.stack([ref[i] for i in idx]))
    del kept, x
    slots = {s.data_ptr() for s in loader.ring.slots}
    ptrs = {x.data_ptr() for x, _ in loader}  # batches dropped at once: slots are reused
    assert ptrs <= slots


@pytest.mark.parametrize("fmt", FORMATS)
def test_encoded_images_of_one_size_are_batched_into_the_ring_too(packed, fmt, tmp_path):
    """JPEGs decode to images of one size: their batches are one tensor, built in the shared ring
    like raw ones (not sample by sample), and hold the pixels the reader decodes."""
    out = tmp_path / fmt
    convert(packed["_src"], out, ConvertConfig(fmt, PRE, ShardSize(samples=4), codec=ImageCodec("jpeg")), workers=2)
    ds = open_dataset(out)
    assert ds.fixed_images
    loader = make_loader(ds, 5, num_workers=2, seed=1)
    assert loader.ring is not None
    images, labels = next(iter(loader))
    assert images.shape == (5, 3, 32, 40) and images.dtype == torch.float32


def test_defaults_follow_cores_memory_and_dataset(packed, monkeypatch):
    ds = open_dataset(packed["npy"])
    opts = loader_defaults.default_options(ds, 4, torch.uint8, cores=8, memory=2**40)
    assert opts["num_workers"] == 6  # capped by the dataset: 23 samples make 6 batches of 4
    assert opts["persistent_workers"] and opts["prefetch_factor"] == 2 and not opts["pin_memory"]
    assert loader_defaults.default_options(ds, 1, torch.uint8, cores=3, memory=2**40)["num_workers"] == 3
    per_batch = loader_defaults.batch_bytes(ds, 4, torch.uint8)
    # per worker: (2 x prefetch + 2) batches in flight (queue and ring)
    tight = loader_defaults.default_options(ds, 4, torch.uint8, cores=3, memory=int(3 * 4 * per_batch / 0.25))
    assert tight["num_workers"] == 3 and tight["prefetch_factor"] == 1  # prefetch lowered first
    tighter = loader_defaults.default_options(ds, 4, torch.uint8, cores=3, memory=int(2 * 4 * per_batch / 0.25))
    assert tighter["num_workers"] == 2
    assert loader_defaults.default_options(ds, 4, torch.uint8, cores=2, memory=2**40, cuda=True)["pin_memory"]
    monkeypatch.setattr(loader_defaults, "physical_cores", lambda: 1)
    monkeypatch.setattr(loader_defaults, "available_memory", lambda: 2**40)
    made = make_loader(ds, 4)
    assert made.loader.num_workers == 1 and made.loader.persistent_workers
    assert make_loader(ds, 4, num_workers=0).loader.num_workers == 0
    assert made.loader.multiprocessing_context is None
    spawned = make_loader(ds, 4, multiprocessing_context="spawn")
    assert spawned.loader.multiprocessing_context.get_start_method() == "spawn"
    assert 1 <= loader_defaults.physical_cores() <= __import__("packer.system").system.usable_cpus()


def _ddp_rank(rank: int, world: int, port: int, roots: dict, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    result = {}
    for fmt, root in roots.items():
        loader = make_loader(open_dataset(root, return_meta=True), 3, num_workers=1, seed=7)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = []
            for *_, meta in loader:
                dist.all_reduce(torch.ones(1))  # what DDP does each step: hangs if a rank runs out early
                seen.append(meta["index"].tolist())
            epochs.append(seen)
        result[fmt] = {"epochs": epochs, "len": len(loader)}
    dist.barrier()
    dist.destroy_process_group()
    rank_result(out, rank, result)


def test_ddp_two_processes(packed, tmp_path):
    roots = {fmt: str(packed[fmt]) for fmt in FORMATS}
    ranks = run_ranks(_ddp_rank, roots, tmp_path)
    for fmt in FORMATS:
        a, b = ranks[0][fmt], ranks[1][fmt]
        assert a["len"] == b["len"]
        for epoch in range(2):
            ea, eb = a["epochs"][epoch], b["epochs"][epoch]
            assert len(ea) == len(eb) == a["len"]  # equal batch counts
            sa, sb = [i for x in ea for i in x], [i for x in eb for i in x]
            if fmt != "wds":
                assert not set(sa) & set(sb) and sorted(sa + sb) == list(range(N))
            else:  # disjoint shards per rank; the rank with fewer batches adds resampled ones
                assert set(sa) | set(sb) == set(range(N))
        assert a["epochs"][0] != a["epochs"][1]


GLOBAL_BATCH = 6


def _ranks_save_then_resume(rank: int, world: int, port: int, payload: dict, out: str) -> None:
    """Save: 2 batches on each rank, then the loader's state. Resume: the state loaded, the epoch's rest."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    loader = make_loader(open_dataset(payload["root"], return_meta=True), GLOBAL_BATCH // world, num_workers=1, seed=3)
    result: dict = {"len": len(loader)}
    if payload.get("state") is None:
        loader.set_epoch(1)
        seen = []
        for *_, meta in itertools.islice(loader, 2):
            seen += meta["index"].tolist()
        result |= {"seen": seen, "state": loader.state_dict()}
    else:
        loader.load_state_dict(payload["state"])
        rest = []
        for *_, meta in loader:
            dist.all_reduce(torch.ones(1))  # as DDP does each step: hangs if a rank runs out early
            rest += meta["index"].tolist()
        result["rest"] = rest
    dist.barrier()
    dist.destroy_process_group()
    rank_result(out, rank, result)


def test_a_loader_state_saved_on_two_ranks_resumes_on_three_and_on_one(packed, tmp_path):
    """The same global batch (3 x 2 ranks, 2 x 3 ranks, 6 x 1): the resumed epoch is every sample the
    two ranks had not seen, each once, with equal batch counts on the three ranks."""
    root = str(packed["npy"])
    for sub in ("save", "three"):
        (tmp_path / sub).mkdir()
    saved = run_ranks(_ranks_save_then_resume, {"root": root}, tmp_path / "save", world=2)
    seen = saved[0]["seen"] + saved[1]["seen"]
    assert len(seen) == 2 * GLOBAL_BATCH and saved[0]["state"] == saved[1]["state"]
    resumed = run_ranks(
        _ranks_save_then_resume, {"root": root, "state": saved[0]["state"]}, tmp_path / "three", world=3
    )
    rest = [i for r in resumed for i in r["rest"]]
    assert sorted(seen + rest) == list(range(N))
    one = make_loader(open_dataset(root, return_meta=True), GLOBAL_BATCH, num_workers=0, seed=3)
    one.load_state_dict(saved[0]["state"])
    alone = [i for *_, meta in one for i in meta["index"].tolist()]
    assert sorted(seen + alone) == list(range(N)) and sorted(alone) == sorted(rest)


def test_a_tar_loader_state_of_another_rank_count_is_refused_saying_why(packed):
    state = make_loader(open_dataset(packed["wds"]), 3, num_workers=0).state_dict() | {"world_size": 2}
    with pytest.raises(ValueError, match="tar shards are assigned to ranks and their DataLoader workers"):
        make_loader(open_dataset(packed["wds"]), 3, num_workers=0).load_state_dict(state)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "wds"])
@pytest.mark.parametrize("ctx", ["fork", "fresh"])
def test_in_memory_gives_the_same_batches_and_is_shared_with_workers(packed, fmt, ctx):
    """Forked workers inherit the shared tensor; fresh ones (pickled, as under spawn) get it by its handle."""
    ds = open_dataset(packed[fmt], in_memory=True)
    assert ds.memory is not None and ds.memory.is_shared() and tuple(ds.memory.shape) == (N, 32, 40, 3)
    ref = reference(packed)
    assert all(torch.allclose(ds[i][0], ref[i]) for i in range(N))
    context = "fork" if ctx == "fork" else fresh_processes()
    loader = make_loader(ds, 5, num_workers=2, multiprocessing_context=context, seed=1)
    got = [x.clone() for x, _ in loader]
    for x, idx in zip(got, loader.sampler.batches(0), strict=True):
        assert torch.allclose(x, torch.stack([ref[i] for i in idx]))


def test_tar_shard_batch_plan_is_exact_for_one_rank_and_equal_across_ranks(packed):
    ds = open_dataset(packed["wds"])
    for workers in (1, 2, 3, 4):
        ds.configure_batches(5, workers=workers)
        shares, sizes, seq = ds.batch_plan(workers)
        assert sum(map(sum, sizes)) == N and len(seq) == len(ds)
        counts = []
        for rank in range(3):
            ds.configure_batches(5, workers=workers, rank=rank, world_size=3)
            counts.append(len(ds.batch_plan(workers)[2]))
            assert counts[-1] == len(ds)
        assert len(set(counts)) == 1
        ds.configure_batches(5, workers=workers, rank=0, world_size=3, drop_last=True)
        assert all(n == 5 for x in ds.batch_plan(workers)[1] for n in x)


def test_tar_shard_workers_beyond_the_shards_stay_idle_and_every_sample_comes_once(packed):
    """6 shards: with 8 workers two have none of their own and read nothing (they used to re-read
    another's, repeating its samples within the epoch); across ranks every rank runs as many
    workers, the smallest rank's shards by default."""
    ds = open_dataset(packed["wds"])
    ds.configure_batches(4, workers=8)
    shares, sizes, seq = ds.batch_plan(8)
    assert sorted(s for share in shares for s in share) == list(range(6)) and shares[6:] == [[], []]
    assert sum(map(sum, sizes)) == N and sizes[6:] == [[], []]
    for rank in range(4):  # 6 shards over 4 ranks x 2 workers: ranks 2 and 3 hold one each
        ds.configure_batches(4, workers=2, rank=rank, world_size=4)
        shares, sizes, seq = ds.batch_plan(2)
        assert all(sizes[w] == [] for w in range(2) if not shares[w]) and len(seq) == len(ds)
    with pytest.warns(UserWarning, match="no shard of their own and stay idle"):
        loader = make_loader(open_dataset(packed["wds"]), 4, num_workers=8, seed=3)
    labels = torch.cat([y for _, y in loader])
    assert len(labels) == N and torch.bincount(labels).tolist() == [8, 7, 8]
    from readers.datasets.defaults import default_options

    options = default_options(open_dataset(packed["wds"]), 4, torch.uint8, cores=16, memory=2**34, world_size=4)
    assert options["num_workers"] == 1  # ranks 0 and 1 hold 2 shards, ranks 2 and 3 one: one worker each


def test_resume_refuses_another_setup(packed):
    loader = make_loader(open_dataset(packed["wds"]), 4, num_workers=2, seed=5)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="workers"):
        make_loader(open_dataset(packed["wds"]), 4, num_workers=1, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(open_dataset(packed["npy"]), 3, num_workers=0).load_state_dict(
            make_loader(open_dataset(packed["npy"]), 4, num_workers=0).state_dict()
        )


def test_a_pass_left_early_gives_its_ring_slots_back(packed):
    loader = make_loader(open_dataset(packed["npy"]), 2, num_workers=2, seed=2)
    for _ in range(3):
        for i, _batch in enumerate(loader):
            if i == 1:
                break  # queued batches are thrown away by the DataLoader
    del _batch
    slots = {s.data_ptr() for s in loader.ring.slots}
    ptrs = [x.data_ptr() for x, _ in loader]
    # The ring is still in use, not bypassed. A worker may still be finishing a task of the pass left
    # early when the next one starts, so a batch or two may come in fresh memory: correct, just slower.
    assert sum(p in slots for p in ptrs) >= len(ptrs) - 2


def test_plain_dataloader_items_have_int_labels_and_subclasses_keep_their_getitem(packed):
    from torch.utils.data import DataLoader

    from readers import NpyDataset

    seen = []
    list(DataLoader(open_dataset(packed["npy"]), batch_size=4, collate_fn=lambda b: seen.extend(y for _, y in b)))
    assert all(type(y) is int for y in seen) and len(seen) == N

    class Flipped(NpyDataset):
        def __getitem__(self, i):
            image, label = super().__getitem__(i)
            return image.flip(-1), label

    ds = Flipped(packed["npy"])
    x, _ = next(iter(DataLoader(ds, batch_size=3)))
    assert torch.equal(x[0], open_dataset(packed["npy"])[0][0].flip(-1))


def test_make_loader_takes_a_weighted_random_sampler_and_keeps_whole_batches(tmp_path):
    """The README's class-balance recipe: only class 0 has weight, so only class 0 is drawn; batches
    are still read whole, and each image is the one its index names."""
    from torch.utils.data import WeightedRandomSampler

    src = tmp_path / "src"
    make_tree(src, {"ant": 6, "bee": 6})
    out = tmp_path / "out"
    convert(src, out, ConvertConfig("npy", PreprocessConfig(size=(8, 8)), ShardSize(samples=5)), workers=1)
    ds = open_dataset(out)
    weights = [1.0 if label == 0 else 0.0 for label in ds.targets]
    drawn = WeightedRandomSampler(weights, 40, generator=torch.Generator().manual_seed(0))
    loader = make_loader(ds, 8, sampler=drawn, num_workers=0)
    labels = [label for _, batch in loader for label in batch.tolist()]
    assert len(loader) == 5 and len(labels) == 40 and set(labels) == {0}
    indices = list(WeightedRandomSampler(weights, 40, generator=torch.Generator().manual_seed(0)))
    images, _ = next(iter(make_loader(ds, 8, sampler=indices, num_workers=0)))
    assert all(torch.equal(images[k], ds[i][0]) for k, i in enumerate(indices[:8]))
    batches = make_loader(ds, 99, batch_sampler=[[0, 11], [5]], num_workers=0)
    assert [labels.tolist() for _, labels in batches] == [[0, 1], [0]]
    with pytest.raises(ValueError, match="not both"):
        make_loader(ds, 8, sampler=indices, batch_sampler=[[0]])


def test_make_loader_refuses_a_sampler_for_tar_shards(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"ant": 3})
    convert(src, tmp_path / "wds", ConvertConfig("wds", PreprocessConfig(size=(8, 8))), workers=1)
    with pytest.raises(ValueError, match="tar shards are read in order"):
        make_loader(open_dataset(tmp_path / "wds"), 2, sampler=[0, 1, 2])


def test_images_of_their_own_sizes_batch_when_a_transform_gives_them_one(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"ant": 4, "bee": 4})
    out = tmp_path / "out"
    convert(src, out, ConvertConfig("npy", PreprocessConfig(resize="none")), workers=1)
    ds = open_dataset(out, transform=lambda image: image[:, :16, :16])
    images, labels = next(iter(make_loader(ds, 4, shuffle=False, num_workers=0)))
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="a transform that gives every image one size"):
        make_loader(open_dataset(out), 4)


def test_a_distributed_sampler_gets_the_loaders_epochs_and_resumes(tmp_path):
    from torch.utils.data import DistributedSampler

    src = tmp_path / "src"
    make_tree(src, {"ant": 7, "bee": 7})
    out = tmp_path / "out"
    convert(src, out, ConvertConfig("npy", PreprocessConfig(size=(8, 8)), ShardSize(samples=5)), workers=1)
    ds = open_dataset(out, return_meta=True)

    def indices(loader, epoch):
        loader.set_epoch(epoch)
        return [[m["index"] for m in batch[2]] for batch in loader]

    def order(epoch):
        s = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
        s.set_epoch(epoch)
        return list(s)

    loader = make_loader(
        ds,
        4,
        sampler=DistributedSampler(ds, num_replicas=1, rank=0, seed=3),
        num_workers=0,
        collate_fn=lambda samples: (None, None, [s[2] for s in samples]),
    )
    first, second = indices(loader, 0), indices(loader, 1)
    assert sum(first, []) == order(0) and sum(second, []) == order(1) and order(0) != order(1)
    loader.set_epoch(1)
    stream = iter(loader)
    next(stream)
    state = loader.state_dict()
    again = make_loader(
        ds,
        4,
        sampler=DistributedSampler(ds, num_replicas=1, rank=0, seed=3),
        num_workers=0,
        collate_fn=lambda samples: (None, None, [s[2] for s in samples]),
    )
    again.load_state_dict(state)
    assert [[m["index"] for m in batch[2]] for batch in again] == second[1:]
    with pytest.raises(ValueError, match="sampler"):
        make_loader(ds, 4, num_workers=0).load_state_dict(state)


def first_pass(loader):
    """The first ``len(loader)`` batches of a new pass, as a framework takes them: the pass is never
    run to its end (its generator is left suspended after its last batch)."""
    return itertools.islice(iter(loader), len(loader))


def passes(loader, count: int) -> list[list[list[int]]]:
    """The batch indices of ``count`` passes, each taken as ``first_pass`` takes it."""
    return [indices(first_pass(loader)) for _ in range(count)]


def epochs(loader, numbers) -> list[list[list[int]]]:
    """The batch indices of whole passes over the epochs ``numbers``, chosen with ``set_epoch``."""
    out = []
    for epoch in numbers:
        loader.set_epoch(epoch)
        out.append(indices(loader))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_new_pass_is_the_next_epoch_when_a_framework_stops_after_len_batches(packed, fmt):
    def fresh():
        return make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=7)

    taken, want = passes(fresh(), 3), epochs(fresh(), range(3))
    assert taken == want
    assert want[0] != want[1] != want[2]
    assert all(sorted(sum(e, [])) == list(range(N)) for e in taken)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "wds"])
def test_set_epoch_on_the_loaders_sampler_chooses_the_epoch(packed, fmt):
    """Lightning calls set_epoch on ``loader.sampler`` (not on the loader) before each epoch."""
    loader = make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=7)
    got = []
    for epoch in (0, 1, 1, 4):
        loader.sampler.set_epoch(epoch)
        got.append(indices(first_pass(loader)))
    want = epochs(make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=7), (0, 1, 1, 4))
    assert got == want and got[1] == got[2] and got[0] != got[1] != got[3]


def test_an_explicit_set_epoch_wins_over_moving_on(packed):
    loader = make_loader(open_dataset(packed["npy"], return_meta=True), 4, num_workers=0, seed=7)
    first, second = indices(loader), indices(loader)
    assert first != second
    loader.set_epoch(0)
    assert indices(loader) == first
    assert indices(loader) == second  # and without a call, on again from there


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resumed_state_keeps_its_place_when_the_framework_sets_the_same_epoch(packed, fmt):
    """Lightning restores the loader's state, then calls set_epoch with the epoch it was saved in."""

    def fresh():
        return make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=5)

    full = passes(fresh(), 3)
    first = fresh()
    passes(first, 1)
    stream = iter(first)  # epoch 1, two batches taken, then the job is stopped
    seen = [next(stream)[2]["index"].tolist() for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    del stream
    assert (state["epoch"], state["batches"]) == (1, 2)
    resumed = fresh()
    resumed.load_state_dict(state)
    if resumed.sampler is not None:
        resumed.sampler.set_epoch(1)
    resumed.set_epoch(1)
    assert seen + indices(first_pass(resumed)) == full[1]
    assert indices(first_pass(resumed)) == full[2]


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_a_left_pass_does_not_take_a_batch_of_the_next_one(packed, fmt):
    """With persistent workers both passes share the DataLoader's iterator: the left pass must not take
    a batch from it once a newer pass began."""
    loader = make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=7)
    old = iter(loader)
    next(old)
    new = iter(loader)
    first = next(new)
    assert list(old) == []  # the left pass ends without taking anything
    rest = indices(new)
    want = epochs(make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=2, seed=7), [1])[0]
    assert [first[2]["index"].tolist(), *rest] == want
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["batches"] == 0


def test_the_loaders_sampler_can_be_pickled_and_copied_without_its_loader(packed):
    import copy
    import pickle

    loader = make_loader(open_dataset(packed["npy"]), 4, num_workers=0, seed=7)
    for clone in (pickle.loads(pickle.dumps(loader.sampler)), copy.deepcopy(loader.sampler)):
        clone.set_epoch(3)  # follows no loader
        assert clone.batches(3) == loader.sampler.batches(3)
    assert loader.sampler.epoch == 0


def test_the_loader_hands_its_batch_state_to_its_own_copy_of_the_reader(packed):
    """make_loader's buffers and seed go to a copy of the reader (``for_loader``), which takes them to
    the workers when pickled; the caller's reader keeps its own; a tar-shard reader's pass is set on
    the batch plan the loader keeps."""
    import pickle

    from readers.loading.batch_buffers import BatchBuffers

    ds = open_dataset(packed["npy"], seed=4)
    copy = ds.for_loader(BatchBuffers(shared=True, encoded=True), 9, normalize=False)
    assert copy.buffers.shared and copy.buffers.encoded and copy.seed == 9 and copy.convert.normalize is None
    assert ds.buffers == BatchBuffers() and ds.seed == 4 and ds.convert.normalize is not None
    assert pickle.loads(pickle.dumps(copy)).buffers.encoded
    loader = make_loader(open_dataset(packed["wds"]), 5, num_workers=0)
    assert loader.batches is not None and loader.dataset.batches is loader.batches
    next(iter(loader))
    assert loader.batches.this_pass() == (0, 0)


def test_a_state_of_another_output_of_the_same_size_is_refused(packed):
    """npy and lmdb outputs of the same 23 samples: the epoch order would fit, the samples would not."""
    state = make_loader(open_dataset(packed["npy"]), 4, num_workers=0).state_dict()
    make_loader(open_dataset(packed["npy"]), 4, num_workers=0).load_state_dict(state)  # its own output: fine
    with pytest.raises(ValueError, match="saved reading another output"):
        make_loader(open_dataset(packed["lmdb"]), 4, num_workers=0).load_state_dict(state)
