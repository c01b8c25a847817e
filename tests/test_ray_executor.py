"""The Ray executor on a real local Ray instance: the same output as local runs, retries of killed
tasks, strict mode, interruption and resume through the CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from compare import assert_same_output
from conftest import FORMATS, make_tree
from helpers import process_alive, quiet_after, wait_for
from PIL import Image
from ray_cluster import hooked_ray, slow_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ShardSize
from packer.output.files import DONE_SUFFIX, staging_dir
from packer.output.verify import verify
from packer.run.ray_executor import RayExecutor
from packer.spec.errors import DecodeError, PackerError
from packer.spec.manifest import read_manifest

PRE = PreprocessConfig(size=(16, 12))
pytestmark = pytest.mark.xdist_group("ray")  # one test process runs them all: one Ray instance, not one a process


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local Ray instance (2 CPUs) for the module, its processes started with ``ray_cluster.HOOK``."""
    with hooked_ray(tmp_path_factory) as started:
        yield started


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """14 PNGs in 3 classes and one corrupt file, which every run must skip and report."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"ant": 5, "bee": 4, "cat": 5})
    (root / "bee" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_ray_output_equals_local(cluster, tree, tmp_path, fmt):
    config = ConvertConfig(fmt, PRE, ShardSize(samples=4))
    convert(tree, tmp_path / "local", config, workers=2)
    counted = []
    with RayExecutor() as executor:  # joins the module's Ray instance
        result = convert(tree, tmp_path / "ray", config, executor=executor, progress=counted.append)
    assert_same_output(tmp_path / "local", tmp_path / "ray")
    assert sum(counted) == 15  # every source file once, the corrupt one included
    assert [s.path for s in result.skipped] == ["bee/broken.png"]
    assert not staging_dir(tmp_path / "ray").exists()


def test_auto_shard_size_balances_for_the_cluster(cluster, tree, tmp_path):
    with RayExecutor() as executor:
        assert executor.workers == 2
        convert(tree, tmp_path / "ray", ConvertConfig("npy", PRE), executor=executor)
    convert(tree, tmp_path / "local", ConvertConfig("npy", PRE), workers=2)
    assert read_manifest(tmp_path / "ray").sharding["balanced_for_workers"] == 2
    assert_same_output(tmp_path / "local", tmp_path / "ray")


def test_a_task_killed_mid_way_is_retried_and_the_output_is_complete(cluster, tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"a": 6, "b": 6})
    with open(src / "a" / "img_003.png", "ab") as f:
        f.write(b"KILL-TASK")  # after the PNG's end marker: still the same image; 4th file of shard 0
    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    convert(src, tmp_path / "local", config, workers=2)
    counted = []
    with RayExecutor() as executor:
        convert(src, tmp_path / "ray", config, executor=executor, progress=counted.append)
    assert (cluster.markers / "killed").exists()  # the first attempt really died
    assert verify(tmp_path / "ray") == []
    assert_same_output(tmp_path / "local", tmp_path / "ray")
    assert sum(counted) == 12  # what the dead attempt had counted was taken back


def test_a_task_that_keeps_dying_fails_the_run_and_leaves_no_output(cluster, tmp_path, monkeypatch):
    src = tmp_path / "src"
    make_tree(src, {"a": 4, "b": 4})
    with open(src / "b" / "img_001.png", "ab") as f:
        f.write(b"KILL-ALWAYS")
    import ray  # the test extra installs it: a missing Ray fails, never skips

    # ray.cancel racing a finishing task can abort the driver's process (ray-project/ray#54798): unused
    monkeypatch.setattr(ray, "cancel", lambda *a, **k: pytest.fail("ray.cancel called"))
    with RayExecutor(max_retries=1) as executor, pytest.raises(PackerError, match=r"writing shard-00001 failed"):
        convert(src, tmp_path / "out", ConvertConfig("npy", PRE, ShardSize(samples=4)), executor=executor)
    assert not (tmp_path / "out").exists() and not staging_dir(tmp_path / "out").exists()


def test_a_failed_run_stops_its_other_tasks(cluster, tmp_path, monkeypatch):
    """Shard 1 dies for good while shard 0 hangs in its first file, so that shard 0 can never finish on
    its own: the run fails, and shard 0's task is told to stop and ends its shard's process."""
    hung = cluster.markers / "hung"
    hung.unlink(missing_ok=True)
    src = tmp_path / "src"
    for i in range(8):
        path = src / f"c{i // 4}" / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(path)
        with open(path, "ab") as f:
            f.write(b"HANG-ME" if i < 4 else b"KILL-WHEN-HUNG")
    told: list = []  # the tasks still running when the run failed, as the executor stops them
    stop = RayExecutor._stop

    def recorded(self, board, run, refs):
        told.extend(refs)
        stop(self, board, run, refs)

    monkeypatch.setattr(RayExecutor, "_stop", recorded)
    with RayExecutor(max_retries=0) as executor, pytest.raises(PackerError, match="writing shard-00001 failed"):
        convert(src, tmp_path / "out", ConvertConfig("npy", PRE, ShardSize(samples=4)), executor=executor)
    # Shard 0's task ended as stopped, not with a result or an error: its hanging files would have
    # kept it going for many minutes (each up to the hang timeout). The timeout here only ends a test
    # whose task never ends.
    import ray

    assert ray.get(told, timeout=120) == [("stopped", None)]
    assert not process_alive(int(hung.read_text()))  # its shard's process, stuck in the file, was ended
    assert not (tmp_path / "out").exists() and not staging_dir(tmp_path / "out").exists()


def test_strict_stops_at_the_bad_file_without_retries(cluster, tmp_path):
    """A bad file under --strict is packer's own error, which the task returns: Ray never runs the
    task again, so the file is decoded once."""
    counted = cluster.markers / "counted"
    counted.unlink(missing_ok=True)
    src = tmp_path / "images"
    make_tree(src, {"ant": 5, "bee": 4, "cat": 5})
    (src / "bee" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20 + b"COUNT-ME")
    with RayExecutor() as executor, pytest.raises(DecodeError, match="bee/broken.png"):
        convert(src, tmp_path / "out", ConvertConfig("wds", PRE, ShardSize(samples=4)), executor=executor, strict=True)
    assert [Path(line).name for line in counted.read_text().splitlines()] == ["broken.png"]
    assert not (tmp_path / "out").exists() and not staging_dir(tmp_path / "out").exists()


def test_without_ray_the_error_says_what_to_install(tree, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    with pytest.raises(PackerError, match=r"pip install 'packer-datasets\[ray\]'"):
        RayExecutor()
    result = CliRunner().invoke(
        cli, ["convert", str(tree), "-f", "npy", "-o", str(tmp_path / "o"), "--executor", "ray", "-q"]
    )
    assert result.exit_code == 1 and "pip install" in result.output and not (tmp_path / "o").exists()


def test_cli_interrupted_then_resumed_on_the_cluster(cluster, tmp_path):
    """A real subprocess joins the Ray instance (--address), is stopped by Ctrl-C mid-run: exit 130, no
    output, tasks cancelled; --resume finishes it, equal to a local run."""
    src = tmp_path / "src"
    slow_tree(src)
    out, local = tmp_path / "out", tmp_path / "local"
    options = ["-f", "wds", "--size", "16", "--shard-size", "4", "-q"]
    command = [
        sys.executable,
        "-m",
        "packer",
        "convert",
        str(src),
        "-o",
        str(out),
        *options,
        "--executor",
        "ray",
        "--address",
        cluster.address,
    ]
    for marker in cluster.markers.glob("slow-*"):
        marker.unlink()
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(staging_dir(out).glob(f"*{DONE_SUFFIX}")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "--resume" in proc.stderr.read()
    assert not out.exists() and staging_dir(out).exists()
    # The stopped tasks end their shards' processes (each wrote its id on its first file) ...
    shard_processes = [int(marker.name.split("-")[1]) for marker in cluster.markers.glob("slow-*")]
    assert shard_processes
    wait_for(lambda: not any(map(process_alive, shard_processes)), "the stopped tasks' shard processes still run")
    assert quiet_after(staging_dir(out))  # ... and write nothing more
    done = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    convert(src, local, ConvertConfig("wds", PreprocessConfig(size=(16, 16)), ShardSize(samples=4)), workers=2)
    assert_same_output(local, out)
