"""A checksum of the pages of an LMDB file that LMDB follows to find a record.

LMDB memory-maps its file and trusts the page numbers and sizes it finds there: one damaged byte in
a meta page, a branch page or a leaf node can send it past the end of the file, and the process
dies of SIGBUS, which Python cannot catch. ``structure_crc32`` covers what a read-only LMDB reader
looks at on the way to a value: both meta pages and every branch and leaf page of the main
database's B-tree, walked from its root as LMDB walks it. It skips the values stored in overflow
pages (each sample's stored CRC-32 covers those) and pages that are not in the tree (free pages
left by earlier transactions), which a reader never touches. The writer records it in the
manifest; a reader compares it before LMDB opens the file, so LMDB only ever follows pointers as
they were written, at the cost of reading the tree's pages once (far fewer than the records:
a leaf page holds many nodes).

Layout (``mdb.c``, 64-bit): a page starts with a 16-byte header: ``pgno`` (8 bytes), padding (2),
``flags`` (2: 0x01 branch, 0x02 leaf), ``lower`` (2: the end of the node pointers) and ``upper``
(2); then one 2-byte pointer per node, the node's offset in the page. A branch node starts with
its child's page number in 48 bits (``lo``, ``hi``, ``flags``: 2 bytes each). A meta page holds, after
the header, ``magic`` (4), ``version`` (4), ``address`` (8), ``mapsize`` (8), two database records of
48 bytes (free pages, main; the free one's first 4 bytes hold the page size, at byte 40 of the
page; the main one's ``root`` is its last 8, at byte 128), ``last_pg`` (8) and ``txnid`` (8, at byte
144). A reader uses the meta page of the larger ``txnid``.
"""

from __future__ import annotations

import os
import struct
import zlib

_BRANCH = 0x01
_PAGE_SIZE_AT, _ROOT_AT, _TXNID_AT = 40, 128, 144
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")


def structure_crc32(path: str | os.PathLike) -> int:
    """CRC-32 of an LMDB file's meta pages and main B-tree pages, in the order of a walk from the
    root (see the module); each page's number goes in before its bytes.

    Reads with plain reads, never a memory map, and takes damaged files in its stride: it runs on
    files not yet known to be intact. Each page is read at most once and the walk stops at a page
    referenced twice (time and memory stay bounded by the file's page count); a page number
    outside the file is put into the checksum instead of being followed, so any damage to what it
    covers changes the result."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        head = os.pread(fd, _PAGE_SIZE_AT + 4, 0)
        page_size = _U32.unpack_from(head, _PAGE_SIZE_AT)[0] if len(head) == _PAGE_SIZE_AT + 4 else 0
        if page_size < 512 or page_size > 1 << 16 or page_size & (page_size - 1) or size < 2 * page_size:
            return zlib.crc32(head)  # not an LMDB file: damaged, and any other such file differs
        crc = zlib.crc32(struct.pack("<QI", size, page_size))
        metas = [os.pread(fd, page_size, 0), os.pread(fd, page_size, page_size)]
        for meta in metas:
            crc = zlib.crc32(meta, crc)
        meta = max(metas, key=lambda m: _U64.unpack_from(m, _TXNID_AT)[0])
        pages = size // page_size
        stack, seen, pushed = [_U64.unpack_from(meta, _ROOT_AT)[0]], set(), 1
        while stack:
            number = stack.pop()
            crc = zlib.crc32(_U64.pack(number), crc)
            if number in seen or pushed > pages:
                # No page of a B-tree is referenced twice, nor are there more references than
                # pages: damage, maybe crafted to make the walk long. Recorded; the walk stops.
                return zlib.crc32(b"cycle", crc)
            if not 2 <= number < pages:
                continue  # an empty tree (no root), or damage: recorded above, not followed
            seen.add(number)
            page = os.pread(fd, page_size, number * page_size)
            crc = zlib.crc32(page, crc)
            if _U16.unpack_from(page, 10)[0] & _BRANCH:
                children = _children(page, page_size)
                pushed += len(children)
                stack.extend(reversed(children))
    return crc


def _children(page: bytes, page_size: int) -> list[int]:
    """The child page numbers of a branch page, in key order (nodes out of the page are skipped)."""
    lower = min(_U16.unpack_from(page, 12)[0], page_size)
    children = []
    for pointer in range(16, lower - 1, 2):
        node = _U16.unpack_from(page, pointer)[0]
        if node + 6 <= page_size:
            lo, hi, top = struct.unpack_from("<HHH", page, node)
            children.append(lo | hi << 16 | top << 32)
    return children
