"""Shared test helpers: real image files made in temporary folders."""

from __future__ import annotations

import logging
import os
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.spec.registry import FORMAT_NAMES  # noqa: E402

# glibc gives each thread that allocates an arena of its own and keeps what is freed there: after the
# multipart upload tests (a pool of threads, moto's server threads) a test process held about 300 MB
# it no longer used, which malloc_trim did not return, and every later fork of it (each conversion
# forks its workers) copied those page tables. Two arenas keep that heap small. This module is read
# before pytest-xdist starts the test processes, which inherit the variable (a user's own value
# stays).
os.environ.setdefault("MALLOC_ARENA_MAX", "2")
# gcsfs asks each bucket whether it is zonal, over gRPC, before its first request: the tests' Cloud
# Storage emulator (gcs_server) answers no gRPC, and each filesystem then waited for gRPC's timeout.
# Set before gcsfs is imported (in every test process and the commands they run).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long: a test among the suite's longest, started early (see below)")


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """The tests of xdist groups first, then those marked ``long``, then the others, each in their
    order. xdist's loadgroup hands a group to one process when the collection reaches it: the Ray
    tests, a few minutes in one process, came about three quarters of the way through and ran on
    alone at the end; a long test reached last does the same on a smaller scale. Started first,
    they run beside the rest."""
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None, not item.get_closest_marker("long")))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (the suite's addopts): one test process more than the cores this process may use.
    A share of the suite waits with its core idle (on the subprocesses it starts, on its servers, on
    a Ray instance, on a timeout): with one process a core the machine was partly idle, with one more
    it is kept busy (docs/BENCHMARKS.md, "the test suite with one process more than the cores")."""
    from packer.system import usable_cpus

    return usable_cpus() + 1


FORMATS = FORMAT_NAMES  # every registered format is tested the moment it is registered


def write_image(path: Path, size: tuple[int, int] = (64, 48), mode: str = "RGB", seed: int = 0, **save) -> Path:
    """Write a smooth random image (so JPEG keeps it recognisable) of ``size`` (w, h) and ``mode``."""
    rng = np.random.default_rng(seed)
    w, h = size
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}.get(mode, 3)
    base = rng.integers(0, 256, size=(max(1, h // 8), max(1, w // 8), channels), dtype=np.uint8)
    pixels = base.squeeze(-1) if channels == 1 else base
    small = Image.fromarray(pixels, mode if mode in ("RGB", "RGBA", "L", "LA") else "RGB")
    img = small.resize((w, h), Image.BILINEAR)
    if img.mode != mode:
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **save)
    return path


def save_array(path: Path, array: np.ndarray, mode: str | None = None, **save) -> Path:
    """Write ``array`` as an image file (converted to ``mode`` if given) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(array)
    if mode and img.mode != mode:
        img = img.convert(mode)
    img.save(path, **save)
    return path


def solid(path: Path, size: tuple[int, int], color, mode: str = "RGB") -> Path:
    """Write an image of one ``color`` and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


def make_tree(
    root: Path, classes: dict[str, int], size: tuple[int, int] = (64, 48), ext: str = "png", vary: bool = True
) -> list[Path]:
    """A class-folder tree: ``classes`` maps class name to file count; sizes vary a little per file
    (7 pixels wider each), unless ``vary`` is false (for trees of many files, whose last ones would be
    thousands of pixels wide: slow to write and to convert)."""
    paths = []
    for ci, (name, count) in enumerate(sorted(classes.items())):
        for i in range(count):
            w, h = (size[0] + 7 * i, size[1] + 3 * ci) if vary else size
            paths.append(write_image(root / name / f"img_{i:03d}.{ext}", (w, h), seed=100 * ci + i))
    return paths


def pack_every_format(
    tmp_path_factory, classes: dict[str, int], preprocess, samples_per_shard: int, formats=FORMATS
) -> dict:
    """A ``make_tree`` of ``classes`` converted into every format of ``formats`` with ``samples_per_shard``:
    format -> output."""
    from packer import ConvertConfig, convert
    from packer.config import ShardSize

    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, classes)
    out = tmp_path_factory.mktemp("out")
    for fmt in formats:
        convert(src, out / fmt, ConvertConfig(fmt, preprocess, ShardSize(samples=samples_per_shard)), workers=2)
    return {fmt: out / fmt for fmt in formats}


def pair_tree(root: Path, per_class: int = 3) -> Path:
    """cats/dogs with NNNN.png + NNNN.txt + NNNN.json, and one sample (dogs/0002) lacking its json."""
    import json

    for c, cls in enumerate(("cats", "dogs")):
        for i in range(per_class):
            write_image(root / cls / f"{i:04d}.png", (20 + i, 16), seed=10 * c + i)
            (root / cls / f"{i:04d}.txt").write_text(f"a {cls[:-1]} number {i}", encoding="utf-8")
            if not (cls == "dogs" and i == 2):
                (root / cls / f"{i:04d}.json").write_text(json.dumps({"n": i, "cls": cls}), encoding="utf-8")
    return root


def add_varied_files(root: Path) -> None:
    """Originals in more size bins (a wide and a tall one) and a file every run skips."""
    write_image(root / "ant" / "wide.png", (300, 20), seed=5)
    write_image(root / "cat" / "tall.jpg", (20, 700), seed=6)
    (root / "bee" / "bad.png").write_bytes(b"not an image")


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """Three classes of 5, 4 and 6 PNG images of varied sizes, plus litter that must be ignored."""
    root = tmp_path / "images"
    make_tree(root, {"ant": 5, "bee": 4, "cat": 6})
    (root / "ant" / ".DS_Store").write_bytes(b"\0\1")
    (root / "bee" / "Thumbs.db").write_bytes(b"\0\1")
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",  # none of this machine's own settings
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_supported",  # botocore's defaults, whatever the shell says
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_supported",
}
AWS_UNSET = (
    "AWS_PROFILE",  # a profile the settings above leave unread would be an error
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",  # it would win over AWS_ENDPOINT_URL: the tests' server, or a dead one, never
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
)
"""The AWS variables of a developer's shell that the tests' S3 server must not see."""


@pytest.fixture(scope="module")
def s3_server():
    """An S3-compatible server on 127.0.0.1 (moto's server mode, as s3fs's own tests use), found
    through the standard AWS variables, with a bucket ``data``: yields an s3fs filesystem of it."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line a request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    reset = urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
    # moto keeps its buckets in this process across servers: start from none (its reset API)
    urllib.request.urlopen(reset).close()
    env = pytest.MonkeyPatch()
    for key, value in {**AWS, "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
        env.setenv(key, value)
    for key in AWS_UNSET:
        env.delenv(key, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("data")
    yield fs
    env.undo()
    s3fs.S3FileSystem.clear_instance_cache()
    # ... and end with none either: what the module uploaded (hundreds of MB for the multipart tests)
    # would otherwise stay in this process, and every later fork of it (each conversion's workers)
    # copies the page tables of all it holds.
    try:
        urllib.request.urlopen(reset).close()
    finally:
        server.stop()
    release_memory()


@pytest.fixture(scope="module")
def gcs_server():
    """A Google Cloud Storage emulator on 127.0.0.1 (gcp-storage-emulator, in memory), found through
    ``STORAGE_EMULATOR_HOST`` as gcsfs and Google's own clients find one, read without credentials
    (fsspec's setting of gcsfs's ``token``), with a bucket ``data``: yields a gcsfs filesystem."""
    import fsspec.config
    import gcsfs
    from gcp_storage_emulator.server import create_server

    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = create_server("127.0.0.1", 0, in_memory=True, default_bucket="data")
    server.start()
    port = server._api._httpd.server_address[1]  # the port the system gave (no race with another process)
    env = pytest.MonkeyPatch()
    env.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    env.setenv("FSSPEC_GCS_TOKEN", "anon")  # the commands the tests run read it at fsspec's import
    for protocol in ("gs", "gcs"):
        env.setitem(fsspec.config.conf, protocol, {"token": "anon"})
    gcsfs.GCSFileSystem.clear_instance_cache()
    try:
        yield gcsfs.GCSFileSystem()
    finally:
        env.undo()
        gcsfs.GCSFileSystem.clear_instance_cache()
        server.stop()


def release_memory() -> None:
    """Collect garbage and hand the freed heap back to the system (glibc's malloc_trim), so that the
    forks of this process that follow copy less."""
    import ctypes
    import gc

    gc.collect()
    process = ctypes.CDLL(None)  # the symbols the interpreter has loaded: libc's where it is glibc
    if hasattr(process, "malloc_trim"):
        process.malloc_trim(0)


def failing_uploads(monkeypatch, name: str) -> None:
    """Every upload (``packer.output.upload.put_checked``) of an object named ``name`` fails with
    ``OSError("connection reset")``; the others go up."""
    from packer.output import upload

    real = upload.put_checked

    def put_checked(fs, path, target, url, sha256=None):
        if target.endswith(f"/{name}"):
            raise OSError("connection reset")
        return real(fs, path, target, url, sha256)

    monkeypatch.setattr(upload, "put_checked", put_checked)


class FailsAt:
    """A stand-in for the function ``real`` whose ``n``-th call raises ``OSError("connection reset")``
    (a connection lost mid-upload); ``calls`` counts them (set it to 0 to count again)."""

    def __init__(self, real, n: int) -> None:
        self.real, self.n, self.calls = real, n, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.n:
            raise OSError("connection reset")
        return self.real(*args)
