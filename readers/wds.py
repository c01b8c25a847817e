"""Reader of WebDataset tar outputs: an iterable dataset that streams shards sequentially.

Shards are split across DataLoader workers (worker ``w`` of ``n`` reads shards ``w, w+n, ...``);
with ``shuffle=N`` the shard order changes each epoch and samples pass through an N-sample shuffle
buffer. Tar members are read in memory only; a member with an absolute path or ``..`` is refused.
"""

from __future__ import annotations

import os
import random
import tarfile
import warnings
from pathlib import Path, PurePosixPath
from typing import Iterator

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.codecs import CODECS
from packer.errors import ManifestError
from readers.base import ReaderBase, build_sample


class WdsDataset(ReaderBase, IterableDataset):
    """Iterable dataset over a wds output.

    Yields ``(image, label)`` (``(image, label, meta)`` with ``return_meta=True``) as the map-style
    readers do; ``meta["index"]`` is the sample's position in the output, the index the map-style
    readers use. ``len()`` is the number of samples in the output. ``shuffle=N`` shuffles the shard
    order and passes samples through an N-sample buffer; call ``set_epoch(e)`` before each epoch.
    """

    format_name = "wds"

    def __init__(self, root: str | os.PathLike, *, shuffle: int = 0, seed: int = 0, **options) -> None:
        super().__init__(root, **options)
        self.shuffle = int(shuffle)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of epoch ``epoch`` (same seed and epoch give the same order)."""
        self.epoch = int(epoch)

    def shard_order(self) -> list[int]:
        """All shard numbers in this epoch's order (shuffled when ``shuffle`` is on)."""
        order = list(range(len(self.manifest.shards)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        shards = self.shard_order()
        if workers > len(shards) and worker == 0:
            warnings.warn(
                f"{len(shards)} shard(s) for {workers} DataLoader workers: some workers stay idle; "
                "convert with a smaller --shard-size for more shards", stacklevel=2,
            )
        samples = (s for shard in shards[worker::workers] for s in self.iter_shard(shard))
        if self.shuffle:
            rng = random.Random((self.seed * 1_000_003 + self.epoch) * 4099 + worker)
            samples = shuffle_buffer(samples, self.shuffle, rng)
        for index, array, label, key in samples:
            meta = {"index": index, "key": key, "label": label} if self.return_meta else None
            yield build_sample(self.convert(array), label, self.transform, meta)

    def iter_shard(self, shard: int) -> Iterator[tuple[int, np.ndarray, int, str]]:
        """``(index, image array, label, key)`` of each sample of one shard, in stored order."""
        entry = self.manifest.shards[shard]
        path = self.root / entry.file(".tar")
        if not path.is_file():
            raise ManifestError(f"{path} is listed in the manifest but missing; the output is incomplete")
        local = 0
        for fields in iter_tar_samples(path):
            try:
                array = CODECS["npy"].decode(fields["npy"])
                label = CODECS["cls"].decode(fields["cls"])
                key = CODECS["json"].decode(fields["json"])["key"] if "json" in fields else fields["__key__"]
            except (KeyError, ValueError) as e:
                raise ManifestError(f"{path}: sample {fields.get('__key__')} is damaged ({e})") from None
            yield self._offsets[shard] + local, array, label, key
            local += 1
        if local != entry.samples:
            raise ManifestError(f"{path} holds {local} samples but the manifest says {entry.samples}; it is damaged")


def iter_tar_samples(path: Path) -> Iterator[dict]:
    """Group a tar's members into samples: ``{"__key__": KEY, EXT: bytes, ...}``, in stored order."""
    current: dict = {}
    try:
        with tarfile.open(path, mode="r|") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                name = PurePosixPath(info.name)
                if name.is_absolute() or ".." in name.parts:
                    raise ManifestError(f"{path}: member {info.name!r} has an unsafe path; refusing to read it")
                key, _, ext = info.name.partition(".") if "/" not in info.name else _split_nested(info.name)
                if current and key != current["__key__"]:
                    yield current
                    current = {}
                current["__key__"] = key
                current[ext] = tar.extractfile(info).read()  # type: ignore[union-attr]
    except tarfile.TarError as e:
        raise ManifestError(f"{path} is not a readable tar file ({e}); the shard is damaged") from None
    if current:
        yield current


def _split_nested(name: str) -> tuple[str, str, str]:
    folder, _, base = name.rpartition("/")
    key, dot, ext = base.partition(".")
    return f"{folder}/{key}", dot, ext


def shuffle_buffer(items: Iterator, size: int, rng: random.Random) -> Iterator:
    """Yield ``items`` in a random order drawn through a buffer of ``size`` items."""
    buf: list = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        buf[j], item = item, buf[j]
        yield item
    rng.shuffle(buf)
    yield from buf
