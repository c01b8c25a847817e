"""A local Ray instance for the tests, its processes started with ``HOOK`` (the test files' markers)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import numpy as np
from PIL import Image

# Loaded by every process of the Ray instance (PYTHONPATH): a file holding KILL-TASK kills the Ray
# worker running its task the first time it is decoded (the shard's process is that worker's
# child, and dies with it), as a lost node or the out-of-memory killer would; KILL-ALWAYS every
# time; KILL-WHEN-HUNG every time too, once a HANG-ME file hangs; HANG-ME files never finish
# decoding, their process's id in the marker "hung"; SLOW-ME files take 0.2 s each, so that a run
# lasts long enough to be interrupted, their process's id in a marker "slow-PID"; COUNT-ME files
# add a line to the marker "counted" each time they are decoded.
HOOK = """
import os, signal, time
import packer.pixels.preprocess as _pp
_decode = _pp.decode
def _marker(name):
    return os.path.join(os.environ["PACKER_TEST_MARKERS"], name)
def _hooked(data, cfg, path="<bytes>", **options):
    if b"KILL-TASK" in data:
        marker = _marker("killed")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getppid(), signal.SIGKILL)
            time.sleep(60)
    if b"KILL-WHEN-HUNG" in data:
        deadline = time.monotonic() + 120  # a safety net: the HANG-ME file of the other shard comes first
        while not os.path.exists(_marker("hung")) and time.monotonic() < deadline:
            time.sleep(0.02)
    if b"KILL-ALWAYS" in data or b"KILL-WHEN-HUNG" in data:
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)
    if b"HANG-ME" in data:
        with open(_marker("hung.part"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(_marker("hung.part"), _marker("hung"))
        time.sleep(3600)
    if b"SLOW-ME" in data:
        open(_marker("slow-%d" % os.getpid()), "w").close()
        time.sleep(0.2)
    if b"COUNT-ME" in data:
        with open(_marker("counted"), "a") as f:
            f.write(path + "\\n")
    return _decode(data, cfg, path, **options)
_pp.decode = _hooked
"""


@contextlib.contextmanager
def hooked_ray(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A local Ray instance (2 CPUs) for the block, its processes started with ``HOOK`` and this
    process's environment as it is now (a store's variables set before reach its tasks): yields its
    ``address`` and the ``markers`` folder."""
    import ray  # here, not at collection: its memory would be in every test process, copied by each fork

    hooks = tmp_path_factory.mktemp("ray-hooks")
    (hooks / "sitecustomize.py").write_text(HOOK)
    markers = tmp_path_factory.mktemp("markers")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(hooks), saved or ""])
    os.environ["PACKER_TEST_MARKERS"] = str(markers)
    try:
        context = ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    finally:  # only what was set here: ray.init adds variables of its own that its clients need
        del os.environ["PACKER_TEST_MARKERS"]
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield SimpleNamespace(address=context.address_info["address"], markers=markers)
    finally:
        ray.shutdown()


def slow_tree(src: Path, count: int = 24) -> None:
    """``count`` 20 x 20 PNGs in two classes under ``src``, each marked SLOW-ME (0.2 s a decode under
    ``HOOK``): a run over them lasts long enough to be interrupted."""
    for i in range(count):
        path = src / f"c{i % 2}" / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((20, 20, 3), i, np.uint8)).save(path)
        with open(path, "ab") as f:
            f.write(b"SLOW-ME")
