"""Reader of WebDataset tar outputs: an iterable dataset that streams shards sequentially.

Shards are split across DataLoader workers (worker ``w`` of ``n`` reads shards ``w, w+n, ...``);
with ``shuffle=N`` the shard order changes each epoch and samples pass through an N-sample shuffle
buffer. Tar members are read in memory only; a member with an absolute path or ``..`` is refused.
The root may be a URL: shards then stream from it (``readers.remote.urls``).
"""

from __future__ import annotations

import io
import os
import random
import warnings
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packer.pixels.source_codec import decode_stored
from packer.spec.codecs import NpyDecoder
from packer.spec.errors import ManifestError
from packer.spec.manifest import ShardEntry
from packer.spec.shard_names import NPY_IMAGE_SHAPES, TAR_SUFFIX, wds_lengths_suffix
from packer.spec.tario import decode_tar_sample, iter_shard_samples, tar_fields
from readers.augment.crops import Placement
from readers.datasets.base import ReaderBase
from readers.datasets.samples import decode_field
from readers.loading.collate import PackedBatch
from readers.loading.tar_batches import TarBatches, shuffle_buffer, warn_few_shards
from readers.remote.urls import file_url, is_url, iter_remote_tar, read_remote_file

PASS_SLOTS = 64
"""DataLoader workers whose passes a tar-shard reader counts in shared memory (see ``set_epoch``)."""


class WdsDataset(ReaderBase, IterableDataset):
    """Iterable dataset over a wds output.

    Yields ``(image, label)`` (``(image, label, meta)`` with ``return_meta=True``) as the map-style
    readers do; ``meta["index"]`` is the sample's position in the output, the index the map-style
    readers use. ``len()`` is the number of samples in the output. ``shuffle=N`` shuffles the shard
    order and passes samples through an N-sample buffer; call ``set_epoch(e)`` before each epoch.
    ``root`` may be a URL (``readers.remote.urls``): shards then stream from it, each checked against the
    manifest's SHA-256; ``cache_dir`` keeps verified copies for later passes.
    """

    format_name = "wds"
    reads_urls = True

    def __init__(
        self, root: str | os.PathLike, *, shuffle: int = 0, cache_dir: Optional[str | os.PathLike] = None, **options
    ) -> None:
        super().__init__(root, **options)
        self.cache_dir = cache_dir  # for URL roots: where streamed shards are kept (readers.remote.urls)
        self.shuffle = int(shuffle)
        self.epoch = 0
        # [the epoch set_epoch chose, then the passes each DataLoader worker (by id) began since], in
        # shared memory: workers, persistent or made anew each epoch, see set_epoch and count their passes
        self._epochs = torch.zeros(1 + PASS_SLOTS, dtype=torch.int64).share_memory_()
        self._local_passes = -1  # a worker beyond PASS_SLOTS counts its own
        self.batches: Optional[TarBatches] = None
        """The whole batches this reader makes (``batch_by``), or None: it yields samples."""
        self._npy = NpyDecoder()  # the images of an output share one npy header: parsed once

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle, crops and flips of epoch ``epoch`` (same seed and epoch give the same
        order), in this process and in the DataLoader workers reading this dataset.

        Each further pass without a call moves to the next epoch: every worker counts its passes
        (up to PASS_SLOTS workers; beyond, each copy counts its own).
        """
        self.epoch = int(epoch)
        self._epochs[0] = self.epoch
        self._epochs[1:] = 0
        self._local_passes = -1

    def _pass_epoch(self, worker: int) -> int:
        """The epoch of the pass worker ``worker`` (0 without workers) begins now: set_epoch's, plus
        the passes it began since."""
        if worker >= PASS_SLOTS:
            self._local_passes += 1
            return int(self._epochs[0]) + self._local_passes
        done = int(self._epochs[1 + worker])
        self._epochs[1 + worker] = done + 1
        return int(self._epochs[0]) + done

    def shard_order(self, epoch: Optional[int] = None) -> list[int]:
        """All shard numbers in an epoch's order (shuffled when ``shuffle`` is on)."""
        order = list(range(len(self.manifest.shards)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + (self.epoch if epoch is None else epoch)).shuffle(order)
        return order

    def __len__(self) -> int:
        """Samples in the output; with ``batch_by``, this rank's batches per epoch."""
        return self.batches.count(self._shard_samples()) if self.batches is not None else self.manifest.samples

    def __iter__(self) -> Iterator:
        if self.batches is not None:
            yield from self._iter_batches(self.batches)
            return
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self._pass_epoch(worker)
        shards = self.shard_order(epoch)
        if workers > len(shards) and worker == 0:
            warnings.warn(
                f"{len(shards)} shard(s) for {workers} DataLoader workers: some workers stay idle; "
                "convert with a smaller --shard-size for more shards",
                stacklevel=2,
            )
        samples = (s for shard in shards[worker::workers] for s in self.iter_shard(shard, epoch))
        if self.shuffle:
            rng = random.Random((self.seed * 1_000_003 + epoch) * 4099 + worker)
            samples = shuffle_buffer(samples, self.shuffle, rng)
        for sample in samples:
            yield self._sample(*sample)

    def _sample(
        self,
        index: int,
        array: Optional[np.ndarray],
        label: int,
        key: str,
        texts: tuple,
        placement: Optional[Placement] = None,
    ):
        """The tuple yielded for one decoded sample (see ``ReaderBase.sample_of``)."""
        image = (self.convert(array),) if array is not None else ()
        return self.sample_of(index, key, label, image + texts, placement)

    def iter_shard(self, shard: int, epoch: int = 0) -> Iterator[tuple]:
        """``(index, image array or None, label, key, text field values, Placement or None)`` of each
        sample of one shard, in stored order, cropped and flipped for ``epoch``."""
        for index, fields, path in self.iter_shard_raw(shard):
            yield (index, *self.decode(fields, path, index, epoch))

    def lengths(self, field: Optional[str] = None) -> np.ndarray:
        """Every sample's length of a text field in stored order, int64 (see ``PackedDataset.lengths``),
        read from the shards' ``.lengths.npy`` side files, not from the tars."""
        f = self.info.length_field(field)
        parts = [
            np.load(self._side_file(s, wds_lengths_suffix(f.name)), allow_pickle=False) for s in self.manifest.shards
        ]
        self.files.check_unchanged()  # after the reads: the side files read were the opened output's
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @property
    def image_sizes(self) -> np.ndarray:
        """``(N, 2)`` int64 (height, width) of every image in stored order, from the shards' side files
        alone (see ``PackedDataset.image_sizes``)."""
        if not self.layout.has_image:
            raise ValueError(f"{self.root} stores no images")
        if self.layout.shape is not None:
            return np.tile(np.array(self.layout.shape[:2], np.int64), (len(self), 1))
        parts = []
        for entry in self.manifest.shards:
            if not any(f.path.endswith(NPY_IMAGE_SHAPES) for f in entry.files):
                raise ValueError(
                    f"{self.root}: shard {entry.name} has no index of its images' sizes (written by "
                    f"packer {self.manifest.packer_version}); convert it again with this packer"
                )
            parts.append(np.load(self._side_file(entry, NPY_IMAGE_SHAPES), allow_pickle=False)[:, :2])
        self.files.check_unchanged()
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, 2), np.int64)

    def iter_shard_raw(self, shard: int) -> Iterator[tuple[int, dict, str]]:
        """``(index, tar fields, shard path)`` of each sample of one shard, not decoded (cheap to skip)."""
        entry = self.manifest.shards[shard]
        relpath = entry.file(TAR_SUFFIX)
        if is_url(self.root):
            path = file_url(self.root, relpath)
            samples = iter_remote_tar(self.root, next(f for f in entry.files if f.path == relpath), self.cache_dir)
        else:
            path = self.files.path(relpath)
            samples = self._local_tar(path)
        local = 0
        for fields in samples:
            yield self._offsets[shard] + local, fields, str(path)
            local += 1
        if local != entry.samples:
            raise ManifestError(f"{path} holds {local} samples but the manifest says {entry.samples}; it is damaged")

    def _local_tar(self, path: Path) -> Iterator[dict]:
        """The samples of a local tar shard; the output is checked to be the one this dataset
        opened once the file is open (before its first sample is used), so no sample of a newer
        output written in its place is ever passed on. Each sample is passed on once the next one has
        begun (or the tar ended cleanly): the sample in progress where a damaged tar breaks may lack
        members, and is never passed on."""
        checked = False
        pending = None
        for fields in iter_shard_samples(path):  # headers walked here, not by tarfile (see packer.spec.tario)
            if not checked:
                self.files.check_unchanged()
                checked = True
            if pending is not None:
                yield pending
            pending = fields
        if pending is not None:
            yield pending

    def _side_file(self, shard: ShardEntry, suffix: str):
        """A small file of a shard, to read: local (size checked), or fetched whole from the URL root
        and checked against the manifest's SHA-256."""
        relpath = shard.file(suffix)
        if not is_url(self.root):
            return self.files.path(relpath)
        return io.BytesIO(read_remote_file(self.root, next(f for f in shard.files if f.path == relpath)))

    def decode(self, fields: dict, path: str, index: int = 0, epoch: int = 0) -> tuple:
        """``(image array or None, label, key, text field values, Placement or None)`` of one sample's
        tar fields; the image cropped and flipped for sample ``index`` in ``epoch`` (``crop=``, ``flip=``)."""
        codec = self.layout.codec.name
        array, label, meta = decode_tar_sample(fields, path, codec if self.layout.has_image else None, self._npy)
        stored = tar_fields(fields, self.text_fields, path)
        texts = tuple(decode_field(f, stored[f.name]) for f in self.text_fields)
        placement = None
        if array is not None and (codec != "raw" or self.crops is not None):
            try:
                if self.crops is None:
                    array = decode_stored(array, codec, self.layout.mode)
                else:
                    array, placement = self.crops.image(array, self.seed, index, epoch)
            except Exception as e:  # noqa: BLE001 - Pillow reports bad data with many types
                raise ManifestError(
                    f"{path}: sample {fields['__key__']} is damaged ({type(e).__name__}: {e}); "
                    f"run packer verify {self.root}"
                ) from None
        if self.has_target and placement is not None:  # the boxes or mask follow the pixels
            texts = (self.crops.target(texts[0], placement), *texts[1:])  # type: ignore[union-attr]
        return array, label, meta.get("key", fields["__key__"]), texts, placement

    # Whole batches, for make_loader ---------------------------------------------------------------
    def configure_batches(
        self,
        batch_size: int,
        *,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        workers: int = 0,
        control: Optional[torch.Tensor] = None,
    ) -> None:
        """Yield whole batches (``PackedBatch``) instead of samples, an equal number on every rank, through
        this reader's shuffle buffer: ``batch_by`` a ``TarBatches`` of these (its policy is there)."""
        batches = TarBatches(batch_size, drop_last, rank, world_size, workers, self.shuffle)
        if control is not None:
            batches.control = control
        self.batch_by(batches)

    def batch_by(self, batches: TarBatches) -> None:
        """Yield the whole batches ``batches`` plans (``PackedBatch``) instead of samples; ``len()`` is then
        this rank's batches per epoch. ``make_loader`` makes the plan and keeps it to start each pass."""
        self.batches = batches
        warn_few_shards(len(self.manifest.shards), batches.world, batches.workers)

    def batch_plan(self, workers: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """For this rank: each worker's shards, each worker's batch sizes in order, and which worker
        makes each batch (``TarBatches.plan``)."""
        return self.batches.plan(self._shard_samples(), workers)  # type: ignore[union-attr]

    def _shard_samples(self) -> list[int]:
        return [s.samples for s in self.manifest.shards]

    def _iter_batches(self, b: TarBatches) -> Iterator:
        yield from b.iterate(self._shard_samples(), self.seed, self.iter_shard_raw, self._make_batch)

    def _make_batch(self, items: list, epoch: int) -> PackedBatch:
        n = len(items)
        labels = np.empty(n, dtype=np.int64)
        decoded = [(index, *self.decode(fields, path, index, epoch)) for index, fields, path in items]
        if not self.fixed_images or self.one_by_one:  # one by one (transforms, meta), then collated
            return [self._sample(*d) for d in decoded]  # type: ignore[return-value]
        slot, images = self.batch_tensor(n)
        slots = images.numpy()  # indexed per image: a numpy view is far cheaper to make than a tensor's
        hwc = slots.transpose(0, 2, 3, 1) if self.convert.normalize is None else None
        for j, (_, array, label, _, _, _) in enumerate(decoded):
            if hwc is not None and array.dtype == hwc.dtype:
                hwc[j] = array
            else:
                self.convert.into(array, slots[j])
            labels[j] = label
        return PackedBatch(images, torch.from_numpy(labels), slot)
