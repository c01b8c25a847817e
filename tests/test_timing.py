"""time_loader: warm-up excluded, passes repeated until the time is up, bounded overshoot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers import FakeClock

from packer.advisor import timing
from packer.advisor.timing import busy_note, check_images, time_loader
from packer.spec.errors import ConfigError


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """time_loader's clock, standing still but for the time a SlowLoader lets pass."""
    fake = FakeClock()
    monkeypatch.setattr(timing, "_clock", fake)
    return fake


class SlowLoader:
    """Batches of ``size`` labels, ``batches`` per pass, each ``delay`` seconds apart on ``clock``; the
    first batch of a pass takes ``first`` seconds (a worker starting)."""

    def __init__(self, clock: FakeClock, batches: int, size: int, delay: float, first: float = 0.0) -> None:
        self.clock, self.batches, self.size, self.delay, self.first, self.passes = clock, batches, size, delay, first, 0

    def __iter__(self):
        self.passes += 1
        for i in range(self.batches):
            self.clock.advance(self.first if i == 0 and self.passes == 1 else self.delay)
            yield torch.zeros(self.size, 1), torch.zeros(self.size)


def test_warm_up_is_not_timed_and_passes_repeat(clock):
    loader = SlowLoader(clock, batches=3, size=4, delay=0.01, first=0.2)
    start = clock()
    rate = time_loader(loader, 0.4, warmup_batches=1)
    assert clock() - start < 0.4 + 0.01 + 1e-9  # overshoot: at most one batch
    assert rate.warm and rate.warmup_seconds >= 0.2 and loader.passes > 1
    assert rate.samples % 4 == 0 and rate.samples_per_s == pytest.approx(rate.samples / rate.seconds)
    assert 4 / 0.01 * 0.5 < rate.samples_per_s < 4 / 0.01 * 1.1  # the warm-up's slow batch is not in it


def test_time_out_during_the_warm_up_still_reports(clock):
    rate = time_loader(SlowLoader(clock, batches=2, size=2, delay=0.05, first=0.05), 0.01, warmup_batches=5)
    assert not rate.warm and rate.samples == 2 and rate.samples_per_s > 0


def test_an_empty_loader_is_an_error():
    with pytest.raises(ValueError, match="no batch"):
        time_loader([], 1.0)


def test_busy_note(monkeypatch):
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (3.0, 1.0, 1.0))
    assert "load average is 3.0 on 2 core(s)" in busy_note(2)
    monkeypatch.setattr(timing.os, "getloadavg", lambda: (0.2, 1.0, 1.0))
    assert busy_note(2) is None


def test_check_images():
    check_images(SimpleNamespace(fields={"image": {"shape": [8, 8, 3]}}), 64, "out")
    check_images(SimpleNamespace(fields={"image": {"shape": None}}), 1, "out")
    with pytest.raises(ConfigError, match="--resize none"):
        check_images(SimpleNamespace(fields={"image": {"shape": None}}), 2, "out")
    with pytest.raises(ConfigError, match="out holds no images"):
        check_images(SimpleNamespace(fields={"text": {}}), 1, "out")


def test_batch_sizes_of_tuples_and_pad_collate_dicts():
    from packer.advisor.timing import batch_size_of

    assert batch_size_of((torch.zeros(3, 1), torch.zeros(3))) == 3
    assert batch_size_of({"input_ids": torch.zeros(5, 7), "labels": torch.zeros(5)}) == 5
