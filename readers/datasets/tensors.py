"""Stored pixels to the tensors a model wants: normalization per batch or per image, CHW views.

numpy does the per-pixel work on the DataLoader's worker side: it runs on one thread, whereas
torch's intra-op threads in a process that shares its cores with DataLoader workers can stall
each other badly. On another device, one fused torch kernel does it.
"""

from __future__ import annotations

import math
import threading
import warnings
from typing import Sequence, Union

import numpy as np
import torch

from packer.spec.manifest import Manifest


class BatchNormalize:
    """Normalizes uint8 image batches (NCHW, or one CHW image) as the manifest records, on any device.

    For ``normalize=False`` readers: uint8 crosses the DataLoader's worker pipes (4x fewer bytes
    than float32) and is normalized once per batch, ideally after the copy to the GPU::

        normalize = ds.batch_normalizer()
        images = normalize(images.to("cuda", non_blocking=True))

    Gives float32 ``(x / 255 - mean) / std``, or ``x / 255`` when the output has no normalization,
    from uint8 in any memory format (the readers' uint8 batches are channels_last), laid out as
    ``memory_format`` says (contiguous NCHW, or ``torch.channels_last``: NHWC memory, the same
    values). Float batches (from float storage) are returned as float32 unchanged: they are normalized.
    """

    def __init__(self, manifest: Manifest, memory_format: torch.memory_format = torch.contiguous_format) -> None:
        self.memory_format = checked_memory_format(memory_format)
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
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._scratch = Scratch()
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
            out = torch.addcmul(bias, images, scale)
            return out.contiguous(memory_format=self.memory_format) if out.dim() == 4 else out.contiguous()
        if images.dim() not in (3, 4):
            raise ValueError(f"expected a CHW image or an NCHW batch, got shape {tuple(images.shape)}")
        shape = tuple(images.shape)
        if images.dim() == 4 and self.memory_format == torch.channels_last:
            n, c, h, w = shape  # numpy asks for huge pages when large
            out = torch.from_numpy(np.empty((n, h, w, c), dtype=np.float32)).permute(0, 3, 1, 2)
        else:
            out = torch.from_numpy(np.empty(shape, dtype=np.float32))
        src, dst = images.numpy(), out.numpy()
        if images.dim() == 3:
            self.normalize_into(src, dst)
        for i in range(shape[0] if images.dim() == 4 else 0):  # a sample at a time stays in cache
            self.normalize_into(src[i], dst[i])
        return out

    def normalize_into(self, src: np.ndarray, dst: np.ndarray) -> None:
        """``dst = src * scale + bias`` per channel: one CHW uint8 image (any strides) into a float32
        (C, H, W) ``dst``, contiguous or a CHW view of HWC memory (a channels-last batch's slot).

        numpy: the bytes cast to float32 where they go, then multiplied and added in place
        (``_scale_shift``), so every layout, worker count and rank gives the same float32 values. numpy, not
        torch: it runs on one thread, whereas torch's intra-op threads in a process that shares its
        cores with DataLoader workers can stall each other badly. numpy is fastest when the source
        is laid out as ``dst`` is, so an image of the other layout is first regrouped by OpenCV's
        ``split`` (pixels to planes) or ``merge`` (planes to pixels) into a scratch buffer of this
        thread. ``scripts/bench_normalize.py`` times each way (docs/BENCHMARKS.md has the figures).
        """
        c, h, w = src.shape
        if c > 1 and _pixels_side_by_side(dst.transpose(1, 2, 0)):  # a channels-last slot
            hwc = src.transpose(1, 2, 0)
            if not _pixels_side_by_side(hwc):
                hwc = self._scratch.merged(src)
            out = dst.transpose(1, 2, 0)
            np.copyto(_rows(out), _rows(hwc), casting="unsafe")
            if out.flags.c_contiguous and h * w <= FLAT_FACTORS:  # one run of h * w pixels, factors as long
                _scale_shift(out.reshape(-1), *self._tiled(c, h * w))  # reshape: a view, it is contiguous
            else:
                _scale_shift(_rows(out), *self._tiled(c, w))
            return
        if c > 1 and src.strides[0] < src.strides[2]:  # pixels side by side (HWC memory): to planes
            src = self._scratch.split(src)
        np.copyto(dst, src, casting="unsafe")
        _scale_shift(dst, self._np_scale, self._np_bias)

    def _tiled(self, channels: int, pixels: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, bias)`` of ``channels`` channels repeated for ``pixels`` pixels side by side (a
        row's, or a whole image's: numpy multiplies a run as long as its factors about as fast as by
        a scalar, and factors broadcast row by row cost it a loop a row). One pair per channel count,
        as long as the largest yet, sliced for smaller ones."""
        found = self._rows.get(channels)
        if found is None or found[0].size < pixels * channels:
            found = self._rows[channels] = tuple(  # type: ignore[assignment]
                np.tile(np.broadcast_to(f.reshape(-1), (channels,)), max(pixels, 256))
                for f in (self._np_scale, self._np_bias)
            )
        return found[0][: pixels * channels], found[1][: pixels * channels]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_scratch"] = None  # per process and thread: made again where it is unpickled
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._scratch = Scratch()


FLAT_FACTORS = 1 << 19
"""The most pixels a channels-last image is normalized as one run, with factors as long (2 x 6 MB for
RGB at most, kept per worker); larger images broadcast a row's factors over their rows."""


class Scratch(threading.local):
    """The uint8 buffer of one thread that ``normalize_into`` regroups an image's channels into, kept
    for the next image (threads of a thread-based loader each get their own); it grows to the
    largest image yet, never one buffer per size."""

    def __init__(self) -> None:
        self.memory = np.empty(0, np.uint8)

    def _buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)  # not np.prod, which makes an array of the tuple first
        if self.memory.size < size:
            self.memory = np.empty(size, np.uint8)
        return self.memory[:size].reshape(shape)

    def split(self, chw: np.ndarray) -> np.ndarray:
        """The CHW image ``chw`` (a view of HWC memory) copied to planar memory."""
        out = self._buffer(chw.shape)
        planes = list(out)
        _written(_opencv().split(chw.transpose(1, 2, 0), planes), planes)
        return out

    def merged(self, chw: np.ndarray) -> np.ndarray:
        """The CHW image ``chw`` (planes) copied to HWC memory, returned as HWC."""
        c, h, w = chw.shape
        out = self._buffer((h, w, c))
        _written((_opencv().merge(list(chw), out),), (out,))
        return out


def _scale_shift(values: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> None:
    """``values = values * scale + bias`` in place (broadcast), each step rounded to float32. The
    caller casts the bytes into ``values`` first, a pass of its own: numpy's mixed uint8 x float32
    multiply casts through a small buffer and takes longer (docs/BENCHMARKS.md)."""
    np.multiply(values, scale, out=values)
    np.add(values, bias, out=values)


def _written(got: Sequence[np.ndarray], asked: Sequence[np.ndarray]) -> None:
    """Check that OpenCV wrote into the buffers it was given: had it made a new one, the scratch buffer
    would hold an earlier image's pixels, and normalizing it would give wrong data silently. OpenCV's
    bindings give back the very array they were given when they wrote into it, a new one otherwise
    (an identity test: reading each array's address through ``.ctypes`` cost more than the split)."""
    if len(got) != len(asked) or any(g is not a for g, a in zip(got, asked)):
        raise RuntimeError("OpenCV wrote a new array instead of the buffer given to it: report this as a packer bug")


def _pixels_side_by_side(hwc: np.ndarray) -> bool:
    """Whether each row of an (H, W, C) array holds its pixels' channels side by side, one item apart."""
    return hwc.strides[2] == hwc.itemsize and hwc.strides[1] == hwc.shape[2] * hwc.itemsize


def _rows(hwc: np.ndarray) -> np.ndarray:
    """An (H, W, C) array whose pixels lie side by side (``_pixels_side_by_side``) as (H, W * C): a view
    (never a copy, which a write would be lost in), its rows as far apart as ``hwc``'s."""
    h, w, c = hwc.shape
    if hwc.strides[0] == w * c * hwc.itemsize:  # contiguous: a reshape is that view, and much cheaper
        return hwc.reshape(h, w * c)
    return np.lib.stride_tricks.as_strided(
        hwc, (h, w * c), (hwc.strides[0], hwc.itemsize), writeable=hwc.flags.writeable
    )


def _opencv():
    """OpenCV, imported when first needed; its ``split`` and ``merge`` run on the calling thread."""
    import cv2

    return cv2


class ImageConverter:
    """Turns a stored HWC array into the CHW tensor a model wants.

    uint8 storage with ``normalize=True`` gives float32 normalized by BatchNormalize; with
    ``normalize=False`` the uint8 pixels. Float storage is already normalized: it is returned as
    float32, or in its stored dtype with ``normalize=False``. ``memory_format``: how whole batches
    of normalized images are laid out (``channels_last``: NHWC memory); batches of stored values
    keep the stored NHWC order (one plain copy per image) whatever it says.
    """

    def __init__(
        self, manifest: Manifest, normalize: bool = True, memory_format: torch.memory_format = torch.contiguous_format
    ) -> None:
        self.normalize = BatchNormalize(manifest, memory_format) if normalize else None
        self.channels_last = self.normalize is None or checked_memory_format(memory_format) == torch.channels_last
        """Whether whole batches are NHWC memory (viewed as NCHW), as ``torch.channels_last`` tensors are."""

    def batch_dtype(self, stored: np.dtype) -> torch.dtype:
        """dtype of the batches this converter fills (float32 when normalizing, else the stored dtype)."""
        return torch.float32 if self.normalize is not None else torch_dtype(stored)

    def into(self, array: np.ndarray, slot: Union[torch.Tensor, np.ndarray]) -> None:
        """Write one HWC image into ``slot``, a (C, H, W) view of a batch (a tensor, or the numpy
        view of one: a batch's loop indexes the array: cheaper than a tensor's view), converting on the way.

        Normalizing uint8 is one fused pass (``x * scale + bias`` per channel) reading the stored
        bytes where they lie, e.g. in a memory-mapped file; nothing else is allocated.
        """
        if self.normalize is not None and array.dtype == np.uint8:
            self.normalize.normalize_into(
                array.transpose(2, 0, 1), slot if isinstance(slot, np.ndarray) else slot.numpy()
            )
        else:
            target = torch.from_numpy(slot) if isinstance(slot, np.ndarray) else slot
            target.copy_(_tensor_view(array).permute(2, 0, 1))

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


MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last)
"""The layouts of image batches the readers write: NCHW memory, or NHWC memory viewed as NCHW."""


def checked_memory_format(memory_format: torch.memory_format) -> torch.memory_format:
    """``memory_format`` when it is one of ``MEMORY_FORMATS``; ValueError saying which are, otherwise."""
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(
            f"memory_format takes torch.contiguous_format (NCHW batches) or torch.channels_last (NHWC memory, "
            f"as channels-last CNN training wants), not {memory_format!r}"
        )
    return memory_format


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
