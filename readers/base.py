"""What every reader shares: the manifest and sample layout, how samples are returned, file checks.

Readers keep only the output path and the parsed manifest in their state. File handles are opened
on first use inside the process that uses them, reopened after a fork (a handle inherited from the
parent would be shared with it), and never pickled, so datasets travel cheaply to spawned workers.
Map-style readers share ``readers.mapstyle.PackedDataset``; tensors come from ``readers.tensors``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from packer.errors import ConfigError, ManifestError
from packer.manifest import unsafe_file
from packer.records import TextField
from packer.sample_layout import SampleLayout
from packer.text import TOKEN_DTYPE
from readers.collate import SlotRing, empty_batch
from readers.remote import is_url, open_manifest
from readers.tensors import BatchNormalize, ImageConverter

Transform = Callable[[torch.Tensor], Any]


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
        self.layout = SampleLayout.from_manifest(self.manifest)
        self.text_fields = self.manifest.text_fields

    def batch_tensor(self, n: int) -> tuple[Optional[int], torch.Tensor]:
        """``(ring slot or None, empty (n, C, H, W) batch tensor)`` for this reader's fixed image size:
        a free slot of make_loader's ring when there is one, else fresh (shared) memory. Float32 when
        normalizing, contiguous; otherwise the stored dtype in the stored NHWC byte order."""
        h, w, c = self.layout.shape
        out_dtype = self.convert.batch_dtype(self.layout.np_dtype)
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
        unsafe = unsafe_file(p, self.root)
        if unsafe:
            raise ManifestError(f"{p} {unsafe}; the output is damaged: run packer verify {self.root}")
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
        return self.layout.fixed_images

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
