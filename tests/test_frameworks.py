"""make_loader under a real training framework: PyTorch Lightning's Trainer drives the loader itself
(it calls iter() to check it, set_epoch on ``loader.sampler`` and stops after ``len(loader)``
batches), and every epoch must still be the next epoch's order."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest
import torch
from conftest import pack_every_format
from helpers import rank_result, run_ranks, stop_workers

from packer import PreprocessConfig
from readers import make_loader, open_dataset

SIZE = 16
N = 23


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """23 images in 3 classes, as npy (random access) and wds (tar shards read in order)."""
    classes = {"ant": 8, "bee": 7, "cat": 8}
    return pack_every_format(tmp_path_factory, classes, PreprocessConfig(size=(SIZE, SIZE)), 4, ("npy", "wds"))


@functools.cache
def _recorder() -> type:
    """The LightningModule class below. Lightning (in the test extra) is imported by the tests that
    use it: imported at collection, it cost every test process seconds of CPU and its memory, which
    each of its forks then copied."""
    import lightning

    class Recorder(lightning.LightningModule):
        """A linear classifier that records the sample indices of every batch it trains on, by epoch."""

        def __init__(self, root: Path, workers: int) -> None:
            super().__init__()
            self.root, self.workers = root, workers
            self.linear = torch.nn.Linear(3 * SIZE * SIZE, 3)
            self.seen: dict[int, list[list[int]]] = {}
            self.loaders: list = []  # those train_dataloader made, to stop their workers after fit

        def training_step(self, batch, index):
            images, labels, meta = batch
            self.seen.setdefault(self.current_epoch, []).append(meta["index"].tolist())
            return torch.nn.functional.cross_entropy(self.linear(images.flatten(1)), labels)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            self.loaders.append(
                make_loader(open_dataset(self.root, return_meta=True), 4, num_workers=self.workers, seed=3)
            )
            return self.loaders[-1]

        def stop(self) -> None:
            """Stop the workers of the loaders this module made (see helpers.stop_workers)."""
            for loader in self.loaders:
                stop_workers(loader)

    return Recorder


def _module(root: Path, workers: int):
    """A ``_recorder`` module of ``root``'s samples, read by ``workers`` workers."""
    return _recorder()(root, workers)


@pytest.mark.parametrize(("fmt", "workers"), [("npy", 0), ("npy", 2), ("wds", 2)])
def test_lightning_trainer_gets_the_next_epochs_order_every_epoch(packed, fmt, workers):
    model = _module(packed[fmt], workers)
    trainer = _trainer(max_epochs=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(model)
    model.stop()
    reference = make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=workers, seed=3)
    want = []
    for epoch in range(3):
        reference.set_epoch(epoch)
        want.append([meta["index"].tolist() for *_, meta in reference])
    stop_workers(reference)
    assert [model.seen[e] for e in range(3)] == want
    assert want[0] != want[1] != want[2]
    assert all(sorted(sum(batches, [])) == list(range(N)) for batches in want)


def _trainer(**kwargs):
    """A quiet CPU ``lightning.Trainer`` for 2 epochs; ``kwargs`` add to or replace its arguments."""
    import lightning

    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    return lightning.Trainer(**{"max_epochs": 2, "accelerator": "cpu", "devices": 1, **quiet, **kwargs})


def _lightning_ddp_rank(rank: int, world: int, port: int, payload: dict, out: str) -> None:
    """One rank of a Lightning DDP run launched as torchrun does (Lightning sees LOCAL_RANK and does
    not start processes itself): the batches this rank trained on, by epoch, per format."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), NODE_RANK="0")
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    result = {}
    for fmt, root in payload.items():
        model = _module(Path(root), 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _trainer(devices=world, strategy="ddp").fit(model)
        result[fmt] = [model.seen[e] for e in range(2)]
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()  # Lightning leaves it: gloo's threads would abort the exit
    rank_result(out, rank, result)


@pytest.mark.long
def test_lightning_ddp_on_two_processes_splits_every_epoch_between_the_ranks(packed, tmp_path):
    ranks = run_ranks(_lightning_ddp_rank, {fmt: str(packed[fmt]) for fmt in ("npy", "wds")}, tmp_path)
    for fmt in ("npy", "wds"):
        a, b = ranks[0][fmt], ranks[1][fmt]
        for epoch in range(2):
            assert len(a[epoch]) == len(b[epoch]) == 3  # equal batch counts: 23 samples, 4 a batch on 2 ranks
            sa, sb = sum(a[epoch], []), sum(b[epoch], [])
            if fmt == "npy":
                assert not set(sa) & set(sb) and sorted(sa + sb) == list(range(N))
            else:  # disjoint shards per rank; the rank with fewer batches adds resampled ones
                assert set(sa) | set(sb) == set(range(N))
        assert a[0] != a[1] and b[0] != b[1]


@pytest.mark.parametrize(("fmt", "workers"), [("npy", 0), ("wds", 2)])
def test_lightning_resumes_a_mid_epoch_checkpoint_exactly(packed, tmp_path, fmt, workers):
    """Lightning saves the loader's state_dict in its checkpoint (loops.fit_loop.state_dict.combined_loader)
    and loads it on fit(ckpt_path=...): the restart trains on exactly the batches of that epoch not yet seen."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    full = _module(packed[fmt], workers)
    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=8, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _trainer(callbacks=[every], enable_checkpointing=True).fit(full)
        checkpoint = tmp_path / "epoch=1-step=8.ckpt"  # 6 batches an epoch: 2 batches into the second epoch
        saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert [(s["epoch"], s["batches"]) for s in saved] == [(1, 2)]
        resumed = _module(packed[fmt], workers)
        _trainer().fit(resumed, ckpt_path=checkpoint)
    full.stop()
    resumed.stop()
    assert list(resumed.seen) == [1] and resumed.seen[1] == full.seen[1][2:]
    assert sorted(sum(full.seen[1][:2] + resumed.seen[1], [])) == list(range(N))
