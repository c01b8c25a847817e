"""Weighted mixtures of outputs: proportions, each part's own normalization, streams across epochs, exact resume."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import write_image
from helpers import rank_result, run_ranks

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from readers import RandomResizedCrop, make_loader, open_dataset, open_mixture
from readers.compose.mixture import allocate

PRE = PreprocessConfig(size=(16, 12), auto_normalize=True)


def make_output(root: Path, name: str, n: int, base: int, fmt: str = "npy") -> Path:
    """An output of ``n`` images in classes a and b, their keys starting with ``name``; pixels around ``base``."""
    src = root / f"src-{name}"
    for i in range(n):
        write_image(src / ("a" if i % 2 else "b") / f"{name}-{i:03d}.png", (20, 16), seed=base + i)
    out = root / name
    convert(src, out, ConvertConfig(fmt, PRE, ShardSize(samples=7)), workers=1)
    return out


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mix")
    return {"web": make_output(root, "web", 60, 0), "cur": make_output(root, "cur", 13, 500, "lmdb")}


def keys(batch) -> list[str]:
    return list(batch[-1]["key"])


def test_allocate_adds_up_and_follows_the_weights():
    assert allocate([0.7, 0.3], 100) == [70, 30]
    assert allocate([1, 1, 1], 10) == [4, 3, 3]
    assert sum(allocate([0.123, 5, 0.4], 997)) == 997


def test_an_epoch_holds_each_part_in_its_proportion_and_each_part_normalized_by_its_own_manifest(parts):
    mix = open_mixture(
        {"web": (parts["web"], 0.7), "cur": (parts["cur"], 0.3)}, epoch_size=1000, seed=3, return_meta=True
    )
    assert mix.proportions() == {"web": 700, "cur": 300} and len(mix) == 1000
    counts = Counter(mix.names[mix.draw(i, 0)[0]] for i in range(1000))
    assert counts == {"web": 700, "cur": 300}
    first_100 = Counter(mix.names[mix.draw(i, 0)[0]] for i in range(100))  # interleaved, not one part then the other
    assert abs(first_100["web"] - 70) <= 1
    web, cur = open_dataset(parts["web"], return_meta=True), open_dataset(parts["cur"], return_meta=True)
    assert web.convert.normalize.mean.tolist() != cur.convert.normalize.mean.tolist()
    for i in (0, 1, 2, 3, 500, 999):
        k, j = mix.draw(i, 0)
        image, label, meta = mix[i]
        want = (web, cur)[k][j]
        assert torch.equal(image, want[0]) and label == want[1] and meta["key"] == want[2]["key"]


def test_each_part_is_a_stream_over_epochs(parts):
    mix = open_mixture({"web": (parts["web"], 1), "cur": (parts["cur"], 1)}, epoch_size=20, seed=0)
    assert mix.proportions() == {"web": 10, "cur": 10}
    seen = {0: [], 1: []}
    for epoch in range(6):
        for i in range(20):
            k, j = mix.draw(i, epoch)
            seen[k].append(j)
    web, cur = seen[0], seen[1]
    assert len(set(web)) == 60  # 6 epochs x 10 draws: the whole of web, each sample once
    # cur repeats only after a full pass
    assert sorted(cur[:13]) == list(range(13)) and sorted(cur[13:26]) == list(range(13))
    assert cur[:13] != cur[13:26]  # in another order each pass
    assert [mix.draw(i, 2) for i in range(20)] != [mix.draw(i, 1) for i in range(20)]
    again = open_mixture({"web": (parts["web"], 1), "cur": (parts["cur"], 1)}, epoch_size=20, seed=0)
    assert [again.draw(i, 4) for i in range(20)] == [mix.draw(i, 4) for i in range(20)]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_do_not_depend_on_the_workers_and_resume_exactly(parts, workers):
    spec = {"web": (parts["web"], 0.7), "cur": (parts["cur"], 0.3)}

    def loader():
        return make_loader(open_mixture(spec, epoch_size=50, seed=5, return_meta=True), 8, num_workers=workers)

    whole = []
    full = loader()
    for epoch in range(3):
        full.set_epoch(epoch)
        whole.append([keys(b) for b in full])
    assert len(whole[0]) == 7 and whole[0] != whole[1]
    assert whole == [
        [
            keys(b)
            for b in _epoch(
                make_loader(open_mixture(spec, epoch_size=50, seed=5, return_meta=True), 8, num_workers=0), e
            )
        ]
        for e in range(3)
    ]
    first = loader()
    first.set_epoch(1)
    it = iter(first)
    taken = [keys(next(it)) for _ in range(3)]
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 3
    resumed = loader()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [keys(b) for b in resumed]
    assert taken + rest == whole[1]
    resumed.set_epoch(2)
    assert [keys(b) for b in resumed] == whole[2]


def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def test_resume_refuses_another_mixture(parts):
    loader = make_loader(
        open_mixture({"web": (parts["web"], 0.7), "cur": (parts["cur"], 0.3)}, epoch_size=50), 8, num_workers=0
    )
    state = loader.state_dict()
    other = make_loader(
        open_mixture({"web": (parts["web"], 0.6), "cur": (parts["cur"], 0.4)}, epoch_size=50), 8, num_workers=0
    )
    with pytest.raises(ValueError, match="cannot resume: the state was saved with mixture="):
        other.load_state_dict(state)


def test_parts_that_cannot_mix_are_refused(parts, tmp_path):
    wds = make_output(tmp_path, "tars", 5, 900, "wds")
    with pytest.raises(ValueError, match="tar shards are read in order.*packer convert OUTPUT -f lmdb"):
        open_mixture({"a": (parts["web"], 1), "b": (wds, 1)})
    src = tmp_path / "other"
    for name in ("x", "y"):
        write_image(src / name / "1.png", (20, 16))
    other = tmp_path / "other-out"
    convert(src, other, ConvertConfig("npy", PRE), workers=1)
    with pytest.raises(ValueError, match="different class maps"):
        open_mixture({"a": (parts["web"], 1), "b": (other, 1)})
    with pytest.raises(ValueError, match="weight 0: weights must be positive"):
        open_mixture({"a": (parts["web"], 0), "b": (parts["cur"], 1)})
    sizes = tmp_path / "sizes"
    convert(tmp_path / "src-tars", sizes, ConvertConfig("npy", PreprocessConfig(resize="none")), workers=1)
    with pytest.raises(ValueError, match="image shape"):
        open_mixture({"a": (parts["web"], 1), "b": (sizes, 1)})
    cropped = open_mixture({"a": (parts["web"], 1), "b": (sizes, 1)}, crop=RandomResizedCrop(8), seed=2)
    images, labels = next(iter(make_loader(cropped, 4, num_workers=0)))
    assert images.shape == (4, 3, 8, 8) and labels.shape == (4,)


def _ddp_rank(rank: int, world: int, port: int, spec: dict, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    parts = {n: (p, w) for n, (p, w) in spec.items()}

    def loader():
        return make_loader(open_mixture(parts, epoch_size=45, seed=9, return_meta=True), 4, num_workers=1)

    whole = loader()
    epochs = []
    for epoch in range(3):
        whole.set_epoch(epoch)
        seen = []
        for batch in whole:
            dist.all_reduce(torch.ones(1))  # hangs if a rank runs out of batches early
            seen.append(keys(batch))
        epochs.append(seen)
    first = loader()
    first.set_epoch(1)
    it = iter(first)
    taken = [keys(next(it)) for _ in range(2)]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    rest = [keys(b) for b in resumed]
    resumed.set_epoch(2)
    last = [keys(b) for b in resumed]
    dist.barrier()
    dist.destroy_process_group()
    rank_result(out, rank, {"epochs": epochs, "resumed": [taken + rest, last]})


def test_two_ddp_ranks_get_equal_batches_and_resume_exactly_across_epochs(parts, tmp_path):
    spec = {"web": (str(parts["web"]), 0.7), "cur": (str(parts["cur"]), 0.3)}
    ranks = run_ranks(_ddp_rank, spec, tmp_path)
    mix = open_mixture({n: (p, w) for n, (p, w) in spec.items()}, epoch_size=45, seed=9)
    for epoch in range(3):
        a, b = ranks[0]["epochs"][epoch], ranks[1]["epochs"][epoch]
        assert len(a) == len(b)
        drawn = Counter(k.split("/")[-1].split("-")[0] for batch in a + b for k in batch)
        want = mix.proportions()
        assert abs(drawn["web"] - want["web"]) <= 1 and abs(drawn["cur"] - want["cur"]) <= 1  # one padded sample
    for r in range(2):
        assert ranks[r]["resumed"] == ranks[r]["epochs"][1:]
    assert len(ranks[0]["epochs"][0]) == 6  # 45 samples: 23 a rank (one repeated), in batches of 4
    assert ranks[0]["epochs"][0] != ranks[1]["epochs"][0]


def test_parts_that_would_batch_wrongly_are_refused(parts, tmp_path):
    web, cur = open_dataset(parts["web"], normalize=False), open_dataset(parts["cur"])
    with pytest.raises(ValueError, match="give samples of other kinds \\(image dtype, normalized"):
        open_mixture({"web": (web, 1), "cur": (cur, 1)})
    src = tmp_path / "halves"
    for i in range(4):
        write_image(src / ("a" if i % 2 else "b") / f"h-{i}.png", (20, 16), seed=i)
    halves = tmp_path / "halves-out"
    convert(src, halves, ConvertConfig("npy", PreprocessConfig(size=(16, 12), dtype="float16")), workers=1)
    with pytest.raises(ValueError, match="image dtype"):
        open_mixture({"web": (web, 1), "h": (open_dataset(halves, normalize=False), 1)})
    with pytest.raises(ValueError, match="would get no sample of an epoch of 100: raise their weight"):
        open_mixture({"web": (parts["web"], 1), "cur": (parts["cur"], 0.001)}, epoch_size=100)
    for bad in (2.7, "10", True):
        with pytest.raises(ValueError, match="epoch_size must be a whole number"):
            open_mixture({"web": (parts["web"], 1)}, epoch_size=bad)
    with pytest.raises(ValueError, match="weight '0.5': weights must be positive numbers"):
        open_mixture({"web": (parts["web"], "0.5")})
    with pytest.raises(ValueError, match="bucket_by_length"):
        make_loader(open_mixture({"web": (parts["web"], 1)}), 4, bucket_by_length=True)


def test_a_sample_drawn_twice_in_an_epoch_is_cropped_anew_and_the_callers_readers_are_left_alone(parts):
    cur = open_dataset(parts["cur"], crop=RandomResizedCrop(8), flip=True, seed=123)
    mix = open_mixture({"cur": (cur, 1)}, epoch_size=39, seed=4)  # 13 samples drawn 3 times an epoch
    assert cur.seed == 123
    mix.set_epoch(0)
    by_sample: dict[int, list] = {}
    for i in range(39):
        by_sample.setdefault(mix.draw(i, 0)[1], []).append(mix[i][0])
    assert all(len(v) == 3 for v in by_sample.values())
    assert all(not torch.equal(v[0], v[1]) or not torch.equal(v[1], v[2]) for v in by_sample.values())
    first = [keys_of(b) for b in make_loader(mix, 13, num_workers=0)]
    other = [keys_of(b) for b in make_loader(mix, 13, num_workers=0, seed=5)]  # the loader's seed draws too
    assert first != other


def keys_of(batch) -> list:
    return batch[0].flatten()[:4].tolist()


def test_parts_draw_crops_of_their_own(parts):
    """Parts of one mixture seed take their crops from numbers of their own: the same output twice as
    two parts gives sample j of each other crops (they all shared the mixture's seed)."""
    from readers.compose.mixture import part_seed

    a, b = (open_dataset(parts["web"], crop=RandomResizedCrop(8), flip=True, return_meta=True) for _ in range(2))
    mix = open_mixture({"a": (a, 1), "b": (b, 1)}, seed=5)
    assert [d.seed for d in mix.datasets] == [part_seed(5, 0), part_seed(5, 1)] and part_seed(5, 0) != part_seed(5, 1)
    mix.set_epoch(0)
    seen = {}
    for i in range(len(mix)):
        part, j = mix.draw(i, 0)
        meta = mix[i][-1]
        seen[part, j] = (meta["crop"], meta["flip"])
    pairs = [(seen[0, j], seen[1, j]) for p, j in seen if p == 0 and (1, j) in seen]
    assert len(pairs) > 20 and sum(x == y for x, y in pairs) < len(pairs) // 4
    assert [d.seed for d in mix.with_seed(6).datasets] == [part_seed(6, 0), part_seed(6, 1)]
