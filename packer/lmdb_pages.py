"""A checksum of the parts of an LMDB file that LMDB follows to find a record.

LMDB memory-maps its file and trusts the page numbers it finds there: one damaged byte in a page
header or a B-tree node can send it to a page past the end of the file, and the process dies of
SIGBUS, which Python cannot catch. ``structure_crc32`` covers everything LMDB reads on the way to
a value (the two meta pages, every branch and leaf page, and the header of each run of overflow
pages, which holds the run's length) and skips only the values' own bytes in overflow pages,
which each sample's stored CRC-32 covers. The writer records it in the manifest; a reader compares
it before LMDB opens the file, so a file whose structure is intact can be read without that risk,
at the cost of reading the leaf pages once (for image shards, a page per sample).

Page layout (``mdb.c``): each page starts with a 16-byte header, ``pgno`` (8 bytes), padding (2),
``flags`` (2), then either ``lower``/``upper`` (2 + 2) or, for the first page of an overflow run,
the run's page count (4). The page size is in the first meta page, at byte 40 (``mm_dbs[0].md_pad``).
Packer's writers never delete a record, so overflow runs are never freed and reused: the walk from
page 0 meets every run at its first page.
"""

from __future__ import annotations

import os
import struct
import zlib

_HEADER = struct.Struct("<QHHI")  # pgno, pad, flags, lower/upper or overflow page count
_PAGE_SIZE_AT = 40
_OVERFLOW = 0x04
_MAX_BLOCK = 256  # pages read at once across a run of branch and leaf pages


def structure_crc32(path: str | os.PathLike) -> int:
    """CRC-32 of an LMDB file's meta, branch and leaf pages and overflow-run headers (see module).

    Reads the file with plain reads, never a memory map: it runs on files not yet known to be
    intact. Any damage to what it covers changes the result."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        head = os.pread(fd, 64, 0)
        page_size = struct.unpack_from("<I", head, _PAGE_SIZE_AT)[0] if len(head) >= 44 else 0
        if page_size < 512 or page_size > 1 << 16 or page_size & (page_size - 1):
            return zlib.crc32(head)  # not a page size: damaged, and any other value of it differs
        crc = zlib.crc32(struct.pack("<QI", size, page_size))
        pages, page, ahead = size // page_size, 0, 1
        while page < pages:
            count = min(ahead, pages - page)
            block = os.pread(fd, count * page_size, page * page_size)
            if len(block) < page_size:
                break  # the file shrank while being read: the checksum will not match
            first = page
            for at in range(0, len(block) - page_size + 1, page_size):
                if page != first + at // page_size:
                    break  # an overflow run jumped past this page: read from where it ends
                flags, run = _HEADER.unpack_from(block, at)[2:]
                if flags & _OVERFLOW:
                    crc = zlib.crc32(block[at:at + _HEADER.size], crc)
                    page += max(1, run)
                    ahead = 1  # the next page may start another run: read no more than it
                else:
                    crc = zlib.crc32(block[at:at + page_size], crc)
                    page += 1
                    ahead = min(ahead * 2, _MAX_BLOCK)
        if size % page_size:
            crc = zlib.crc32(os.pread(fd, size % page_size, pages * page_size), crc)
    return crc
