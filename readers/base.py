"""What every reader shares: manifest loading, sample-to-tensor conversion, lazy per-process handles.

Readers keep only the output path and the parsed manifest in their state. File handles are opened
on first use inside the process that uses them, reopened after a fork (a handle inherited from the
parent would be shared with it), and never pickled, so datasets travel cheaply to spawned workers.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from packer.errors import ConfigError, ManifestError
from packer.manifest import Manifest, ShardEntry
from packer.records import TextField
from packer.text import TOKEN_DTYPE
from readers.collate import PackedBatch, SlotRing, empty_batch
from readers.remote import is_url, open_manifest

Transform = Callable[[torch.Tensor], Any]


class BatchNormalize:
    """Normalizes uint8 image batches (NCHW, or one CHW image) as the manifest records, on any device.

    For ``normalize=False`` readers: uint8 crosses the DataLoader's worker pipes (4x fewer bytes
    than float32) and is normalized once per batch, ideally after the copy to the GPU::

        normalize = ds.batch_normalizer()
        images = normalize(images.to("cuda", non_blocking=True))

    Gives contiguous float32 ``(x / 255 - mean) / std``, or ``x / 255`` when the output has no
    normalization, from uint8 in any memory format (the readers' uint8 batches are channels_last).
    Float batches (from float storage) are returned as float32 unchanged: they are normalized.
    """

    def __init__(self, manifest: Manifest) -> None:
        norm = manifest.preprocess.get("normalize")
        self.mean = torch.tensor(norm["mean"], dtype=torch.float32) if norm else None
        self.std = torch.tensor(norm["std"], dtype=torch.float32) if norm else None
        mean, std = (self.mean, self.std) if norm else (torch.zeros(1), torch.ones(1))
        # (x / 255 - mean) / std == x * scale + bias: one fused pass (addcmul) over the bytes.
        self.scale = (1.0 / (255.0 * std)).view(-1, 1, 1)
        self.bias = (-mean / std).view(-1, 1, 1)
        # Copies, not views: pickling for a spawned worker moves the tensors' memory into shared
        # memory, and a numpy view of the old memory would then read freed bytes.
        self._np_scale, self._np_bias = self.scale.numpy().copy(), self.bias.numpy().copy()
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def factors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, bias)`` as (C, 1, 1) float32 tensors on ``device``."""
        found = self._on.get(device)
        if found is None:
            found = self._on[device] = (self.scale.to(device), self.bias.to(device))
        return found

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Normalized float32 copy of ``images``."""
        if images.dtype != torch.uint8:
            return images.float()
        if images.device.type != "cpu":  # one fused kernel; equal to the CPU result up to float rounding
            scale, bias = self.factors(images.device)
            return torch.addcmul(bias, images, scale).contiguous()
        if images.dim() not in (3, 4):
            raise ValueError(f"expected a CHW image or an NCHW batch, got shape {tuple(images.shape)}")
        shape = tuple(images.shape)
        out = torch.from_numpy(np.empty(shape, dtype=np.float32))  # numpy asks for huge pages when large
        src, dst = images.numpy(), out.numpy()
        if images.dim() == 3:
            self.normalize_into(src, dst)
        for i in range(shape[0] if images.dim() == 4 else 0):  # a sample at a time stays in cache
            self.normalize_into(src[i], dst[i])
        return out

    def normalize_into(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst = src * scale + bias`` per channel, for one CHW uint8 image (any strides) into float32.

        numpy, not torch: it runs on one thread, whereas torch's intra-op threads in a process that
        shares its cores with DataLoader workers can stall each other badly.
        """
        np.multiply(src, self._np_scale, out=dst, casting="unsafe")
        np.add(dst, self._np_bias, out=dst)


class ImageConverter:
    """Turns a stored HWC array into the CHW tensor a model wants.

    uint8 storage with ``normalize=True`` gives float32 normalized by BatchNormalize; with
    ``normalize=False`` the uint8 pixels. Float storage is already normalized: it is returned as
    float32, or in its stored dtype with ``normalize=False``.
    """

    def __init__(self, manifest: Manifest, normalize: bool = True) -> None:
        self.normalize = BatchNormalize(manifest) if normalize else None

    def batch_dtype(self, stored: np.dtype) -> torch.dtype:
        """dtype of the batches this converter fills (float32 when normalizing, else the stored dtype)."""
        return torch.float32 if self.normalize is not None else torch_dtype(stored)

    def into(self, array: np.ndarray, slot: torch.Tensor) -> None:
        """Write one HWC image into ``slot``, a (C, H, W) view of a batch, converting on the way.

        Normalizing uint8 is one fused pass (``x * scale + bias`` per channel) reading the stored
        bytes where they lie, e.g. in a memory-mapped file; nothing else is allocated.
        """
        if self.normalize is not None and array.dtype == np.uint8:
            self.normalize.normalize_into(array.transpose(2, 0, 1), slot.numpy())
        else:
            slot.copy_(_tensor_view(array).permute(2, 0, 1))

    def __call__(self, array: np.ndarray) -> torch.Tensor:
        """CHW tensor of one HWC image array (always a fresh, writable copy, never a file map)."""
        if self.normalize is not None and array.dtype == np.uint8:
            out = torch.empty((array.shape[2], array.shape[0], array.shape[1]), dtype=torch.float32)
            self.into(array, out)
            return out
        chw = np.ascontiguousarray(array.transpose(2, 0, 1))
        if not chw.flags.owndata or not chw.flags.writeable:
            # Still a view of the file (memory-mapped npy, one channel): a tensor over it would be
            # read-only, and an in-place op on it would crash the process.
            chw = chw.copy()
        t = torch.from_numpy(chw)
        return t if self.normalize is None else self.normalize(t)


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _tensor_view(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array``'s memory without copying, also for read-only arrays (file maps).

    Only ever read from: writing into a read-only map would crash the process.
    """
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
        return torch.from_numpy(array)


def build_sample(image: Any, label: int, transform: Optional[Transform], meta: Optional[dict], rest: tuple = ()):
    """The tuple a reader yields: ``(image, label)`` or ``(image, label, meta)``; with text fields
    ``(first field, *rest, label[, meta])``. ``transform`` applies to the first field (the image,
    or the text of a text-only output)."""
    if transform is not None:
        image = transform(image)
    return (image, *rest, label) if meta is None else (image, *rest, label, meta)


def decode_field(field: TextField, data) -> Any:
    """The value of a stored text field's bytes: ``str`` for text, a 1-D int64 tensor of token ids,
    the parsed object for json (None for a json field stored empty by --allow-missing)."""
    if field.kind == "tokens":
        return torch.from_numpy(np.frombuffer(data, dtype=TOKEN_DTYPE).astype(np.int64))
    text = bytes(data).decode("utf-8")
    if field.kind == "json":
        return json.loads(text) if text else None
    return text


class ReaderBase:
    """What every reader holds: the output's path, its manifest and how samples are returned.

    ``transform`` is applied to the image tensor (random augmentation at training time);
    ``return_meta=True`` adds a third item ``{"index", "key", "label"}`` to each sample: the
    sample's position in the output, its source path relative to the converted folder, its label.
    """

    format_name: str = ""
    reads_urls: bool = False  # True for readers that stream shards from URLs (readers.remote)

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        normalize: bool = True,
        transform: Optional[Transform] = None,
        return_meta: bool = False,
    ) -> None:
        if is_url(root) and not self.reads_urls:
            raise ConfigError(f"{type(self).__name__} reads local folders only ({root} is a URL): the "
                              f"{self.format_name} format needs random access. Copy the output to a local disk, "
                              "or convert with --format wds, whose shards stream from URLs")
        self.root: Any = root if is_url(root) else Path(root)  # Path, or the URL as given (readers.remote)
        self.manifest = open_manifest(self.root, expect_format=self.format_name or None)
        self.convert = ImageConverter(self.manifest, normalize)
        self.transform = transform
        self.return_meta = return_meta
        self.ring: Optional[SlotRing] = None  # set by make_loader: reused shared batch buffers
        self.shared_batches = False  # set by make_loader: batches cross to the main process as they are
        self._offsets = self.manifest.shard_offsets
        self._sizes = {f.path: f.bytes for shard in self.manifest.shards for f in shard.files}
        field = self.manifest.fields.get("image")
        self._stored = (np.dtype(field["dtype"]), field.get("shape")) if field else None
        self.text_fields = self.manifest.text_fields

    def batch_tensor(self, n: int) -> tuple[Optional[int], torch.Tensor]:
        """``(ring slot or None, empty (n, C, H, W) batch tensor)`` for this reader's fixed image size:
        a free slot of make_loader's ring when there is one, else fresh (shared) memory. Float32 when
        normalizing, contiguous; otherwise the stored dtype in the stored NHWC byte order."""
        dtype, (h, w, c) = self._stored
        out_dtype = self.convert.batch_dtype(dtype)
        claimed = self.ring.claim(n, out_dtype) if self.ring is not None else None
        if claimed is not None:
            return claimed
        return None, empty_batch((n, c, h, w), out_dtype, self.convert.normalize is None, shared=self.shared_batches)

    def path(self, relpath: str) -> Path:
        """Path of a shard file named in the manifest, checked to exist with its recorded size.

        The size check matters: memory-mapping a cut file (LMDB does) kills the process with SIGBUS
        on the first read past its end, instead of raising an error.
        """
        p = self.root / relpath
        try:
            size = p.stat().st_size
        except OSError:
            raise ManifestError(f"{p} is listed in the manifest but missing; the output is incomplete") from None
        if size != self._sizes.get(relpath, size):
            raise ManifestError(
                f"{p} is {size} bytes but the manifest says {self._sizes[relpath]}: the file is damaged; "
                "run packer verify"
            )
        return p

    @property
    def fixed_images(self) -> bool:
        """True when samples are one image of one size and nothing else: batches are one tensor."""
        return self._stored is not None and self._stored[1] is not None and not self.text_fields

    def length_field(self, field: Optional[str] = None) -> TextField:
        """The text field ``field`` names; by default the first text or token-id field (else json)."""
        fields = {f.name: f for f in self.text_fields}
        if not fields:
            raise ValueError(f"{self.root} has no text fields, so its samples have no length")
        if field is None:
            return next((f for f in self.text_fields if f.kind != "json"), self.text_fields[0])
        if field not in fields:
            raise ValueError(f"{self.root} has no field {field!r}; its text fields are {', '.join(fields)}")
        return fields[field]

    @property
    def pad_id(self) -> int:
        """Padding id of the token-id field's tokenizer (0 without one): what pad_collate should pad with."""
        tokens = next((f for f in self.text_fields if f.kind == "tokens"), None)
        return int((tokens.tokenizer or {}).get("pad_id") or 0) if tokens else 0

    @property
    def classes(self) -> Optional[list[str]]:
        """Class names by index, or None for unlabelled data."""
        return self.manifest.classes

    @property
    def class_counts(self) -> Optional[list[int]]:
        """Samples per class, from the manifest (no shard is opened); None for unlabelled data."""
        return self.manifest.class_counts

    @property
    def stats(self) -> Optional[dict]:
        """The manifest's dataset statistics (pixel mean/std, original sizes); None for older outputs."""
        return self.manifest.stats

    def batch_normalizer(self) -> BatchNormalize:
        """The normalization of this output as a per-batch callable (see BatchNormalize)."""
        return BatchNormalize(self.manifest)

    def __len__(self) -> int:
        return self.manifest.samples

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, samples={len(self)}, shards={len(self.manifest.shards)})"


class PackedDataset(ReaderBase, Dataset):
    """Base of the map-style readers (npy, lmdb, hdf5): ``len``, random access, any sampler.

    ``dataset[i]`` is ``(image, label)``: image a CHW tensor (see ImageConverter), label an int
    (-1 for unlabelled data); ``(image, label, meta)`` with ``return_meta=True`` (see ReaderBase).
    At most ``max_open_shards`` shards are kept open per process (least recently used are closed),
    so datasets of thousands of shards stay within the open-file limit. ``in_memory=True`` reads
    every image once into shared memory that DataLoader workers share (see load_into_memory).
    """

    def __init__(self, root: str | os.PathLike, *, max_open_shards: int = 64, in_memory: bool = False,
                 **options) -> None:
        super().__init__(root, **options)
        self.max_open_shards = max(1, int(max_open_shards))
        self._handles: OrderedDict[int, Any] = OrderedDict()
        self._labels: dict[int, np.ndarray] = {}
        self._pid: Optional[int] = None
        self.memory: Optional[torch.Tensor] = None
        self._memory_view: Optional[np.ndarray] = None
        if in_memory:
            self.load_into_memory()

    def load_into_memory(self) -> None:
        """Read every stored image once into one shared-memory array (``in_memory=True``).

        DataLoader workers share it instead of copying it: forked ones inherit the mapping, spawned
        ones receive it as a shared-memory handle. Encoded images (jpeg, png) are held decoded, so
        nothing is decoded again. Needs a fixed image size.
        """
        if not self.fixed_images:
            raise ValueError("in_memory=True holds images of one size: this output has text fields or images of "
                             "several sizes (--resize none)")
        dtype, shape = self._stored
        memory = torch.empty((len(self), *shape), dtype=torch_dtype(dtype)).share_memory_()
        view = memory.numpy()
        for shard in range(len(self.manifest.shards)):
            with self._reading(shard):
                for local in range(self.manifest.shards[shard].samples):
                    view[self._offsets[shard] + local] = self._image(shard, local)
        self.memory, self._memory_view = memory, None
        self.close()  # the files are not needed any more

    def _image(self, shard: int, local: int) -> np.ndarray:
        """The stored image at ``local`` in ``shard``: from memory (``in_memory``) or the shard's files."""
        if self.memory is not None:
            if self._memory_view is None:
                self._memory_view = self.memory.numpy()
            return self._memory_view[self._offsets[shard] + local]
        image = self.read_image(self._handle(shard), local)
        self._check_image(image, shard)
        return image

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
        shard, local = self.locate(int(index))
        with self._reading(shard):
            values = self._values(shard, local)
            label = int(self._shard_labels(shard)[local])
            key = self.read_key(self._handle(shard), local) if self.return_meta else None
        meta = {"index": self._offsets[shard] + local, "key": key, "label": label} if self.return_meta else None
        return build_sample(values[0], label, self.transform, meta, tuple(values[1:]))

    def __getitems__(self, indices: list[int]):
        """The samples at ``indices`` as one ``PackedBatch`` (PyTorch calls this with a batch's indices).

        Images are read in index order (sequential within a shard) and written straight into one
        batch tensor; ``packed_collate`` (``make_loader`` uses it) hands that tensor on without
        another copy. Float32 batches are contiguous NCHW; unnormalized batches keep the stored
        NHWC byte order (``channels_last``), so filling them is one plain copy per sample. With a
        ``transform`` or ``return_meta`` the samples are read one by one as by ``dataset[i]``.
        """
        if self.transform is not None or self.return_meta or type(self).__getitem__ is not PackedDataset.__getitem__:
            return [self[i] for i in indices]  # per sample, as dataset[i] (also a subclass's own __getitem__)
        n = len(indices)
        if self._stored is not None and self._stored[1] is None:  # images of their own sizes: no batch tensor
            return [self[i] for i in indices]
        if self.text_fields:
            return self._text_samples(indices)
        slot, images = self.batch_tensor(n)
        labels = np.empty(n, dtype=np.int64)
        # Unnormalized batches keep the stored NHWC byte order: each image is one numpy copy into them.
        hwc = images.numpy().transpose(0, 2, 3, 1) if self.convert.normalize is None else None
        for shard, rows, local in self._by_shard(indices):
            with self._reading(shard):
                labels[rows] = self._shard_labels(shard)[local]
                for j, at in zip(rows.tolist(), local.tolist()):
                    image = self._image(shard, at)
                    if hwc is not None and image.dtype == hwc.dtype:
                        hwc[j] = image
                    else:
                        self.convert.into(image, images[j])  # before the next shard opens: LMDB views live until then
        return PackedBatch(images, torch.from_numpy(labels), slot)

    def _text_samples(self, indices: list[int]) -> list[tuple]:
        """The samples at ``indices`` of an output with text fields, as ``dataset[i]`` gives them, read
        shard by shard (pad_collate batches them)."""
        out: list = [None] * len(indices)
        for shard, rows, local in self._by_shard(indices):
            with self._reading(shard):
                labels = self._shard_labels(shard)[local].tolist()
                for j, at, label in zip(rows.tolist(), local.tolist(), labels):
                    out[j] = (*self._values(shard, at), label)
        return out

    def _values(self, shard: int, local: int) -> list:
        """The field values of one sample, in order: the image tensor (if any), then each text field's value."""
        values = [self.convert(self._image(shard, local))] if self._stored is not None else []
        if self.text_fields:
            handle = self._handle(shard)
            values += [decode_field(f, self.read_field(handle, local, f.name)) for f in self.text_fields]
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

    @contextlib.contextmanager
    def _reading(self, shard: int):
        """Turn any failure to read a shard into one ManifestError naming its files."""
        try:
            yield
        except (ManifestError, IndexError):
            raise
        except Exception as e:  # noqa: BLE001 - numpy, h5py, lmdb each raise their own types
            files = ", ".join(str(self.root / f.path) for f in self.manifest.shards[shard].files)
            raise ManifestError(f"{files}: cannot be read ({type(e).__name__}: {e}); the output is damaged, "
                                f"run packer verify {self.root}") from None

    def _check_image(self, image: np.ndarray, shard: int) -> None:
        dtype, shape = self._stored
        if image.dtype != dtype or image.ndim != 3 or (shape and list(image.shape) != shape):
            raise ValueError(f"stored image is {image.dtype} {image.shape}, the manifest says {dtype} {shape}")

    @property
    def labels(self) -> np.ndarray:
        """Every sample's label in dataset order, int64, read from the shards' label arrays alone
        (no image is read)."""
        return np.concatenate([self._shard_labels(i) for i in range(len(self.manifest.shards))] or
                              [np.zeros(0, np.int64)])

    def lengths(self, field: Optional[str] = None) -> np.ndarray:
        """Every sample's length of a text field in dataset order, int64: UTF-8 bytes for text and
        json, ids for token ids (``field`` defaults to the text/token field). Read from the shards'
        indexes alone; no sample is read. For ``LengthBucketSampler``."""
        f = self.length_field(field)
        parts = []
        for shard in range(len(self.manifest.shards)):
            with self._reading(shard):
                parts.append(np.asarray(self.read_lengths(self._handle(shard), f), dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def sample_weights(self) -> torch.Tensor:
        """Per-sample weights 1 / (samples of its class), for ``WeightedRandomSampler`` class balance.

        ``WeightedRandomSampler(ds.sample_weights(), num_samples=len(ds))`` draws every class
        equally often. Unlabelled samples (label -1) get weight 0.
        """
        labels = self.labels
        counts = np.bincount(labels[labels >= 0], minlength=len(self.classes or []))
        weights = np.zeros(len(labels), dtype=np.float64)
        known = labels >= 0
        weights[known] = 1.0 / counts[labels[known]]
        return torch.from_numpy(weights)

    # Per-format parts -------------------------------------------------------------------------
    def open_shard(self, shard: ShardEntry) -> Any:
        """Open one shard's files; called once per shard per process."""
        raise NotImplementedError

    def read_image(self, handle: Any, local: int) -> np.ndarray:
        """The stored HWC image at ``local`` in an open shard.

        May be a read-only view of the shard's file, valid until the shard is closed: use it before
        the next ``_handle`` call (which may close shards) and never write into it.
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

    def close_shard(self, handle: Any) -> None:
        """Release an open shard."""

    # Handle lifecycle -------------------------------------------------------------------------
    def _handle(self, shard: int) -> Any:
        if self._pid != os.getpid():
            # A fresh process (forked worker): handles inherited from the parent must not be used.
            self._handles, self._labels, self._pid = OrderedDict(), {}, os.getpid()
        handle = self._handles.get(shard)
        if handle is None:
            while len(self._handles) >= self.max_open_shards:
                self.close_shard(self._handles.popitem(last=False)[1])
            handle = self._handles[shard] = self.open_shard(self.manifest.shards[shard])
        else:
            self._handles.move_to_end(shard)
        return handle

    def _shard_labels(self, shard: int) -> np.ndarray:
        labels = self._labels.get(shard)
        if labels is None:
            labels = self._labels[shard] = self.read_labels(self._handle(shard))
        return labels

    def close(self) -> None:
        """Close every open shard in this process."""
        if self._pid == os.getpid():
            for handle in self._handles.values():
                self.close_shard(handle)
        self._handles, self._labels = OrderedDict(), {}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_handles"], state["_labels"], state["_pid"] = OrderedDict(), {}, None
        state["_memory_view"] = None  # the shared tensor travels as a handle; numpy views of it do not
        return state
