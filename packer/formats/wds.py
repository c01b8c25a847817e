"""WebDataset shards: plain tar files ``NAME.tar`` of ``KEY.EXT`` members.

Each sample is three members sharing a key (the zero-padded position of the source file in the
sorted listing): ``KEY.npy`` (the HxWxC image; ``KEY.jpg`` or ``KEY.png`` with an encoding codec),
``KEY.cls`` (the label, ASCII) and ``KEY.json`` (``{"key": relative source path, "label": int,
"crc32": CRC-32 of the image's stored bytes}``). ``webdataset.WebDataset(urls).decode()`` reads
them unchanged (``.decode("rgb8")`` for uint8 pixels of jpg/png members).

The tar is written with the standard library's ``tarfile`` (POSIX ustar, as webdataset's own
TarWriter does) rather than through webdataset, whose import pulls in torch: two seconds and a
large address space in every converter process that has no use for torch. Member times, owners
and modes are fixed so equal inputs give byte-identical tars.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import ClassVar, Iterator

from packer.codecs import CODECS, IMAGE_EXTENSIONS
from packer.formats.base import ImageLayout, encoded_bytes
from packer.layout import TAR_MEMBERS, TAR_SUFFIX, tar_member_key
from packer.manifest import ShardEntry
from packer.records import Sample, StoredSample
from packer.tario import decode_tar_sample, iter_tar_samples


class WdsWriter:
    """Writes one shard as a tar file."""

    name: ClassVar[str] = "wds"
    variable_shape: ClassVar[bool] = True

    def __init__(self, directory: Path, shard: str, layout: ImageLayout, capacity: int) -> None:
        self.file_name = f"{shard}{TAR_SUFFIX}"
        self.layout = layout
        self._members = TAR_MEMBERS[:-1] + (IMAGE_EXTENSIONS[layout.codec.name],)
        self._tar = tarfile.open(Path(directory) / self.file_name, "w", format=tarfile.USTAR_FORMAT)

    def add(self, sample: Sample) -> None:
        """Write the sample's three members."""
        key = tar_member_key(sample.index)
        image = encoded_bytes(sample, self.layout) if self.layout.codec.encoded else CODECS["npy"].encode(sample.image)
        values = {
            "cls": CODECS["cls"].encode(sample.label),
            "json": CODECS["json"].encode({"key": sample.key, "label": sample.label, "crc32": sample.crc32}),
        }
        for ext in self._members:
            data = values.get(ext, image)
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o444
            info.uname = info.gname = "packer"
            self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> list[str]:
        """Write the tar end marker and close."""
        self._tar.close()
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
