"""Reading outputs by URL: a real HTTP server on loopback, pipe: commands, fsspec URLs, the cache;
streams that stall, run long or lie about their sizes (issue 25, cases 3, 10 and 11)."""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import io
import os
import re
import shutil
import signal
import socket
import sys
import tarfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch
from conftest import make_tree
from helpers import process_alive, served_folder, shard_file, wait_for

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.spec.errors import ConfigError, ManifestError
from packer.spec.manifest import read_manifest
from packer.spec.shard_names import DALI_INDEX
from packer.spec.tario import iter_tar_samples
from readers import WdsDataset, make_loader, open_dataset
from readers.remote import streams
from readers.remote import urls as remote
from readers.remote.block_memory import MEMORY_LIMIT, BlockMemory
from readers.remote.streams import open_stream
from readers.remote.urls import clean_cache, is_url, iter_remote_tar


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder holding a wds output (``wds``) and an npy output (``npy``), served over HTTP on
    127.0.0.1; ``requests`` lists the paths asked for."""
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 7, "bee": 6})
    root = tmp_path_factory.mktemp("served")
    pre = PreprocessConfig(size=(16, 12))
    convert(src, root / "wds", ConvertConfig("wds", pre, ShardSize(samples=4)), workers=2)
    convert(src, root / "npy", ConvertConfig("npy", pre, ShardSize(samples=4)), workers=2)
    with served_folder(root) as (url, requests):
        yield root, url, requests


def samples(ds) -> list[tuple[bytes, int, dict]]:
    return [(image.numpy().tobytes(), label, meta) for image, label, meta in ds]


def test_is_url():
    assert is_url("https://host/out") and is_url("s3://bucket/out") and is_url("pipe:cat {}")
    assert not is_url("out") and not is_url("/data/out") and not is_url(Path("http://x"))


def test_http_streams_every_sample_as_the_local_read(served):
    root, url, requests = served
    local = samples(open_dataset(root / "wds", return_meta=True))
    remote = open_dataset(f"{url}/wds", return_meta=True)
    assert isinstance(remote, WdsDataset) and len(remote) == 13
    assert samples(remote) == local
    tars = [f"/wds/{shard_file(root / 'wds', n, '.tar').name}" for n in (0, 3)]
    assert {"/wds/manifest.json", *tars} <= set(requests)


def test_make_loader_over_http_with_two_workers(served):
    root, url, _ = served

    def images(ds) -> Counter:
        seen: Counter = Counter()
        for batch, labels in make_loader(ds, batch_size=3, num_workers=2):
            for image, label in zip(batch, labels):
                seen[(image.contiguous().numpy().tobytes(), int(label))] += 1
        return seen

    remote = images(open_dataset(f"{url}/wds", normalize=False))
    assert sum(remote.values()) == 13
    assert remote == images(open_dataset(root / "wds", normalize=False))


def test_cache_keeps_complete_verified_shards_only(served, tmp_path):
    root, url, requests = served
    cache = tmp_path / "cache"
    first = next(iter(WdsDataset(f"{url}/wds", cache_dir=cache)))  # stops inside shard 0
    assert isinstance(first[0], torch.Tensor)
    assert list(cache.iterdir()) == []  # a shard not read to its end is never kept, nor its part file
    ds = WdsDataset(f"{url}/wds", cache_dir=cache, return_meta=True)
    assert samples(ds) == samples(open_dataset(root / "wds", return_meta=True))
    manifest = read_manifest(root / "wds")
    kept = {p.name: p.read_bytes() for p in cache.iterdir()}
    # every file the reader reads; not DALI's index, which is for other loaders
    assert kept == {
        f"{f.sha256[:32]}-{f.path}": (root / "wds" / f.path).read_bytes()
        for s in manifest.shards
        for f in s.files
        if not f.path.endswith(DALI_INDEX)
    }
    assert len(kept) == len(manifest.shards) == 4
    requests.clear()
    assert len(samples(ds)) == 13
    assert requests == []  # shards come from the cache now
    damaged = next(p for p in cache.iterdir())
    data = bytearray(damaged.read_bytes())
    data[600] ^= 0xFF  # inside the first member's data: the tar still parses
    damaged.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="SHA-256"):
        samples(ds)
    assert not damaged.exists()  # removed: the next pass streams that shard again
    assert len(samples(ds)) == 13


def test_damaged_remote_shard_is_refused_and_not_cached(served, tmp_path):
    root, url, _ = served
    damaged = root / "damaged"
    shutil.copytree(root / "wds", damaged, dirs_exist_ok=True)
    tar = shard_file(damaged, 1, ".tar")
    data = bytearray(tar.read_bytes())
    data[1600] ^= 0xFF  # inside the first sample's image bytes: the tar still parses
    tar.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ManifestError, match=re.escape(f"{tar.name} is of another SHA-256")):
        list(WdsDataset(f"{url}/damaged", cache_dir=cache))
    assert {p.name.split("-", 1)[1] for p in cache.iterdir()} == {shard_file(damaged, 0, ".tar").name}


def test_pipe_and_fsspec_roots(served):
    root, _, _ = served
    local = samples(open_dataset(root / "wds", return_meta=True))
    assert samples(open_dataset(f"pipe:cat {root / 'wds'}/{{}}", return_meta=True)) == local
    assert samples(open_dataset(f"file://{root / 'wds'}", return_meta=True)) == local


def test_bad_urls_say_what_is_wrong(served):
    root, url, _ = served
    with pytest.raises(ManifestError, match="HTTP 404"):
        open_dataset(f"{url}/nothing")
    with pytest.raises(ManifestError, match="needs {} where the file name goes"):
        open_dataset(f"pipe:cat {root / 'wds'}/manifest.json")
    with pytest.raises(ManifestError, match="exit status 1"):
        open_dataset("pipe:false {}")
    with pytest.raises(ManifestError, match="cannot open nosuchscheme://"):
        open_dataset("nosuchscheme://bucket/out")
    with pytest.raises(ConfigError, match="NpyDataset reads .* at random and download=True asks it, .*cache_dir="):
        open_dataset(f"{url}/npy", download=True)


def test_a_server_that_ignores_ranges_is_refused_never_sliced_wrong(served, monkeypatch):
    from readers.remote import ranges

    root, url, _ = served
    monkeypatch.setattr(ranges, "BLOCK", 512)  # a range shorter than the file: this server sends it all
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    with pytest.raises(ManifestError, match="does not answer range requests.*download=True and cache_dir="):
        open_dataset(f"{url}/npy")[5]


def test_a_map_style_output_at_a_url_is_read_through_a_verified_cache(served, tmp_path):
    root, url, requests = served
    local = open_dataset(root / "npy", return_meta=True)
    remote = open_dataset(f"{url}/npy", cache_dir=tmp_path / "cache", return_meta=True, download=True)
    assert samples(remote) == samples(local)
    asked = len(requests)
    again = open_dataset(f"{url}/npy", cache_dir=tmp_path / "cache", return_meta=True, download=True)
    assert samples(again) == samples(local)
    assert all(r.endswith("manifest.json") for r in requests[asked:])  # the shards come from the cache
    cached = open_dataset(f"{url}/npy", cache_dir=tmp_path / "cache", download=True)
    loaders = [make_loader(d, 4, num_workers=2, seed=1) for d in (open_dataset(root / "npy"), cached)]
    first, second = ([(x.numpy().tobytes(), y.tolist()) for x, y in loader] for loader in loaders)
    assert first == second


def test_text_lengths_come_checked_from_the_url(served):
    root, url, _ = served
    texts = root.parent / "texts-src"
    for i in range(5):
        (texts / "a").mkdir(parents=True, exist_ok=True)
        (texts / "a" / f"{i}.txt").write_text("word " * (i + 1))
    convert(texts, root / "texts", ConvertConfig("wds", shard_size=ShardSize(samples=2)), workers=1)
    remote = WdsDataset(f"{url}/texts")
    assert remote.lengths().tolist() == open_dataset(root / "texts").lengths().tolist() == [5, 10, 15, 20, 25]
    side = next(p for p in (root / "texts").iterdir() if p.name.endswith(".lengths.npy"))
    side.write_bytes(side.read_bytes()[:-8] + b"\x01" * 8)  # same size, other bytes
    with pytest.raises(ManifestError, match="SHA-256"):
        WdsDataset(f"{url}/texts").lengths()


# --- streams that stall, run long or lie about their sizes ---------------------------------------


def bounded(fn: Callable[[], object], patience: float = 120.0) -> object:
    """``fn()``'s result, or the exception it raised; the test fails (and the daemon thread is left
    behind) when it runs past ``patience`` seconds, so a hang cannot hang the suite. A safety net far
    beyond what a loaded machine takes, never a measure of speed: a test asserts on what ``fn`` gave."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test to assert on
            box["value"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(patience)
    assert not thread.is_alive(), f"still running after {patience:g} s"
    return box["value"]


Send = Callable[[str, bytes, "io.BufferedIOBase", threading.Event], None]  # path, file bytes, wfile, stop


@contextlib.contextmanager
def custom_server(root: Path, send: Send) -> Iterator[str]:
    """The files under ``root`` on a loopback HTTP server whose bodies ``send(path, data, wfile, stop)``
    writes, without a Content-Length (the end is the connection's close); ``stop`` is set on exit, for
    a sender that waits to end its wait."""
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            path = root / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(404)
                return
            self.send_response(200)
            self.end_headers()
            try:
                send(self.path, path.read_bytes(), self.wfile, stop)
            except (BrokenPipeError, ConnectionResetError):  # the reader gave up, as it should
                pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(10)


def paced(target: str, piece: int, pause: float, then_silent: bool) -> Send:
    """A sender that writes ``target``'s bytes ``piece`` at a time, ``pause`` s apart (after the first
    piece, nothing more until the server ends when ``then_silent``), and every other file whole."""

    def send(path: str, data: bytes, wfile, stop: threading.Event) -> None:
        if not path.endswith(target):
            wfile.write(data)
            return
        for at in range(0, len(data), piece):
            wfile.write(data[at : at + piece])
            wfile.flush()
            if stop.wait(None if then_silent else pause):
                return

    return send


@pytest.mark.parametrize("target", ["manifest.json", "first-shard.tar"])
@pytest.mark.parametrize("then_silent", [True, False], ids=["silent-after-64-bytes", "64-bytes-every-0.1s"])
def test_a_stalling_server_fails_within_the_window(served, monkeypatch, target, then_silent):
    # The server sent 64 bytes every 20 s: every read under the 60 s timeout, no end ever.
    # Here the same at 1/200 of the time, with the window cut to 1 s.
    root, _, _ = served
    if target == "first-shard.tar":  # its published name carries the output's content tag
        target = shard_file(root / "wds", 0, ".tar").name
    monkeypatch.setattr(streams, "STALL_WINDOW", 1.0)
    with custom_server(root, paced(target, 64, 0.1, then_silent)) as url:
        # The silent server sends nothing more until the read has ended; the other sends too little
        # in each window, for seconds: only the stall rule ends the read with an error.
        error = bounded(lambda: list(open_dataset(f"{url}/wds")))
    assert isinstance(error, ManifestError), error
    got = re.search(
        rf"{url}/wds/{re.escape(target)} stalled: (\d+) bytes in the last \d+\.\d s, under the 1048576 "
        r"bytes a stream must deliver every 1 s",
        str(error),
    )
    assert got, error
    assert int(got.group(1)) == 64 if then_silent else 64 < int(got.group(1)) < (1 << 20)  # more came, too little


def test_a_slow_steady_link_reads_every_sample(served, monkeypatch):
    root, _, _ = served
    monkeypatch.setattr(streams, "STALL_WINDOW", 2.0)
    monkeypatch.setattr(streams, "STALL_BYTES", 2048)  # the link gives ~12x that: 256 bytes every 20 ms
    entry = read_manifest(root / "wds").shards[0].files[0]
    assert entry.bytes > 3 * streams.STALL_BYTES  # several windows' bytes, so that several must be met
    with custom_server(root, paced(entry.path, 256, 0.02, then_silent=False)) as url:
        result = bounded(lambda: list(iter_remote_tar(f"{url}/wds", entry)))
    assert result == list(iter_tar_samples(root / "wds" / entry.path))  # each window met: no stall
    assert len(result) == 4


@pytest.mark.skipif(sys.platform != "linux", reason="reads process states from /proc")
def test_a_trickling_pipe_command_is_killed_whole_on_a_stall(monkeypatch, tmp_path):
    monkeypatch.setattr(streams, "STALL_WINDOW", 1.0)
    pid_file = tmp_path / "sleep.pid"
    # Neither command sends more, or ends, for 10 minutes: a stall error is the window at work.
    stream = open_stream(f"pipe:sh -c 'sleep 600 & echo $! > {pid_file}; printf x; wait'")
    error = bounded(stream.read)
    assert isinstance(error, ManifestError), error
    assert re.search(r"stalled: 1 bytes in the last \d+\.\d s", str(error)), error
    assert stream.proc.returncode == -signal.SIGKILL  # the shell, killed and reaped ...
    sleeper = int(pid_file.read_text())
    try:  # ... with its child: the whole process group
        wait_for(lambda: not process_alive(sleeper), "the command's child outlived it")
    finally:
        if process_alive(sleeper):  # only when the test failed
            os.kill(sleeper, signal.SIGKILL)
    error = bounded(lambda: open_dataset("pipe:sh -c 'printf x; sleep 600' {}"))  # the manifest, by name
    assert isinstance(error, ManifestError) and "stalled" in str(error), error


def claiming(tar: bytes, size: int) -> bytes:
    """``tar`` with its first member's header claiming ``size`` bytes (its checksum made right)."""
    header = bytearray(tar[:512])
    header[124:136] = b"%011o\0" % size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + tar[512:]


def endless(prefix: bytes) -> Send:
    """A sender that writes ``prefix`` in place of the shard, then 64 MiB of zeros: far past any
    manifest's size, never a Content-Length."""
    zeros = bytes(1 << 20)

    def send(path: str, data: bytes, wfile, stop: threading.Event) -> None:
        if not path.endswith(".tar"):
            wfile.write(data)
            return
        wfile.write(prefix)
        for _ in range(64):
            if stop.is_set():
                return
            wfile.write(zeros)

    return send


def peak_memory(fn: Callable[[], object]) -> tuple[object, int]:
    """``fn()``'s result (or exception) and the peak of Python's allocations while it ran, in bytes."""
    tracemalloc.start()
    try:
        result = bounded(fn)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_member_claiming_a_gibibyte_is_refused_before_it_is_read(served):
    # The case: such a member took 2.3 GB of memory for a 1.5 MB shard.
    root, _, _ = served
    entry = read_manifest(root / "wds").shards[0].files[0]
    shard = (root / "wds" / entry.path).read_bytes()
    member = tarfile.open(root / "wds" / entry.path).getnames()[0]
    with custom_server(root, endless(claiming(shard, 1 << 30))) as url:
        error, peak = peak_memory(lambda: list(iter_remote_tar(f"{url}/wds", entry)))
    assert isinstance(error, ManifestError), error
    assert str(error) == (
        f"{url}/wds/{entry.path}: member {member!r} claims 1073741824 bytes, more than the "
        f"{entry.bytes - 512} left in the shard's {entry.bytes} bytes; the shard is damaged"
    )
    assert peak < 4 << 20


def test_a_stream_longer_than_the_manifest_stops_at_its_size(served):
    root, _, _ = served
    entry = read_manifest(root / "wds").shards[0].files[0]
    shard = (root / "wds" / entry.path).read_bytes()
    with custom_server(root, endless(shard)) as url:
        error, peak = peak_memory(lambda: list(iter_remote_tar(f"{url}/wds", entry)))
    assert isinstance(error, ManifestError), error
    assert str(error).startswith(f"{url}/wds/{entry.path} is longer than the manifest's {entry.bytes} bytes")
    assert peak < 4 << 20  # 64 MiB came after it


def test_local_tars_are_bounded_by_their_size_too(served, tmp_path):
    root, _, _ = served
    shard = shard_file(root / "wds", 0, ".tar").read_bytes()
    claims = tmp_path / "claims.tar"
    claims.write_bytes(claiming(shard, 1 << 30))
    error, peak = peak_memory(lambda: list(iter_tar_samples(claims)))
    assert isinstance(error, ManifestError) and "claims 1073741824 bytes, more than the" in str(error), error
    assert peak < 4 << 20
    # A GNU long name's payload is read by tarfile itself, in one read of the size its header claims
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, 1 << 30
    long_name = tmp_path / "long-name.tar"
    long_name.write_bytes(info.tobuf(format=tarfile.GNU_FORMAT) + b"a" * 4096 + shard)
    error, peak = peak_memory(lambda: list(iter_tar_samples(long_name)))
    assert isinstance(error, ManifestError) and "is not a complete tar file" in str(error), error
    assert peak < 4 << 20  # not the 1 GiB it claims


def test_leftover_part_files_are_removed_when_a_cache_is_first_used(served, tmp_path, monkeypatch):
    root, url, _ = served
    monkeypatch.setattr(remote, "_CLEANED", set())
    cache = tmp_path / "cache"
    cache.mkdir()
    entry = read_manifest(root / "wds").shards[0].files[0]
    part = f".{entry.sha256[:32]}-{entry.path}.{{}}.part"
    old = time.time() - remote.PART_STALE - 60
    stale, fresh, locked = (cache / part.format(c * 12) for c in "abc")
    foreign = cache / ".notes.part"  # not a name packer writes: never touched
    for path in (stale, fresh, locked, foreign):
        path.write_bytes(b"half a shard")
    for path in (stale, locked, foreign):
        os.utime(path, (old, old))
    with open(locked, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as a download of another process holds it
        assert len(list(WdsDataset(f"{url}/wds", cache_dir=cache))) == 13
    names = {p.name for p in cache.iterdir()}
    assert (
        names - {p.name for p in (fresh, locked, foreign)}
        == {  # DALI's index is not the reader's
            f"{f.sha256[:32]}-{f.path}"
            for s in read_manifest(root / "wds").shards
            for f in s.files
            if not f.path.endswith(DALI_INDEX)
        }
    )
    assert {fresh.name, locked.name, foreign.name} <= names and stale.name not in names
    stale.write_bytes(b"half a shard")
    os.utime(stale, (old, old))
    assert len(list(WdsDataset(f"{url}/wds", cache_dir=cache))) == 13
    assert stale.exists()  # once a process: a later leftover waits for the next process
    # asked again: the stale one goes now, and so does the one whose lock was let go since
    assert sorted(clean_cache(cache)) == [stale, locked] and {p.name for p in cache.iterdir()} == names - {locked.name}
    assert clean_cache(tmp_path / "no-such-cache") == []


def test_a_live_download_keeps_its_part_file_and_survives_its_removal(served, tmp_path, monkeypatch):
    root, url, _ = served
    cache = tmp_path / "cache"
    entry = read_manifest(root / "wds").shards[0].files[0]
    samples_of_shard = iter_remote_tar(f"{url}/wds", entry, cache)
    first = next(samples_of_shard)
    [part] = cache.glob(".*.part")
    monkeypatch.setattr(remote, "PART_STALE", 0.0)
    assert clean_cache(cache) == []  # locked by the download running here
    part.unlink()  # as a cleaner on another host, without the lock, would after an hour's pause
    rest = list(samples_of_shard)
    assert [first, *rest] == list(iter_tar_samples(root / "wds" / entry.path))
    assert list(cache.iterdir()) == []  # read and checked, only not kept


def test_an_endless_manifest_is_refused_at_its_cap(served, monkeypatch):
    root, _, _ = served

    def send(path: str, data: bytes, wfile, stop: threading.Event) -> None:
        wfile.write(data if not path.endswith("manifest.json") else b"{" + b" " * (3 << 20))

    monkeypatch.setattr(remote, "MANIFEST_BYTES", 2 << 20)
    with custom_server(root, send) as url:
        error = bounded(lambda: open_dataset(f"{url}/wds"))
    assert isinstance(error, ManifestError), error
    assert str(error).startswith(f"{url}/wds/manifest.json is longer than {2 << 20} bytes")


def test_a_garbled_http_answer_is_a_packer_error(tmp_path):
    """A server that answers with something that is not HTTP: a ManifestError naming the URL, not
    http.client's BadStatusLine."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/out"
    try:
        error = bounded(lambda: WdsDataset(url))
    finally:
        listener.close()
        thread.join(10)
    assert isinstance(error, ManifestError), error
    assert str(error).startswith(f"cannot open {url}/manifest.json: BadStatusLine")


def test_a_chunked_answer_trickling_its_framing_stalls_within_the_window(monkeypatch):
    """One read of a chunked body may receive many times (the chunk-size line, byte by byte): the
    window bounds the whole read, not each receive."""
    monkeypatch.setattr(streams, "STALL_WINDOW", 1.0)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while not stop.wait(0.2):  # a chunk-size line that never ends: "0000..."
                try:
                    conn.sendall(b"0")
                except OSError:
                    return

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/shard-00000.tar"
    try:
        stream = open_stream(url)
        error = bounded(lambda: stream.read(1024))  # each receive alone would wait 0.2 s: no end
    finally:
        stop.set()
        listener.close()
        thread.join(10)
    assert isinstance(error, ManifestError), error
    assert str(error).startswith(f"{url} stalled: 0 bytes in the last"), error


@contextlib.contextmanager
def busy_server(root: Path, failures: int, code: int = 503, retry_after: str = "0") -> Iterator[tuple[str, list]]:
    """``root``'s files on a loopback HTTP server that answers ``code`` (with ``Retry-After``) to the
    first ``failures`` requests of each path; yields its URL and the (path, status) of each request."""
    seen: list = []

    def answer(handler) -> bool:
        if sum(1 for p, _ in seen if p == handler.path) < failures:
            seen.append((handler.path, code))
            handler.send_response(code)
            handler.send_header("Retry-After", retry_after)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return True
        seen.append((handler.path, 200))
        return False

    with served_folder(root, answer) as (url, _):
        yield url, seen


def test_a_busy_or_throttling_server_is_tried_again_then_named(served):
    root, _, _ = served
    local = samples(open_dataset(root / "wds", return_meta=True))
    with busy_server(root, failures=2, code=503) as (url, seen):
        assert samples(open_dataset(f"{url}/wds", return_meta=True)) == local
    busy, served_ok = ({p for p, s in seen if s == code} for code in (503, 200))
    assert "/wds/manifest.json" in busy and busy == served_ok  # each path: twice busy, then served
    with busy_server(root, failures=99, code=429) as (url, seen):
        with pytest.raises(ManifestError, match=r"manifest.json: HTTP 429 .* \(after 5 tries\)"):
            open_dataset(f"{url}/wds")
    assert len(seen) == 5
