"""Reader of WebDataset tar outputs: an iterable dataset that streams shards sequentially.

Shards are split across DataLoader workers (worker ``w`` of ``n`` reads shards ``w, w+n, ...``);
with ``shuffle=N`` the shard order changes each epoch and samples pass through an N-sample shuffle
buffer. Tar members are read in memory only; a member with an absolute path or ``..`` is refused.
"""

from __future__ import annotations

import os
import random
import warnings
from typing import Iterator, Optional

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from packer.codecs import decode_image
from packer.errors import ManifestError
from packer.layout import TAR_SUFFIX
from packer.tario import decode_tar_sample, iter_tar_samples
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
        self._passes = 0  # iterations since set_epoch: persistent workers never see set_epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of epoch ``epoch`` (same seed and epoch give the same order).

        Each further iteration without a call moves to the next epoch's order, so that
        ``persistent_workers=True`` (whose worker copies never see this call) still reshuffles.
        """
        self.epoch = int(epoch)
        self._passes = 0

    def shard_order(self, epoch: Optional[int] = None) -> list[int]:
        """All shard numbers in an epoch's order (shuffled when ``shuffle`` is on)."""
        order = list(range(len(self.manifest.shards)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + (self.epoch if epoch is None else epoch)).shuffle(order)
        return order

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.epoch + self._passes
        self._passes += 1
        shards = self.shard_order(epoch)
        if workers > len(shards) and worker == 0:
            warnings.warn(
                f"{len(shards)} shard(s) for {workers} DataLoader workers: some workers stay idle; "
                "convert with a smaller --shard-size for more shards", stacklevel=2,
            )
        samples = (s for shard in shards[worker::workers] for s in self.iter_shard(shard))
        if self.shuffle:
            rng = random.Random((self.seed * 1_000_003 + epoch) * 4099 + worker)
            samples = shuffle_buffer(samples, self.shuffle, rng)
        for index, array, label, key in samples:
            meta = {"index": index, "key": key, "label": label} if self.return_meta else None
            yield build_sample(self.convert(array), label, self.transform, meta)

    def iter_shard(self, shard: int) -> Iterator[tuple[int, np.ndarray, int, str]]:
        """``(index, image array, label, key)`` of each sample of one shard, in stored order."""
        entry = self.manifest.shards[shard]
        path = self.path(entry.file(TAR_SUFFIX))
        local = 0
        codec, mode = self.manifest.image_codec, self.manifest.preprocess["mode"]
        for fields in iter_tar_samples(path):
            array, label, meta = decode_tar_sample(fields, str(path), codec)
            if codec != "raw":
                try:
                    array = decode_image(array, codec, mode)
                except Exception as e:  # noqa: BLE001 - Pillow reports bad data with many types
                    raise ManifestError(f"{path}: sample {fields['__key__']} is damaged ({type(e).__name__}: {e}); "
                                        f"run packer verify {self.root}") from None
            yield self._offsets[shard] + local, array, label, meta.get("key", fields["__key__"])
            local += 1
        if local != entry.samples:
            raise ManifestError(f"{path} holds {local} samples but the manifest says {entry.samples}; it is damaged")


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
