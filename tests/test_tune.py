"""packer tune: the doubling search (with a fake measure), the real measure, the code it recommends,
and the command."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import make_tree
from helpers import FakeClock, exited_cleanly

from packer import ConvertConfig, PreprocessConfig, convert
from packer.advisor.tune import (
    LoaderMeasure,
    Measurement,
    Trial,
    most_useful_workers,
    recommended_code,
    tune,
    worker_counts,
)
from packer.cli import cli
from packer.config import ShardSize
from packer.spec.errors import ConfigError
from readers import open_dataset

PRE = PreprocessConfig(size=(24, 16))
# The module itself: packer.advisor exports the function tune, which hides the submodule of that name.
TUNE_MODULE = importlib.import_module("packer.advisor.tune")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """16 images in 2 classes as npy and wds outputs of 4 shards."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"a": 8, "b": 8}, size=(32, 24))
    out = tmp_path_factory.mktemp("out")
    for fmt in ("npy", "wds"):
        convert(root, out / fmt, ConvertConfig(fmt, PRE, ShardSize(samples=4)), workers=1)
    return {"npy": out / "npy", "wds": out / "wds"}


class FakeMeasure:
    """Samples/s from a table by (workers, prefetch) (or by workers alone); records what it was asked."""

    def __init__(self, rates: dict) -> None:
        self.rates, self.calls = rates, []

    def __call__(self, trial: Trial, seconds: float) -> Measurement:
        self.calls.append((trial, seconds))
        rate = self.rates.get((trial.num_workers, trial.prefetch_factor), self.rates.get(trial.num_workers))
        return Measurement(rate, peak_memory=100 * (1 + trial.num_workers), samples=int(rate), seconds=1.0)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """The search's clock, standing still but for the time a fake measure lets pass."""
    fake = FakeClock()
    monkeypatch.setattr(TUNE_MODULE, "_clock", fake)
    return fake


@pytest.fixture
def real_measure_on_the_clock(clock, monkeypatch) -> None:
    """The real LoaderMeasure, each trial then moving the search's clock by exactly its share: which trials
    run depends on the budget alone, not on how long a busy machine takes to start and stop workers."""
    measure = LoaderMeasure.__call__

    def measured(self: LoaderMeasure, trial: Trial, seconds: float) -> Measurement:
        m = measure(self, trial, seconds)
        clock.advance(seconds)
        return m

    monkeypatch.setattr(LoaderMeasure, "__call__", measured)


def test_worker_counts_double_up_to_the_most_useful():
    assert worker_counts(1) == [0, 1]
    assert worker_counts(6) == [0, 1, 2, 4, 6]
    assert worker_counts(8) == [0, 1, 2, 4, 8]


def test_doubling_stops_when_it_no_longer_helps_by_the_margin():
    fake = FakeMeasure({0: 100, 1: 200, 2: 390, 4: 400, 8: 2000, (2, 1): 300, (2, 4): 395})
    result = tune(fake, max_workers=8, seconds=10)
    tried = [t.num_workers for t, _ in fake.calls]
    assert tried == [0, 1, 2, 4, 2, 2]  # 8 workers never tried: 4 gained only 3% over 2
    assert "doubling to 4 workers" in result.stopped and "+3%" in result.stopped
    # prefetch 4 is within 10% of 2 and costs more memory: the default 2 stays
    assert result.best == Trial(2, 2)
    assert result.measured(result.best).samples_per_s == 390
    assert result.baseline.samples_per_s == 100


def test_doubling_goes_on_while_it_helps_and_a_faster_prefetch_wins():
    fake = FakeMeasure({0: 100, 1: 150, 2: 300, 4: 600, 6: 900, (6, 1): 500, (6, 4): 1200})
    result = tune(fake, max_workers=6, seconds=10)
    assert [t.num_workers for t, _ in result.trials] == [0, 1, 2, 4, 6, 6, 6]
    assert "tried up to 6" in result.stopped
    assert result.best == Trial(6, 4)


def test_fewer_workers_win_when_within_the_margin():
    fake = FakeMeasure({0: 100, 1: 500, 2: 1000, 4: 1060, (2, 1): 1000, (2, 4): 1000})
    result = tune(fake, max_workers=4, seconds=10)
    assert result.best == Trial(2, 1)  # prefetch 1 as fast as 2: less memory


def test_the_main_process_is_recommended_only_when_clearly_faster():
    fake = FakeMeasure({0: 1000, 1: 300, 2: 310})
    result = tune(fake, max_workers=2, seconds=10)
    assert result.best == Trial(0) and [t.num_workers for t, _ in result.trials] == [0, 1, 2]


def test_the_time_budget_is_split_and_respected(clock):
    def sleeping(trial: Trial, seconds: float) -> Measurement:
        given.append(seconds)
        clock.advance(seconds)  # takes exactly its share
        return Measurement(100.0 * (trial.num_workers + 1))

    given: list[float] = []
    start = clock()
    result = tune(sleeping, max_workers=1, seconds=1.2)
    assert clock() - start == result.seconds <= 1.2 + 1e-6  # on a fake clock the search itself takes no time
    assert sum(given) <= 1.2 + 1e-6 and len(given) == 4  # 0 and 1 worker, then prefetch 1 and 4
    assert given[0] == pytest.approx(0.3)  # a quarter each
    assert result.best.num_workers == 1
    with pytest.raises(ConfigError, match="no time to measure"):
        tune(sleeping, max_workers=4, seconds=0.1)


def test_a_measure_that_overruns_its_share_does_not_overrun_the_budget(clock):
    def overrunning(trial: Trial, seconds: float) -> Measurement:
        clock.advance(seconds + 0.1)  # e.g. stopping its workers after the timed part
        return Measurement(100.0 * (trial.num_workers + 1))

    start = clock()
    result = tune(overrunning, max_workers=1, seconds=1.2)
    assert clock() - start == result.seconds <= 1.2  # on a fake clock the search itself takes no time
    assert len(result.trials) >= 2


def test_most_useful_workers_is_capped_by_batches_and_shards(outputs):
    assert most_useful_workers(open_dataset(outputs["npy"]), 4, cpus=8) == 4  # 16 samples: 4 batches
    assert most_useful_workers(open_dataset(outputs["npy"]), 64, cpus=8) == 1
    assert most_useful_workers(open_dataset(outputs["npy"]), 1, cpus=2) == 4  # twice the cores
    assert most_useful_workers(open_dataset(outputs["wds"]), 1, cpus=8) == 4  # 4 shards


def test_the_real_measure_gives_rate_and_memory(outputs):
    measure = LoaderMeasure(open_dataset(outputs["npy"]), 4, memory_every=0.05)
    for trial in (Trial(0), Trial(1, 2)):
        m = measure(trial, 0.4)
        assert m.samples_per_s > 0 and m.samples > 0 and m.seconds > 0
        assert m.peak_memory > 10 * 2**20  # this process alone holds torch


@pytest.mark.parametrize("fmt", ["npy", "wds"])
def test_recommended_code_runs_against_the_output(outputs, fmt):
    for trial in (Trial(0), Trial(1, 4)):
        code = recommended_code(outputs[fmt], fmt, 4, trial)
        for name, text in code.items():
            namespace: dict = {}
            exec(compile(text, f"<{name}>", "exec"), namespace)
            images, labels = next(iter(namespace["loader"]))
            assert images.shape == (4, 3, 16, 24) and images.dtype == torch.float32 and len(labels) == 4
            del namespace
    cuda = recommended_code(outputs["npy"], "npy", 4, Trial(2, 2), cuda=True)
    assert 'device="cuda"' in cuda["make_loader"] and "pin_memory=True" in cuda["DataLoader"]
    for text in cuda.values():
        compile(text, "<cuda>", "exec")


def test_tune_command_json_and_text(outputs, real_measure_on_the_clock):
    result = CliRunner().invoke(
        cli,
        [
            "tune",
            str(outputs["npy"]),
            "-b",
            "4",
            "--seconds",
            "2",
            "--device",
            "cpu",
            "--max-workers",
            "1",
            "--json",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"trials", "recommended", "code", "stopped", "seconds"} <= set(data)
    assert [t["num_workers"] for t in data["trials"]][:2] == [0, 1]
    for t in data["trials"]:
        assert t["samples_per_s"] > 0 and t["peak_memory_bytes"] > 0
    assert data["recommended"]["num_workers"] in {t["num_workers"] for t in data["trials"]}
    assert data["seconds"] <= 2 + 1e-6  # within --seconds, on the search's fake clock
    for text in data["code"].values():
        compile(text, "<code>", "exec")
    text = CliRunner().invoke(
        cli, ["tune", str(outputs["npy"]), "-b", "8", "--seconds", "1", "--device", "cpu", "--max-workers", "1", "-q"]
    )
    assert text.exit_code == 0, text.output
    assert "main process (0 workers)" in text.stdout and "<- recommended" in text.stdout
    assert "recommended:" in text.stdout and "loader = make_loader(" in text.stdout
    assert "loader = DataLoader(" in text.stdout and f"open_dataset({str(outputs['npy'])!r}" in text.stdout


def test_tune_refuses_what_is_not_an_output(tmp_path):
    result = CliRunner().invoke(cli, ["tune", str(tmp_path), "--seconds", "1"])
    assert result.exit_code == 1 and "not a packer output" in result.output and exited_cleanly(result)


def test_tune_checks_the_device(outputs):
    bad = CliRunner().invoke(cli, ["tune", str(outputs["npy"]), "--device", "gpu"])
    assert bad.exit_code == 2 and "--device" in bad.output
    if not torch.cuda.is_available():
        none = CliRunner().invoke(cli, ["tune", str(outputs["npy"]), "--device", "cuda"])
        assert none.exit_code == 2 and "no CUDA device" in none.output


def test_recommended_code_for_a_text_output_runs(tmp_path):
    from pathlib import Path

    from packer import ConvertConfig, convert

    src = Path(__file__).resolve().parents[1] / "sample_data" / "texts"
    out = convert(src, tmp_path / "texts", ConvertConfig("npy"), workers=1).output
    measured = LoaderMeasure(open_dataset(out), 4, memory_every=0.05)(Trial(0), 0.3)
    assert measured.samples > 0
    for trial in (Trial(0), Trial(1, 2)):
        for name, text in recommended_code(out, "npy", 4, trial, text=True).items():
            namespace: dict = {}
            exec(compile(text, f"<{name}>", "exec"), namespace)
            batch = next(iter(namespace["loader"]))
            assert len(batch["texts"]) == 4 and batch["labels"].shape == (4,)
            del namespace
