"""Samples read by byte ranges, each compared with the CRC-32 its shard records for it.

A file read whole is checked against the manifest's SHA-256; one read by ranges cannot be, so each
sample is checked instead: the CRC-32 of its stored image bytes continued over its fields' bytes
(``packer.spec.checksums.stored_crc32``), against the shard's checksums file. A block of another version
of the object, or a damaged one, is then an error naming the sample, never a wrong sample.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from packer.spec.checksums import fields_crc32, image_crc32
from packer.spec.errors import ManifestError


class SampleChecks:
    """The CRC-32 of each sample of one shard read by ranges (``crcs``), and the last sample checked,
    kept so that its fields, asked for one by one after its image, are not read twice."""

    def __init__(self, crcs: np.ndarray, where: str) -> None:
        self.crcs, self.where = crcs, where
        self.last: Optional[tuple[int, Any, list]] = None

    def checked(self, local: int, image: Optional[np.ndarray], fields: Iterable[np.ndarray]) -> tuple[Any, list]:
        """``(image, fields)`` of sample ``local`` once their CRC-32 matches the shard's record
        (ManifestError when it does not); kept as the last sample checked."""
        fields = list(fields)
        crc = image_crc32(image) if image is not None else 0
        crc = fields_crc32((np.ascontiguousarray(f).data for f in fields), crc)
        if crc != int(self.crcs[local]):
            raise ManifestError(
                f"sample {local} of {self.where} does not match its checksum: the object was changed or "
                "damaged after the manifest was written (or replaced by a new conversion). Open the "
                "dataset again; if it persists, run packer verify on the output"
            )
        self.last = (local, image, fields)
        return image, fields

    def held(self, local: int) -> Optional[tuple[Any, list]]:
        """``(image, fields)`` of sample ``local`` when it was the last one checked, else None."""
        if self.last is not None and self.last[0] == local:
            return self.last[1], self.last[2]
        return None
