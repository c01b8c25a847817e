"""Stored pixels to the tensors a model wants: normalization per batch or per image, CHW views.

Compiled loops (``normalize_kernel``, numba) do the per-pixel work on the DataLoader's worker side,
on the calling thread, whereas torch's intra-op threads in a process that shares its cores with
DataLoader workers can stall each other badly. On another device, one fused torch kernel does it.
"""

from __future__ import annotations

import warnings
from typing import Union

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
        self._channels: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def load_kernels(self) -> None:
        """Compile (or load from numba's cache) the normalize loops in this process, once: DataLoader
        workers forked from it then inherit them, instead of each importing numba and loading them
        on its first batch (``ImageConverter`` calls it for readers of uint8 images). One tiny image
        in each pair of layouts, a read-only one too, of this output's channel count (RGB where its
        factors fit any)."""
        if _KERNEL:
            return
        channels = self._np_scale.size if self._np_scale.size > 1 else 3
        pixels = np.zeros((2, 2, channels), np.uint8)
        frozen = pixels.copy()
        frozen.setflags(write=False)
        for hwc in (pixels, frozen, np.ascontiguousarray(pixels.transpose(2, 0, 1)).transpose(1, 2, 0)):
            self.normalize_into(hwc.transpose(2, 0, 1), np.empty((channels, 2, 2), np.float32))
            self.normalize_into(hwc.transpose(2, 0, 1), np.empty((2, 2, channels), np.float32).transpose(2, 0, 1))

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

    def normalize_into(self, src: np.ndarray, dst: np.ndarray, stream: bool = True) -> bool:
        """``dst = src * scale + bias`` per channel: one CHW uint8 image (any strides) into a float32
        (C, H, W) ``dst``, contiguous or a CHW view of HWC memory (a channels-last batch's slot).

        One compiled pass (``readers.datasets.normalize_kernel``) reads each byte where it lies
        (pixels side by side or planes, a memory-mapped file too) and writes each float once, with
        numpy's float32 roundings: every layout, worker count and rank gives the same values. A source
        whose rows are not contiguous (a window of a wider image) or that shares memory with ``dst``
        is copied first, as uint8; a ``dst`` that is neither layout is written through a contiguous
        float32 buffer. With ``stream`` (for a batch's slot, not read again before the batch is
        handed on), a ``dst`` on a cache line is written past the cache (non-temporal stores); False
        keeps what it writes in the cache for a reader right after. Returns whether it streamed.
        ``scripts/bench_normalize.py`` times it (docs/BENCHMARKS.md has the figures).
        """
        c = src.shape[0]
        if src.dtype != np.uint8 or dst.dtype != np.float32 or dst.shape != src.shape:
            raise ValueError(
                f"normalize_into takes uint8 CHW into float32 of its shape, not {src.dtype} {src.shape} "
                f"into {dst.dtype} {dst.shape}"
            )
        if src.size == 0:
            return False
        kernel = _kernel()
        scale16, bias16 = self._per_channel(c)
        hwc, out = src.transpose(1, 2, 0), dst.transpose(1, 2, 0)
        planes_in = not hwc.flags.c_contiguous and src.flags.c_contiguous  # torch's resize writes planes
        if np.may_share_memory(src, dst):  # the loops read and write in their own order: never in place
            hwc, planes_in = hwc.copy(), False
        elif not planes_in and not hwc.flags.c_contiguous:
            hwc = np.ascontiguousarray(hwc)
        flat_in = src.reshape(-1) if planes_in else hwc.reshape(-1)
        if c > 1 and out.flags.c_contiguous:  # a channels-last slot
            if planes_in:
                return kernel.planes_to_pixels(flat_in, out.reshape(-1), c, *self._tiled(c, 16), stream)
            h, w = src.shape[1:]
            rows_in, rows_out = flat_in.reshape(h, w * c), out.reshape(h, w * c)
            return kernel.pixels_to_pixels(rows_in, rows_out, c, *self._tiled(c, w), stream)
        target = dst if dst.flags.c_contiguous else np.empty(dst.shape, np.float32)
        stream = stream and target is dst  # a buffer of ours is read right away, by the copy below
        if planes_in:
            streamed = kernel.planes_to_planes(flat_in, target.reshape(-1), c, scale16, bias16, stream)
        else:
            streamed = kernel.pixels_to_planes(flat_in, target.reshape(-1), c, scale16, bias16, stream)
        if target is not dst:
            np.copyto(dst, target)
        return streamed

    def _per_channel(self, channels: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, bias)`` for ``channels`` channels (one value stands for every channel of an output
        with no normalization), each channel's value 16 times over, contiguous float32: the compiled
        loops' streamed stores write 16 floats of a channel at once, and the plain loops read every
        16th."""
        found = self._channels.get(channels)
        if found is None:
            found = self._channels[channels] = tuple(  # type: ignore[assignment]
                np.repeat(np.broadcast_to(f.reshape(-1), (channels,)), 16) for f in (self._np_scale, self._np_bias)
            )
        return found

    def _tiled(self, channels: int, pixels: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scale, bias)`` of ``channels`` channels repeated for a row of ``pixels`` pixels side by side:
        the compiled loop then multiplies a run by a run as long, which it vectorizes. One pair per
        channel count, as long as the longest row yet, sliced for shorter ones."""
        found = self._rows.get(channels)
        if found is None or found[0].size < pixels * channels:
            found = self._rows[channels] = tuple(  # type: ignore[assignment]
                np.tile(f[::16], max(pixels, 256)) for f in self._per_channel(channels)
            )
        return found[0][: pixels * channels], found[1][: pixels * channels]


def _kernel():
    """``readers.datasets.normalize_kernel``, imported when first needed (it imports numba: a reader
    that never normalizes uint8 images on the CPU does not load it), then kept: an import statement
    a sample costs more than the module lookup."""
    if not _KERNEL:
        from readers.datasets import normalize_kernel

        _KERNEL.append(normalize_kernel)
    return _KERNEL[0]


_KERNEL: list = []


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
        # here, so that forked workers inherit them (the advisor's stand-in for a manifest has no images)
        if self.normalize is not None and getattr(manifest, "uint8_images", False):
            self.normalize.load_kernels()
        self.channels_last = self.normalize is None or checked_memory_format(memory_format) == torch.channels_last
        """Whether whole batches are NHWC memory (viewed as NCHW), as ``torch.channels_last`` tensors are."""

    def batch_dtype(self, stored: np.dtype) -> torch.dtype:
        """dtype of the batches this converter fills (float32 when normalizing, else the stored dtype)."""
        return torch.float32 if self.normalize is not None else torch_dtype(stored)

    def into(self, array: np.ndarray, slot: Union[torch.Tensor, np.ndarray], stream: bool = True) -> None:
        """Write one HWC image into ``slot``, a (C, H, W) view of a batch (a tensor, or the numpy
        view of one: a batch's loop indexes the array: cheaper than a tensor's view), converting on the way.

        Normalizing uint8 is one fused pass (``x * scale + bias`` per channel) reading the stored
        bytes where they lie, e.g. in a memory-mapped file; nothing else is allocated, except a uint8
        copy of an image whose rows are not contiguous (a window of a wider one). ``stream``: past
        the cache where the slot allows (``BatchNormalize.normalize_into``), as for a batch's slot.
        """
        if self.normalize is not None and array.dtype == np.uint8:
            self.normalize.normalize_into(
                array.transpose(2, 0, 1), slot if isinstance(slot, np.ndarray) else slot.numpy(), stream=stream
            )
        else:
            target = torch.from_numpy(slot) if isinstance(slot, np.ndarray) else slot
            target.copy_(_tensor_view(array).permute(2, 0, 1))

    def __call__(self, array: np.ndarray) -> torch.Tensor:
        """CHW tensor of one HWC image array (always a fresh, writable copy, never a file map)."""
        if self.normalize is not None and array.dtype == np.uint8:
            out = torch.empty((array.shape[2], array.shape[0], array.shape[1]), dtype=torch.float32)
            self.into(array, out, stream=False)  # kept in the cache: a transform or a collate reads it next
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
