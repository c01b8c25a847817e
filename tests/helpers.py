"""Shared test helpers that are not fixtures: a fake clock, waiting for an event or for writers to go
quiet, whether a process runs, telling a clean CLI error from a crash, the sizes of planned shards, and
whether a run left its staging folder, and photograph-like images with the changes copies go through."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import pytest
from click.testing import Result
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from image_copies import brightened, cropped, jpeg, resized, textured  # noqa: E402, F401 - the tests' images

from packer.output.files import staging_dir
from packer.records import ShardTask


class FakeClock:
    """A clock that stands still until ``advance`` moves it: call it for the time in seconds.

    Patched in for a module's clock, it lets a test assert on exactly how long the code believes
    things took, where sleeping and reading the wall clock flakes on a loaded machine."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start  # not 0: the code under test must use differences, as with a real clock

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        self.now += seconds


def quiet_after(stage: Path, seconds: float = 1.5) -> bool:
    """True when no file in ``stage`` changes for ``seconds`` (no worker still writing)."""

    def snapshot():
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in stage.iterdir()}

    before = snapshot()
    time.sleep(seconds)
    return snapshot() == before


def wait_for(condition: Callable[[], object], what: str, patience: float = 120.0) -> None:
    """Poll until ``condition()`` is true. ``patience`` is a safety net that ends a test whose event never
    comes (failing it, naming ``what``), far beyond what a loaded machine takes: never a measure of speed."""
    deadline = time.monotonic() + patience
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {patience:g} s"
        time.sleep(0.02)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux: from /proc; a zombie waiting for its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def exited_cleanly(result: Result) -> bool:
    """True when a ``CliRunner`` run ended by exiting (a message and an exit code), not by an uncaught
    exception. ``CliRunner`` catches exceptions and keeps their traceback out of ``result.output``,
    so checking the output for "Traceback" can never fail."""
    return result.exception is None or isinstance(result.exception, SystemExit)


def sizes(tasks: list[ShardTask]) -> list[int]:
    """The number of items in each planned shard."""
    return [len(t.items) for t in tasks]


def no_staging(out: Path) -> bool:
    """True when no staging folder of ``out`` is left behind."""
    return not staging_dir(out).exists()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a gloo process group), from a range
    of this pytest-xdist worker's own below the kernel's ephemeral ports: a port the kernel hands out
    (bind to 0) is free only until it is closed, and a test running at once in another worker, or
    any server it starts, could be given the same one before the rank binds it (two groups then
    meet on one port and wait on each other). Assumes the kernel's ephemeral ports start above
    30000 (Linux: 32768) and at most 20 workers (more share ranges)."""
    import random
    import socket

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    low = 10_000 + (int(worker) % 20 if worker.isdigit() else 0) * 1_000  # under 32768, the usual ephemeral start
    for port in random.sample(range(low, low + 1_000), 1_000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{low + 999}")


RANK_TIMEOUT = 240
"""Seconds ``run_ranks`` waits for each rank before it counts it as hung."""


def fresh_processes():
    """multiprocessing's forkserver context, its server preloaded with torch: each process it starts
    is a clean one whose arguments travel pickled, as under spawn (Windows, macOS), without importing
    torch again (seconds of CPU each). Not packer or readers: Python before 3.12.8 starts the
    server without the test process's ``sys.path`` (gh-117378), so a copy of the tree sharing this
    venv would preload the installed tree's. The server keeps the environment of the test that
    started it: a test using it must not rely on variables it sets."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])  # read when the server starts
    return ctx


def run_python(code: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` as ``python -c`` would in ``cwd``, with this process's environment, in one of the
    ``fresh_processes`` (torch is imported there already): its exit code (an uncaught exception's is
    1, with the traceback on its stderr; ``sys.exit(n)``'s is n; a signal's is minus the signal) and
    what it printed. Its end drops the code's objects (their finalizers run) and runs its atexit
    functions, not the rest of an interpreter's shutdown: a test of that needs a real subprocess.
    Past ``timeout`` it is killed with what it started and ``subprocess.TimeoutExpired`` raised: a
    hang fails the test instead of the suite."""
    import tempfile

    args = ["python", "-c", code]
    with tempfile.TemporaryDirectory(prefix="run-python-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        environ = dict(os.environ)
        process = fresh_processes().Process(target=_python_code, args=(code, str(cwd), environ, str(out), str(err)))
        process.start()
        try:
            process.join(timeout)
            hung = process.exitcode is None
        finally:  # past the timeout, or the test interrupted: never a process left behind
            if process.exitcode is None:
                _kill_session(process)
        # (a process that died before it opened them printed nothing)
        printed = [path.read_text() if path.exists() else "" for path in (out, err)]
        if hung:
            raise subprocess.TimeoutExpired(args, timeout, *printed)
        return subprocess.CompletedProcess(args, process.exitcode, *printed)


def _kill_session(process) -> None:
    """Kill ``process`` and what it started (its session: see ``_python_code``), then reap it."""
    import signal

    for kill in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill()  # the group is not there yet if the process has not reached its setsid
    process.join()


def _python_code(code: str, cwd: str, environ: dict, out: str, err: str) -> None:
    """The process of ``run_python``: a session of its own, the caller's environment, its output to
    the files ``out`` and ``err``, then ``code`` as the module ``__main__`` (multiprocessing prints
    an uncaught exception's traceback and exits with 1)."""
    import atexit
    import gc
    import multiprocessing
    import types

    os.setsid()
    multiprocessing.set_start_method("fork", force=True)  # as python -c has on Linux (see _rank)
    os.environ.clear()
    os.environ.update(environ)
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(cwd)
    sys.argv = ["-c"]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(code, "<string>", "exec"), vars(main))
    finally:
        vars(main).clear()  # what ending python -c does first: the code's objects go, finalizers run
        gc.collect()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def run_ranks(target, payload, out: Path, world: int = 2) -> list[dict]:
    """Run ``target(rank, world, port, payload, out)`` in ``world`` processes (a gloo group on a free
    port), each writing ``out/rankR.json``; their JSON, in rank order. The ranks are
    ``fresh_processes``: clean ones, as if started by torchrun."""
    import json

    ctx = fresh_processes()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(target, r, world, port, payload, str(out))) for r in range(world)]
    for p in procs:
        p.start()
    try:
        for r, p in enumerate(procs):
            p.join(timeout=RANK_TIMEOUT)
            # None: still running after RANK_TIMEOUT (hung); negative: killed by that signal (no traceback then)
            assert p.exitcode == 0, f"rank {r} of {world} failed or hung (exit code {p.exitcode})"
    finally:
        for p in procs:  # a rank waiting on one that failed would wait for gloo's 30-minute timeout
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def rank_result(out: str, rank: int, result: object) -> None:
    """The last step of a ``run_ranks`` target: write its JSON ``result`` as ``out/rankR.json``, then
    exit at once. The target's own objects (a framework's process group, wrapped model, loaders) are
    never torn down: a rank of the Accelerate test hung after writing its result, in the teardown of
    the target's locals as it returned (a destructor waiting with the interpreter's lock held)."""
    import os

    path = Path(out, f"rank{rank}.json")
    path.with_suffix(".part").write_text(json.dumps(result))
    os.replace(path.with_suffix(".part"), path)
    _exit_rank(0)


def _exit_rank(code: int) -> None:
    """End a rank at once, with the processes it started (its DataLoader's persistent workers):
    ``os._exit`` skips the loader's own shutdown of them."""
    import multiprocessing
    import signal

    # A DataLoader's SIGCHLD handler raises when one of its workers is killed: the first kill would
    # interrupt the rest, and a rank that had written its result would exit with 1.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        child.kill()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank(target, rank: int, world: int, port: int, payload, out: str) -> None:
    """One process of ``run_ranks``: ``target`` (which ends with ``rank_result``), else an exit that
    skips the interpreter's teardown. Its result is on disk by then; a framework's leftovers (gloo's
    and OpenMP's threads, objects whose finalizers wait on a peer that has gone) once kept a rank from
    exiting on a loaded machine."""
    import faulthandler
    import multiprocessing
    import traceback

    # The rank's own DataLoader workers fork from it, as in a process that torchrun starts on Linux.
    # A child of the forkserver would otherwise take forkserver as its start method: each rank would
    # start a server of its own, without torch, so each worker imported torch again, and the server
    # and the workers kept each other alive after the rank had gone (they held the server's pipe).
    multiprocessing.set_start_method("fork", force=True)
    # A rank still running when run_ranks gives up on it prints where each of its threads stands first
    # (pytest shows it with the failure): a hang says where it hangs.
    faulthandler.dump_traceback_later(RANK_TIMEOUT - 10, exit=False)
    try:
        target(rank, world, port, payload, out)
    except BaseException:
        traceback.print_exc()
        _exit_rank(1)
    _exit_rank(0)


def shard_file(out: Path, position: int, suffix: str) -> Path:
    """The file ending in ``suffix`` of the ``position``-th shard of the output ``out``, by its
    manifest: published names carry the output's content tag (``shard-00001-TAG.tar``)."""
    from packer.spec.manifest import read_manifest

    return out / read_manifest(out).shards[position].file(suffix)


def shard_names(out: Path) -> list[str]:
    """The names of the output's shards, in order."""
    from packer.spec.manifest import read_manifest

    return [s.name for s in read_manifest(out).shards]


def as_older_sha256_record(record: dict, tree: Path) -> dict:
    """A shard record as packers before 0.8.0 and XXH3 source digests wrote it: keys and digests as
    JSON lists, the digests SHA-256 prefixes of the source files under ``tree``, no ``digest`` name."""
    import hashlib

    d = dict(record)
    del d["digest"], d["digests_hex"], d["count"]
    d["keys"] = d.pop("keys_nul").split("\0")
    d["digests"] = [hashlib.sha256((tree / key).read_bytes()).hexdigest()[:32] for key in d["keys"]]
    return d


def interrupted_after(source, out, config, items: int) -> None:
    """Run a one-worker conversion of ``source`` and stop it as by Ctrl-C once its progress counts
    more than ``items`` files, the shards not finished by then left unfinished."""
    from packer import convert

    done: list[int] = []

    def stop(n):
        done.append(n)
        if sum(done) > items:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), later_shards_unfinished():
        convert(source, out, config, workers=1, progress=stop)


@contextlib.contextmanager
def later_shards_unfinished(first: int = 1) -> Iterator[None]:
    """While inside, the worker of every shard from number ``first`` on waits before closing its
    shard (the patch reaches the forked workers), so that a Ctrl-C raised from the progress of its
    samples finds it unfinished. Workers record their shard as soon as it is closed: without the
    wait a fast shard may finish between its last progress message and the Ctrl-C."""
    import packer.run.worker

    real = packer.run.worker.closed

    def waiting(job, *args, **kwargs):
        if job.number >= first:
            time.sleep(120)  # killed by the parent's Ctrl-C long before
        return real(job, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packer.run.worker, "closed", waiting)
        yield


def stop_workers(loader) -> None:
    """Shut down the persistent DataLoader workers of a ``PackedLoader`` now. A framework keeps its loader
    in reference cycles (Trainer, model, loader), and torch's DataLoader iterator freed by the cyclic
    garbage collector waits 5 s per persistent worker to end it: the cost would land on whatever test
    collects next (the transformers Trainer calls gc.collect() at its start)."""
    iterator = getattr(loader.loader, "_iterator", None)
    if iterator is not None:
        iterator._shutdown_workers()


def make_bpe_tokenizer(path: Path, texts: list[str], vocab_size: int = 300) -> Path:
    """A byte-level BPE tokenizer with ``<|endoftext|>`` (id 0), trained on ``texts`` with the
    ``tokenizers`` library itself, saved as ``path`` (a tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


def corpus_texts(count: int, seed: int = 0, longest: int = 400) -> list[str]:
    """``count`` documents of made-up words, of 1 to ``longest`` words each (short and long mixed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("etaoinshrdlu"), size=int(rng.integers(1, 8)))) for _ in range(200)]
    return [" ".join(rng.choice(words, size=int(rng.integers(1, longest)))) for _ in range(count)]


@contextlib.contextmanager
def served_folder(directory: Path, answer: Optional[Callable] = None) -> Iterator[tuple[str, list[str]]]:
    """``directory`` served over HTTP on 127.0.0.1 for the block: its base URL, and the paths asked for.
    ``answer(handler)``, where given, may answer a request itself (returning True) before the file is."""
    import functools
    import http.server
    import threading

    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            requests.append(self.path)
            if answer is None or not answer(self):
                super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def save(path: Path, pixels: np.ndarray, quality: int = 92) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=quality) if path.suffix == ".jpg" else Image.fromarray(pixels).save(path)


def photo_tree(root: Path) -> Path:
    """Three classes of six photograph-like images each, and copies of some of them: changed (each
    way a near-duplicate is made), identical bytes, and two images of one colour each."""
    for seed in range(18):
        save(root / f"c{seed % 3}" / f"img{seed:02d}.jpg", textured(seed, seed % 3))
    originals = {seed: textured(seed, seed % 3) for seed in (0, 1, 2, 4)}
    save(root / "c0" / "copy_resized.jpg", resized(originals[0]))
    save(root / "c1" / "copy_q60.jpg", originals[1], quality=60)
    save(root / "c2" / "copy_bright_crop.png", brightened(cropped(originals[2], where="bottom-left")))
    save(root / "c2" / "copy_of_c1.jpg", jpeg(cropped(originals[4], where="centre"), 80))  # under another class
    shutil.copy(root / "c0" / "img03.jpg", root / "c0" / "same_bytes.jpg")
    save(root / "c1" / "flat_red.png", np.full((90, 120, 3), (200, 30, 30), np.uint8))
    save(root / "c1" / "flat_blue.png", np.full((90, 120, 3), (30, 30, 200), np.uint8))
    return root


EXPECTED_GROUPS = [  # the near-duplicates among photo_tree's images
    ["c0/copy_resized.jpg", "c0/img00.jpg"],
    ["c1/copy_q60.jpg", "c1/img01.jpg"],
    ["c1/img04.jpg", "c2/copy_of_c1.jpg"],
    ["c2/copy_bright_crop.png", "c2/img02.jpg"],
]


def leaky_splits(root: Path, train: int = 12, val: int = 4) -> Path:
    """Split folders of photograph-like images in two classes, ``val/c1/leaked.jpg`` a resized,
    brightened copy of ``train/c1/t05.jpg``."""
    for seed in range(train):
        save(root / "train" / f"c{seed % 2}" / f"t{seed:02d}.jpg", textured(seed, seed % 2))
    for seed in range(train, train + val):
        save(root / "val" / f"c{seed % 2}" / f"v{seed:02d}.jpg", textured(seed, seed % 2))
    save(root / "val" / "c1" / "leaked.jpg", resized(brightened(textured(5, 1)), 0.8))
    return root


def answer_range(handler, path: str, asked) -> io.BytesIO:
    """For a test's ``http.server`` handler: answer the request's ``Range: bytes=A-B`` (``asked``, its
    match) from the file ``path`` with 206 and its headers; the body, for ``send_head`` to return."""
    size = os.path.getsize(path)
    start, end = int(asked[1]), min(int(asked[2]), size - 1)
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), end - start + 1, start)
    handler.send_response(206)
    handler.send_header("Content-Range", f"bytes {start}-{end}/{size}")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    return io.BytesIO(data)


def whole_checksums_with_parts(monkeypatch, sha256: bytes) -> None:
    """Make the tests' S3 server answer each ranged read (206) with the whole object's SHA-256
    ``sha256`` (raw digest), as rclone's S3 server does: botocore then finds every part other than
    its checksum."""
    import base64

    from aiobotocore.endpoint import AioEndpoint

    send = AioEndpoint._send
    whole = base64.b64encode(sha256).decode()

    async def sent(self, request):
        response = await send(self, request)
        if response.status_code == 206:
            response.headers["x-amz-checksum-sha256"] = whole
        return response

    monkeypatch.setattr(AioEndpoint, "_send", sent)


@contextlib.contextmanager
def s3_calls(fs, **handlers):
    """The names of the S3 operations ``fs`` calls meanwhile (a list that grows); ``handlers``: more
    of botocore's event handlers by event name, registered as long (on the filesystem's own client,
    and on the client of its twin that sends uploads' bodies, ``packer.output.upload_client``)."""
    from packer.output import upload_client

    fs.call_s3("list_buckets")  # the client made: its events can be registered
    twin = upload_client._twin(fs)
    twin.call_s3("list_buckets")
    calls = []
    handlers = {"before-call.s3": lambda model, **kwargs: calls.append(model.name), **handlers}
    for client in (fs.s3, twin.s3):
        for event, handler in handlers.items():
            client.meta.events.register(event, handler)
    try:
        yield calls
    finally:
        for client in (fs.s3, twin.s3):
            for event, handler in handlers.items():
                client.meta.events.unregister(event, handler)


def damage_body(request, **kwargs) -> None:
    """A botocore ``before-send`` hook: one byte of the request's body changed after botocore hashed
    and signed it, as on the way to a store that records the SHA-256 it is sent without checking it
    (moto, rclone's S3 server), which then keeps the damaged bytes under the checksum of those sent."""
    body = request.body.getvalue() if hasattr(request.body, "getvalue") else request.body
    at = min(1000, len(body) // 2)
    request.body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1 :]
