"""Outputs in a bucket against the same on a local disk, on an S3-compatible server on 127.0.0.1
(moto's server mode, through s3fs and botocore): the figures measure packer's overhead, not a network.

    python scripts/bench_bucket.py --images 1000 --work /tmp/packer-bucket
    python scripts/bench_bucket.py --append-check --images 1000 --format npy   # only the append

- **Conversion**: ``packer convert SRC -f wds -o s3://bench/out`` (shards uploaded as they finish,
  each file checked by the SHA-256 the store records, the manifest last) against ``-o LOCAL``, the
  same images, each a new process, alternated ``--repeat`` times; the most local disk the bucket's
  conversion held meanwhile.
- **Random reads** of an npy output, shuffled batches of 64, 2 workers, one epoch each, against the
  local output read with its page cache dropped (``/proc/sys/vm/drop_caches``, where this process
  may write it; otherwise warm, and said so): ``open_dataset("s3://bench/npy")`` by byte ranges
  without a cache (by presigned URLs, then again through s3fs's client: the workers' CPU of each);
  with ``cache_dir=`` empty, then full (the blocks of the first epoch); and with
  ``download=True`` (every shard file downloaded whole and verified on first use). The requests the
  server answered per batch are counted (every one: a shard's size, indexes and ranges). moto's
  server copies the whole object for each range it answers (its time grows with the object's size),
  so the range reads are measured again from a lean server of the same files on 127.0.0.1, read
  by packer over ``http://`` (``--range-server``): nginx where installed (``NginxServer``, whose
  CPU is next to none: those figures are packer's own overhead), else ``RangeServer``, a threaded
  ``http.server`` in a process of its own that answers ranges with ``os.pread``; ``--repeat`` rounds,
  each after a cold local read, medians (``lean_reads``).
- **Append** (``--append-check``, alone): half of the photographs converted (every other file),
  the other half appended (``--append``), into the bucket and to a local folder, alternated
  ``--repeat`` times; the requests the server answered during the bucket's append.
- **Another server** (``--endpoint URL``, ``--bucket NAME``): the same against an S3-compatible
  server already running (on another machine, where its CPU does not share these cores), found
  with the usual AWS variables for its credentials; its requests and CPU are then not counted.

    python scripts/bench_bucket.py --images 1000 --repeat 3 --endpoint http://HOST:9000 --bucket bench
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import logging
import multiprocessing
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from packer.advisor.host import describe_host  # noqa: E402

AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_CONFIG_FILE": "/nonexistent/config",
}


UNREAD = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN")
"""A shell's AWS settings that moto's run drops: its credentials are ``AWS``'s, its config none."""


class Requests(logging.Handler):
    """Counts the requests the server's log records (werkzeug logs one line a request)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def start_server(endpoint: Optional[str] = None) -> tuple[Optional[object], Optional[Requests]]:
    """moto's server on 127.0.0.1 in this process's threads, found through the AWS variables, and its
    request counter; with ``endpoint``, that server instead (the credentials of the environment),
    neither started nor counted: ``(None, None)``."""
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)  # it would win over the endpoint set here
    if endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        return None, None
    from moto.server import ThreadedMotoServer

    counter = Requests()
    log = logging.getLogger("werkzeug")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.handlers = [counter]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({**AWS, "AWS_ENDPOINT_URL": f"http://{host}:{port}"})
    for name in UNREAD:
        os.environ.pop(name, None)
    return server, counter


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Files of a folder with ``Range: bytes=A-B`` answered (206, read with ``os.pread``), as a store does
    (HTTP/1.0, a connection a request: faster here than HTTP/1.1's kept connections through this server)."""

    def log_message(self, *args) -> None:
        pass

    def send_head(self):  # noqa: ANN201 - http.server's own hook
        asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if asked is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        start, end = int(asked[1]), min(int(asked[2]), size - 1)
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), end - start + 1, start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return _Body(data)


class _Body:
    """The bytes of a range, as ``send_head``'s file object for ``copyfile``."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = memoryview(data), 0  # a view: each chunk sent without copying the rest

    def read(self, n: int = -1) -> memoryview:
        end = len(self.data) if n < 0 else min(len(self.data), self.at + n)
        data, self.at = self.data[self.at : end], end
        return data

    def close(self) -> None:
        pass


class RangeServer:
    """``RangeHandler`` serving a folder on 127.0.0.1 in a process of its own (started with ``spawn``:
    this process runs moto's threads), so that its CPU is measured apart from the reader's: ``url``,
    ``served`` (its requests so far) and ``cpu`` (its CPU seconds so far); ``stop()`` ends it."""

    def __init__(self, folder: Path) -> None:
        context = multiprocessing.get_context("spawn")
        self._served = context.Value("q", 0)
        ready = context.Queue()
        self._process = context.Process(target=_serve, args=(str(folder), self._served, ready), daemon=True)
        self._process.start()
        self.url = f"http://127.0.0.1:{ready.get(timeout=60)}"

    @property
    def served(self) -> int:
        return int(self._served.value)

    @property
    def cpu(self) -> float:
        return process_cpu(self._process.pid)

    def stop(self) -> None:
        self._process.terminate()
        self._process.join()


def process_cpu(pid: int) -> float:
    """The CPU seconds of the process ``pid`` so far (user and system, from ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _serve(folder: str, served, ready) -> None:
    """The range server's process: ``RangeHandler`` on a free port (sent on ``ready``), a thread a request."""

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 128  # socketserver's 5 drops a batch's connections

    class Counted(RangeHandler):
        def send_head(self):  # noqa: ANN201 - http.server's own hook
            with served.get_lock():
                served.value += 1  # every request: sizes (HEAD), whole small files, ranges
            return super().send_head()

    server = Server(("127.0.0.1", 0), functools.partial(Counted, directory=folder))
    ready.put(server.server_address[1])
    server.serve_forever()


class NginxServer:
    """nginx (where installed: ``apt install nginx-light``) serving a folder on 127.0.0.1, one worker
    process, ranges answered with ``sendfile``: a server whose CPU is next to none, so that the range
    reads measure the reader. The same ``url``, ``served``, ``cpu`` and ``stop()`` as ``RangeServer``."""

    def __init__(self, folder: Path, work: Path) -> None:
        self.home = work / "nginx"
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir(parents=True)
        port = _free_port()
        (self.home / "nginx.conf").write_text(
            "daemon off; worker_processes 1; pid nginx.pid; error_log error.log;\n"
            "events { worker_connections 1024; }\n"
            "http { sendfile on; keepalive_requests 1000000; access_log access.log;\n"
            f"  server {{ listen 127.0.0.1:{port}; root {folder.absolute()}; }} }}\n"
        )
        self._process = subprocess.Popen(
            [shutil.which("nginx") or "nginx", "-p", str(self.home), "-c", "nginx.conf"], stderr=subprocess.DEVNULL
        )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/", timeout=1).close()
            except urllib.error.HTTPError:
                break  # answered (a folder without an index: 403 or 404)
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"nginx did not start: see {self.home / 'error.log'}") from None
                time.sleep(0.1)
            else:
                break
        self._worker = int(subprocess.check_output(["pgrep", "-P", str(self._process.pid)]).split()[0])

    @property
    def served(self) -> int:
        log = self.home / "access.log"
        return sum(1 for _ in log.open("rb")) if log.exists() else 0

    @property
    def cpu(self) -> float:
        return process_cpu(self._worker)

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def range_server(kind: str, work: Path) -> tuple[object, str]:
    """The lean range server of ``--range-server`` over ``work`` and the words that name it: nginx
    where asked for, or where ``auto`` finds it installed; else ``RangeServer``."""
    if kind == "nginx" or (kind == "auto" and shutil.which("nginx")):
        return NginxServer(work, work), "nginx"
    return RangeServer(work), "Python's http.server"


class Converted(NamedTuple):
    """One timed conversion: its wall ``seconds``, the most bytes its temporary folder held
    (``peak``), the CPU seconds of packer's processes (``cpu``: the command and its workers) and of
    this process meanwhile (``here_cpu``: the S3 server's threads, and the 10 ms polling)."""

    seconds: float
    peak: int
    cpu: float
    here_cpu: float


def timed_convert(src: Path, out: str, fmt: str, scratch: Optional[Path] = None, *more: str) -> Converted:
    """``packer convert SRC -f FMT -o OUT`` in a new process (with ``--overwrite``, unless ``more``
    has ``--append``), timed (``Converted``); its temporary folder is ``TMPDIR=scratch``, where a
    bucket output's local folder goes, its size polled every 10 ms."""
    children, here = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    started = time.perf_counter()
    replace = [] if "--append" in more else ["--overwrite"]
    command = [sys.executable, "-m", "packer", "convert", str(src), "-f", fmt, "-o", out, "-q", *replace, *more]
    env = dict(os.environ)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        env["TMPDIR"] = str(scratch)
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=env)
    peak = 0
    while run.poll() is None:
        if scratch is not None:
            peak = max(peak, _folder_size(scratch))
        time.sleep(0.01)
    seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({run.returncode})")
    cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)  # workers included: waited for
    return Converted(seconds, peak, cpu, time.process_time() - here)


def _folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder`` now (0 when a folder goes while it is listed: polled again)."""
    try:
        return sum(_size(p) for p in folder.rglob("*"))
    except OSError:
        return 0


def _size(path: Path) -> int:
    """Bytes of the file ``path``; 0 for a folder or a file removed while the folder was listed."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def drop_page_cache() -> bool:
    """Drop the page cache (the local output then reads from the disk); False where not allowed."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def epoch(root, batch: int, workers: int, **options) -> tuple[float, int, float, float]:
    """One shuffled epoch of the npy output at ``root`` through ``make_loader``: samples/s, batches,
    the reader's CPU seconds (this process's, which a server in its threads adds to, and its
    workers', joined at the epoch's end) and the workers' alone."""
    from readers import make_loader, open_dataset

    children, here = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time()
    loader = make_loader(open_dataset(root, **options), batch, num_workers=workers, seed=0)
    started, batches, samples = time.perf_counter(), 0, 0
    for _, labels in loader:
        batches += 1
        samples += len(labels)
    rate = samples / (time.perf_counter() - started)
    del loader  # its workers are gone before their CPU is read
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = after.ru_utime - children.ru_utime + after.ru_stime - children.ru_stime
    return rate, batches, time.process_time() - here + workers_cpu, workers_cpu


@contextlib.contextmanager
def through_s3fs() -> Iterator[None]:
    """Range reads of ``s3://`` sent through s3fs's client, as before presigned URLs
    (``readers.remote.signed_urls``: ``PACKER_S3_PRESIGNED=0``), in this process and its workers."""
    from readers.remote.signed_urls import SWITCH

    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[SWITCH]
        else:
            os.environ[SWITCH] = before


def _count(requests: Optional[Requests]) -> Optional[int]:
    """The requests the server answered so far; None where they are not counted (``--endpoint``)."""
    return None if requests is None else requests.count


def _since(requests: Optional[Requests], before: Optional[int]) -> Optional[int]:
    return None if requests is None or before is None else requests.count - before


def _bucket(fs, name: str) -> None:
    """The bucket ``name``, made where the server has none by that name."""
    if not fs.exists(name):
        fs.mkdir(name)


def _stop(server: Optional[object]) -> None:
    if server is not None:
        server.stop()


def run(args: argparse.Namespace) -> dict:
    import bench
    import s3fs

    work = Path(args.work)
    src = work / "images"
    if not src.is_dir() or sum(1 for _ in src.rglob("*.jpg")) != args.images:
        shutil.rmtree(src, ignore_errors=True)
        bench.make_images(src, args.images)
    server, requests = start_server(args.endpoint)
    bucket = f"s3://{args.bucket}"
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        _bucket(fs, args.bucket)
        host = describe_host()
        print(f"{host.line()}; {args.images} images, {args.workers} workers", flush=True)
        local, remote, asked = [], [], []
        shards = ("--shard-size", str(args.shard_size))
        for _ in range(args.repeat):  # alternated: the host's drift falls on both
            local.append(timed_convert(src, str(work / "local-wds"), "wds", None, *shards))
            before = _count(requests)
            remote.append(timed_convert(src, f"{bucket}/wds", "wds", work / "tmp", *shards))
            asked.append(_since(requests, before))
        tars = [p.stat().st_size for p in (work / "local-wds").glob("*.tar")]
        conversion = {
            "local_s": [c.seconds for c in local],
            "bucket_s": [c.seconds for c in remote],
            "ratio": statistics.median(c.seconds for c in local) / statistics.median(c.seconds for c in remote),
            "local_cpu_s": [c.cpu for c in local],
            "bucket_cpu_s": [c.cpu for c in remote],
            "server_cpu_s": [c.here_cpu for c in remote] if server is not None else None,
            "bucket_requests": asked,
            "output_bytes": sum(_size(p) for p in (work / "local-wds").rglob("*")),
            "shards": len(tars),
            "largest_shard_bytes": max(tars),
            "peak_local_bytes": max(c.peak for c in remote),
        }
        print(f"conversion: {json.dumps(conversion)}", flush=True)
        timed_convert(src, str(work / "local-npy"), "npy")  # shards of the default size
        fs.put(f"{work / 'local-npy'}/", f"{args.bucket}/npy/", recursive=True)
        cold = not args.warm and drop_page_cache()
        local_rate, batches, local_cpu, _ = epoch(work / "local-npy", args.batch, args.workers)
        reads = {"local_samples_per_s": local_rate, "local_cold": cold, "batches": batches, "local_cpu_s": local_cpu}
        blocks, downloads = work / "blocks", work / "downloads"
        for folder in (blocks, downloads):
            shutil.rmtree(folder, ignore_errors=True)
        runs = {  # in this order: the block cache is empty in the third and full in the fourth
            "ranges": {},
            "ranges_s3fs": {},
            "ranges_cache_empty": {"cache_dir": blocks},
            "ranges_cache_full": {"cache_dir": blocks},
            "download": {"cache_dir": downloads, "download": True},
        }
        for name, options in runs.items():
            before = _count(requests)
            with through_s3fs() if name == "ranges_s3fs" else contextlib.nullcontext():
                reads[name], _, _, reads[f"{name}_workers_cpu_s"] = epoch(
                    f"{bucket}/npy", args.batch, args.workers, **options
                )
            asked_now = _since(requests, before)
            reads[f"{name}_requests_per_batch"] = None if asked_now is None else asked_now / batches
        lean, reads["range_server"] = range_server(args.range_server, work)
        try:
            reads.update(lean_reads(lean, work, runs, batches, args))
        finally:
            lean.stop()
        print(json.dumps(reads, indent=1), flush=True)
        results = {"machine": host.to_dict(), "images": args.images, "conversion": conversion, "reads": reads}
        (work / "bucket.json").write_text(json.dumps(results, indent=2))
        print(markdown(results, args))
        return results
    finally:
        _stop(server)


def lean_reads(lean, work: Path, runs: dict, batches: int, args: argparse.Namespace) -> dict:
    """The reads of ``HTTP_READS`` from the lean range server, ``--repeat`` rounds, each after a read of
    the local output with its page cache dropped (alternated: the host's drift falls on both; one
    epoch of each says little on a VM whose rates move between rounds): each figure the median of the
    rounds, its rounds under ``_runs``, the ratio against the rounds' local median."""
    got: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        cold = not args.warm and drop_page_cache()
        rate, _, cpu, _ = epoch(work / "local-npy", args.batch, args.workers)
        got.setdefault("http_local", []).append(rate)
        got.setdefault("http_local_reader_cpu_s", []).append(cpu)
        shutil.rmtree(work / "blocks", ignore_errors=True)  # empty for the second, full for the third
        for name, options in ((n, o) for n, o in runs.items() if n in HTTP_READS):
            before, server_cpu = lean.served, lean.cpu
            rate, _, cpu, _ = epoch(f"{lean.url}/local-npy", args.batch, args.workers, **options)
            got.setdefault(f"http_{name}", []).append(rate)
            got.setdefault(f"http_{name}_reader_cpu_s", []).append(cpu)
            got.setdefault(f"http_{name}_requests_per_batch", []).append((lean.served - before) / batches)
            got.setdefault(f"http_{name}_server_cpu_s", []).append(lean.cpu - server_cpu)
    reads = {name: statistics.median(values) for name, values in got.items()}
    reads.update({f"{name}_runs": values for name, values in got.items() if not name.endswith(("_cpu_s", "_batch"))})
    reads["http_local_cold"] = cold
    return reads


def append_check(args: argparse.Namespace) -> dict:
    """``--append-check``: half of the bench photographs converted (``--format``), the other half
    appended, into the bucket and to a local folder, alternated ``--repeat`` times; the appends'
    seconds, the requests the server answered during the bucket's, and the most bytes the local
    folder of the bucket's held."""
    import bench
    import s3fs

    work = Path(args.work)
    src = work / "images"
    if not src.is_dir() or sum(1 for _ in src.rglob("*.jpg")) != args.images:
        shutil.rmtree(src, ignore_errors=True)
        bench.make_images(src, args.images)
    files = sorted(src.rglob("*.jpg"))
    grow = work / "grow"
    server, requests = start_server(args.endpoint)
    bucket = f"s3://{args.bucket}"
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        _bucket(s3fs.S3FileSystem(), args.bucket)
        host = describe_host()
        print(f"{host.line()}; {len(files) // 2} + {len(files) - len(files) // 2} images, --format {args.format}")
        local_s, bucket_s, asked, peaks = [], [], [], []
        shards = ("--shard-size", str(args.shard_size))
        for _ in range(args.repeat):
            shutil.rmtree(grow, ignore_errors=True)
            for f in files[::2]:  # every other file, as links (no bytes copied): every class in both halves
                (grow / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                os.link(f, grow / f.relative_to(src))
            timed_convert(grow, str(work / "grown"), args.format, None, *shards)
            timed_convert(grow, f"{bucket}/grown", args.format, work / "tmp", *shards)
            time.sleep(1.1)  # the sources' times after the outputs' (S3 keeps whole seconds)
            for f in files[1::2]:
                (grow / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                os.link(f, grow / f.relative_to(src))
            local_s.append(timed_convert(grow, str(work / "grown"), args.format, None, "--append", *shards).seconds)
            before = _count(requests)
            done = timed_convert(grow, f"{bucket}/grown", args.format, work / "tmp", "--append", *shards)
            seconds, peak = done.seconds, done.peak
            bucket_s.append(seconds)
            asked.append(_since(requests, before))
            peaks.append(peak)
        result = {
            "machine": host.to_dict(),
            "images": len(files),
            "format": args.format,
            "local_append_s": local_s,
            "bucket_append_s": bucket_s,
            "ratio": statistics.median(local_s) / statistics.median(bucket_s),
            "requests": asked,
            "peak_local_bytes": max(peaks),
            "output_bytes": sum(_size(p) for p in (work / "grown").rglob("*")),
        }
        print(json.dumps(result, indent=1))
        return result
    finally:
        _stop(server)


def markdown(r: dict, args: argparse.Namespace) -> str:
    c, x = r["conversion"], r["reads"]
    cold = "cold page cache" if x["local_cold"] else "warm page cache (drop_caches not allowed here)"
    return "\n".join(
        [
            f"| {r['images']} images | seconds (runs) | ratio |",
            "|---|---|---:|",
            f"| convert -f wds to a local folder | {', '.join(f'{s:.1f}' for s in c['local_s'])} | 1.00x |",
            f"| convert -f wds into the bucket | {', '.join(f'{s:.1f}' for s in c['bucket_s'])} | {c['ratio']:.2f}x |",
            "",
            "| CPU seconds (medians) | packer's processes | the S3 server (this process) |",
            "|---|---:|---:|",
            f"| to a local folder | {statistics.median(c['local_cpu_s']):.1f} | |",
            f"| into the bucket | {statistics.median(c['bucket_cpu_s']):.1f} "
            f"| {_figure(c['server_cpu_s'] and statistics.median(c['server_cpu_s']), '.1f')} |",
            "",
            f"Local disk during the conversion into the bucket: at most {c['peak_local_bytes'] / 2**20:.1f} MB "
            f"({c['peak_local_bytes'] / c['largest_shard_bytes']:.1f} shards of "
            f"{c['largest_shard_bytes'] / 2**20:.1f} MB; the output: {c['output_bytes'] / 2**20:.1f} MB in "
            f"{c['shards']} shards). Requests the S3 server answered for each conversion into it: "
            f"{', '.join(_figure(n, 'd') for n in c['bucket_requests'])}.",
            "",
            f"| npy reads, batches of {args.batch}, {args.workers} workers | samples/s | / local | requests a batch "
            "| reader CPU s | server CPU s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| local output, {cold} | {x['local_samples_per_s']:.0f} | 1.00x | | {x['local_cpu_s']:.1f} | |",
            *(
                f"| bucket, {label} | {x[name]:.0f} | {x[name] / x['local_samples_per_s']:.2f}x "
                f"| {_figure(x[f'{name}_requests_per_batch'], '.2f')} | {x[f'{name}_workers_cpu_s']:.1f} (workers) | |"
                for name, label in READS.items()
            ),
            "",
            f"| the same from the lean range server ({x['range_server']}), rounds: {len(x['http_local_runs'])} "
            "(medians; each round's samples/s) | samples/s | / local | requests a batch | reader CPU s "
            "| server CPU s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| local output, {cold} ({_runs(x['http_local_runs'])}) | {x['http_local']:.0f} | 1.00x | "
            f"| {x['http_local_reader_cpu_s']:.1f} | |",
            *(
                f"| {label} ({_runs(x[f'http_{name}_runs'])}) | {x[f'http_{name}']:.0f} "
                f"| {x[f'http_{name}'] / x['http_local']:.2f}x | {x[f'http_{name}_requests_per_batch']:.2f} "
                f"| {x[f'http_{name}_reader_cpu_s']:.1f} | {x[f'http_{name}_server_cpu_s']:.1f} |"
                for name, label in READS.items()
                if name in HTTP_READS
            ),
            "",
            "Byte ranges without a cache from the S3 server, the workers' CPU: "
            f"{x['ranges_workers_cpu_s']:.2f} s by presigned URLs against {x['ranges_s3fs_workers_cpu_s']:.2f} s "
            f"through s3fs's client{_saved_per_request(x)}.",
        ]
    )


def _runs(rates: list[float]) -> str:
    return ", ".join(f"{r:.0f}" for r in rates)


def _figure(value: Optional[float], form: str) -> str:
    """``value`` as ``form`` writes it; "not counted" where the server is one of its own (``--endpoint``)."""
    return "not counted" if value is None else format(value, form)


def _saved_per_request(x: dict) -> str:
    """The end of the sentence on presigned URLs: the milliseconds of the workers' CPU they save per
    request the server answered."""
    if x["ranges_s3fs_requests_per_batch"] is None:
        return " (the requests of a server of its own are not counted)"
    asked = x["ranges_s3fs_requests_per_batch"] * x["batches"]
    saved = 1000 * (x["ranges_s3fs_workers_cpu_s"] - x["ranges_workers_cpu_s"]) / max(asked, 1)
    return f", {saved:.2f} ms less for each request the server answered"


READS = {
    "ranges": "byte ranges, no cache",
    "ranges_s3fs": "byte ranges through s3fs's client (no presigned URLs), no cache",
    "ranges_cache_empty": "byte ranges, cache_dir empty",
    "ranges_cache_full": "byte ranges, cache_dir full",
    "download": "download=True, cache_dir empty (whole shards)",
}
HTTP_READS = ("ranges", "ranges_cache_empty", "ranges_cache_full")
"""The reads measured again from the lean range server (its URLs are plain HTTP: no signing)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--shard-size", default="100", help="of the conversions (samples, or bytes: 16MB)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--work", type=Path, default=Path("/tmp/packer-bucket"))
    p.add_argument("--warm", action="store_true", help="read the local output warm (no page cache drop: tests)")
    p.add_argument(
        "--range-server",
        choices=("auto", "nginx", "python"),
        default="auto",
        help="the lean range server: nginx (auto: where installed) or Python's http.server",
    )
    p.add_argument("--append-check", action="store_true", help="only: an append into the bucket against a local one")
    p.add_argument("--format", default="npy", help="of the --append-check outputs")
    p.add_argument(
        "--endpoint",
        help="an S3-compatible server already running (its credentials from the AWS variables), instead of moto",
    )
    p.add_argument("--bucket", default="bench", help="the bucket the outputs go to (made where missing)")
    return p


if __name__ == "__main__":
    arguments = parser().parse_args()
    if arguments.append_check:
        append_check(arguments)
    else:
        run(arguments)
