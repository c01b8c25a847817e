"""The peer tools' side of scripts/bench.py: packer's task through WebDataset, LitData and MosaicML Streaming.

Each peer converts a list of (image file, label) with its own writer, storing the raw uint8 HWC pixels that
bench.py's ``load`` gives (Pillow's full decode, then the resize: the bare decode + resize floor, what these
tools' users write) and the label, then reads them back with its
own dataset and loader, shuffled, in batches, each sample turned into a CHW tensor the way that tool's users write
it: float32 ``(x / 255 - mean) / std`` (ImageNet) or left uint8. Peers are optional: ``pip install -e .[bench]``.

A peer's ``out`` folder holds ``data/`` (its output, whose size is reported), ``cache/`` (every cache it makes)
and ``labels.npy`` (the labels written, to check that each epoch sees every sample exactly once).
"""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.metadata
import io
import math
import os
import shutil
import sys
import tempfile
import time
import types
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from packer.config import IMAGENET_MEAN, IMAGENET_STD

PEERS: tuple[str, ...] = ("webdataset", "litdata", "streaming")
_DIST = {"webdataset": "webdataset", "litdata": "litdata", "streaming": "mosaicml-streaming"}
_MEAN = torch.tensor(IMAGENET_MEAN, dtype=torch.float32).view(3, 1, 1)
_STD = torch.tensor(IMAGENET_STD, dtype=torch.float32).view(3, 1, 1)
_MAX_SHARD = 1000  # samples per shard/chunk: ~150 MB of 224x224x3 pixels, what these tools' docs suggest
_MIN_SHARDS = 16  # small sets still get enough shards for every reader worker (WebDataset splits by shard)

# Local files only: nothing these libraries import (huggingface_hub, transformers via streaming) may go online.
for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "LITDATA_DISABLE_VERSION_CHECK": "1",
    "DO_NOT_TRACK": "1",
}.items():
    os.environ.setdefault(_k, _v)


def _cache_env(out: Path) -> None:
    """Point the caches these libraries make (read when used, or at import) under ``out/cache``."""
    for key, sub in {
        "LITDATA_CACHE_DIR": "litdata",
        "DATA_OPTIMIZER_CACHE_FOLDER": "litdata-optimize/chunks",
        "DATA_OPTIMIZER_DATA_CACHE_FOLDER": "litdata-optimize/data",
        "HF_HOME": "hf",
        "MPLCONFIGDIR": "matplotlib",
    }.items():
        os.environ[key] = str(out / "cache" / sub)


def _stub_torchvision() -> None:
    """Let ``import streaming`` work where torchvision cannot be imported.

    streaming imports ``streaming.vision`` (torchvision's VisionDataset, to_tensor) at package import although
    MDSWriter and StreamingDataset never use it, and PyPI's torchvision is a CUDA build that fails to load next to
    a CPU-only torch ("operator torchvision::nms does not exist"). Only called when the real import fails.
    """
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # leftovers of the failed import
    attrs = {
        "torchvision": {},
        "torchvision.datasets": {"VisionDataset": torch.utils.data.Dataset},
        "torchvision.transforms": {},
        "torchvision.transforms.functional": {"to_tensor": None},
    }
    for name, extra in attrs.items():
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(extra)
        sys.modules[name] = mod


def _import(peer: str) -> types.ModuleType:
    """The peer's module; ImportError (or the library's own error) when it cannot be used here."""
    if peer == "webdataset":
        import webdataset

        return webdataset
    if peer == "litdata":
        import litdata

        return litdata
    if peer == "streaming":
        if "streaming" not in sys.modules:
            try:
                import torchvision  # noqa: F401
            except Exception:
                _stub_torchvision()
        import streaming

        return streaming
    raise ValueError(f"unknown peer {peer!r}; one of {PEERS}")


def available_peers() -> dict[str, str | None]:
    """Each peer's installed version, or None when it is not installed or cannot be imported."""
    found: dict[str, str | None] = {}
    for peer in PEERS:
        try:
            _import(peer)
            found[peer] = importlib.metadata.version(_DIST[peer])
        except Exception:
            found[peer] = None
    return found


def _shard_samples(n: int) -> int:
    return max(1, min(_MAX_SHARD, math.ceil(n / _MIN_SHARDS)))


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _fresh(out: Path) -> Path:
    """Empty ``out/data`` and ``out/cache``; returns the data folder."""
    for sub in ("data", "cache"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "data").mkdir(parents=True)
    _cache_env(out)
    return out / "data"


# Module-level so that they pickle into Pool and optimize() workers.
def _load_pair(load: Callable[[str], np.ndarray], item: tuple[str, int]) -> tuple[np.ndarray, int]:
    return load(item[0]), int(item[1])


def _load_npy(load: Callable[[str], np.ndarray], item: tuple[str, int]) -> tuple[bytes, int]:
    buf = io.BytesIO()
    np.save(buf, load(item[0]), allow_pickle=False)
    return buf.getvalue(), int(item[1])


def _load_dict(load: Callable[[str], np.ndarray], item: tuple[str, int]) -> dict[str, Any]:
    return {"image": load(item[0]), "label": int(item[1])}


def _pooled(fn: Callable, items: list[tuple[str, int]], workers: int) -> Iterable:
    """``fn`` over ``items`` in order, in ``workers`` processes (in this one for ``workers`` < 1)."""
    if workers < 1:
        yield from map(fn, items)
        return
    with get_context("fork").Pool(workers) as pool:
        yield from pool.imap(fn, items, chunksize=8)


def peer_convert(
    peer: str, items: list[tuple[str, int]], out: Path, workers: int, load: Callable[[str], np.ndarray]
) -> dict:
    """Convert with the peer's own writer using ``workers`` processes.

    LitData: ``optimize(num_workers=workers)``, its own parallel writer. WebDataset ``ShardWriter`` and Streaming
    ``MDSWriter`` write from one process: as their users do, a Pool of ``workers`` processes decodes (WebDataset's
    also encodes the npy bytes) and feeds the single writer in this process.
    Returns {"seconds": float, "images": int, "bytes": int (output size on disk)}.
    """
    mod = _import(peer)
    data = _fresh(out)
    per_shard = _shard_samples(len(items))
    start = time.perf_counter()
    if peer == "webdataset":
        with mod.ShardWriter(str(data / "shard-%06d.tar"), maxcount=per_shard, maxsize=1 << 40, verbose=0) as sink:
            for i, (npy, label) in enumerate(_pooled(partial(_load_npy, load), items, workers)):
                sink.write({"__key__": f"{i:09d}", "npy": npy, "cls": label})
    elif peer == "litdata":
        mod.optimize(
            fn=partial(_load_dict, load),
            inputs=list(items),
            output_dir=str(data),
            num_workers=workers,
            chunk_size=per_shard,
            start_method="fork",
            verbose=False,
        )
    elif peer == "streaming":
        with _MDSWriterLazy(mod, data, per_shard) as sink:
            for image, label in _pooled(partial(_load_pair, load), items, workers):
                sink.write({"image": image, "label": label})
    seconds = time.perf_counter() - start
    np.save(out / "labels.npy", np.array([label for _, label in items], dtype=np.int64))
    return {"seconds": seconds, "images": len(items), "bytes": _du(data)}


class _MDSWriterLazy:
    """An MDSWriter for raw uint8 arrays + int labels, its size_limit set from the first image (per_shard samples).

    MDS's fixed-shape ``ndarray:uint8:H,W,C`` encoding needs the shape up front, so the writer opens on first write.
    """

    def __init__(self, mod: types.ModuleType, data: Path, per_shard: int) -> None:
        self.mod, self.data, self.per_shard, self.writer = mod, data, per_shard, None

    def __enter__(self) -> _MDSWriterLazy:
        return self

    def write(self, sample: dict[str, Any]) -> None:
        if self.writer is None:
            image = sample["image"]
            shape = ",".join(map(str, image.shape))
            self.writer = self.mod.MDSWriter(
                out=str(self.data),
                columns={"image": f"ndarray:uint8:{shape}", "label": "int"},
                compression=None,
                size_limit=self.per_shard * (image.nbytes + 64),
            )
        self.writer.write(sample)

    def __exit__(self, *exc: object) -> None:
        if self.writer is not None:
            self.writer.finish()


def _to_tensor(image: np.ndarray, dtype: str) -> torch.Tensor:
    """HWC uint8 -> CHW: float32 ``(x / 255 - mean) / std``, or uint8 as stored (a fresh, writable copy)."""
    chw = torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
    return chw.float().div_(255).sub_(_MEAN).div_(_STD) if dtype == "float32" else chw


def _wds_sample(dtype: str, sample: tuple[np.ndarray, int]) -> tuple[torch.Tensor, int]:
    return _to_tensor(sample[0], dtype), sample[1]


def _litdata_sample(dtype: str, item: dict[str, Any]) -> tuple[torch.Tensor, int]:
    return _to_tensor(item["image"], dtype), item["label"]


_MDS_CLASS: type | None = None


def _mds_dataset(mod: types.ModuleType) -> type:
    """streaming's documented pattern: subclass StreamingDataset, transform in ``__getitem__``."""
    global _MDS_CLASS
    if _MDS_CLASS is None:

        class MDSImages(mod.StreamingDataset):
            def __init__(self, *, dtype: str, **kw: Any) -> None:
                super().__init__(**kw)
                self.dtype = dtype

            def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
                sample = super().__getitem__(idx)
                return _to_tensor(sample["image"], self.dtype), sample["label"]

        _MDS_CLASS = MDSImages
    return _MDS_CLASS


def _loader(peer: str, mod: types.ModuleType, out: Path, batch_size: int, workers: int, dtype: str) -> Iterable:
    data = out / "data"
    if peer == "webdataset":
        urls = sorted(str(p) for p in data.glob("*.tar"))
        ds = (
            mod.WebDataset(urls, shardshuffle=len(urls), nodesplitter=mod.single_node_only)
            .shuffle(1000)
            .decode()
            .to_tuple("npy", "cls")
            .map(partial(_wds_sample, dtype))
            .batched(batch_size, partial=True)
        )
        return mod.WebLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    if peer == "litdata":
        ds = mod.StreamingDataset(
            str(data),
            cache_dir=str(out / "cache" / "litdata"),
            shuffle=True,
            drop_last=False,
            transform=partial(_litdata_sample, dtype),
        )
        return mod.StreamingDataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    # streaming puts its shared-memory file locks in tempfile.gettempdir(), read while the dataset is made.
    locks = out / "cache" / "streaming-locks"
    locks.mkdir(parents=True, exist_ok=True)
    saved, tempfile.tempdir = tempfile.tempdir, str(locks)
    try:
        ds = _mds_dataset(mod)(local=str(data), shuffle=True, batch_size=batch_size, dtype=dtype)
    finally:
        tempfile.tempdir = saved
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)


def peer_read(
    peer: str, out: Path, *, batch_size: int = 64, workers: int = 2, dtype: str = "float32", epochs: int = 1
) -> dict:
    """Iterate the converted output with the peer's own dataset and loader, shuffled, ``epochs`` times.

    Timed from the dataset's creation to the last batch, worker start included. Raises RuntimeError unless each
    epoch gives every written sample exactly once (the count and the multiset of labels are checked).
    Returns {"samples": int, "seconds": float, "batches": int}.
    """
    if dtype not in ("float32", "uint8"):
        raise ValueError(f"dtype must be float32 or uint8, not {dtype!r}")
    mod = _import(peer)
    _cache_env(out)
    expected = np.bincount(np.load(out / "labels.npy"))
    samples = batches = 0
    images = None
    start = time.perf_counter()
    loader = _loader(peer, mod, out, batch_size, workers, dtype)
    try:
        for epoch in range(epochs):
            seen = np.zeros_like(expected)
            for images, labels in loader:
                labels = torch.as_tensor(labels).numpy()
                seen += np.bincount(labels, minlength=len(expected))[: len(expected)]
                samples += len(labels)
                batches += 1
            if not np.array_equal(seen, expected):
                raise RuntimeError(
                    f"{peer}: epoch {epoch} gave {int(seen.sum())} samples (labels {seen.tolist()}), "
                    f"not the {int(expected.sum())} written (labels {expected.tolist()})"
                )
        seconds = time.perf_counter() - start
    finally:
        del loader
        gc.collect()  # streaming: frees its shared memory, so the next dataset may use the same local folder
    if images is not None and images.dtype != (torch.float32 if dtype == "float32" else torch.uint8):
        raise RuntimeError(f"{peer}: batches of {images.dtype}, not {dtype}")
    return {"samples": samples, "seconds": seconds, "batches": batches}
