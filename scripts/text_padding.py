"""How much padding length bucketing saves on real text, through a real conversion.

The corpus is the docstrings of Python's standard library (real English of naturally varied length,
on every machine that runs this, nothing downloaded): one ``.txt`` file per docstring, one class
folder per top-level module. A WordPiece tokenizer is trained on it with ``tokenizers``, the folder
is converted with ``packer convert --tokenizer`` (``--max-length`` 512), and the token batches of
``make_loader`` are compared with random batching and with ``bucket_by_length=True``: padding share
(padded slots / all slots), tokens per batch and samples/s over one epoch.

    python scripts/text_padding.py [--work /tmp/packer-text] [--batch-size 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

MODULES = (
    "collections",
    "json",
    "pathlib",
    "argparse",
    "email",
    "http",
    "logging",
    "unittest",
    "asyncio",
    "xml",
    "urllib",
    "typing",
    "dataclasses",
    "inspect",
    "tarfile",
    "zipfile",
    "csv",
    "decimal",
    "fractions",
    "statistics",
    "difflib",
    "textwrap",
    "string",
    "re",
    "datetime",
    "calendar",
    "shutil",
    "tempfile",
    "subprocess",
    "threading",
    "multiprocessing",
    "concurrent",
    "socket",
    "ssl",
    "sqlite3",
)


def docstrings(module_name: str) -> list[str]:
    """Every distinct docstring of a module and its submodules, classes and functions."""
    found: dict[str, None] = {}
    names = [module_name]
    root = importlib.import_module(module_name)
    if hasattr(root, "__path__"):
        names += [
            m.name
            for m in pkgutil.walk_packages(root.__path__, module_name + ".")
            if "test" not in m.name and "__main__" not in m.name
        ]
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - optional submodules that cannot import here are simply not in the corpus
            continue
        objects = [module] + [v for _, v in inspect.getmembers(module) if inspect.isclass(v) or inspect.isfunction(v)]
        for obj in objects:
            for member in [obj] + (
                [v for _, v in vars(obj).items() if inspect.isfunction(v)] if inspect.isclass(obj) else []
            ):
                doc = inspect.getdoc(member)
                if doc and len(doc) > 20:
                    found[doc] = None
    return list(found)


def build_corpus(folder: Path) -> int:
    n = 0
    for module in MODULES:
        for i, doc in enumerate(docstrings(module)):
            path = folder / module / f"{i:05d}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(doc, encoding="utf-8")
            n += 1
    return n


def train_tokenizer(folder: Path, path: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=8000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    tok.train([str(p) for p in sorted(folder.rglob("*.txt"))], trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.save(str(path))


def epoch(loader) -> tuple[float, float, float, int]:
    """(padding share, mean tokens per batch, samples/s, batches) over one pass."""
    slots = tokens = samples = batches = 0
    start = time.perf_counter()
    for batch in loader:
        slots += batch["input_ids"].numel()
        tokens += int(batch["lengths"].sum())
        samples += len(batch["lengths"])
        batches += 1
    seconds = time.perf_counter() - start
    return 1 - tokens / slots, slots / batches, samples / seconds, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/packer-text"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--format", default="npy")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from packer import ConvertConfig, convert
    from packer.spec.text import TextConfig
    from readers import EpochBatchSampler, LengthBucketSampler, make_loader, open_dataset, padding_ratio

    shutil.rmtree(args.work, ignore_errors=True)
    corpus = args.work / "docstrings"
    n = build_corpus(corpus)
    tokenizer = args.work / "tokenizer.json"
    train_tokenizer(corpus, tokenizer)
    start = time.perf_counter()
    result = convert(
        corpus,
        args.work / f"out-{args.format}",
        ConvertConfig(args.format, text=TextConfig(tokenizer=str(tokenizer), max_length=512)),
    )
    seconds = time.perf_counter() - start
    ds = open_dataset(result.output)
    lengths = ds.lengths()
    print(
        f"corpus: {n} docstrings of {len(MODULES)} stdlib modules; packed {ds.manifest.samples} samples in "
        f"{seconds:.1f} s ({ds.manifest.samples / seconds:.0f} samples/s); tokens per sample: mean "
        f"{lengths.mean():.0f}, median {np.median(lengths):.0f}, max {lengths.max()}"
    )
    b = args.batch_size
    print(
        f"padding share of index batches (batch {b}, epoch 0): random "
        f"{padding_ratio(EpochBatchSampler(len(ds), b).batches(0), lengths):.3f}, bucketed "
        f"{padding_ratio(LengthBucketSampler(lengths, b).batches(0), lengths):.3f}"
    )
    print("| batching | padding share | slots per batch | samples/s | batches |")
    print("|---|---|---|---|---|")
    for name, bucket in (("random", False), ("bucket_by_length", True)):
        loader = make_loader(ds, b, num_workers=args.workers, bucket_by_length=bucket)
        epoch(loader)  # warm-up: workers start, pages come into the cache
        pad, slots, rate, batches = epoch(loader)
        print(f"| {name} | {pad:.3f} | {slots:.0f} | {rate:.0f} | {batches} |")


if __name__ == "__main__":
    main()
