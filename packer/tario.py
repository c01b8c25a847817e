"""Reading tar shards as samples, in memory only: shared by ``packer verify`` and the wds reader."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from packer.codecs import CODECS, IMAGE_EXTENSIONS
from packer.errors import ManifestError
from packer.records import TextField
from packer.shard_names import TEXT_MEMBERS
from packer.text import TOKEN_DTYPE


def iter_tar_samples(source: Union[Path, IO[bytes]], name: Optional[str] = None,
                     size: Optional[int] = None, offset: int = 0) -> Iterator[dict]:
    """Group a tar's members into samples: ``{"__key__": KEY, EXT: bytes, ...}``, in stored order.

    ``source`` is a path (read with seeks) or a readable binary stream (read sequentially). Members are
    read into memory only; a member with an absolute path or ``..`` is refused, so a crafted tar
    cannot point anywhere. ``size`` is the shard's size in bytes (the manifest's; for a path, its
    file's size when not given): a member whose header claims more bytes than are left in it is
    refused before it is read, so memory stays bounded by the shard's size. Errors are ManifestError
    naming the shard. ``offset`` (a path only): where to start, the header of a sample's first member.
    """
    name = name or str(source)
    if isinstance(source, Path):
        try:
            with open(source, "rb") as f:
                budget = size if size is not None else os.fstat(f.fileno()).st_size
                f.seek(offset)  # tarfile starts at the file's position
                yield from _grouped(_open_tar(_Capped(f, budget), "r:", name), name, f, budget)  # type: ignore[arg-type]
        except OSError as e:
            raise ManifestError(f"{name} cannot be read ({e.strerror}); the shard is damaged") from None
    else:
        yield from _grouped(_open_tar(source, "r|", name), name, None, size)


_SMALL_READ = 1 << 16  # reads up to this size need no cap: they cannot take much memory


class _Capped:
    """A seekable file that reads nothing past ``size`` bytes: tarfile reads a long name's or a pax
    header's payload in one call of the size its header claims (gigabytes, in a crafted tar)."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self.f, self.size = f, size

    def read(self, n: int = -1) -> bytes:
        if n is not None and 0 <= n <= _SMALL_READ:  # headers (512 bytes): bounded already, and the hot path
            return self.f.read(n)
        left = max(self.size - self.f.tell(), 0)
        return self.f.read(left if n is None or n < 0 else min(n, left))

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


def _open_tar(f: IO[bytes], mode: str, name: str) -> tarfile.TarFile:
    """``tarfile.open`` reads the first header at once: a damaged one is a packer error naming the
    shard too, like every later one (``_grouped``), never a bare ReadError."""
    try:
        return tarfile.open(fileobj=f, mode=mode)
    except (tarfile.TarError, EOFError) as e:
        raise ManifestError(f"{name} is not a complete tar file ({e or type(e).__name__}); the shard is damaged") \
            from None


def _grouped(tar: tarfile.TarFile, name: str, f: Optional[IO[bytes]], budget: Optional[int]) -> Iterator[dict]:
    """Members of ``tar`` grouped by key; with ``f``, the seekable file under it, member data is read
    from it in one call (twice as fast as tarfile's own file objects for large members). A member
    reaching past ``budget`` bytes (the shard's size) is refused before its data is read."""
    current: dict = {}
    try:
        with tar:
            for info in tar:
                if not info.isfile():
                    continue
                member = PurePosixPath(info.name)
                if member.is_absolute() or ".." in member.parts:
                    raise ManifestError(f"{name}: member {info.name!r} has an unsafe path; refusing to read it")
                if budget is not None and info.offset_data + info.size > budget:
                    left = max(budget - info.offset_data, 0)
                    raise ManifestError(f"{name}: member {info.name!r} claims {info.size} bytes, more than the {left} "
                                        f"left in the shard's {budget} bytes; the shard is damaged")
                key, _, ext = member.name.partition(".")
                if member.parent.as_posix() != ".":
                    key = f"{member.parent.as_posix()}/{key}"
                if current and key != current["__key__"]:
                    yield current
                    current = {}
                current["__key__"] = key
                if f is not None:
                    f.seek(info.offset_data)  # tarfile seeks back to the next header by itself
                    data = f.read(info.size)
                    if len(data) != info.size:
                        raise EOFError(f"member {info.name} is cut short")
                    current[ext] = data
                else:
                    current[ext] = tar.extractfile(info).read()  # type: ignore[union-attr]
    except (tarfile.TarError, EOFError, OSError) as e:
        detail = e or type(e).__name__
        raise ManifestError(f"{name} is not a complete tar file ({detail}); the shard is damaged") from None
    if current:
        yield current


def decode_tar_sample(
    fields: dict, name: str = "tar", codec: Optional[str] = "raw", npy: Optional[Callable[[bytes], np.ndarray]] = None
) -> tuple[Union[np.ndarray, bytes, None], int, dict]:
    """(image, label, json metadata) of one grouped tar sample; ManifestError when it is damaged.

    The image is the decoded ``KEY.npy`` array for ``codec`` raw, else the bytes of ``KEY.jpg`` or
    ``KEY.png`` as stored (``packer.codecs.decode_image`` decodes them); None for ``codec`` None
    (an output without images). ``npy`` decodes the ``KEY.npy`` bytes (a ``codecs.NpyDecoder``
    to parse a shard's shared header once).
    """
    try:
        meta = CODECS["json"].decode(fields["json"]) if "json" in fields else {}
        if not isinstance(meta, dict):
            raise ValueError(f"KEY.json holds {type(meta).__name__}, not an object")
        if codec is None:
            image = None
        else:
            image = ((npy or CODECS["npy"].decode)(fields["npy"]) if codec == "raw"
                     else fields[_image_member(fields, codec)])
        return image, CODECS["cls"].decode(fields["cls"]), meta
    except (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{name}: sample {fields.get('__key__')} is damaged ({type(e).__name__}: {e})") from None


def _image_member(fields: dict, codec: str) -> str:
    """The extension of a sample's image member: the codec's, or with ``source`` (JPEG or PNG per
    image) whichever of ``jpg`` and ``png`` the sample has."""
    if codec != "source":
        return IMAGE_EXTENSIONS[codec]
    return "jpg" if "jpg" in fields else "png"


def tar_fields(fields: dict, text: Sequence[TextField], name: str = "tar") -> dict[str, bytes]:
    """The stored bytes of each of a grouped tar sample's ``text`` fields, as the other formats hold
    them (token ids as raw int32, not ``.npy``; a json field without its member, empty);
    ManifestError when a member is missing or damaged."""
    out: dict[str, bytes] = {}
    for f in text:
        member = TEXT_MEMBERS[f.kind]
        try:
            data = fields.get(member, b"") if f.kind == "json" else fields[member]  # no json member: missing
            if f.kind == "tokens":
                ids = CODECS["npy"].decode(data)
                if ids.dtype != TOKEN_DTYPE or ids.ndim != 1:
                    raise ValueError(f"KEY.{member} holds {ids.dtype} {ids.shape}, not 1-D int32 token ids")
                data = ids.tobytes()
        except (KeyError, ValueError) as e:
            raise ManifestError(f"{name}: sample {fields.get('__key__')} is damaged "
                                f"({type(e).__name__}: {e})") from None
        out[f.name] = data
    return out
