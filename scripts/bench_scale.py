"""Issue 26's scale benchmark: what grows with the number of source files, phase by phase.

    python scripts/bench_scale.py                              # 10k and 100k files, npy, wds, lmdb
    python scripts/bench_scale.py --sizes 10000,100000,400000 --discovery-files 1000000 \\
        --markdown bench_scale.md --json bench_scale.json
    python scripts/bench_scale.py --quick                      # 2k and 5k files, npy and wds: a smoke run

For each size it generates (once, cached under ``--work``) a tree of tiny 32x32 JPEGs in 100 class
folders, all byte-distinct, and measures, each in a fresh child process:

- conversion (``packer.convert``, ``--size 32`` so the images keep their size and nothing is about
  the resize): wall and CPU of the packer parent per phase (start to plan known, plan to workers
  started, the workers, workers done to return: duplicate report, manifest, publish), its peak RSS
  after each phase, the workers' CPU and largest peak RSS;
- reading: a plain ``DataLoader(open_dataset(out), batch_size=256, num_workers=2, shuffle=True,
  persistent_workers=True)`` (wds: no sampler shuffle, a 1000-sample buffer) reads 20 batches, then
  each worker's ``Pss`` and ``Anonymous`` from ``/proc/PID/smaps_rollup``;
- epoch start: ``next(iter(EpochBatchSampler(n, 256)))`` after ``set_epoch(1)``, for the real sizes
  and simulated larger ones (``--epoch-sizes``), with its peak RSS increase;
- resume: the CLI interrupted with SIGINT (to its process group, as Ctrl-C) at 70% of the
  uninterrupted conversion's time, then run again with ``--resume``; its shards compared with the
  uninterrupted output's;
- ``packer.verify`` CPU (its own and its per-shard children's) per file;
- shards started during the walk (``packer.run.early_start``): the largest tree converted to npy with a
  cut known from its first samples (``--early-shard-size``), with the early start and without,
  alternated ``--early-rounds`` times: wall, when the first shard started, the parent's peak, and
  whether both wrote the same shards;
- optionally (``--discovery-files``), ``packer.sources.discover.discover`` alone on a tree of empty files.

Prints the tables; ``--markdown`` writes them with an extrapolation to 10^8 files (the per-file slope
between the two largest sizes), ``--json`` the raw records.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLASSES = 100
SIDE = 32
BATCH = 256
READ_BATCHES = 20
INTERRUPT_AT = 0.7
TARGET = 10**8
RESULT_MARK = "@@bench-scale "
"""Prefix of the one stdout line on which a child process returns its JSON record."""
DONE_MARK = "complete"
"""Written beside a generated tree once its last file is: a tree without it is made again."""


# Source trees -----------------------------------------------------------------------------------------
def base_jpegs(count: int = 48) -> list[bytes]:
    """``count`` different 32x32 JPEGs (smooth gradients plus noise, quality 90)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(26)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    out = []
    for _ in range(count):
        a, b, c = rng.uniform(0, 8, 3)
        base = np.stack([(x * a + y * b) % 256, (x * b - y * c) % 256, (x * c + y * a) % 256], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def tagged(jpeg: bytes, index: int) -> bytes:
    """``jpeg`` with a comment (COM) segment holding ``index`` right after its SOI marker: the pixels
    stay those of ``jpeg``, the bytes differ from every other index's (packer reports duplicates)."""
    text = f"bench_scale {index}".encode()
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def make_tree(root: Path, count: int, empty: bool = False, folders: int = CLASSES) -> Path:
    """A tree of ``count`` files ``cNN/NNNNNNN.jpg`` in ``folders`` class folders under ``root``
    (made once: reused when its marker says it is complete). ``empty`` files serve discovery alone."""
    marker = root.with_name(root.name + "." + DONE_MARK)
    if marker.is_file() and marker.read_text().strip() == str(count) and root.is_dir():
        return root
    if root.exists():
        shutil.rmtree(root)
    width = len(str(folders - 1))
    dirs = [root / f"c{k:0{width}d}" for k in range(folders)]
    for d in dirs:
        d.mkdir(parents=True)
    bases = [b""] if empty else base_jpegs()
    for i in range(count):
        data = b"" if empty else tagged(bases[i % len(bases)], i)
        with open(dirs[i % folders] / f"{i:07d}.jpg", "wb") as f:
            f.write(data)
    marker.write_text(f"{count}\n")
    return root


# Measuring in child processes -------------------------------------------------------------------------
def maxrss_kib(who: int = resource.RUSAGE_SELF) -> int:
    """Peak resident set of this process (or of its largest reaped child), in KiB (Linux's unit)."""
    return resource.getrusage(who).ru_maxrss


def rss_kib() -> int:
    """Resident set of this process now, in KiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def children_cpu() -> float:
    """User + system seconds of this process's reaped children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def smaps(pid: int) -> dict[str, int]:
    """``Rss``, ``Pss``, ``Anonymous`` and private (clean + dirty) kB of process ``pid``, from
    ``/proc/PID/smaps_rollup``. A forked worker's Anonymous counts the pages it still shares with its
    parent (torch's, mostly); its private pages are what it alone costs."""
    out = {"private_kb": 0}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Anonymous"):
                out[key.lower() + "_kb"] = int(rest.split()[0])
            elif key in ("Private_Clean", "Private_Dirty"):
                out["private_kb"] += int(rest.split()[0])
    return out


def child_convert(p: dict) -> dict:
    """One conversion through ``packer.convert``, timed phase by phase from inside the packer parent."""
    import packer.ops.convert as pipeline
    import packer.run.early_start as early_start
    import packer.run.executor as executor
    from packer import ConvertConfig, PreprocessConfig, convert
    from packer.cli.option_values import parse_shard_size

    marks: dict[str, dict] = {}

    def mark(name: str) -> None:
        marks[name] = {
            "wall": time.perf_counter(),
            "cpu": time.process_time(),
            "maxrss_kib": maxrss_kib(),
            "rss_kib": rss_kib(),
            "children_cpu": children_cpu(),
        }

    real = pipeline.run_unfinished

    def timed_run(*args, **kwargs):
        # convert looks run_unfinished up in its module at each call: replacing it brackets the workers
        mark("workers_start")
        try:
            return real(*args, **kwargs)
        finally:
            mark("workers_done")

    pipeline.run_unfinished = timed_run
    real_finish, real_start = early_start.EarlyStart.finish, executor.JobRunner._start

    def timed_finish(*args, **kwargs):  # the early start's run of the rest of the plan, as run_unfinished
        mark("workers_start")
        try:
            return real_finish(*args, **kwargs)
        finally:
            mark("workers_done")

    def first_start(*args, **kwargs):
        if "first_worker" not in marks:
            mark("first_worker")
        return real_start(*args, **kwargs)

    early_start.EarlyStart.finish = timed_finish
    executor.JobRunner._start = first_start
    if not p.get("early", True):
        early_start.EARLY_AFTER = float("inf")  # no shard starts before the walk ends
    shards: list[int] = []

    def on_plan(found, tasks) -> None:
        mark("plan")
        shards.append(len(tasks))

    config = ConvertConfig(
        p["format"],
        preprocess=PreprocessConfig(size=(SIDE, SIDE)),
        shard_size=parse_shard_size(p.get("shard_size", "auto")),
    )
    mark("start")
    result = convert(p["source"], p["output"], config, workers=p["workers"], overwrite=True, on_plan=on_plan)
    mark("end")
    start = marks["start"]
    rel = {
        k: {f: v[f] - start[f] for f in ("wall", "cpu", "children_cpu")}
        | {"maxrss_kib": v["maxrss_kib"], "rss_kib": v["rss_kib"]}
        for k, v in marks.items()
    }
    return {
        "marks": rel,
        "baseline_rss_kib": start["rss_kib"],
        "baseline_maxrss_kib": start["maxrss_kib"],
        "worker_peak_kib": maxrss_kib(resource.RUSAGE_CHILDREN),
        "shards": shards[0] if shards else None,
        "samples": result.manifest.samples,
        "bytes": result.bytes,
        "seconds": result.seconds,
        "duplicates": len(result.manifest.duplicates),
        "skipped": len(result.skipped),
    }


def _read_in_fork(out: str, fmt: str, batches: int, conn) -> None:
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from readers import open_dataset

    torch.set_num_threads(1)
    ds = open_dataset(out, shuffle=1000) if fmt == "wds" else open_dataset(out)
    iterable = isinstance(ds, IterableDataset)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, shuffle=not iterable, persistent_workers=True)
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - started
    read = 1
    while read < batches:  # small outputs have fewer batches than that: start another epoch
        try:
            next(it)
            read += 1
        except StopIteration:
            it = iter(loader)
    workers = [smaps(w.pid) for w in it._workers]
    conn.send(
        {"first_batch_s": first, "samples": len(ds), "workers": workers, "main": smaps(os.getpid()), "batches": read}
    )
    conn.close()
    del it, loader


def _epoch_in_fork(size: int, conn) -> None:
    from readers.loading.sampler import EpochBatchSampler

    before = maxrss_kib()
    start = time.perf_counter()
    sampler = EpochBatchSampler(size, BATCH, seed=0)
    sampler.set_epoch(1)
    first = next(iter(sampler))
    cold = time.perf_counter() - start
    start = time.perf_counter()
    sampler.set_epoch(2)
    next(iter(sampler))
    warm = time.perf_counter() - start
    conn.send(
        {
            "size": size,
            "first_batch_ms": cold * 1e3,
            "next_epoch_ms": warm * 1e3,
            "batch": len(first),
            "peak_increase_kib": maxrss_kib() - before,
        }
    )
    conn.close()


def in_forks(target: Callable, jobs: list[tuple]) -> list[dict]:
    """``target(*job, conn)`` for each job in a process forked from this one (torch and readers are
    imported once, here, yet each measure starts from the same clean state); their records."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    records = []
    for job in jobs:
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=target, args=(*job, send))  # not daemonic: DataLoader starts workers
        proc.start()
        send.close()
        try:
            records.append(receive.recv())
        except EOFError:
            proc.join()
            raise RuntimeError(f"the measure of {job} died (exit code {proc.exitcode}); see its stderr above")
        proc.join()
    return records


def child_readers(p: dict) -> dict:
    """Per-worker memory of a DataLoader over each output in ``p["outputs"]`` ([path, format])."""
    import readers  # noqa: F401 - imported before forking, so no measure pays for it

    return {"readers": in_forks(_read_in_fork, [(out, fmt, p["batches"]) for out, fmt in p["outputs"]])}


def child_epoch(p: dict) -> dict:
    """Time to the first batch of an epoch of each size in ``p["sizes"]``."""
    import readers.loading.sampler  # noqa: F401 - imported before forking

    return {"epochs": in_forks(_epoch_in_fork, [(n,) for n in p["sizes"]])}


def child_verify(p: dict) -> dict:
    """``packer.verify`` of one output: wall, CPU of this process and of the shard checkers it forks."""
    from packer.output.verify import verify

    wall, cpu, kids = time.perf_counter(), time.process_time(), children_cpu()
    problems = verify(p["output"])
    return {
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu + children_cpu() - kids,
        "problems": [str(x) for x in problems[:5]],
        "peak_kib": maxrss_kib(),
    }


def child_discover(p: dict) -> dict:
    """``packer.sources.discover.discover`` alone, with ``processes``: wall, CPU (this process and the pool's)
    and peak RSS of this process."""
    from packer.sources.discover import discover

    before, rss = maxrss_kib(), rss_kib()
    wall, cpu, pool_cpu = time.perf_counter(), time.process_time(), children_cpu()
    found = discover(p["root"], processes=p.get("processes", 1))
    return {
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "items": len(found.items),
        "pool_cpu_s": children_cpu() - pool_cpu,
        "processes": p.get("processes", 1),
        "peak_kib": maxrss_kib(),
        "baseline_kib": max(before, rss),
    }


CHILDREN: dict[str, Callable[[dict], dict]] = {
    "convert": child_convert,
    "readers": child_readers,
    "epoch": child_epoch,
    "verify": child_verify,
    "discover": child_discover,
}


def run_child(kind: str, params: dict, timeout: float = 7200) -> dict:
    """Run ``CHILDREN[kind](params)`` in a fresh Python process; its record, or RuntimeError with its
    stderr (printed too) when it fails."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(params)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(f"--- child {kind} {params} failed (exit {proc.returncode}) ---\n{proc.stdout}{proc.stderr}\n")
        raise RuntimeError(f"child {kind} failed with exit code {proc.returncode}")
    return json.loads(lines[-1][len(RESULT_MARK) :])


# The measures, from the parent --------------------------------------------------------------------------
def shard_digests(output: Path) -> list[tuple[str, str]]:
    """(file path, SHA-256) of every shard file the output's manifest lists, in order."""
    from packer.spec.manifest import read_manifest

    return [(f.path, f.sha256) for s in read_manifest(output).shards for f in s.files]


def remove_output(output: Path) -> None:
    """Remove ``output`` and what packer keeps beside it (staging folder, lock file)."""
    from packer.output.files import lock_file, staging_dir

    for path in (output, staging_dir(output)):
        if path.exists():
            shutil.rmtree(path)
    lock_file(output).unlink(missing_ok=True)


def cli_startup() -> float:
    """Wall seconds of ``python -m packer convert --help`` (best of 3): what a CLI run spends on
    start-up and imports before its conversion starts."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "packer", "convert", "--help"], check=True, capture_output=True, cwd=ROOT)
        best = min(best, time.perf_counter() - start)
    return best


def interrupt_at(proc: subprocess.Popen, plan_record: Path, after_plan: float) -> tuple[Optional[float], float]:
    """SIGINT to ``proc``'s process group (as a terminal's Ctrl-C: the workers get it too)
    ``after_plan`` seconds after ``plan_record`` appears. Timed from the plan rather than from the
    process start, so that the CLI's start-up does not move the interrupt. Returns the seconds since
    the plan when it was sent (None when the run ended first) and the seconds from the call to the
    plan (or to the run's end, when no plan was seen)."""
    start = time.perf_counter()
    planned = None
    while proc.poll() is None:
        now = time.perf_counter()
        if planned is None and plan_record.exists():
            planned = now
        if planned is not None and now - planned >= after_plan:
            os.killpg(proc.pid, signal.SIGINT)
            return now - planned, planned - start
        time.sleep(0.005)
    return None, (planned or time.perf_counter()) - start


def measure_resume(
    tree: Path,
    fmt: str,
    work: Path,
    workers: int,
    row: dict,
    startup: float,
    reference: list[tuple[str, str]],
    tries: int = 3,
    shard_size: str = "auto",
) -> dict:
    """Interrupt a CLI conversion at ``INTERRUPT_AT`` of the uninterrupted conversion ``row``'s time,
    resume it, and compare the result with the ``reference`` shard files of that conversion."""
    from packer.output.files import DONE_SUFFIX, PLAN_RECORD, staging_dir

    out = work / f"resume-{fmt}"
    cmd = [
        sys.executable,
        "-m",
        "packer",
        "-v",
        "convert",
        str(tree),
        "-f",
        fmt,
        "-o",
        str(out),
        "--workers",
        str(workers),
        "--size",
        str(SIDE),
        "--shard-size",
        shard_size,
        "-q",
    ]
    # the plan record is written just before on_plan is called, at row["plan_wall_s"] into a conversion
    after_plan = max(0.0, INTERRUPT_AT * row["wall_s"] - row["plan_wall_s"])
    uninterrupted = row["wall_s"] + startup
    for _ in range(tries):
        remove_output(out)
        with tempfile.TemporaryFile("w+") as log:
            began = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
            sent, to_plan = interrupt_at(proc, staging_dir(out) / PLAN_RECORD, after_plan)
            try:
                code = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
            ended = time.perf_counter() - began
            log.seek(0)
            first_log = log.read()
        if sent is not None:
            break
        # This (noisy, shared) machine ran it faster than the timed conversion: the run just made is an
        # uninterrupted CLI run, the better reference; interrupt the next one at 70% of it.
        uninterrupted = ended
        after_plan = max(0.0, INTERRUPT_AT * ended - to_plan)
    else:
        raise RuntimeError(f"the {fmt} conversion ended before its interrupt {tries} times")
    stage = staging_dir(out)
    finished = len(list(stage.glob(f"*{DONE_SUFFIX}"))) if stage.is_dir() else None
    if code != 130:
        print(f"--- interrupted {fmt} conversion exited {code}, not 130 ---\n{first_log}", file=sys.stderr)
    start = time.perf_counter()
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, cwd=ROOT)
    resumed = time.perf_counter() - start
    if again.returncode != 0:
        sys.stderr.write(f"--- resume of {fmt} failed (exit {again.returncode}) ---\n{again.stdout}{again.stderr}\n")
        raise RuntimeError(f"packer convert --resume failed with exit code {again.returncode}")
    said = re.search(r"resuming: (\d+) of (\d+) shards", again.stderr)
    record = {
        "format": fmt,
        "interrupt_after_plan_s": sent,
        "exit_code": code,
        "finished_shards": finished,
        "kept_by_resume": int(said.group(1)) if said else None,
        "shards": row["shards"],
        "resume_wall_s": resumed,
        "uninterrupted_wall_s": uninterrupted,
        "ratio": resumed / uninterrupted,
        "same_shards": shard_digests(out) == reference,
    }
    remove_output(out)
    return record


def convert_row(size: int, fmt: str, r: dict) -> dict:
    """The conversion record ``r`` flattened into the measures of the tables."""
    m = r["marks"]
    before, plan, done, end = m["workers_start"], m["plan"], m["workers_done"], m["end"]
    return {
        "size": size,
        "format": fmt,
        "shards": r["shards"],
        "wall_s": end["wall"],
        "files_per_s": size / end["wall"],
        "plan_wall_s": plan["wall"],
        "before_wall_s": before["wall"],
        "before_cpu_us": before["cpu"] / size * 1e6,
        "workers_wall_s": done["wall"] - before["wall"],
        "parent_cpu_during_workers_us": (done["cpu"] - before["cpu"]) / size * 1e6,
        "worker_cpu_us": (done["children_cpu"] - before["children_cpu"]) / size * 1e6,
        "after_wall_s": end["wall"] - done["wall"],
        "after_cpu_us": (end["cpu"] - done["cpu"]) / size * 1e6,
        "baseline_mib": r["baseline_maxrss_kib"] / 1024,
        "peak_plan_mib": plan["maxrss_kib"] / 1024,
        "peak_workers_start_mib": before["maxrss_kib"] / 1024,
        "peak_workers_done_mib": done["maxrss_kib"] / 1024,
        "peak_mib": end["maxrss_kib"] / 1024,
        "worker_peak_mib": r["worker_peak_kib"] / 1024,
        "duplicates": r["duplicates"],
        "skipped": r["skipped"],
        "bytes": r["bytes"],
        "first_worker_s": m.get("first_worker", before)["wall"],
    }


def measure_early(tree: Path, work: Path, workers: int, shard_size: str, rounds: int) -> list[dict]:
    """Conversions of ``tree`` (npy) with shards started during the walk and without, alternated
    ``rounds`` times: wall, when the first shard started, when the plan was known, the parent's peak,
    and whether both wrote the same shards."""
    rows, digests = [], {}
    for i in range(rounds):
        for early in (True, False):
            out = work / f"out-early-{early}"
            remove_output(out)
            r = run_child(
                "convert",
                {
                    "source": str(tree),
                    "output": str(out),
                    "format": "npy",
                    "workers": workers,
                    "shard_size": shard_size,
                    "early": early,
                },
            )
            row = convert_row(int(r["samples"]), "npy", r)
            digests[early] = shard_digests(out)
            rows.append(
                {
                    "early": early,
                    "round": i,
                    "shards": row["shards"],
                    "wall_s": row["wall_s"],
                    "first_worker_s": row["first_worker_s"],
                    "plan_s": row["plan_wall_s"],
                    "peak_mib": row["peak_mib"],
                    "baseline_mib": row["baseline_mib"],
                }
            )
            print(
                f"early start {'on' if early else 'off'}: {row['wall_s']:.1f} s, first shard at "
                f"{row['first_worker_s']:.2f} s",
                flush=True,
            )
    for row in rows:
        row["same_shards"] = digests[True] == digests[False]
    return rows


# Tables ----------------------------------------------------------------------------------------------
def fmt_num(v: Any) -> str:
    """A measure for a table: three significant digits or so, '-' when missing."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        return f"{v:,.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3g}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool) -> str:
    """``rows`` under ``headers``: a markdown table, or columns aligned for a terminal."""
    cells = [[fmt_num(v) for v in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells])


def extrapolate(points: Sequence[tuple[float, float]], at: float = TARGET) -> Optional[tuple[float, float, float]]:
    """(slope per file, intercept, value at ``at``) of the line through the two largest sizes of
    ``points`` ((size, value) pairs); None with fewer than two sizes."""
    pts = sorted(points)
    if len(pts) < 2 or pts[-1][0] == pts[-2][0]:
        return None
    (x1, y1), (x2, y2) = pts[-2], pts[-1]
    slope = (y2 - y1) / (x2 - x1)
    intercept = y1 - slope * x1
    return slope, intercept, slope * at + intercept


def report(results: dict, markdown: bool) -> str:
    """Every table of ``results``, as markdown or as terminal text."""
    out = []

    def section(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> None:
        if not rows:
            return
        gap = [""] if markdown else []  # markdown needs blank lines around a table
        out.extend([f"### {title}" if markdown else f"== {title} ==", *gap])
        if note:
            out.extend([note, *gap])
        out.extend([table(headers, rows, markdown), ""])

    rows = results["rows"]
    section(
        "Conversion phases (packer parent; CPU per file in µs)",
        [
            "size",
            "format",
            "shards",
            "files/s",
            "wall s",
            "plan s",
            "before-workers s",
            "before CPU µs/f",
            "workers s",
            "worker CPU µs/f",
            "parent CPU in workers µs/f",
            "after-workers s",
            "after CPU µs/f",
        ],
        [
            [
                r["size"],
                r["format"],
                r["shards"],
                r["files_per_s"],
                r["wall_s"],
                r["plan_wall_s"],
                r["before_wall_s"],
                r["before_cpu_us"],
                r["workers_wall_s"],
                r["worker_cpu_us"],
                r["parent_cpu_during_workers_us"],
                r["after_wall_s"],
                r["after_cpu_us"],
            ]
            for r in rows
        ],
        "before-workers: discovery, plan, staging, jobs (plan s: up to the plan); after-workers: duplicate report, "
        "manifest, publish.",
    )
    section(
        "Parent peak RSS by phase (MiB, peak so far at the end of each phase)",
        [
            "size",
            "format",
            "after imports",
            "plan known",
            "workers start",
            "workers done",
            "end",
            "bytes/file",
            "largest worker",
        ],
        [
            [
                r["size"],
                r["format"],
                r["baseline_mib"],
                r["peak_plan_mib"],
                r["peak_workers_start_mib"],
                r["peak_workers_done_mib"],
                r["peak_mib"],
                (r["peak_mib"] - r["baseline_mib"]) * 2**20 / r["size"],
                r["worker_peak_mib"],
            ]
            for r in rows
        ],
    )
    section(
        "Reading and verify",
        [
            "size",
            "format",
            "worker anon KiB",
            "worker PSS KiB",
            "worker private KiB",
            "main PSS KiB",
            "first batch s",
            "verify s",
            "verify CPU µs/f",
        ],
        [
            [
                r["size"],
                r["format"],
                r.get("reader_anon_kib"),
                r.get("reader_pss_kib"),
                r.get("reader_private_kib"),
                r.get("reader_main_pss_kib"),
                r.get("first_batch_s"),
                r.get("verify_wall_s"),
                r.get("verify_cpu_us"),
            ]
            for r in rows
        ],
        f"DataLoader(batch_size={BATCH}, num_workers=2, persistent_workers=True), {READ_BATCHES} batches read; "
        "worker figures are the mean of the 2 workers (smaps_rollup; anon includes the pages a forked worker "
        "still shares with its parent, private is what it alone holds).",
    )
    growth = results.get("reader_growth", [])
    section(
        "Reader worker memory growth between the smallest and largest size",
        ["format", "from", "to", "anon bytes/sample", "PSS bytes/sample", "private bytes/sample"],
        [
            [
                g["format"],
                g["from"],
                g["to"],
                g["anon_bytes_per_sample"],
                g["pss_bytes_per_sample"],
                g["private_bytes_per_sample"],
            ]
            for g in growth
        ],
    )
    section(
        "Epoch start (EpochBatchSampler, first batch of epoch 1)",
        ["samples", "first batch ms", "next epoch ms", "peak RSS increase KiB"],
        [[e["size"], e["first_batch_ms"], e["next_epoch_ms"], e["peak_increase_kib"]] for e in results["epochs"]],
        "target: under 50 ms at 10,000,000 samples.",
    )
    section(
        f"Resume after SIGINT at {INTERRUPT_AT:.0%} (CLI, largest size)",
        [
            "size",
            "format",
            "SIGINT s after plan",
            "exit",
            "shards finished",
            "kept",
            "of",
            "resume wall s",
            "uninterrupted s",
            "resume/uninterrupted",
            "same shards",
        ],
        [
            [
                x["size"],
                x["format"],
                x["interrupt_after_plan_s"],
                x["exit_code"],
                x["finished_shards"],
                x["kept_by_resume"],
                x["shards"],
                x["resume_wall_s"],
                x["uninterrupted_wall_s"],
                x["ratio"],
                x["same_shards"],
            ]
            for x in results["resume"]
        ],
        "finished: shard records in the staging folder after the interrupt; kept: those the resume reused "
        "(its log). Ratio 1.0: all work redone; 0.3: only the unfinished 30%. Both times include the CLI's "
        f"start-up ({results.get('cli_startup_s', 0):.2f} s, added to the in-process conversion time).",
    )
    section(
        "Shards started during the walk (npy, largest size)",
        ["early start", "round", "shards", "wall s", "first shard s", "plan known s", "parent peak MiB", "same shards"],
        [
            [
                ("on" if e["early"] else "off"),
                e["round"],
                e["shards"],
                e["wall_s"],
                e["first_worker_s"],
                e["plan_s"],
                e["peak_mib"],
                e["same_shards"],
            ]
            for e in results.get("early", [])
        ],
        f"--shard-size {results.get('early_shard_size')}: a cut known from the first samples, as --shard-size "
        "auto makes for a large source (packer.run.early_start); off: no shard starts before the walk ends.",
    )
    runs = [d for d in (results.get("discovery"), results.get("discovery_parallel")) if d]
    if runs:
        section(
            "Discovery alone (empty files)",
            [
                "files",
                "processes",
                "wall s",
                "CPU µs/file",
                "pool CPU µs/file",
                "peak RSS MiB",
                "after imports MiB",
                "bytes/file",
            ],
            [
                [
                    d["items"],
                    d.get("processes", 1),
                    d["wall_s"],
                    d["cpu_s"] / d["items"] * 1e6,
                    d.get("pool_cpu_s", 0.0) / d["items"] * 1e6,
                    d["peak_kib"] / 1024,
                    d["baseline_kib"] / 1024,
                    (d["peak_kib"] - d["baseline_kib"]) * 1024 / d["items"],
                ]
                for d in runs
            ],
            "CPU: of the discovering process; pool CPU: of the processes that walked subfolders for it.",
        )
    section(
        f"Extrapolation to {TARGET:.0e} files (line through the two largest sizes)",
        ["measure", "format", "slope per file", "intercept", f"at {TARGET:.0e}", "note"],
        [[*row, "flat: the slope is noise" if row[2] <= 0 else ""] for row in extrapolations(results)],
        "Reader PSS and private memory include the pages of the memory-mapped shard files that the random "
        "reads touched (page cache, reclaimable); anon is the workers' heap. Shards grow with the dataset up "
        "to 256 MiB (--shard-size auto), so a per-shard cost looks per-sample below that.",
    )
    return "\n".join(out)


def extrapolations(results: dict) -> list[list[Any]]:
    """Rows of the extrapolation table: each measure of the issue, per format, at 10^8 files."""
    measures = [
        ("parent peak RSS (GiB)", lambda r: r["peak_mib"] / 1024),
        ("largest worker peak RSS (GiB)", lambda r: r["worker_peak_mib"] / 1024),
        ("before-workers wall (s)", lambda r: r["before_wall_s"]),
        ("after-workers CPU (s)", lambda r: r["after_cpu_us"] * r["size"] / 1e6),
        ("reader worker anon (MiB)", lambda r: r.get("reader_anon_kib") and r["reader_anon_kib"] / 1024),
        ("reader worker PSS (MiB)", lambda r: r.get("reader_pss_kib") and r["reader_pss_kib"] / 1024),
        ("reader worker private (MiB)", lambda r: r.get("reader_private_kib") and r["reader_private_kib"] / 1024),
    ]
    rows = []
    formats = list(dict.fromkeys(r["format"] for r in results["rows"]))
    for name, get in measures:
        for fmt in formats:
            pts = [(r["size"], get(r)) for r in results["rows"] if r["format"] == fmt and get(r) is not None]
            fit = extrapolate(pts)
            if fit:
                rows.append([name, fmt, *fit])
    fit = extrapolate([(e["size"], e["first_batch_ms"]) for e in results["epochs"]])
    if fit:
        rows.append(["epoch start (ms)", "-", *fit])
    d = results.get("discovery")
    if d:
        per = d["cpu_s"] / d["items"]
        rows.append(["discovery CPU (s), proportional", "-", per, 0.0, per * TARGET])
    return rows


def header(args: argparse.Namespace, started: float) -> str:
    """The markdown header: date, commit, machine and the exact command line."""

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", *cmd], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    from packer import __version__
    from packer.advisor.host import describe_host

    command = shlex.join(["python", "scripts/bench_scale.py", *sys.argv[1:]])
    return "\n".join(
        [
            f"## Scale benchmark (issue 26), {datetime.date.today().isoformat()}",
            "",
            f"- commit `{git('rev-parse', '--short', 'HEAD')}`{dirty}, packer {__version__}, Python "
            f"{platform.python_version()}, {platform.platform()}",
            f"- {describe_host().line()}",
            f"- command: `{command}` ({time.perf_counter() - started:.0f} s)",
            f"- sources: {SIDE}x{SIDE} JPEGs in {CLASSES} class folders, converted with `--size {SIDE}` (the default "
            f"shorter-crop, a no-op on images of that size) and otherwise default options, {args.workers} workers",
            "",
        ]
    )


# The run ---------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        usage="bench_scale.py [--sizes N,N,...] [--formats npy,wds,lmdb] [--workers N] "
        "[--shard-size S] [--discovery-files N] [--epoch-sizes N,...] [--no-resume] "
        "[--work DIR] "
        "[--markdown FILE] [--json FILE] [--quick]",
    )
    p.add_argument("--sizes", default="10000,100000", help="source files per tree, comma-separated")
    p.add_argument("--formats", default="npy,wds,lmdb")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shard-size", default="auto", help="packer's --shard-size for every conversion")
    p.add_argument("--discovery-files", type=int, default=0, help="also time discovery alone on this many empty files")
    p.add_argument("--epoch-sizes", default="10000000", help="simulated sizes for the epoch-start measure")
    p.add_argument("--work", type=Path, default=Path("/tmp/packer-bench-scale"), help="trees and outputs (cached)")
    p.add_argument("--no-resume", action="store_true", help="skip the interrupt-and-resume measure")
    p.add_argument(
        "--early-rounds", type=int, default=2, help="rounds of the early-start measure at the largest size (0: skip it)"
    )
    p.add_argument("--early-shard-size", default="20000", help="the --shard-size of the early-start measure")
    p.add_argument("--markdown", type=Path, help="write the tables and the extrapolation here")
    p.add_argument("--json", type=Path, help="write the raw records here")
    p.add_argument("--quick", action="store_true", help="a smoke run: sizes 2000,5000, formats npy,wds")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.formats = "2000,5000", "npy,wds"
    args.size_list = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    args.format_list = [f.strip() for f in args.formats.split(",") if f.strip()]
    args.epoch_list = [int(s) for s in args.epoch_sizes.split(",") if s.strip()]
    return args


def run(args: argparse.Namespace) -> dict:
    """Every measure of the module docstring; the records."""
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"rows": [], "resume": [], "epochs": [], "reader_growth": []}
    trees = {}
    for n in args.size_list:
        t = time.perf_counter()
        trees[n] = make_tree(work / f"tree-{n}", n)
        print(f"tree of {n:,} files ready in {time.perf_counter() - t:.1f} s", flush=True)
    outputs = {}
    for n in args.size_list:
        for fmt in args.format_list:
            out = work / f"out-{n}-{fmt}"
            # A fresh conversion: --overwrite would delete the previous run's output after publishing
            # (kernel time proportional to its bytes, not to the files), inside the after-workers phase.
            remove_output(out)
            r = run_child(
                "convert",
                {
                    "source": str(trees[n]),
                    "output": str(out),
                    "format": fmt,
                    "workers": args.workers,
                    "shard_size": args.shard_size,
                },
            )
            row = convert_row(n, fmt, r)
            results["rows"].append(row)
            outputs[(n, fmt)] = (out, row)
            print(
                f"converted {n:,} files to {fmt} in {row['wall_s']:.1f} s ({row['shards']} shards, parent peak "
                f"{row['peak_mib']:.0f} MiB)",
                flush=True,
            )
            v = run_child("verify", {"output": str(out)})
            if v["problems"]:
                print(f"verify found problems in {out}: {v['problems']}", file=sys.stderr)
            row.update(verify_wall_s=v["wall_s"], verify_cpu_us=v["cpu_s"] / n * 1e6, verify_ok=not v["problems"])
    read = run_child(
        "readers", {"outputs": [[str(o), fmt] for (n, fmt), (o, _) in outputs.items()], "batches": READ_BATCHES}
    )["readers"]
    for ((n, fmt), (_, row)), rec in zip(outputs.items(), read):
        row.update(
            reader_anon_kib=mean(w["anonymous_kb"] for w in rec["workers"]),
            reader_pss_kib=mean(w["pss_kb"] for w in rec["workers"]),
            reader_private_kib=mean(w["private_kb"] for w in rec["workers"]),
            reader_main_pss_kib=rec["main"]["pss_kb"],
            first_batch_s=rec["first_batch_s"],
        )
    print("reader memory measured", flush=True)
    small, large = args.size_list[0], args.size_list[-1]
    if small != large:
        for fmt in args.format_list:
            a, b = outputs[(small, fmt)][1], outputs[(large, fmt)][1]
            results["reader_growth"].append(
                {
                    "format": fmt,
                    "from": small,
                    "to": large,
                    "anon_bytes_per_sample": (b["reader_anon_kib"] - a["reader_anon_kib"]) * 1024 / (large - small),
                    "pss_bytes_per_sample": (b["reader_pss_kib"] - a["reader_pss_kib"]) * 1024 / (large - small),
                    "private_bytes_per_sample": (b["reader_private_kib"] - a["reader_private_kib"])
                    * 1024
                    / (large - small),
                }
            )
    epoch_sizes = sorted(set(args.size_list) | set(args.epoch_list))
    results["epochs"] = run_child("epoch", {"sizes": epoch_sizes})["epochs"]
    print("epoch start measured", flush=True)
    if not args.no_resume:
        startup = cli_startup()
        results["cli_startup_s"] = startup
        for fmt in args.format_list:
            out, row = outputs[(large, fmt)]
            rec = measure_resume(
                trees[large], fmt, work, args.workers, row, startup, shard_digests(out), shard_size=args.shard_size
            )
            results["resume"].append({"size": large, **rec})
            print(
                f"resume of {fmt}: {rec['finished_shards']} of {rec['shards']} shards kept, ratio {rec['ratio']:.2f}",
                flush=True,
            )
    if args.early_rounds:
        results["early_shard_size"] = args.early_shard_size
        results["early"] = measure_early(trees[large], work, args.workers, args.early_shard_size, args.early_rounds)
    if args.discovery_files:
        t = time.perf_counter()
        root = make_tree(work / f"empty-{args.discovery_files}", args.discovery_files, empty=True, folders=1000)
        print(f"tree of {args.discovery_files:,} empty files ready in {time.perf_counter() - t:.1f} s", flush=True)
        results["discovery"] = run_child("discover", {"root": str(root)})
        if args.workers > 1:
            results["discovery_parallel"] = run_child("discover", {"root": str(root), "processes": args.workers})
    return results


def mean(values) -> float:
    """Arithmetic mean of an iterable of numbers."""
    values = list(values)
    return sum(values) / len(values)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the benchmark, print its tables, write --markdown and --json."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        record = CHILDREN[argv[1]](json.loads(argv[2]))
        print(RESULT_MARK + json.dumps(record), flush=True)
        return
    args = parse_args(argv)
    started = time.perf_counter()
    results = run(args)
    results["command"] = shlex.join(["python", "scripts/bench_scale.py", *argv])
    print()
    print(report(results, markdown=False))
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.markdown:
        args.markdown.write_text(header(args, started) + report(results, markdown=True) + "\n")
        print(f"wrote {args.markdown}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
