"""The CRC-32 stored beside every sample: how it is computed, by the converter and every reader.

Every CRC-32 here is zlib-ng's: the same values as zlib's (the checksum any zlib or
``binascii.crc32`` recomputes), several times faster with the CPU's carry-less multiply; it runs
once per sample in the converter's hot path, in verify, and in readers that check samples read by
byte ranges (``readers.remote.sample_checks``).
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np
from zlib_ng.zlib_ng import crc32


def stored_crc32(encoded: Optional[bytes], image: Optional[np.ndarray], fields: Iterable[Any]) -> int:
    """The CRC-32 stored beside a sample: of its ``encoded`` image bytes if any, else of its raw
    ``image`` array (if any), continued over each variable-length field's bytes in order."""
    if encoded is not None:
        crc = crc32(encoded)
    else:
        crc = image_crc32(image) if image is not None else 0
    return fields_crc32(fields, crc)


def fields_crc32(values: Iterable[Any], crc: int = 0) -> int:
    """CRC-32 continued from ``crc`` over each field's bytes (any buffer) in order (``crc``
    unchanged without fields)."""
    for value in values:
        crc = crc32(value, crc)
    return crc


def image_crc32(image: np.ndarray) -> int:
    """CRC-32 of an array's raw bytes in C order, as stored with every sample."""
    return crc32(np.ascontiguousarray(image).data)
