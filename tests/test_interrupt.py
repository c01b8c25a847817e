"""Real subprocesses: Ctrl-C, SIGKILL, then --resume; files that crash or hang the decoder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import process_alive, quiet_after, wait_for
from PIL import Image

from packer.output.files import DONE_SUFFIX, staging_dir
from packer.spec.errors import ManifestError
from packer.spec.manifest import read_manifest
from readers import open_dataset

OPTIONS = ["-f", "npy", "--size", "64", "--shard-size", "15", "-j", "2", "-q"]


def packer_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "packer", "convert", *args]


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory) -> Path:
    """300 JPEGs of 640x480: a few seconds of work for two workers."""
    root = tmp_path_factory.mktemp("big") / "src"
    rng = np.random.default_rng(0)
    for i in range(300):
        small = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((640, 480), Image.BICUBIC)
        path = root / f"c{i % 3}" / f"{i:04d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        img.save(path, quality=95)
    return root


@pytest.fixture(scope="module")
def reference(big_tree, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run(packer_cmd(str(big_tree), "-o", str(out), *OPTIONS), check=True, timeout=300)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


SLOW_DECODE = """
import time
import packer.pixels.preprocess as _pp
_decode = _pp.decode
def _slow(*args, **kwargs):
    time.sleep(0.04)
    return _decode(*args, **kwargs)
_pp.decode = _slow
"""


def slowed_env(where: Path) -> dict:
    """Environment whose Python decodes every image 40 ms slower (a sitecustomize hook), so that a run
    lasts long enough to be interrupted however fast the machine and the decoder are, and is still
    running when the signal comes however slowly a busy machine lets the test notice its first shard
    (at 10 ms a run could end, and restore the default SIGINT handler, before the signal landed)."""
    hooks = where / "slow-hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SLOW_DECODE)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now (Linux: from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended while looked at
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def start_and_stop(src: Path, out: Path, sig: int) -> subprocess.Popen:
    """Start a (slowed) conversion, wait for its first finished shard, send ``sig``; return the ended
    process, its ``workers`` the processes it had started and still had then."""
    proc = subprocess.Popen(
        packer_cmd(str(src), "-o", str(out), *OPTIONS), stderr=subprocess.PIPE, text=True, env=slowed_env(out.parent)
    )
    stage = staging_dir(out)
    deadline = time.monotonic() + 120
    while not (list(stage.glob(f"*{DONE_SUFFIX}")) and children(proc.pid)):
        assert proc.poll() is None, "the conversion finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.workers = children(proc.pid)  # type: ignore[attr-defined]
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc


def resume_and_compare(src: Path, out: Path, reference: dict[str, bytes]) -> None:
    done = subprocess.run(
        packer_cmd(str(src), "-o", str(out), *OPTIONS, "--resume"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == reference
    assert not staging_dir(out).exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_exits_130_leaves_no_output_and_resumes_identically(big_tree, reference, tmp_path, sig):
    out = tmp_path / "out"
    proc = start_and_stop(big_tree, out, sig)
    stderr = proc.stderr.read()  # read once: a second read of the pipe finds it empty
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    assert not out.exists()
    with pytest.raises(ManifestError):
        open_dataset(out)
    wait_for(lambda: not any(map(process_alive, proc.workers)), "the converter's workers outlived it")
    assert quiet_after(staging_dir(out))
    resume_and_compare(big_tree, out, reference)


def test_sigkill_leaves_no_output_stops_workers_and_resumes_identically(big_tree, reference, tmp_path):
    out = tmp_path / "out"
    proc = start_and_stop(big_tree, out, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    with pytest.raises(ManifestError):
        open_dataset(out)
    # The kernel kills them with it (elsewhere they notice it is gone at their next file); they wrote
    # the shards they were at no further.
    wait_for(lambda: not any(map(process_alive, proc.workers)), "the killed converter's workers still run")
    assert quiet_after(staging_dir(out))
    resume_and_compare(big_tree, out, reference)


def test_resume_refuses_changed_options(big_tree, tmp_path):
    out = tmp_path / "out"
    start_and_stop(big_tree, out, signal.SIGINT)
    changed = subprocess.run(
        packer_cmd(str(big_tree), "-o", str(out), *OPTIONS, "--resume", "--normalize", "none"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert changed.returncode == 1 and "changed since the interrupted run" in changed.stderr
    assert not out.exists()


SITECUSTOMIZE = """
import os, signal, time
import packer.pixels.preprocess as _pp
_decode = _pp.decode
def _poisoned(data, cfg, path="<bytes>", **options):
    if b"CRASH-ME" in data:
        os.kill(os.getpid(), signal.SIGSEGV)
    if b"HANG-ME" in data:
        time.sleep(3600)
    return _decode(data, cfg, path, **options)
_pp.decode = _poisoned
"""


READ_SITECUSTOMIZE = """
import os, signal, time
import packer.pixels.read as _read_module
_read = _read_module.read_source
def _poisoned(path, *args, **options):
    if "crash" in os.path.basename(path):
        os.kill(os.getpid(), signal.SIGSEGV)
    if "hang" in os.path.basename(path):
        time.sleep(3600)
    return _read(path, *args, **options)
_read_module.read_source = _poisoned
"""


@pytest.mark.parametrize("where", ["decode", "read"])
def test_files_that_crash_or_hang_the_decoder_are_skipped(tmp_path, where):
    """A decoder segfault or endless loop costs one file, not the run (injected via sitecustomize);
    so does a read that never returns or kills the worker (a broken network file system), though
    workers read files ahead of decoding them: the file is still the one blamed."""
    src = tmp_path / "src"
    names = [f"{i:03d}.png" for i in range(40)]
    if where == "read":
        names[13], names[27] = "013-crash.png", "027-hang.png"
    for i, name in enumerate(names):
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((20, 20, 3), i, np.uint8)).save(path)
    if where == "decode":
        with open(src / "013.png", "ab") as f:
            f.write(b"CRASH-ME")  # bytes after the PNG end marker: still a valid PNG
        with open(src / "027.png", "ab") as f:
            f.write(b"HANG-ME")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE if where == "decode" else READ_SITECUSTOMIZE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    proc = subprocess.run(
        packer_cmd(
            str(src),
            "-o",
            str(out),
            "-f",
            "lmdb",
            "--size",
            "16",
            "--shard-size",
            "10",
            "-j",
            "2",
            "-q",
            "--timeout",
            "2",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    m = read_manifest(out)
    reasons = {s["path"]: s["reason"] for s in m.skipped}
    assert reasons == {names[13]: "decoder crashed (signal SIGSEGV)", names[27]: "decoder hangs: no result after 2 s"}
    assert m.samples == 38
    keys = [open_dataset(out, return_meta=True)[i][2]["key"] for i in range(38)]
    assert keys == [name for i, name in enumerate(names) if i not in (13, 27)]
