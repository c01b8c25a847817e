"""WebDataset shards: plain tar files ``NAME.tar`` of ``KEY.EXT`` members.

Each sample is three members sharing a key (the zero-padded position of the source file in the
sorted listing): ``KEY.npy`` (the HxWxC image; ``KEY.jpg`` or ``KEY.png`` with an encoding codec),
``KEY.cls`` (the label, ASCII) and ``KEY.json`` (``{"key": relative source path, "label": int,
"crc32": CRC-32 of the sample's stored bytes}``). Text fields add ``KEY.txt`` (UTF-8),
``KEY.tokens.npy`` (int32 token ids) or ``KEY.data.json`` members, and a side file
``NAME.FIELD.lengths.npy`` (int64, one length per sample) so that lengths are known without reading
the tar; text-only samples have no image member. ``webdataset.WebDataset(urls).decode()`` reads
them unchanged (``.decode("rgb8")`` for uint8 pixels of jpg/png members).

Other loaders get their indexes too: ``NAME.idx`` beside each tar (NVIDIA DALI's ``wds2idx``
format, from the offsets the writer knows) and one ``shardindex.json`` for the output (``wids``'
shard list, made from the manifest by ``output_files``).

The tar is POSIX ustar, as webdataset's own TarWriter (through ``tarfile``) writes it, but not
through webdataset, whose import pulls in torch: two seconds and a large address space in every
converter process that has no use for torch. Member times, owners and modes are fixed so equal
inputs give byte-identical tars, whatever the Python version.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import ClassVar, Iterator, Optional

import numpy as np

from packer.formats.base import HashedFile, TokenBuffer, encoded_bytes
from packer.records import Sample, StoredSample
from packer.spec.codecs import CODECS, NpyDecoder, encode_npy, image_extension, npy_header
from packer.spec.errors import ManifestError
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.sample_layout import ImageStorage, SampleLayout, choose
from packer.spec.shard_names import (
    DALI_INDEX,
    DALI_INDEX_VERSION,
    NPY_IMAGE_SHAPES,
    TAR_MEMBERS,
    TAR_SUFFIX,
    TAR_TOKEN_MEMBERS,
    WIDS_INDEX,
    tar_member_key,
    wds_lengths_suffix,
)
from packer.spec.tario import USTAR_OWNER, decode_tar_sample, iter_shard_samples, packer_header, tar_fields
from packer.spec.token_blocks import POSITION_DTYPE


def ustar_header(name: str, size: int) -> bytes:
    """The 512-byte POSIX ustar header of a regular file member ``name`` of ``size`` bytes with the
    fixed owner, mode and time: what ``tarfile.TarInfo.tobuf(USTAR_FORMAT)`` gives for it, made
    from a template (tarfile builds it field by field, three times per sample, a noticeable part of
    a conversion). Names that are not short ASCII go through tarfile, which splits long ones."""
    try:
        raw = name.encode("ascii")
    except UnicodeEncodeError:
        raw = b""
    if not raw or len(raw) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, 0, 0o444
        info.uname = info.gname = USTAR_OWNER
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    return packer_header(raw, size)


class WdsWriter:
    """Writes one shard as a tar file: headers from ``ustar_header``, data written straight from
    the sample's buffers (TarFile.addfile would copy each member through a BytesIO)."""

    name: ClassVar[str] = "wds"

    def __init__(self, directory: Path, shard: str, layout: SampleLayout, capacity: int) -> None:
        self.directory, self.shard = Path(directory), shard
        self.file_name = f"{shard}{TAR_SUFFIX}"
        self.layout = layout
        # The parts of a sample's image member: an .npy of raw pixels, or the encoded file bytes.
        self._image = choose(
            layout,
            {
                ImageStorage.FIXED: _npy_parts,
                ImageStorage.VARIABLE: _npy_parts,
                ImageStorage.ENCODED: lambda sample: (encoded_bytes(sample, layout),),
                ImageStorage.NONE: None,
            },
            self.name,
        )
        self._members = TAR_MEMBERS[:-1] + (("image",) if layout.has_image else ())
        self._f = HashedFile(self.directory / self.file_name)  # in order: nobody reads it back for the manifest
        self._offset = 0
        self.lengths: dict[str, list[int]] = {f.name: [] for f in layout.text}
        self.shapes: Optional[list[tuple[int, ...]]] = [] if layout.sizes_indexed else None
        self.digests: dict[str, str] = {}
        self._index: list[str] = []  # one DALI index line per sample
        self._components: list[str] = []  # the current sample's members: "EXT OFFSET SIZE NAME"

    def _member(self, name: str, *parts) -> None:
        size = sum(memoryview(p).nbytes for p in parts)
        header = ustar_header(name, size)
        pad = -size % tarfile.BLOCKSIZE
        for part in (header, *parts, tarfile.NUL * pad):
            self._f.write(part)
        # DALI's index gives each member's extension (after the first dot), data offset and size.
        self._components.append(f"{name.partition('.')[2]} {self._offset + len(header)} {size} {name}")
        self._offset += len(header) + size + pad

    def add(self, sample: Sample) -> None:
        """Write the sample's members: label, metadata, image, then each text field."""
        key = tar_member_key(sample.index)
        image = self._image(sample) if self._image is not None else ()
        values = {
            "cls": (CODECS["cls"].encode(sample.label),),
            "json": (CODECS["json"].encode({"key": sample.key, "label": sample.label, "crc32": sample.crc32}),),
        }
        for ext in self._members:
            if ext == "image":  # KEY.npy, .jpg or .png; with --codec source, the extension of each image's bytes
                ext = image_extension(self.layout.codec.name, image[0] if image else None)
            self._member(f"{key}.{ext}", *values.get(ext, image))
        if self.shapes is not None:
            self.shapes.append(sample.image.shape)
        for f in self.layout.text:
            value = sample.fields[f.name]
            self.lengths[f.name].append(len(value) // f.itemsize)
            parts = f.kind_of.tar_member(value)  # None: no member (a json missing with --allow-missing)
            if parts is not None:
                self._member(f"{key}.{f.kind_of.member}", *parts)
        self._index.append(" ".join(self._components))
        self._components.clear()

    def close(self) -> list[str]:
        """Write the tar end marker (two zero blocks, then zeros to a whole record, as tarfile does) and close."""
        end = tarfile.NUL * (2 * tarfile.BLOCKSIZE)
        self._offset += len(end)
        end += tarfile.NUL * (-self._offset % tarfile.RECORDSIZE)
        self._f.write(end)
        self._f.file.close()
        self.digests[self.file_name] = self._f.hexdigest()
        names = [self.file_name, f"{self.shard}{DALI_INDEX}"]
        index = "".join(f"{line}\n" for line in (f"{DALI_INDEX_VERSION} {len(self._index)}", *self._index))
        (self.directory / names[-1]).write_text(index, encoding="ascii")
        for name, lengths in self.lengths.items():
            names.append(f"{self.shard}{wds_lengths_suffix(name)}")
            np.save(self.directory / names[-1], np.asarray(lengths, dtype=np.int64), allow_pickle=False)
        if self.shapes is not None:  # images of varying size: (H, W, C) of each, known without the tar
            names.append(f"{self.shard}{NPY_IMAGE_SHAPES}")
            np.save(self.directory / names[-1], np.asarray(self.shapes, np.int64).reshape(-1, 3), allow_pickle=False)
        return names


class WdsTokenWriter(TokenBuffer):
    """One tar token shard ``NAME.tar``: the members ``shard.blocks.npy`` (N x 2 uint32: each block's
    start and length in the stream), ``shard.documents.npy`` (uint32: where each document, or the
    piece of one, starts) and ``shard.tokens.npy`` (the stream), as the npy token shard's files;
    ``webdataset.WebDataset(url).decode()`` gives the shard as one sample of the three arrays."""

    max_stream_bytes: ClassVar[int] = 8**11 - 1 - 128
    """The largest stream a shard holds: a ustar member is under 8 GiB (less the .npy header)."""

    def __init__(self, directory: Path, shard: str, dtype: np.dtype, tokens: int) -> None:
        super().__init__(dtype, tokens)
        self.path = Path(directory) / f"{shard}{TAR_SUFFIX}"

    def close(self, spans: np.ndarray, documents: np.ndarray) -> list[str]:
        """Write the shard's tar, hashed as it is written; its name."""
        members = (
            (encode_npy(np.asarray(spans).astype(POSITION_DTYPE)),),
            (encode_npy(np.asarray(documents).astype(POSITION_DTYPE)),),
            (npy_header(self.ids.dtype.str, (self.count,)), self.stream.data),
        )
        f, offset = HashedFile(self.path), 0
        try:
            for name, parts in zip(TAR_TOKEN_MEMBERS, members):
                size = sum(memoryview(p).nbytes for p in parts)
                pad = tarfile.NUL * (-size % tarfile.BLOCKSIZE)
                for part in (ustar_header(name, size), *parts, pad):
                    f.write(part)
                offset += tarfile.BLOCKSIZE + size + len(pad)
            end = tarfile.NUL * (2 * tarfile.BLOCKSIZE)  # the end marker, then zeros to a record, as tarfile
            f.write(end + tarfile.NUL * (-(offset + len(end)) % tarfile.RECORDSIZE))
        finally:
            f.file.close()
        self.digests[self.path.name] = f.hexdigest()
        return [self.path.name]


def _sample_offset(directory: Path, shard: ShardEntry, tar: Path, start: int) -> tuple[int, int]:
    """``(offset of the header of sample start's first member, start)`` from the shard's DALI index,
    checked against the tar (the member name there); ``(0, 0)`` without an index or when it does not match."""
    index = [f.path for f in shard.files if f.path.endswith(DALI_INDEX)]
    if not index:
        return 0, 0
    lines = (directory / index[0]).read_text(encoding="ascii").splitlines()
    if start + 1 >= len(lines):
        return 0, 0
    parts = lines[start + 1].split(" ")
    data, name = int(parts[1]), parts[3]
    header = data - tarfile.BLOCKSIZE  # names of a key and an extension fit one ustar header
    with open(tar, "rb") as f:
        f.seek(max(header, 0))
        block = f.read(tarfile.BLOCKSIZE)
    if header < 0 or block[:100].rstrip(b"\0") != name.encode("ascii", "replace"):
        return 0, 0
    return header, start


def scan_index(directory: Path, shard: ShardEntry, layout: SampleLayout) -> tuple[list[str], np.ndarray]:
    """The keys and stored CRC-32s of a shard's samples, from its ``KEY.json`` members alone: found
    through ``NAME.idx`` (format version 7), else by walking the tar's headers (``iter_shard_samples``)."""
    metas: list[bytes] = []
    tar_path = directory / shard.file(TAR_SUFFIX)
    index = [f.path for f in shard.files if f.path.endswith(DALI_INDEX)]
    if index:
        with open(tar_path, "rb") as f:
            for line in (directory / index[0]).read_text(encoding="ascii").splitlines()[1:]:
                parts = line.split(" ")
                for at in range(0, len(parts) - 3, 4):
                    if parts[at] == "json":
                        f.seek(int(parts[at + 1]))
                        metas.append(f.read(int(parts[at + 2])))
    else:
        metas = [fields["json"] for fields in iter_shard_samples(tar_path) if "json" in fields]
    if len(metas) != shard.samples:
        raise ValueError(f"{shard.name}: {len(metas)} samples in its tar; the manifest says {shard.samples}")
    decoded = [json.loads(m) for m in metas]
    return [str(d["key"]) for d in decoded], np.asarray([int(d["crc32"]) for d in decoded], dtype=np.int64)


def output_files(manifest: Manifest) -> dict[str, bytes]:
    """The files of a tar-shard output made from its manifest: ``shardindex.json``, the shard list of
    ``wids.ShardListDataset`` (as its ``widsindex create`` writes it, without the MD5 sums: the
    manifest's SHA-256 covers the files). None for a token output: its tars hold one sample each, the
    shard's arrays, not its blocks."""
    if manifest.tokens is not None:
        return {}
    shards = [
        {
            "url": s.file(TAR_SUFFIX),
            "nsamples": s.samples,
            "filesize": next(f.bytes for f in s.files if f.path.endswith(TAR_SUFFIX)),
        }
        for s in manifest.shards
    ]
    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shards}
    return {WIDS_INDEX: (json.dumps(index, indent=1) + "\n").encode("utf-8")}


def _npy_parts(sample: Sample) -> tuple:
    """The ``KEY.npy`` member of a raw image: its .npy header, then its pixels."""
    pixels = np.ascontiguousarray(sample.image)
    return npy_header(pixels.dtype.str, pixels.shape), pixels.data


def scan_shard(directory: Path, shard: ShardEntry, layout: SampleLayout, start: int = 0) -> Iterator[StoredSample]:
    """Every sample of one shard from sample ``start`` on, in order, read with numpy alone (encoded
    images as their bytes, the text fields as theirs; the tar's headers walked by
    ``iter_shard_samples``, which refuses what packer never writes). With ``NAME.idx`` (format
    version 7) the tar is read from that sample's first member on; older shards from the start."""
    stored = _Stored(directory, shard, layout)
    tar = directory / shard.file(TAR_SUFFIX)
    offset, first = _sample_offset(directory, shard, tar, start) if start else (0, 0)
    n = first
    samples = iter_shard_samples(tar, offset=offset)
    for n, fields in enumerate(samples, start=first + 1):
        if n <= start:
            continue
        try:
            sample = stored(n - 1, fields)
        except ManifestError:
            next(samples, None)  # a sample cut short by a break in the tar: the walk's error names the break
            raise
        yield sample
    if n != shard.samples:
        raise ValueError(f"{shard.name}: the tar holds {n} samples; the manifest says {shard.samples}")


def scan_intact_shard(directory: Path, shard: ShardEntry, layout: SampleLayout) -> Iterator[StoredSample]:
    """``scan_shard`` of a shard whose files verify found as the manifest records them (their
    SHA-256): their bytes are the writer's, so each member is sliced from the tar where the shard's
    ``NAME.idx`` says it is, its headers not walked again; every sample is still decoded and checked
    against its CRC-32 by the caller. Shards without the index (before format version 7) are walked."""
    index = [f.path for f in shard.files if f.path.endswith(DALI_INDEX)]
    if not index:
        yield from scan_shard(directory, shard, layout)
        return
    stored = _Stored(directory, shard, layout)
    lines = (directory / index[0]).read_text(encoding="ascii").splitlines()[1:]
    buf, start = b"", 0  # the window: buf holds the tar's bytes from offset start on
    with open(directory / shard.file(TAR_SUFFIX), "rb") as f:
        for n, line in enumerate(lines):
            parts = line.split(" ")  # per member: extension, data offset, size, member name
            fields = {"__key__": parts[3].partition(".")[0]}
            for at in range(0, len(parts) - 3, 4):
                offset, size = int(parts[at + 1]), int(parts[at + 2])
                if offset < start or offset + size > start + len(buf):
                    f.seek(offset)
                    buf, start = f.read(max(_WINDOW, size)), offset
                fields[parts[at]] = buf[offset - start : offset - start + size]
            yield stored(n, fields)
    if len(lines) != shard.samples:
        raise ValueError(f"{shard.name}: its index lists {len(lines)} samples; the manifest says {shard.samples}")


_WINDOW = 1 << 22
"""Bytes of the tar ``scan_intact_shard`` reads at once (a member larger than that alone)."""


class _Stored:
    """A shard's grouped tar samples (``{"__key__": KEY, EXT: bytes}``) as the ``StoredSample`` that
    verify checks: decoded as readers decode them, with the size its shard indexes."""

    def __init__(self, directory: Path, shard: ShardEntry, layout: SampleLayout) -> None:
        self.shard, self.layout = shard, layout
        self.codec = layout.codec.name if layout.has_image else None
        self.npy = NpyDecoder()  # the images of a shard share one .npy header: parsed once
        self.shapes = None
        if layout.sizes_indexed and any(f.path.endswith(NPY_IMAGE_SHAPES) for f in shard.files):  # format version 6
            self.shapes = np.load(directory / shard.file(NPY_IMAGE_SHAPES), allow_pickle=False)

    def __call__(self, local: int, fields: dict) -> StoredSample:
        """Sample ``local`` of the shard; ManifestError when it is damaged."""
        pixels, label, meta = decode_tar_sample(fields, self.shard.name, self.codec, self.npy)
        stored = tar_fields(fields, self.layout.text, self.shard.name)
        key, crc = meta.get("key", fields["__key__"]), int(meta.get("crc32", -1))
        shapes = self.shapes
        shape = tuple(int(v) for v in shapes[local]) if shapes is not None and local < len(shapes) else None
        if self.layout.image is not ImageStorage.ENCODED:
            return StoredSample(local, key, label, pixels, crc, None, stored, shape)
        return StoredSample(local, key, label, None, crc, pixels, stored, shape)
