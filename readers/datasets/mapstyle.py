"""The map-style readers' base (npy, lmdb, hdf5): random access, batches read shard by shard, and a
per-process cache of open shard handles.

Handles are opened on first use in the process that uses them and dropped after a fork and when
pickled (see ``readers.datasets.base``); at most ``max_open_shards`` stay open per process.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import warnings
from typing import Any, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from packer.pixels.source_codec import decode_stored
from packer.spec.entries import TextField
from packer.spec.errors import ManifestError
from packer.spec.manifest import ShardEntry
from readers.augment.device_decode import BatchBuilder, EncodedBatch, on_device
from readers.augment.render import render
from readers.datasets import index_views
from readers.datasets.base import ReaderBase
from readers.datasets.samples import decode_field, offset_labels
from readers.datasets.shard_handles import ShardHandles
from readers.datasets.tensors import torch_dtype
from readers.loading.collate import PackedBatch
from readers.remote.ranges import fetch_all

_WARNED: list[bool] = []


def _warn_epochs() -> None:
    """Warn once per process that random crops read in DataLoader workers, without ``set_epoch``, repeat."""
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "random crops and flips are drawn for epoch 0 every epoch: call dataset.set_epoch(epoch) "
            "before each epoch (as with DistributedSampler), or read through readers.make_loader, "
            "whose batches carry their epoch",
            stacklevel=3,
        )


class PackedDataset(ReaderBase, Dataset):
    """Base of the map-style readers (npy, lmdb, hdf5): ``len``, random access, any sampler.

    ``dataset[i]`` is ``(image, label)``: image a CHW tensor (see ImageConverter), label an int
    (-1 for unlabelled data); ``(image, label, meta)`` with ``return_meta=True`` (see ReaderBase).
    At most ``max_open_shards`` shards are kept open per process (least recently used are closed),
    so datasets of thousands of shards stay within the open-file limit. ``in_memory=True`` reads
    every image once into shared memory that DataLoader workers share (see load_into_memory).
    """

    def __init__(
        self, root: str | os.PathLike, *, max_open_shards: int = 64, in_memory: bool = False, **options
    ) -> None:
        super().__init__(root, **options)
        self.handles = ShardHandles(max_open_shards)
        """This process's open shards (``readers.datasets.shard_handles``)."""
        self.memory: Optional[torch.Tensor] = None
        self._memory_view: Optional[np.ndarray] = None
        # The epoch of the crops and flips, in shared memory: DataLoader workers (persistent ones too)
        # see set_epoch. make_loader's batches carry their epoch instead (readers.loading.sampler.EpochBatch).
        # -1: never set (epoch 0, and a warning in DataLoader workers, where crops would repeat every epoch).
        self._epoch = torch.full((1,), -1, dtype=torch.int64).share_memory_() if self.crops is not None else None
        if in_memory:
            self.load_into_memory()

    def load_into_memory(self) -> None:
        """Read every stored image once into one shared-memory array (``in_memory=True``).

        DataLoader workers share it instead of copying it: forked ones inherit the mapping, spawned
        ones receive it as a shared-memory handle. Encoded images (jpeg, png) are held decoded, so
        nothing is decoded again. Needs a fixed image size.
        """
        if not self.layout.fixed_images:
            raise ValueError(
                "in_memory=True holds images of one size and nothing else: this output has text fields, "
                "detection targets, masks or images of several sizes (--resize none, shorter or max)"
            )
        memory = torch.empty((len(self), *self.layout.shape), dtype=torch_dtype(self.layout.np_dtype)).share_memory_()
        view = memory.numpy()
        for shard in range(len(self.manifest.shards)):
            with self.reading(shard):
                for local in range(self.manifest.shards[shard].samples):
                    view[self._offsets[shard] + local] = self._image(shard, local)
        self.memory, self._memory_view = memory, None
        self.close()  # the files are not needed any more

    def _image(self, shard: int, local: int) -> np.ndarray:
        """The stored image at ``local`` in ``shard``, decoded: from memory (``in_memory``) or the shard's files."""
        stored = self._stored(shard, local)
        if self.memory is None and self.layout.codec.encoded:
            stored = decode_stored(stored, self.layout.codec.name, self.layout.mode)
            self._check_image(stored, shard)
        return stored

    def _stored(self, shard: int, local: int) -> Any:
        """The image at ``local`` in ``shard`` as stored: raw pixels (from memory with ``in_memory``,
        where images are held decoded), or an encoded image's bytes."""
        if self.memory is not None:
            if self._memory_view is None:
                self._memory_view = self.memory.numpy()
            return self._memory_view[self._offsets[shard] + local]
        stored = self.read_stored(self.handles.get(shard, self), local)
        if not self.layout.codec.encoded:
            self._check_image(stored, shard)
        return stored

    def set_epoch(self, epoch: int) -> None:
        """Select the crops and flips of epoch ``epoch`` (``crop=``, ``flip=``), in this process and in
        the DataLoader workers reading this dataset. ``make_loader``'s loaders need no call: each of
        their batches carries its epoch."""
        if self._epoch is not None:
            self._epoch.fill_(int(epoch))

    def epoch_now(self) -> int:
        """The epoch of the crops and flips of samples read now (``set_epoch``; 0 before any call)."""
        epoch = int(self._epoch.item()) if self._epoch is not None else 0
        if epoch >= 0:
            return epoch
        if self.crops is not None and self.crops.random and get_worker_info() is not None:
            _warn_epochs()
        return 0

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, index within the shard) of dataset index ``index``; negatives count from the end."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a dataset of {n} samples")
        shard = bisect.bisect_right(self._offsets, index) - 1
        return shard, index - self._offsets[shard]

    def __getitem__(self, index: int):
        return self._sample_at(index, self.epoch_now())

    def _sample_at(self, index: int, epoch: int):
        """Sample ``index`` as ``dataset[index]`` gives it, cropped and flipped for ``epoch``."""
        shard, local = self.locate(int(index))
        placement: list = []
        with self.reading(shard):
            values = self._values(shard, local, epoch, placement)
            label = int(self.handles.labels_of(shard, self)[local])
            key = self.read_key(self.handles.get(shard, self), local) if self.return_meta else None
        return self.sample_of(self._offsets[shard] + local, key, label, values, placement[0] if placement else None)

    def __getitems__(self, indices: list[int]):
        """The samples at ``indices`` as one ``PackedBatch`` (PyTorch calls this with a batch's indices).

        Images are read in index order (sequential within a shard) and written straight into one
        batch tensor; ``packed_collate`` (``make_loader`` uses it) hands that tensor on without
        another copy. Float32 batches are contiguous NCHW; unnormalized batches keep the stored
        NHWC byte order (``channels_last``), so filling them is one plain copy per sample. With a
        ``transform``, a ``target_transform`` or ``return_meta`` (``one_by_one``) the samples are
        read one by one as by ``dataset[i]``.
        """
        epoch = getattr(indices, "epoch", None)
        epoch = self.epoch_now() if epoch is None else int(epoch)
        if self.files.ranged and self.memory is None:
            self._fetch(indices)
        if type(self).__getitem__ is not PackedDataset.__getitem__:
            return [self[i] for i in indices]  # a subclass's own __getitem__
        if self.one_by_one:
            return [self._sample_at(i, epoch) for i in indices]  # per sample, as dataset[i]
        if self.buffers.encoded:
            return self._encoded_batch(indices, epoch)
        n = len(indices)
        size = None  # a batch of one aspect-ratio bucket: one tensor of its resolution
        if self.layout.has_image and self.image_shape is None:
            size = self.crops.batch_resolution(indices) if self.crops is not None else None
            if size is None:  # images of their own sizes: no batch tensor
                return [self._sample_at(i, epoch) for i in indices]
        if self.text_fields:
            return self._text_samples(indices, epoch)
        slot, images = self.batch_tensor(n, size)
        labels = np.empty(n, dtype=np.int64)
        slots = images.numpy()  # indexed per image: a numpy view is far cheaper to make than a tensor's
        # Unnormalized batches keep the stored NHWC byte order: each image is one numpy copy into them.
        hwc = slots.transpose(0, 2, 3, 1) if self.convert.normalize is None else None
        for shard, rows, local in self._by_shard(indices):
            with self.reading(shard):
                labels[rows] = self.handles.labels_of(shard, self)[local]
                for j, at in zip(rows.tolist(), local.tolist()):
                    if self.crops is None:
                        image = self._image(shard, at)
                    else:  # cropped and flipped
                        codec = "raw" if self.memory is not None else None  # held decoded
                        image = self.crops.image(
                            self._stored(shard, at), self.seed, self._offsets[shard] + at, epoch, codec
                        )[0]
                    if hwc is not None and image.dtype == hwc.dtype:
                        hwc[j] = image
                    else:
                        self.convert.into(image, slots[j])  # before the next shard opens: LMDB views live until then
        return PackedBatch(images, torch.from_numpy(labels), slot)

    def _encoded_batch(self, indices: list[int], epoch: int) -> EncodedBatch:
        """The batch at ``indices`` for ``make_loader(..., decode="device")``: the bytes and crops of
        plain upright JPEGs, and the pixels this worker renders of any other sample (a PNG, an EXIF-
        turned source file, a crop the device does not make: ``device_decode.on_device``)."""
        h, w, c = self.image_shape  # type: ignore[misc]
        batch, mode = BatchBuilder(len(indices), (h, w), c), self.layout.mode
        for shard, rows, local in self._by_shard(indices):
            with self.reading(shard):
                batch.labels[rows] = self.handles.labels_of(shard, self)[local]
                for j, at in zip(rows.tolist(), local.tolist()):
                    stored, codec, placement, (height, width) = self.crops.placed(  # type: ignore[union-attr]
                        self._stored(shard, at), self.seed, self._offsets[shard] + at, epoch
                    )
                    if codec == "jpeg" and on_device(placement, height, width):
                        batch.add_encoded(j, bytes(stored), placement)
                    else:
                        batch.add_pixels(j, render(stored, codec, mode, placement))
        return batch.batch()

    def _text_samples(self, indices: list[int], epoch: int) -> list[tuple]:
        """The samples at ``indices`` of an output with text fields, as ``dataset[i]`` gives them, read
        shard by shard (pad_collate batches them)."""
        out: list = [None] * len(indices)
        for shard, rows, local in self._by_shard(indices):
            with self.reading(shard):
                labels = self.handles.labels_of(shard, self)[local].tolist()
                for j, at, label in zip(rows.tolist(), local.tolist(), labels):
                    values = self._values(shard, at, epoch)
                    if self.geometry:
                        values.pop()  # in the meta dict only, and these samples have none
                    if self.has_target:  # (image, target) as build_sample makes them
                        out[j] = (values[0], offset_labels(values[1], self.label_offset), *values[2:])
                    else:
                        out[j] = (*values, label)
        return out

    def _values(self, shard: int, local: int, epoch: int = 0, placement: Optional[list] = None) -> list:
        """The field values of one sample, in order: the image tensor (if any, cropped and flipped for
        ``epoch``), then each text field's value. The Placement used is appended to ``placement``."""
        values, used = [], None
        if self.layout.has_image:
            if self.crops is None:
                image, used = self._image(shard, local), None  # decoded and checked against the manifest
            else:
                codec = "raw" if self.memory is not None else None  # held decoded
                image, used = self.crops.image(
                    self._stored(shard, local), self.seed, self._offsets[shard] + local, epoch, codec
                )
            if placement is not None and used is not None:
                placement.append(used)
            values.append(self.convert(image))
        if self.text_fields:
            handle = self.handles.get(shard, self)
            values += [decode_field(f, self.read_field(handle, local, f.name)) for f in self.text_fields]
            if self.has_target and used is not None:  # the boxes or mask follow the pixels
                values[1] = self.crops.target(values[1], used)  # type: ignore[union-attr]
        return values

    def _by_shard(self, indices: list[int]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(shard, batch rows, indices within the shard)`` for the dataset ``indices`` (negatives count
        from the end), shard by shard and in stored order within each: sequential reads."""
        n = len(indices)
        index = np.asarray(indices, dtype=np.int64).reshape(n)
        index = np.where(index < 0, index + len(self), index)
        if n and (index.min() < 0 or index.max() >= len(self)):
            bad = int(np.asarray(indices)[(index < 0) | (index >= len(self))][0])
            raise IndexError(f"index {bad} out of range for a dataset of {len(self)} samples")
        shards = np.searchsorted(self._offsets, index, side="right") - 1
        order = np.lexsort((index, shards))
        starts = np.flatnonzero(np.diff(shards[order], prepend=-1))
        for first, end in zip(starts, [*starts[1:], n]):
            rows = order[first:end]
            shard = int(shards[rows[0]])
            yield shard, rows, index[rows] - self._offsets[shard]

    def _fetch(self, indices: list[int]) -> None:
        """Ask for the bytes of every sample of a batch read by ranges at once (``readers.remote.ranges``):
        one round of concurrent requests, neighbours joined, instead of one request a sample."""
        wanted: list = []
        by_shard = list(self._by_shard(indices))
        unopened = self.handles.unopened([shard for shard, _, _ in by_shard])
        if unopened:  # their small files in one round, not one request each as each shard opens
            with self.reading(unopened[0]):
                self.files.prefetch([self.manifest.shards[s] for s in unopened])
        for shard, _, local in by_shard:
            with self.reading(shard):
                wanted += self.ranges_of(self.handles.get(shard, self), local)
        fetch_all(wanted, exact=True)

    @contextlib.contextmanager
    def reading(self, shard: int):
        """Turn any failure to read a shard into one ManifestError naming its files.

        An IndexError here too: the index was checked against the manifest before (``locate``,
        ``_by_shard``), so it means a shard holds fewer samples than recorded, and an IndexError
        would end a ``for`` loop over the dataset early as if that were its end.
        """
        try:
            yield
        except ManifestError:
            raise
        except Exception as e:  # noqa: BLE001 - numpy, h5py, lmdb each raise their own types
            files = ", ".join(self.files.where(f.path) for f in self.manifest.shards[shard].files)
            raise ManifestError(
                f"{files}: cannot be read ({type(e).__name__}: {e}); the output is damaged, "
                f"run packer verify {self.root}"
            ) from None

    def _check_image(self, image: np.ndarray, shard: int) -> None:
        dtype, shape = self.layout.np_dtype, self.layout.shape
        if image.dtype != dtype or image.ndim != 3 or (shape and image.shape != shape):
            recorded = list(shape) if shape else shape
            raise ValueError(f"stored image is {image.dtype} {image.shape}, the manifest says {dtype} {recorded}")

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label in dataset order, int64, from the shards' label arrays alone."""
        return index_views.labels(self)

    @property
    def targets(self) -> list[int]:
        """Every sample's label as torchvision's ``ImageFolder.targets`` (see ``index_views.targets``)."""
        return index_views.targets(self)

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(key, label)`` of every sample, as torchvision's ``ImageFolder.samples`` (see ``index_views.samples``)."""
        return index_views.samples(self)

    @property
    def imgs(self) -> list[tuple[str, int]]:
        """The same list as ``samples`` (torchvision keeps ``imgs`` as an alias of it)."""
        return index_views.samples(self)

    @property
    def image_sizes(self) -> np.ndarray:
        """``(N, 2)`` (height, width) of every image as returned without a crop (see ``index_views.image_sizes``)."""
        return index_views.image_sizes(self)

    def lengths(self, field: Optional[str] = None) -> np.ndarray:
        """Every sample's length of a text field, for ``LengthBucketSampler`` (see ``index_views.lengths``)."""
        return index_views.lengths(self, field)

    def sample_weights(self) -> torch.Tensor:
        """Per-sample weights 1 / (samples of its class), for ``WeightedRandomSampler`` class balance."""
        return index_views.sample_weights(self)

    # Per-format parts -------------------------------------------------------------------------
    def open_shard(self, shard: ShardEntry) -> Any:
        """Open one shard's files; called once per shard per process."""
        raise NotImplementedError

    def read_image(self, handle: Any, local: int) -> np.ndarray:
        """The stored HWC image at ``local`` in an open shard, decoded (see ``read_stored``)."""
        stored = self.read_stored(handle, local)
        if not self.layout.codec.encoded:
            return stored
        return decode_stored(stored, self.layout.codec.name, self.layout.mode)

    def checked_sample(self, handle: Any, local: int) -> tuple[Any, list]:
        """``(image, fields)`` of sample ``local`` of a shard read by ranges, as its files hold them,
        checked against its CRC-32 (``handle.checks``, a SampleChecks; the handle's ``images`` and
        ``text`` as npy and hdf5 have them). When the check fails, the sample's blocks are dropped
        from the caches first, so that a read again fetches them."""
        held = handle.checks.held(local)
        if held is not None:
            return held
        image = self.image_bytes(handle, local) if handle.images is not None else None
        fields = [flat[offsets[local] : offsets[local + 1]] for flat, offsets in handle.text.values()]
        try:
            return handle.checks.checked(local, image, fields)
        except ManifestError:
            for source, spans in self.ranges_of(handle, np.asarray([local])):
                source.forget(spans)
            raise

    def ranges_of(self, handle: Any, local: np.ndarray) -> list:
        """For a shard read by ranges from a URL: ``(RangeSource, [(start, end), ...])`` of the bytes
        its samples ``local`` need, fetched for a whole batch at once (``readers.remote.ranges.fetch_all``).
        Empty for local files and formats that are not read by ranges."""
        return []

    def image_bytes(self, handle: Any, local: int) -> Any:
        """The image of sample ``local`` as its file holds it (for ``checked_sample``)."""
        raise NotImplementedError

    def read_stored(self, handle: Any, local: int) -> Any:
        """The image at ``local`` in an open shard as stored: an HWC array of raw pixels, or the
        bytes (any buffer) of an encoded image.

        May be a read-only view of the shard's file, valid until the shard is closed: use it before
        the next ``handles.get`` call (which may close shards) and never write into it.
        """
        raise NotImplementedError

    def read_labels(self, handle: Any) -> np.ndarray:
        """All labels of an open shard, int64."""
        raise NotImplementedError

    def read_field(self, handle: Any, local: int, field: str) -> Any:
        """The stored bytes (any buffer) of text field ``field`` at ``local`` in an open shard."""
        raise NotImplementedError

    def read_lengths(self, handle: Any, field: TextField) -> np.ndarray:
        """Every sample's length of ``field`` in an open shard (bytes of text, count of token ids), int64."""
        raise NotImplementedError

    def read_key(self, handle: Any, local: int) -> str:
        """The sample key (relative source path) at ``local`` in an open shard."""
        raise NotImplementedError

    def read_shapes(self, handle: Any, shard: ShardEntry) -> Optional[np.ndarray]:
        """The shard's index of its images' (H, W, C) (N x 3 int64), or None where it has none."""
        raise NotImplementedError

    def read_keys(self, handle: Any, count: int) -> list[str]:
        """The keys of all ``count`` samples of an open shard, in order (``samples``); by default
        ``read_key`` of each, which a format whose keys are one array can do in one read."""
        return [self.read_key(handle, local) for local in range(count)]

    def close_shard(self, handle: Any) -> None:
        """Release an open shard."""

    def close(self) -> None:
        """Close every open shard in this process."""
        self.handles.close(self)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_memory_view"] = None  # the shared tensor travels as a handle; numpy views of it do not
        return state
