"""WebDataset shards: plain tar files ``NAME.tar`` of ``KEY.EXT`` members.

Each sample is three members sharing a key (the zero-padded position of the source file in the
sorted listing): ``KEY.npy`` (the HxWxC image; ``KEY.jpg`` or ``KEY.png`` with an encoding codec),
``KEY.cls`` (the label, ASCII) and ``KEY.json`` (``{"key": relative source path, "label": int,
"crc32": CRC-32 of the image's stored bytes}``). ``webdataset.WebDataset(urls).decode()`` reads
them unchanged (``.decode("rgb8")`` for uint8 pixels of jpg/png members).

The tar is written with the standard library's ``tarfile`` headers (POSIX ustar, as webdataset's
own TarWriter does) rather than through webdataset, whose import pulls in torch: two seconds and a
large address space in every converter process that has no use for torch. Member times, owners
and modes are fixed so equal inputs give byte-identical tars.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np

from packer.codecs import CODECS, IMAGE_EXTENSIONS, npy_header
from packer.formats.base import ImageLayout, encoded_bytes
from packer.layout import TAR_MEMBERS, TAR_SUFFIX, tar_member_key
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample
from packer.tario import decode_tar_sample, iter_tar_samples


class WdsWriter:
    """Writes one shard as a tar file: headers made by ``tarfile.TarInfo``, data written straight
    from the sample's buffers (TarFile.addfile would copy each member through a BytesIO)."""

    name: ClassVar[str] = "wds"
    variable_shape: ClassVar[bool] = True

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        self.file_name = f"{shard}{TAR_SUFFIX}"
        self.layout = layout
        self._members = TAR_MEMBERS[:-1] + (IMAGE_EXTENSIONS[layout.codec.name],)
        self._f = open(Path(directory) / self.file_name, "wb")
        self._offset = 0

    def _member(self, name: str, *parts) -> None:
        size = sum(memoryview(p).nbytes for p in parts)
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, 0, 0o444
        info.uname = info.gname = "packer"
        header = info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
        pad = -size % tarfile.BLOCKSIZE
        for part in (header, *parts, tarfile.NUL * pad):
            self._f.write(part)
        self._offset += len(header) + size + pad

    def add(self, sample: Sample) -> None:
        """Write the sample's three members."""
        key = tar_member_key(sample.index)
        if self.layout.codec.encoded:
            image: tuple = (encoded_bytes(sample, self.layout),)
        else:
            pixels = np.ascontiguousarray(sample.image)
            image = (npy_header(pixels.dtype.str, pixels.shape), pixels.data)
        values = {
            "cls": (CODECS["cls"].encode(sample.label),),
            "json": (CODECS["json"].encode({"key": sample.key, "label": sample.label, "crc32": sample.crc32}),),
        }
        for ext in self._members:
            self._member(f"{key}.{ext}", *values.get(ext, image))

    def close(self) -> list[str]:
        """Write the tar end marker (two zero blocks, then zeros to a whole record, as tarfile does) and close."""
        end = tarfile.NUL * (2 * tarfile.BLOCKSIZE)
        self._offset += len(end)
        self._f.write(end + tarfile.NUL * (-self._offset % tarfile.RECORDSIZE))
        self._f.close()
        return [self.file_name]


def scan_shard(directory: Path, shard: ShardEntry, codec: str = "raw") -> Iterator[StoredSample]:
    """Every sample of one shard, in order, read with tarfile and numpy alone (encoded images as
    their bytes)."""
    n = 0
    for n, fields in enumerate(iter_tar_samples(directory / shard.file(TAR_SUFFIX)), start=1):
        image, label, meta = decode_tar_sample(fields, shard.name, codec)
        key, crc = meta.get("key", fields["__key__"]), int(meta.get("crc32", -1))
        if codec == "raw":
            yield StoredSample(n - 1, key, label, image, crc)
        else:
            yield StoredSample(n - 1, key, label, None, crc, image)
    if n != shard.samples:
        raise ValueError(f"{shard.name}: the tar holds {n} samples; the manifest says {shard.samples}")
