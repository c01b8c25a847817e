"""Reading tar shards as samples, in memory only: shared by ``packer verify`` and the wds reader.

``iter_tar_samples`` reads any tar (a local file or a stream) through ``tarfile``.
``iter_shard_samples`` reads a tar shard on disk by walking its 512-byte ustar headers itself, in
large reads (tarfile parses every header field by field in Python, most of the CPU of a scan): a
header as packer writes it is checked byte for byte against ``packer_header``, any other parsed as
tarfile parses it, and what packer never writes is refused.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from packer.spec.codecs import CODECS, IMAGE_EXTENSIONS
from packer.spec.entries import TextField
from packer.spec.errors import ManifestError

USTAR_OWNER = "packer"
"""User and group name of every member packer writes (uid and gid 0, mode 0444, mtime 0)."""

_BLOCK = tarfile.BLOCKSIZE
_BEFORE_SIZE = b"0000444\0" + b"0000000\0" * 2  # mode, uid, gid: octal digits and a NUL, as tarfile writes them
_AFTER_SIZE = b"00000000000\0"  # mtime 0
_AFTER_CHECKSUM = (
    b"0" + bytes(100) + tarfile.POSIX_MAGIC + USTAR_OWNER.encode().ljust(32, b"\0") * 2 + bytes(16 + 155 + 12)
)  # regular file, no link, ustar magic, owners, no device, no prefix
_FIXED_SUM = sum(_BEFORE_SIZE) + sum(_AFTER_SIZE) + sum(b" " * 8) + sum(_AFTER_CHECKSUM)


def packer_header(raw: bytes, size: int) -> bytes:
    """The 512-byte ustar header packer writes for a regular file member named ``raw`` (at most 100
    bytes, no NUL) of ``size`` bytes (below 8**11), with the fixed owner, mode and time."""
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(raw) + sum(size_field)
    return b"".join(
        (raw, bytes(100 - len(raw)), _BEFORE_SIZE, size_field, _AFTER_SIZE, b"%06o\0 " % checksum, _AFTER_CHECKSUM)
    )


def iter_tar_samples(
    source: Union[Path, IO[bytes]], name: Optional[str] = None, size: Optional[int] = None, offset: int = 0
) -> Iterator[dict]:
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
        raise ManifestError(
            f"{name} is not a complete tar file ({e or type(e).__name__}); the shard is damaged"
        ) from None


def _grouped(tar: tarfile.TarFile, name: str, f: Optional[IO[bytes]], budget: Optional[int]) -> Iterator[dict]:
    """Members of ``tar`` grouped by key; with ``f``, the seekable file under it, member data is read
    from it in one call (twice as fast as tarfile's own file objects for large members). A member
    reaching past ``budget`` bytes (the shard's size) is refused before its data is read."""
    current: dict = {}
    try:
        with tar:
            while (info := tar.next()) is not None:
                tar.members.clear()  # tarfile keeps every header it read: memory that grew with the shard
                if not info.isfile():
                    continue
                member = PurePosixPath(info.name)
                if member.is_absolute() or ".." in member.parts:
                    raise ManifestError(f"{name}: member {info.name!r} has an unsafe path; refusing to read it")
                if budget is not None and info.offset_data + info.size > budget:
                    left = max(budget - info.offset_data, 0)
                    raise ManifestError(
                        f"{name}: member {info.name!r} claims {info.size} bytes, more than the {left} "
                        f"left in the shard's {budget} bytes; the shard is damaged"
                    )
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


# -- packer's own shards, walked without tarfile ----------------------------------------------------------------------

_WINDOW = 1 << 22  # bytes per read: headers and small members are sliced out of one large read
_ZERO_BLOCK = bytes(_BLOCK)
_ZERO_NAME = bytes(100)
_NOT_FILES = {
    b"x": "a pax extended header",
    b"g": "a pax global header",
    b"L": "a GNU long name",
    b"K": "a GNU long link name",
    b"S": "a GNU sparse file",
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"5": "a directory",
    b"6": "a FIFO",
}


def iter_shard_samples(path: Path, name: Optional[str] = None, offset: int = 0) -> Iterator[dict]:
    """The samples of a tar shard on disk, as ``iter_tar_samples`` groups them, from the header at
    byte ``offset`` (a sample's first member) on; its headers are read here, not by tarfile.

    Any tar packer writes yields what ``iter_tar_samples`` yields. Refused with a ManifestError naming
    the shard and the byte where it breaks: a header whose checksum does not match (after the first,
    tarfile takes one for the end of the tar and stops quietly), a member running past the end of the
    file, a file cut short, an unsafe member path, and every kind of member packer never writes (pax
    headers, GNU long names, links, directories). The sample in progress at a break is yielded
    first, with the members read before it: it may lack some (``scan_shard`` then reports the break).
    """
    name = name or str(path)
    try:
        with open(path, "rb") as f:
            yield from _walk(f, name, os.fstat(f.fileno()).st_size, offset)
    except OSError as e:
        raise ManifestError(f"{name} cannot be read ({e.strerror}); the shard is damaged") from None


def _walk(f: IO[bytes], name: str, end: int, pos: int) -> Iterator[dict]:
    """``iter_shard_samples`` of the open file ``f`` of ``end`` bytes, from the header at ``pos``."""
    buf, start = b"", pos  # the window: buf holds the file's bytes from offset start on
    current: dict = {}
    try:
        while True:
            if pos + _BLOCK > start + len(buf):
                f.seek(pos)
                buf, start = f.read(_WINDOW), pos
            at = pos - start
            block = buf[at : at + _BLOCK]
            ours = _packer_member(block)
            if ours is not None:
                member, size = ours
                key, _, ext = member.partition(".")
            elif block == _ZERO_BLOCK:
                break  # the end marker
            elif len(block) < _BLOCK:
                where = "without its end marker" if len(block) == 0 else "inside a header"
                raise ManifestError(f"{name}: the tar ends at byte {end} {where}; the shard is cut short")
            else:
                member, key, ext, size = _parse_header(block, name, pos)
            data = pos + _BLOCK
            if data + size > end:
                raise ManifestError(
                    f"{name}: member {member!r} (header at byte {pos}) claims {size} bytes, more "
                    f"than the {max(end - data, 0)} left in the shard's {end} bytes; "
                    "the shard is damaged"
                )
            if current and key != current["__key__"]:
                yield current
                current = {}
            at = data - start
            if at + size <= len(buf):
                value = buf[at : at + size]
            else:  # past the window: read the member alone (a large one), or the next window from it
                f.seek(data)
                if size >= _WINDOW:
                    value = f.read(size)
                else:
                    buf, start = f.read(_WINDOW), data
                    value = buf[:size]
                if len(value) != size:
                    raise ManifestError(
                        f"{name}: member {member!r} (header at byte {pos}) is cut short; the shard is damaged"
                    )
            current["__key__"] = key
            current[ext] = value
            pos = data + size + (-size % _BLOCK)
    except ManifestError:
        if current:  # its members were read whole: the break comes after them (tarfile yields it too)
            yield current
        raise
    if current:
        yield current


def _packer_member(block: bytes) -> Optional[tuple[str, int]]:
    """``(name, size)`` of a header that is byte for byte ``packer_header(name, size)`` for a name
    without a ``/``, else None. Compared field by field in place: rebuilding the header to compare
    costs more, and there are three per sample."""
    cut = block.find(0, 0, 100)
    if cut < 0:
        cut = 100
    raw, digits = block[:cut], block[124:135]
    if not (
        digits.isdigit()
        and block[135] == 0
        and block[cut:124] == _ZERO_NAME[cut:] + _BEFORE_SIZE
        and block[136:148] == _AFTER_SIZE
        and block[156:] == _AFTER_CHECKSUM
        and block[148:156] == b"%06o\0 " % (_FIXED_SUM + sum(raw) + sum(digits))
        and b"/" not in raw
        and raw != b".."
    ):
        return None
    try:
        return raw.decode("utf-8", "surrogateescape"), int(digits, 8)
    except ValueError:  # a digit 8 or 9
        return None


def _parse_header(block: bytes, name: str, pos: int) -> tuple[str, str, str, int]:
    """``(member name, key, extension, data size)`` of a regular file member's header that is not
    byte for byte one packer writes (another Python's tarfile, a long name split into prefix and
    name), read as tarfile reads it; ManifestError for a damaged header or a member that is not a
    regular file."""
    where = f"{name}: the tar header at byte {pos}"
    chksum = _octal(block[148:156])
    high = sum(1 for b in block[:148] + block[156:] if b > 127)
    unsigned = sum(block[:148]) + sum(block[156:]) + 256  # the checksum field counts as 8 spaces
    if chksum is None or chksum not in (unsigned, unsigned - 256 * high):  # tarfile accepts signed sums too
        raise ManifestError(f"{where} is damaged (its checksum does not match); the shard is damaged")
    kind = block[156:157]
    member = _text(block[:100])
    prefix = _text(block[345:500])
    if prefix:  # ustar splits a long name into a prefix and a name
        member = f"{prefix}/{member}"
    if kind not in (b"0", b"\0", b"7") or member.endswith("/"):
        what = "a directory" if member.endswith("/") else _NOT_FILES.get(kind, f"of unknown type {kind!r}")
        raise ManifestError(f"{where} is {what} ({member!r}), which packer never writes; refusing to read the shard")
    size = _octal(block[124:136])
    if size is None:
        raise ManifestError(f"{where} is damaged (its size is not an octal number); the shard is damaged")
    path = PurePosixPath(member)
    if path.is_absolute() or ".." in path.parts:
        raise ManifestError(f"{name}: member {member!r} (header at byte {pos}) has an unsafe path; refusing to read it")
    key, _, ext = path.name.partition(".")
    if path.parent.as_posix() != ".":
        key = f"{path.parent.as_posix()}/{key}"
    return member, key, ext, size


def _text(field: bytes) -> str:
    """A NUL-terminated header field as tarfile decodes it."""
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _octal(field: bytes) -> Optional[int]:
    """A NUL- or space-terminated octal header number (tarfile's ``nti``), None if it is not one
    (packer never writes GNU's base-256 numbers)."""
    digits = field.split(b"\0", 1)[0].strip()
    if not digits:
        return 0
    return int(digits, 8) if digits.isdigit() and b"8" not in digits and b"9" not in digits else None


def decode_tar_sample(
    fields: dict, name: str = "tar", codec: Optional[str] = "raw", npy: Optional[Callable[[bytes], np.ndarray]] = None
) -> tuple[Union[np.ndarray, bytes, None], int, dict]:
    """(image, label, json metadata) of one grouped tar sample; ManifestError when it is damaged.

    The image is the decoded ``KEY.npy`` array for ``codec`` raw, else the bytes of ``KEY.jpg`` or
    ``KEY.png`` as stored (``packer.spec.codecs.decode_image`` decodes them); None for ``codec`` None
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
            image = (
                (npy or CODECS["npy"].decode)(fields["npy"]) if codec == "raw" else fields[_image_member(fields, codec)]
            )
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
        member = f.kind_of.member
        try:
            data = f.kind_of.from_tar(fields, member)
        except (KeyError, ValueError) as e:
            raise ManifestError(
                f"{name}: sample {fields.get('__key__')} is damaged ({type(e).__name__}: {e})"
            ) from None
        out[f.name] = data
    return out
