"""make_loader under Hugging Face's training frameworks. Accelerate's ``prepare`` hands the loader back
as it is (it wraps only torch DataLoaders), and ``register_for_checkpointing`` saves and restores its
state_dict; the ``transformers`` Trainer calls ``set_epoch`` each epoch and, resuming mid-epoch, asks
``get_resumed_dataloader``, whose default re-makes a DataLoader: that is refused with what to do instead."""

from __future__ import annotations

import functools
import itertools
import json
import warnings
from pathlib import Path

import pytest
import torch
from conftest import pack_every_format
from helpers import rank_result, run_ranks, stop_workers

from packer import PreprocessConfig
from readers import make_loader, open_dataset

SIZE = 16
N = 23  # 6 batches of 4 an epoch, the last of 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """23 images in 3 classes, as npy (random access) and wds (tar shards read in order)."""
    classes = {"ant": 8, "bee": 7, "cat": 8}
    return pack_every_format(tmp_path_factory, classes, PreprocessConfig(size=(SIZE, SIZE)), 4, ("npy", "wds"))


def _loader(root: Path, workers: int = 0):
    return make_loader(open_dataset(root, return_meta=True), 4, num_workers=workers, seed=3)


def _epochs(root: Path, workers: int, count: int) -> list[list[list[int]]]:
    """make_loader's own epochs 0..count-1: the sample indices of each batch."""
    loader = _loader(root, workers)
    out = []
    for epoch in range(count):
        loader.set_epoch(epoch)
        out.append([meta["index"].tolist() for *_, meta in loader])
    stop_workers(loader)
    return out


class Net(torch.nn.Module):
    """A linear classifier (no download: nothing from the model hub)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3 * SIZE * SIZE, 3)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.linear(images.flatten(1)), labels)


def _accelerate_steps(accelerator, model, optimizer, loader, steps: int) -> list[list[int]]:
    """Train ``steps`` batches from ``loader`` (fewer at the end of a pass): the indices of each."""
    seen = []
    for images, labels, meta in itertools.islice(loader, steps):
        optimizer.zero_grad()
        accelerator.backward(model(images, labels))
        optimizer.step()
        seen.append(meta["index"].tolist())
    return seen


@pytest.mark.parametrize(("fmt", "workers"), [("npy", 0), ("wds", 1)])
def test_accelerate_prepare_passes_the_loader_through_and_save_state_resumes_it(packed, tmp_path, fmt, workers):
    import accelerate

    want = _epochs(packed[fmt], workers, 2)
    accelerator = accelerate.Accelerator(cpu=True)
    loader = _loader(packed[fmt], workers)
    model = Net()
    model, optimizer, prepared = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    assert prepared is loader  # Accelerate wraps only torch DataLoaders; make_loader shards by rank itself
    accelerator.register_for_checkpointing(loader)
    epoch0 = _accelerate_steps(accelerator, model, optimizer, loader, 99)
    first = _accelerate_steps(accelerator, model, optimizer, loader, 2)  # no set_epoch: a new pass moves on
    accelerator.save_state(tmp_path / "state")
    stop_workers(loader)
    assert epoch0 == want[0] and first == want[1][:2] and want[0] != want[1]

    again = accelerate.Accelerator(cpu=True)
    loader = _loader(packed[fmt], workers)
    model = Net()
    model, optimizer = again.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    again.register_for_checkpointing(loader)
    again.load_state(tmp_path / "state")
    assert _accelerate_steps(again, model, optimizer, loader, 99) == want[1][2:]  # the epoch's rest, exactly
    stop_workers(loader)


def _accelerate_run(root: Path) -> tuple:
    """What a training script sets up: an Accelerator, a model and optimizer it prepares, and the
    loader it prepares (handed back as it is) and registers for checkpointing."""
    import accelerate

    accelerator = accelerate.Accelerator(cpu=True)
    model = Net()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = accelerator.prepare(_loader(root))
    accelerator.register_for_checkpointing(loader)
    return accelerator, model, optimizer, loader


def _accelerate_rank(rank: int, world: int, port: int, payload: dict, out: str) -> None:
    """One rank of an Accelerate run launched by torchrun (``Accelerator`` joins the gloo group the
    environment names): per format, the batches of two epochs; then a run saving its state two batches
    into the second epoch and a restart that loads it, their batches."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    result = {}
    for fmt, root in payload.items():
        accelerator, model, optimizer, loader = _accelerate_run(Path(root))
        epochs = [_accelerate_steps(accelerator, model, optimizer, loader, 99) for _ in range(2)]
        accelerator, model, optimizer, loader = _accelerate_run(Path(root))  # a fresh run, saved mid-epoch
        _accelerate_steps(accelerator, model, optimizer, loader, 99)
        before = _accelerate_steps(accelerator, model, optimizer, loader, 2)
        accelerator.save_state(Path(out) / f"state-{fmt}")
        accelerator, model, optimizer, loader = _accelerate_run(Path(root))  # the restart
        accelerator.load_state(Path(out) / f"state-{fmt}")
        after = _accelerate_steps(accelerator, model, optimizer, loader, 99)
        result[fmt] = {"epochs": epochs, "before": before, "after": after}
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    rank_result(out, rank, result)


def test_accelerate_on_two_processes_splits_every_epoch_and_resumes_each_rank_exactly(packed, tmp_path):
    """torchrun-style ranks (what ``accelerate launch`` and ``torchrun`` start): each epoch split
    between the ranks, the next epoch another order, and ``save_state``/``load_state`` (Accelerate
    saves the main process's loader state; every rank loads it) resuming each rank's epoch exactly."""
    ranks = run_ranks(_accelerate_rank, {fmt: str(packed[fmt]) for fmt in ("npy", "wds")}, tmp_path)
    for fmt in ("npy", "wds"):
        a, b = ranks[0][fmt], ranks[1][fmt]
        for epoch in range(2):
            assert len(a["epochs"][epoch]) == len(b["epochs"][epoch]) == 3  # 23 samples, 4 a batch, 2 ranks
            sa, sb = sum(a["epochs"][epoch], []), sum(b["epochs"][epoch], [])
            if fmt == "npy":
                assert not set(sa) & set(sb) and sorted(sa + sb) == list(range(N))
            else:  # disjoint shards per rank; the rank with fewer batches adds resampled ones
                assert set(sa) | set(sb) == set(range(N))
        assert a["epochs"][0] != a["epochs"][1]
        for rank in (a, b):
            assert rank["before"] + rank["after"] == rank["epochs"][1]  # nothing repeated or skipped


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_a_dataloader_remade_around_the_loader_is_refused_saying_what_to_do(packed, fmt):
    """accelerate's skip_first_batches re-makes a torch DataLoader from the loader's dataset: its batch
    order, collate and device placement would be lost, so it fails naming the loader's own resume."""
    import accelerate

    with pytest.raises(AttributeError, match="not a torch DataLoader.*load_state_dict.*register_for_checkpointing"):
        accelerate.skip_first_batches(_loader(packed[fmt]), 2)


@functools.cache
def _trainers() -> tuple[type, type]:
    """The two Trainer classes below. transformers (in the test extra) is imported by the tests that
    use it, as is accelerate: imported at collection, they cost every test process time and memory,
    which each of its forks then copied."""
    import transformers

    class PackedTrainer(transformers.Trainer):
        """The lines docs/READERS.md gives: the loader from make_loader, resumed by its own state."""

        def __init__(self, root: Path, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.root, self.seen = root, []

        def get_train_dataloader(self):
            return _loader(self.root)

        def get_resumed_dataloader(self, loader, batches):
            # The Trainer resumes epoch int(state.epoch) after `batches` batches: the loader starts there
            loader.load_state_dict({**loader.state_dict(), "epoch": int(self.state.epoch), "batches": batches})
            return loader

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            images, labels, meta = inputs
            self.seen.append(meta["index"].tolist())
            return model(images, labels)

    class DefaultResume(PackedTrainer):
        """A Trainer that keeps transformers' own mid-epoch resume (accelerate's skip_first_batches)."""

        get_resumed_dataloader = transformers.Trainer.get_resumed_dataloader

    return PackedTrainer, DefaultResume


def _train(trainer_class, root: Path, out: Path, resume: bool = False) -> list[list[int]]:
    """10 steps of 4 (an epoch and 4 batches) with a checkpoint at step 8; resuming from it if asked."""
    import transformers

    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=10, save_steps=8, per_device_train_batch_size=4, use_cpu=True,
        report_to=[], logging_strategy="no", disable_tqdm=True, seed=3,
    )  # fmt: skip
    trainer = trainer_class(root, model=Net(), args=args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-8") if resume else None)
    return trainer.seen


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_transformers_trainer_gets_each_epochs_order_and_resumes_exactly(packed, tmp_path, fmt):
    want = _epochs(packed[fmt], 0, 2)
    assert want[0] != want[1]
    assert _train(_trainers()[0], packed[fmt], tmp_path) == want[0] + want[1][:4]  # set_epoch(e) each epoch
    state = json.loads((tmp_path / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["global_step"] == 8  # epoch 1 after 2 of its 6 batches
    assert _train(_trainers()[0], packed[fmt], tmp_path, resume=True) == want[1][2:4]  # nothing repeated or skipped
    with pytest.raises(AttributeError, match="not a torch DataLoader.*get_resumed_dataloader"):
        _train(_trainers()[1], packed[fmt], tmp_path, resume=True)
