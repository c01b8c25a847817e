"""Token outputs against the tokenizer floor and LitData: conversion speed, stored size, block reads.

    python scripts/bench_tokens.py --corpus-mb 200 --work /tmp/packer-tokens
    python scripts/bench.py --tokens ...        # the same, from the main benchmark

What it measures, all on the same corpus, tokenizer and cores (ratios in one run):

- the **tokenizer floor**: the ``tokenizers`` library's own ``encode_batch`` of every document, held
  in memory, in batches of the size packer gives it, doing nothing else (no reading, no storing);
- **packer**: ``packer convert CORPUS -f npy --tokenizer T --pack BLOCK`` as a user runs it (a new
  process: reading the files, tokenizing, packing, writing, hashing, publishing);
- **LitData** (if installed): ``optimize(fn=..., item_loader=TokensLoader())`` with the tokenizer's
  ``encode`` per document and the end-of-text id appended, as LitData's pretraining guide writes it,
  on as many workers as packer's threads;
- **reads** of shuffled blocks of BLOCK inputs + 1, batches of ``--batch``: ``make_loader`` with 0
  and ``--workers`` workers, LitData's ``StreamingDataset(item_loader=TokensLoader(block_size=BLOCK
  + 1), shuffle=True)`` in its ``StreamingDataLoader``, and a bare ``np.memmap`` gather of the same
  blocks into an int64 batch in one process (the memory-copy bound), each for ``--seconds``;
- **size**: the bytes of each output per token of the corpus;
- with ``--stream``, the same concat output in wds, read from its folder (``TokenBlocks``) and
  streamed over HTTP from a server on 127.0.0.1 (``TokenStream``, 1 and 2 workers);
- with ``--resume-check``, the concat conversion stopped by SIGINT at 70% of its fresh time, then
  ``--resume``: the resumed run's time against the fresh one's, and whether the shards are the same.

The corpus is made once in ``--work`` (JSON Lines files of documents of made-up words with
Zipf-distributed frequencies, many short documents and a long tail), with a byte-level BPE tokenizer
of ``--vocab`` ids trained on part of it by ``tokenizers`` itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from packer.advisor.host import describe_host  # noqa: E402
from packer.sources.corpus import BATCH_CHARACTERS  # noqa: E402

FILES = 16
"""JSON Lines files of the corpus: enough for LitData's workers to share."""


def make_corpus(folder: Path, megabytes: int, seed: int = 0) -> list[Path]:
    """``megabytes`` of documents in ``FILES`` JSON Lines files (made once; kept when the size matches)."""
    stamp = folder / "corpus.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == {"megabytes": megabytes, "seed": seed}:
        return sorted(folder.glob("*.jsonl"))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = np.array(
        [
            12.7,
            9.1,
            8.2,
            7.5,
            7.0,
            6.7,
            6.3,
            6.1,
            6.0,
            4.3,
            4.0,
            2.8,
            2.8,
            2.4,
            2.4,
            2.2,
            2.0,
            2.0,
            1.9,
            1.5,
            1.0,
            0.8,
            0.15,
            0.15,
            0.1,
            0.07,
        ]
    )
    stems = ["".join(rng.choice(letters, size=int(rng.integers(1, 11)), p=freq / freq.sum())) for _ in range(50000)]
    words = np.array([w + rng.choice(["", "", "", "", ",", ".", ".\n"]) for w in stems], dtype=object)
    cumulative = np.cumsum(1.0 / np.arange(1, len(words) + 1) ** 1.07)
    cumulative /= cumulative[-1]
    target = megabytes * 1024**2
    written = 0
    handles = [open(folder / f"part-{i:02d}.jsonl", "w", encoding="utf-8") for i in range(FILES)]
    n = 0
    while written < target:
        # short documents (a few dozen words) and long ones (thousands): lognormal lengths
        count = int(min(40000, max(5, rng.lognormal(5.3, 1.3))))
        picks = np.searchsorted(cumulative, rng.random(count))
        text = " ".join(words[picks].tolist())
        line = json.dumps({"text": text}) + "\n"
        handles[n % FILES].write(line)
        written += len(text)
        n += 1
    for h in handles:
        h.close()
    stamp.write_text(json.dumps({"megabytes": megabytes, "seed": seed}))
    return sorted(folder.glob("*.jsonl"))


def texts_of(files: list[Path]) -> list[str]:
    return [json.loads(line)["text"] for f in files for line in open(f, encoding="utf-8")]


def make_tokenizer(path: Path, files: list[Path], vocab: int) -> Path:
    """A byte-level BPE tokenizer of ``vocab`` ids with ``<|endoftext|>``, trained on two of the files."""
    if path.is_file():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts_of(files[:2]), trainer)
    tok.save(str(path))
    return path


def tokenizer_floor(texts: list[str], tokenizer: Path, fast: bool = False) -> dict:
    """Seconds of ``encode_batch`` over every text, in batches of packer's size, and the tokens.
    ``fast``: ``encode_batch_fast`` (no offsets), the call packer makes: the most any converter
    using ``tokenizers`` can reach on these cores."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    batches, batch, size = [], [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if size >= BATCH_CHARACTERS:
            batches.append(batch)
            batch, size = [], 0
    batches.append(batch)
    tokens = 0
    started = time.perf_counter()
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    for b in batches:
        tokens += sum(len(e.ids) for e in encode(b, add_special_tokens=False))
    return {"seconds": time.perf_counter() - started, "tokens": tokens + len(texts)}


def packer_convert(corpus: Path, tokenizer: Path, out: Path, block: int, mode: str, fmt: str = "npy") -> dict:
    """``packer convert ... --pack`` in a new process: its wall time and the output's bytes and tokens."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "packer", "convert", str(corpus), "-f", fmt, "-o", str(out)]
    command += ["--tokenizer", str(tokenizer), "--pack", str(block), "--pack-mode", mode, "-q"]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    manifest = json.loads((out / "manifest.json").read_text())
    size = sum(f["bytes"] for s in manifest["shards"] for f in s["files"])
    return {
        "seconds": seconds,
        "bytes": size,
        "tokens": manifest["tokens"]["tokens"],
        "padding": manifest["tokens"]["padding"],
        "blocks": manifest["samples"],
    }


def resume_check(corpus: Path, tokenizer: Path, out: Path, block: int, fresh: float, share: float = 0.7) -> dict:
    """``packer convert ... --pack`` stopped by SIGINT after ``share`` of the ``fresh`` run's seconds,
    then the same command with ``--resume``: each one's wall time, and whether the output is the
    fresh run's (its manifest's shard files)."""
    import signal

    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "packer", "convert", str(corpus), "-f", "npy", "-o", str(out)]
    command += ["--tokenizer", str(tokenizer), "--pack", str(block), "-q"]
    started = time.perf_counter()
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = run.wait(timeout=share * fresh)  # done before the stop is due
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGINT)
        code = run.wait()
    stopped = time.perf_counter() - started
    # Published before the signal came, or as it came (a small corpus, a fast host): nothing to
    # resume, and --resume of a finished output is refused.
    if (out / "manifest.json").is_file():
        return {"stopped_after": stopped, "exit": code, "resumed": None}
    started = time.perf_counter()
    subprocess.run([*command, "--resume"], check=True, stdout=subprocess.DEVNULL)
    resumed = time.perf_counter() - started
    return {"stopped_after": stopped, "exit": code, "resumed": resumed}


def _litdata_tokenize(path: str, tokenizer: str, eos: int):
    from tokenizers import Tokenizer

    tok = _litdata_tokenize.cache.get(tokenizer)  # type: ignore[attr-defined]
    if tok is None:
        tok = _litdata_tokenize.cache[tokenizer] = Tokenizer.from_file(tokenizer)  # type: ignore[attr-defined]
    with open(path, encoding="utf-8") as f:
        for line in f:
            ids = tok.encode(json.loads(line)["text"], add_special_tokens=False).ids
            yield torch.tensor(ids + [eos], dtype=torch.int32)


_litdata_tokenize.cache = {}  # type: ignore[attr-defined]


def litdata_convert(files: list[Path], tokenizer: Path, out: Path, block: int, workers: int) -> dict | None:
    try:
        from litdata import TokensLoader, optimize
    except ImportError:
        return None
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    optimize(
        fn=partial(_litdata_tokenize, tokenizer=str(tokenizer), eos=0),
        inputs=[str(f) for f in files],
        output_dir=str(out),
        chunk_size=(block + 1) * 8192,
        item_loader=TokensLoader(),
        num_workers=workers,
    )
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return {"seconds": seconds, "bytes": size}


def _rate(batches, seconds: float, per_batch: int) -> float:
    """Tokens a second from an iterator of batches, for ``seconds`` after a warm-up of 10 batches."""
    it = iter(batches)
    for _ in range(10):
        next(it)
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        try:
            next(it)
        except StopIteration:
            break
        n += 1
    return n * per_batch / (time.perf_counter() - started)


def _forever(make):
    while True:
        yield from make()


def packer_reads(out: Path, batch: int, workers: int, seconds: float) -> float:
    from readers import make_loader, open_dataset

    ds = open_dataset(out)
    loader = make_loader(ds, batch, num_workers=workers)
    return _rate(_forever(lambda: iter(loader)), seconds, batch * ds.block_size)


def stream_reads(out: Path, batch: int, seconds: float) -> dict[str, float]:
    """Reads of the wds output ``out``: from its folder (``TokenBlocks``, no worker), and streamed over
    HTTP from a server on 127.0.0.1 (``TokenStream``: one worker, make_loader's default, and two)."""
    import functools
    import http.server
    import threading

    from readers import make_loader, open_dataset

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(out.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{out.name}"
    try:
        local = open_dataset(out)
        rates = {"packer wds, local folder, 0 workers": packer_reads(out, batch, 0, seconds)}
        for workers in (1, 2):
            loader = make_loader(open_dataset(url), batch, num_workers=workers)
            rate = _rate(_forever(lambda: iter(loader)), seconds, batch * local.block_size)
            rates[f"packer wds streamed over HTTP (127.0.0.1), {workers} worker(s)"] = rate
    finally:
        server.shutdown()
        server.server_close()
    return rates


def memmap_gather(out: Path, block: int, batch: int, seconds: float) -> float:
    """A bare gather of random blocks of ``block + 1`` ids from the token streams into an int64 batch."""
    manifest = json.loads((out / "manifest.json").read_text())
    streams = [np.load(out / f"{s['name']}.tokens.npy", mmap_mode="r") for s in manifest["shards"]]
    rng = np.random.default_rng(0)

    def batches():
        while True:
            rows = np.empty((batch, block + 1), np.int64)
            for r in range(batch):
                stream = streams[rng.integers(len(streams))]
                start = int(rng.integers(0, (len(stream) - block - 1) // block + 1)) * block
                rows[r] = stream[start : start + block + 1]
            yield torch.from_numpy(rows)

    return _rate(batches(), seconds, batch * block)


def litdata_reads(out: Path, block: int, batch: int, workers: int, seconds: float) -> float | None:
    try:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    except ImportError:
        return None
    ds = StreamingDataset(input_dir=str(out), item_loader=TokensLoader(block_size=block + 1), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers)
    return _rate(_forever(lambda: iter(loader)), seconds, batch * block)


def run(args: argparse.Namespace) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    files = make_corpus(work / "corpus", args.corpus_mb)
    tokenizer = make_tokenizer(work / "tokenizer.json", files, args.vocab)
    host = describe_host()
    print(f"{host.line()}; corpus {args.corpus_mb} MB in {len(files)} files, vocabulary {args.vocab}", flush=True)
    texts = texts_of(files)
    results: dict = {
        "machine": host.to_dict(),
        "corpus_mb": args.corpus_mb,
        "documents": len(texts),
        "block": args.block,
    }
    floor = tokenizer_floor(texts, tokenizer)
    results["floor"] = floor
    print(f"tokenizer floor: {floor['tokens'] / floor['seconds']:,.0f} tokens/s ({floor['seconds']:.1f} s)", flush=True)
    results["floor-fast"] = fast = tokenizer_floor(texts, tokenizer, fast=True)
    del texts
    print(
        f"encode_batch_fast: {fast['seconds']:.1f} s ({floor['seconds'] / fast['seconds']:.2f}x the floor)", flush=True
    )
    for mode in ("concat", "best-fit"):
        c = packer_convert(work / "corpus", tokenizer, work / f"packer-{mode}", args.block, mode)
        results[f"packer-{mode}"] = c
        print(
            f"packer {mode}: {c['tokens'] / c['seconds']:,.0f} tokens/s ({c['seconds']:.1f} s, "
            f"{floor['seconds'] / c['seconds']:.2f}x the floor), {c['bytes'] / c['tokens']:.4f} bytes a token, "
            f"padding {c['padding'] / (c['blocks'] * (args.block + 1)):.2%}",
            flush=True,
        )
    if args.resume_check:
        fresh = results["packer-concat"]["seconds"]
        r = resume_check(work / "corpus", tokenizer, work / "packer-resumed", args.block, fresh)
        same = (
            json.loads((work / "packer-resumed" / "manifest.json").read_text())["shards"]
            == json.loads((work / "packer-concat" / "manifest.json").read_text())["shards"]
        )
        results["resume"] = {**r, "fresh": fresh, "same_shards": same}
        if r["resumed"] is None:
            print(f"--resume: the output was published before SIGINT ({r['stopped_after']:.1f} s); same shards: {same}")
        else:
            print(
                f"--resume: stopped by SIGINT after {r['stopped_after']:.1f} s (exit {r['exit']}), resumed in "
                f"{r['resumed']:.1f} s against {fresh:.1f} s fresh ({r['resumed'] / fresh:.2f}); same shards: "
                f"{same}",
                flush=True,
            )
    lit = litdata_convert(files, tokenizer, work / "litdata", args.block, args.workers)
    results["litdata"] = lit
    if lit is not None:
        print(
            f"litdata optimize: {lit['seconds']:.1f} s, {lit['bytes'] / floor['tokens']:.4f} bytes a token", flush=True
        )
    out = work / "packer-concat"
    reads = {
        "packer 0 workers": packer_reads(out, args.batch, 0, args.seconds),
        f"packer {args.workers} workers": packer_reads(out, args.batch, args.workers, args.seconds),
        "np.memmap gather, 1 process": memmap_gather(out, args.block, args.batch, args.seconds),
    }
    if lit is not None:
        reads[f"litdata {args.workers} workers"] = litdata_reads(
            work / "litdata", args.block, args.batch, args.workers, args.seconds
        )
    if args.stream:
        packer_convert(work / "corpus", tokenizer, work / "packer-wds", args.block, "concat", "wds")
        reads.update(stream_reads(work / "packer-wds", args.batch, args.seconds))
    results["reads"] = reads
    for name, rate in reads.items():
        print(f"reads, {name}: {rate:,.0f} tokens/s", flush=True)
    print(markdown(results, args))
    (work / "tokens.json").write_text(json.dumps(results, indent=2))
    return results


def markdown(r: dict, args: argparse.Namespace) -> str:
    floor = r["floor"]
    lines = [
        "| conversion | seconds | tokens/s | / tokenizer floor | bytes a token |",
        "|---|---:|---:|---:|---:|",
        f"| tokenizers encode_batch (floor) | {floor['seconds']:.1f} "
        f"| {floor['tokens'] / floor['seconds']:,.0f} | 1.00x | |",
    ]
    fast = r["floor-fast"]
    lines.append(
        f"| tokenizers encode_batch_fast (no offsets: packer's call, the ceiling) | {fast['seconds']:.1f} "
        f"| {fast['tokens'] / fast['seconds']:,.0f} | {floor['seconds'] / fast['seconds']:.2f}x | |"
    )
    for mode in ("concat", "best-fit"):
        c = r[f"packer-{mode}"]
        lines.append(
            f"| packer --pack {r['block']} --pack-mode {mode} | {c['seconds']:.1f} | {c['tokens'] / c['seconds']:,.0f} "
            f"| {floor['seconds'] / c['seconds']:.2f}x | {c['bytes'] / c['tokens']:.4f} |"
        )
    if r["litdata"] is not None:
        lit = r["litdata"]
        lines.append(
            f"| LitData optimize(TokensLoader), {args.workers} workers | {lit['seconds']:.1f} "
            f"| {floor['tokens'] / lit['seconds']:,.0f} | {floor['seconds'] / lit['seconds']:.2f}x "
            f"| {lit['bytes'] / floor['tokens']:.4f} |"
        )
    lines += ["", f"| reads, blocks of {r['block']} + 1, batches of {args.batch}, shuffled | tokens/s |", "|---|---:|"]
    lines += [f"| {name} | {rate:,.0f} |" for name, rate in r["reads"].items()]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-mb", type=int, default=200)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--block", type=int, default=2048)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--seconds", type=float, default=10.0, help="each read rate is measured this long")
    p.add_argument("--work", type=Path, default=Path("/tmp/packer-tokens"))
    p.add_argument("--stream", action="store_true", help="also a wds output, read locally and streamed over HTTP")
    p.add_argument(
        "--resume-check", action="store_true", help="also a concat conversion stopped at 70%% of its time, then resumed"
    )
    return p


if __name__ == "__main__":
    run(parser().parse_args())
