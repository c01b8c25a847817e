"""The local executor's loop as an object (packer.run.executor.JobRunner): jobs added while others run,
and cancelled ones leave neither files nor counted progress behind."""

from __future__ import annotations

import time
from dataclasses import replace

import packer.run.worker
from packer.config import PreprocessConfig
from packer.records import ShardTask
from packer.run.executor import JobRunner
from packer.run.shard_job import ShardJob
from packer.sources.discover import discover
from packer.spec.sample_layout import SampleLayout


def _jobs(tree, stage, per: int = 5) -> list[ShardJob]:
    items = discover(tree).items
    layout = SampleLayout("uint8", (8, 8, 3), 3)
    return [
        ShardJob(
            k,
            ShardTask(f"shard-{k:05d}", items[a : a + per]),
            "npy",
            layout,
            PreprocessConfig(size=(8, 8)),
            str(stage),
            record=True,
        )
        for k, a in enumerate(range(0, len(items), per))
    ]


def test_jobs_added_while_others_run_all_finish(image_tree, tmp_path):
    first, second, third = _jobs(image_tree, tmp_path)
    counted: list[int] = []
    runner = JobRunner(2, progress=counted.append)
    runner.add([first])
    runner.step(0)
    runner.add([second, third])
    results = runner.finish()
    assert sorted(results) == [0, 1, 2] and [results[k].samples for k in range(3)] == [5, 5, 5]
    assert sum(counted) == 15 and not runner.busy
    assert sorted(p.name for p in tmp_path.glob("*.done.json")) == [f"shard-0000{k}.done.json" for k in range(3)]


def test_cancelled_jobs_leave_no_files_and_are_counted_back(image_tree, tmp_path, monkeypatch):
    done, slow, queued = _jobs(image_tree, tmp_path)
    real = packer.run.worker.closed

    def waiting(job, *args, **kwargs):  # the second shard stays unfinished until it is cancelled
        if job.number == 1:
            time.sleep(120)
        return real(job, *args, **kwargs)

    monkeypatch.setattr(packer.run.worker, "closed", waiting)
    counted: list[int] = []
    runner = JobRunner(2, progress=counted.append)
    runner.add([done, slow, queued])
    while 0 not in runner.results or sum(counted) < 10:  # the first done, the second written to its end
        runner.step(0.1)
    assert list(tmp_path.glob("shard-00001.*"))  # its files are there, not yet closed
    runner.cancel({0, 1, 2})
    assert not runner.busy and runner.results == {}
    assert sum(counted) == 0  # the cancelled shards' files counted back
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("shard-")]


def test_a_cancelled_job_waiting_to_run_again_leaves_no_files(image_tree, tmp_path):
    """A job whose worker died waits in the queue to run again, its partial files still there."""
    first, second, third = _jobs(image_tree, tmp_path)
    runner = JobRunner(1)
    runner.add([first, second, third])
    (tmp_path / "shard-00002.npy").write_bytes(b"half a shard")  # as a killed attempt leaves it
    (tmp_path / "shard-00002.done.json").write_text("{}")
    runner.cancel({2})
    assert runner.queued == 2
    assert not list(tmp_path.glob("shard-00002.*"))
    assert sorted(runner.finish()) == [0, 1]


def test_the_parents_time_in_on_result_is_not_a_hang_of_the_others(image_tree, tmp_path, monkeypatch):
    """``on_result`` may wait (a bucket's uploads): a worker that went on writing meanwhile is not
    ended as one that made no progress for ``timeout`` seconds."""
    quick, second = _jobs(image_tree, tmp_path, per=1)[:2]
    long = replace(second, task=ShardTask(second.task.name, discover(image_tree).items[1:]))
    real = packer.run.worker.read_sample

    def paced(item, job, *args, **kwargs):  # the long shard takes a file every 0.4 s: 5.6 s in all
        if job.number == 1:
            time.sleep(0.4)
        return real(item, job, *args, **kwargs)

    def uploading(job, result) -> None:  # the parent busy for longer than the timeout
        if job.number == 0:
            time.sleep(3.0)

    monkeypatch.setattr(packer.run.worker, "read_sample", paced)
    runner = JobRunner(2, on_result=uploading, timeout=2.0)
    runner.add([quick, long])
    results = runner.finish()
    assert sorted(results) == [0, 1] and results[1].samples == 14 and not runner._failures
