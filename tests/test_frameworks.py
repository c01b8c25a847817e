"""make_loader under a real training framework: PyTorch Lightning's Trainer drives the loader itself
(it calls iter() to check it, set_epoch on ``loader.sampler`` and stops after ``len(loader)``
batches), and every epoch must still be the next epoch's order."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from conftest import pack_every_format

from packer import PreprocessConfig
from readers import make_loader, open_dataset

lightning = pytest.importorskip("lightning")  # in the test extra: never skipped after the README's install

SIZE = 16
N = 23


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """23 images in 3 classes, as npy (random access) and wds (tar shards read in order)."""
    classes = {"ant": 8, "bee": 7, "cat": 8}
    return pack_every_format(tmp_path_factory, classes, PreprocessConfig(size=(SIZE, SIZE)), 4, ("npy", "wds"))


class Recorder(lightning.LightningModule):
    """A linear classifier that records the sample indices of every batch it trains on, by epoch."""

    def __init__(self, root: Path, workers: int) -> None:
        super().__init__()
        self.root, self.workers = root, workers
        self.linear = torch.nn.Linear(3 * SIZE * SIZE, 3)
        self.seen: dict[int, list[list[int]]] = {}

    def training_step(self, batch, index):
        images, labels, meta = batch
        self.seen.setdefault(self.current_epoch, []).append(meta["index"].tolist())
        return torch.nn.functional.cross_entropy(self.linear(images.flatten(1)), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return make_loader(open_dataset(self.root, return_meta=True), 4, num_workers=self.workers, seed=3)


@pytest.mark.parametrize(("fmt", "workers"), [("npy", 0), ("npy", 2), ("wds", 2)])
def test_lightning_trainer_gets_the_next_epochs_order_every_epoch(packed, fmt, workers):
    model = Recorder(packed[fmt], workers)
    trainer = lightning.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(model)
    reference = make_loader(open_dataset(packed[fmt], return_meta=True), 4, num_workers=workers, seed=3)
    want = []
    for epoch in range(3):
        reference.set_epoch(epoch)
        want.append([meta["index"].tolist() for *_, meta in reference])
    assert [model.seen[e] for e in range(3)] == want
    assert want[0] != want[1] != want[2]
    assert all(sorted(sum(batches, [])) == list(range(N)) for batches in want)
