"""Crops of JPEG-stored images decoded where the batches go (``make_loader(..., decode="device")``).

The DataLoader workers draw each sample's crop and flip as always (``Augment``), but send the stored
JPEG bytes (of a JPEG packer stored, only the MCUs around the crop's box) with those placements
instead of pixels (``EncodedBatch``). The loader decodes them in
one call on the batches' device (nvJPEG through ``torchvision.io.decode_jpeg`` on CUDA; packer's own
CPU decoder elsewhere), cuts and resizes each crop (antialiased bilinear, rounded to whole levels as
the workers' uint8 kernel gives them), flips it, and normalizes the batch there. Samples that are not
plain upright JPEGs (a PNG or an EXIF-turned file of ``--codec source``), and boxes that reach past
the image (a ``CenterCrop`` larger than it, which pads), are rendered by the worker as before and
travel as pixels in the same batch.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F

from readers.augment.crops import Placement
from readers.augment.render import box_inside
from readers.datasets.tensors import BatchNormalize

DECODE_WHERE = ("workers", "device")
"""Where ``make_loader`` decodes stored images: in the DataLoader workers (the default), or on the
batches' device (``decode="device"``: JPEG crops, see this module)."""


class EncodedBatch(NamedTuple):
    """One batch as a worker sends it for ``decode="device"`` (a NamedTuple of tensors, which the
    DataLoader's pin-memory step keeps intact).

    ``data`` holds the JPEG files of the encoded rows one after another (of a JPEG packer stored,
    the MCUs around the crop's box: ``jpeg_region.splice``), ``ends`` where each ends; ``rows``
    their rows in the batch; ``boxes`` (left, top, right, bottom) the whole-pixel box cut from each,
    in the pixels of the file sent; ``wholes`` (height, width, top, left) of a ``CenterCrop(resize=)``
    (the whole image resized first, the box then cut from it at top, left), all -1 otherwise;
    ``flips`` which are mirrored. ``pixels`` (m, H, W, C) uint8 are the rows ``done`` the worker
    rendered itself. ``labels`` (n,) int64; ``shape`` (n, C, H, W) of the batch."""

    data: torch.Tensor
    ends: torch.Tensor
    rows: torch.Tensor
    boxes: torch.Tensor
    wholes: torch.Tensor
    flips: torch.Tensor
    pixels: torch.Tensor
    done: torch.Tensor
    labels: torch.Tensor
    shape: torch.Tensor


class BatchBuilder:
    """Collects one batch's samples in a worker: ``add_encoded`` for a JPEG whose crop the device
    makes, ``add_pixels`` for an image the worker rendered; ``batch`` gives the ``EncodedBatch``."""

    def __init__(self, n: int, size: tuple[int, int], channels: int) -> None:
        self.n, self.size, self.channels = n, size, channels
        self.chunks: list[bytes] = []
        self.rows: list[int] = []
        self.boxes: list[tuple[int, int, int, int]] = []
        self.wholes: list[tuple[int, int, int, int]] = []
        self.flips: list[bool] = []
        self.done: list[int] = []
        self.pixels: list[np.ndarray] = []
        self.labels = np.empty(n, dtype=np.int64)

    def add_encoded(self, row: int, data: bytes, placement: Placement) -> None:
        """Send ``data`` (a plain upright JPEG) for the device to crop as ``placement`` says (a crop the
        device makes: see ``on_device``)."""
        if placement.whole is not None:
            (top, left), box = placement.offset, (0, 0, 0, 0)
            whole = (*placement.whole, top, left)
        else:
            box, whole = tuple(int(v) for v in placement.box), (-1, -1, -1, -1)
            from readers.augment import jpeg_region  # imports numba: only once a JPEG is sent

            # one component is not upsampled: the blocks under the box are all its pixels need
            context = DEVICE_CONTEXT if self.channels > 1 else 0
            part = jpeg_region.splice(data, self.channels, box, context)  # type: ignore[arg-type]
            if part is not None:  # only the MCUs under the box travel and are decoded
                jpeg, top, left = part
                data, box = jpeg.tobytes(), (box[0] - left, box[1] - top, box[2] - left, box[3] - top)
        self.chunks.append(data)
        self.rows.append(row)
        self.boxes.append(box)  # type: ignore[arg-type]
        self.wholes.append(whole)
        self.flips.append(bool(placement.flip))

    def add_pixels(self, row: int, image: np.ndarray) -> None:
        """An HWC uint8 image of the batch's size, rendered by the worker."""
        self.done.append(row)
        self.pixels.append(image)

    def batch(self) -> EncodedBatch:
        """The batch to send to the main process."""
        h, w = self.size
        data = np.frombuffer(b"".join(self.chunks), dtype=np.uint8).copy()
        pixels = np.stack(self.pixels) if self.pixels else np.empty((0, h, w, self.channels), np.uint8)
        return EncodedBatch(
            torch.from_numpy(data),
            torch.tensor(np.cumsum([len(c) for c in self.chunks], dtype=np.int64)),
            torch.tensor(self.rows, dtype=torch.int64),
            torch.tensor(self.boxes, dtype=torch.int64).reshape(-1, 4),
            torch.tensor(self.wholes, dtype=torch.int64).reshape(-1, 4),
            torch.tensor(self.flips, dtype=torch.bool),
            torch.from_numpy(np.ascontiguousarray(pixels)),
            torch.tensor(self.done, dtype=torch.int64),
            torch.from_numpy(self.labels),
            torch.tensor([self.n, self.channels, h, w], dtype=torch.int64),
        )


DEVICE_CONTEXT = 16
"""Pixels kept around a box whose MCUs are sent alone (``jpeg_region.splice``): a whole MCU of 4:2:0
(8 chroma samples) on every side, so that a device decoder whose chroma upsampling reads further
than libjpeg-turbo's 1 sample still sees under the box the neighbours the whole image gives it."""

MAX_SHRINK = 32
"""The most a crop is shrunk on the device, per side: torch's antialiased kernel on CUDA refuses
shrinking by about 94 or more (the filter no longer fits its shared memory); the worker renders
such a crop (a crop of a large ``--resize none`` image to a small size)."""


def on_device(placement: Placement, height: int, width: int) -> bool:
    """True when the device makes ``placement`` of an image of ``height`` x ``width`` as the worker
    would: a box within the image, or a ``CenterCrop(resize=)`` (whose box lies within the resized
    image), shrunk at most ``MAX_SHRINK`` times. The worker renders the others: a box that reaches
    past the image or the resized image (it pads), and ``reduced_decode`` crops (decoded at a reduced scale, which the
    device's full decode would not give)."""
    if placement.reduced:
        return False
    (oh, ow), (left, top, right, bottom) = placement.size, placement.box
    if placement.whole is not None:
        (rh, rw), (y0, x0) = placement.whole, placement.offset
        if y0 < 0 or x0 < 0 or y0 + oh > rh or x0 + ow > rw:  # padded (an image fitted into its bucket)
            return False
        (box_h, box_w) = (height, width)
    else:
        if not placement.cut or not box_inside(placement.box, (height, width)):
            return False
        (rh, rw), (box_h, box_w) = (oh, ow), (bottom - top, right - left)
    return box_h <= MAX_SHRINK * rh and box_w <= MAX_SHRINK * rw


def refusal(dataset, random_access: bool, collate_given: bool) -> Optional[str]:
    """Why ``make_loader(..., decode="device")`` cannot read ``dataset`` (a ``ReaderBase``; of npy,
    lmdb or hdf5 with ``random_access``), or None."""
    codec = dataset.layout.codec.name if dataset.layout.has_image else None
    if not random_access:
        return "it reads npy, lmdb and hdf5 outputs; tar shards (wds) are decoded in the workers"
    if codec not in ("jpeg", "source"):
        return (
            f"it decodes JPEG-stored images (--codec jpeg or source), and this output stores "
            f"{codec or 'no images'}: its images are decoded in the workers"
        )
    if getattr(dataset, "memory", None) is not None:
        return "in_memory=True holds the images decoded already: there is nothing left to decode on the device"
    if dataset.crops is None or dataset.crops.augment.crop is None:
        return "it makes batches of crops of one size: open the dataset with crop=RandomResizedCrop(N) or CenterCrop(N)"
    if dataset.one_by_one or dataset.text_fields or dataset.has_target:
        return (
            "a transform, a target_transform, return_meta, text fields or detection and segmentation targets "
            "are made per sample in the workers"
        )
    if collate_given:
        return "a collate_fn of your own gets samples, and this path sends whole batches of JPEG bytes"
    return None


class DeviceDecoder:
    """Turns ``EncodedBatch`` es into ``(images, labels)`` on ``device``: float32 normalized as
    ``normalize`` says, or uint8 (N, C, H, W) when ``normalize`` is None."""

    def __init__(self, device: Optional[torch.device], mode: str, normalize: Optional[BatchNormalize]) -> None:
        self.device = device if device is not None else torch.device("cpu")
        self.mode, self.normalize = mode, normalize
        self._jpeg = gpu_jpeg_decoder() if self.device.type == "cuda" else None

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        n, c, h, w = (int(v) for v in batch.shape)
        out = torch.empty((n, c, h, w), dtype=torch.float32, device=self.device)
        ends = batch.ends.tolist()
        starts = [0, *ends[:-1]]
        files = [batch.data[a:b] for a, b in zip(starts, ends)]
        for row, image, box, whole, flip in zip(
            batch.rows.tolist(), self._decode(files), batch.boxes.tolist(), batch.wholes.tolist(), batch.flips.tolist()
        ):
            out[row] = _crop(image, box, whole, (h, w), flip)
        if len(batch.done):
            pixels = batch.pixels.to(self.device, non_blocking=True).permute(0, 3, 1, 2)
            out[batch.done.to(self.device)] = pixels.float()
        labels = batch.labels.to(self.device, non_blocking=True)
        if self.normalize is None:
            return out.to(torch.uint8), labels
        scale, bias = self.normalize.factors(self.device)
        return out.mul_(scale).add_(bias), labels

    def _decode(self, files: list[torch.Tensor]) -> list[torch.Tensor]:
        """(C, H, W) uint8 images on the device, one per JPEG file."""
        if not files:
            return []
        if self._jpeg is not None:
            try:
                return self._jpeg(files, self.mode, self.device)
            except RuntimeError:  # one file nvJPEG does not take (arithmetic coding, odd subsampling) fails all
                return [self._one(f) for f in files]
        return [self._on_cpu(f) for f in files]

    def _one(self, data: torch.Tensor) -> torch.Tensor:
        """One file by nvJPEG, else by libjpeg-turbo as the workers decode it."""
        try:
            return self._jpeg([data], self.mode, self.device)[0]  # type: ignore[misc]
        except RuntimeError:
            return self._on_cpu(data)

    def _on_cpu(self, data: torch.Tensor) -> torch.Tensor:
        from packer.pixels.source_codec import decode_stored

        pixels = decode_stored(data.numpy().tobytes(), "jpeg", self.mode)  # HxWxC, gray too
        return torch.from_numpy(pixels).permute(2, 0, 1).to(self.device)


def _crop(image: torch.Tensor, box: list[int], whole: list[int], size: tuple[int, int], flip: bool) -> torch.Tensor:
    """The (C, H, W) float crop of one decoded image, in whole levels (as the workers' uint8 resize)."""
    if whole[0] >= 0:  # CenterCrop(resize=): the whole image resized, then the box cut from it
        wh, ww, top, left = whole
        resized = _resize(image, (wh, ww))
        cut = resized[:, top : top + size[0], left : left + size[1]]
    else:
        x0, y0, x1, y1 = box
        cut = _resize(image[:, y0:y1, x0:x1], size)
    return torch.flip(cut, dims=[2]) if flip else cut


def _resize(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Antialiased bilinear resize of a (C, H, W) image to ``size``, as float32 rounded to whole levels."""
    x = image.float()
    if tuple(x.shape[1:]) == tuple(size):
        return x
    x = F.interpolate(x[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    return x.round_().clamp_(0, 255)


def gpu_jpeg_decoder():
    """torchvision's batched nvJPEG decode, as ``fn(files, mode, device)``; ImportError that says
    what to install when torchvision is missing."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError as e:
        raise ImportError(
            "decode='device' on a CUDA device decodes JPEGs with torchvision's nvJPEG decoder: "
            "install the torchvision that matches your torch (pip install torchvision), or use "
            "decode='workers'"
        ) from e

    def decode(files: list[torch.Tensor], mode: str, device: torch.device) -> list[torch.Tensor]:
        read = ImageReadMode.GRAY if mode == "L" else ImageReadMode.RGB
        return list(decode_jpeg(files, mode=read, device=device))

    return decode
