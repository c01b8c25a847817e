"""Stored pixels to the tensors a model wants: normalization per batch or per image, CHW views.

numpy does the per-pixel work on the DataLoader's worker side: it runs on one thread, whereas
torch's intra-op threads in a process that shares its cores with DataLoader workers can stall
each other badly. On another device, one fused torch kernel does it.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from packer.spec.manifest import Manifest


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
