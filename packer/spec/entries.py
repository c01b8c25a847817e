"""The manifest's entries that describe stored data: a variable-length field (``TextField``) and
one file of a shard (``FileEntry``). Both directions use them: the converter writes them, verify and
the readers read them back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from packer.spec.field_kinds import KINDS, FieldKind, kind_of


@dataclass(frozen=True)
class TextField:
    """A variable-length field stored as bytes per sample: ``text`` or ``json`` (by ``name``), holding
    ``kind`` data; ``tokenizer`` is the manifest's record of the tokenizer for ``tokens``. How the
    sources were read is recorded too: their ``encoding``, and whether a missing file was stored
    empty (``allow_missing``) rather than skipping its sample."""

    name: str
    kind: str
    tokenizer: Optional[dict] = None
    encoding: str = "utf-8"
    allow_missing: bool = False
    info: Optional[dict] = None
    """A mask field's record: ``ignore_index`` (the value of padding) and ``source`` (the masks folder)."""

    @property
    def kind_of(self) -> FieldKind:
        """What this field's kind is (``packer.spec.field_kinds``): its entry, its checks, its reading."""
        return kind_of(self.kind)

    @property
    def itemsize(self) -> int:
        """Bytes per element: a sample's length is its byte count divided by this (tokens are 4 bytes)."""
        return self.kind_of.itemsize

    def to_dict(self) -> dict:
        """The manifest's entry for this field."""
        return self.kind_of.entry(self)

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "TextField":
        """Inverse of ``to_dict``."""
        kind = d["kind"]
        return cls(
            name,
            kind,
            d.get("tokenizer"),
            d.get("source_encoding", "utf-8"),
            d.get("missing") == "stored empty",
            KINDS[kind].info(d) if kind in KINDS else None,
        )


@dataclass
class FileEntry:
    """One file of a shard, as the manifest records it.

    ``structure_crc32``, for formats whose library trusts what it finds in the file (LMDB): the
    checksum of the parts it follows to find a record (``FormatSpec.structure``), which readers
    compare before the library opens the file; None for other formats and older outputs."""

    path: str
    bytes: int
    sha256: str
    structure_crc32: Optional[int] = None

    def to_dict(self) -> dict:
        """The manifest's form of this record."""
        d: dict = {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}
        if self.structure_crc32 is not None:
            d["structure_crc32"] = self.structure_crc32
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FileEntry":
        """Inverse of ``to_dict`` (not checked: ``Manifest.from_dict`` checks the manifest's)."""
        crc = d.get("structure_crc32")
        return cls(d["path"], int(d["bytes"]), d["sha256"], None if crc is None else int(crc))
