"""One table of field codecs, used to encode when writing and to decode when reading.

Each codec turns a value into bytes and back, by a file-name extension as WebDataset uses them
(``KEY.npy``, ``KEY.cls``, ``KEY.json``). None of them executes code on load: npy is read with
``allow_pickle=False``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from packer.errors import PackerError


@dataclass(frozen=True)
class Codec:
    """A pair of functions: ``encode(value) -> bytes`` and ``decode(bytes) -> value``."""

    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


def encode_npy(array: np.ndarray) -> bytes:
    """An array as the bytes of a ``.npy`` file."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


def decode_npy(data: bytes) -> np.ndarray:
    """The array in the bytes of a ``.npy`` file (object arrays are refused)."""
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def _encode_json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


CODECS: dict[str, Codec] = {
    "npy": Codec(encode_npy, decode_npy),
    "cls": Codec(lambda v: str(int(v)).encode("ascii"), lambda b: int(b)),
    "json": Codec(_encode_json, lambda b: json.loads(b.decode("utf-8"))),
    "txt": Codec(lambda v: str(v).encode("utf-8"), lambda b: b.decode("utf-8")),
}


def codec(extension: str) -> Codec:
    """The codec for ``extension`` (without the dot)."""
    try:
        return CODECS[extension]
    except KeyError:
        raise PackerError(f"no codec for .{extension} members; known: {', '.join(sorted(CODECS))}") from None
