"""Text fields: decode ``.txt`` and ``.json`` source files, and optionally tokenize them.

Text is stored as UTF-8 with newlines normalised: a byte-order mark is dropped and CRLF (Windows)
line ends become LF, so the same text gives the same bytes whichever editor saved it. Lone CR (old
Mac line ends) is kept as it is. A file that does not decode with the source encoding (UTF-8
unless ``--encoding`` says otherwise) is skipped with the position of the first bad byte.

Token ids come from a Hugging Face ``tokenizers`` file (``tokenizer.json``), loaded from the local
path only, once per worker process; they are stored as little-endian int32.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from packer.spec.errors import ConfigError, DecodeError
from packer.spec.source_kinds import FIELD_KINDS, JSON_EXTENSIONS, TEXT_EXTENSIONS

TOKEN_DTYPE = np.dtype("<i4")
"""Stored dtype of token ids: every vocabulary in use fits, at half the bytes of int64."""

MAX_TEXT_BYTES = 64 * 1024**2
"""Largest text or json file read: this is a packer of small files, and a bigger one is almost
always a misplaced data dump that would be read whole into memory."""


@dataclass(frozen=True)
class TextConfig:
    """How text fields are read and stored.

    ``encoding`` is the source files' encoding (any Python codec name); ``tokenizer`` the path of a
    ``tokenizer.json`` whose ids are stored instead of the text, truncated to ``max_length`` ids;
    ``allow_missing`` lets a paired sample without its text or json file through with that field
    empty; ``fields`` names the fields of every sample (``image``, ``text``, ``json``), or None to
    find them from the files (see ``packer.sources.discover``).
    """

    encoding: str = "utf-8"
    tokenizer: Optional[str] = None
    max_length: Optional[int] = None
    allow_missing: bool = False
    fields: Optional[tuple[str, ...]] = None

    def __post_init__(self) -> None:
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ConfigError(
                f"--encoding {self.encoding!r} is not an encoding Python knows (e.g. utf-8, latin-1, cp1252, utf-16)"
            ) from None
        if self.max_length is not None and self.max_length < 1:
            raise ConfigError(f"--max-length must be at least 1, got {self.max_length}")
        if self.max_length is not None and self.tokenizer is None:
            raise ConfigError("--max-length truncates token ids and needs --tokenizer")
        if self.tokenizer is not None and not os.path.isfile(self.tokenizer):
            raise ConfigError(f"--tokenizer {self.tokenizer} is not a file; pass the path of a tokenizer.json")
        if self.tokenizer is not None:  # workers may run elsewhere (Ray tasks, other nodes): one meaning everywhere
            object.__setattr__(self, "tokenizer", os.path.abspath(self.tokenizer))
        if self.fields is not None:
            unknown = [f for f in self.fields if f not in FIELD_KINDS]
            if unknown or not self.fields or len(set(self.fields)) != len(self.fields):
                raise ConfigError(
                    f"--fields takes a comma-separated subset of {', '.join(FIELD_KINDS)} "
                    f"(each once), got {','.join(self.fields)!r}"
                )

    def tokenizer_info(self) -> Optional[dict]:
        """The manifest's record of the tokenizer: file name, SHA-256, max_length, pad id; None without one."""
        if self.tokenizer is None:
            return None
        with open(self.tokenizer, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        tok = read_tokenizer(self.tokenizer)  # as saved: its padding settings name the pad id
        return {
            "file": os.path.basename(self.tokenizer),
            "sha256": digest,
            "max_length": self.max_length,
            "pad_id": pad_id(tok),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "add_special_tokens": True,
        }


def decode_text(data: bytes, path: str, encoding: str = "utf-8") -> str:
    """The text of a file's bytes: BOM dropped, CRLF made LF. DecodeError naming the first bad byte,
    or for a file that holds nothing but a BOM or whitespace-free emptiness."""
    if encoding.replace("_", "-").lower() in ("utf-8", "utf8"):
        encoding = "utf-8-sig"  # the same decoder, dropping a leading BOM
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        raise DecodeError(
            path,
            f"not valid {e.encoding.replace('-sig', '').upper()} text: {e.reason} at byte "
            f"{e.start}; pass --encoding if the files use another encoding",
        ) from None
    # A BOM under an explicit --encoding that keeps it (utf-16-le, latin-1's bytes of one): dropped once.
    # utf-8-sig, utf-16 and utf-32 drop their own, and a second U+FEFF is the text's.
    if text.startswith("\ufeff") and codecs.lookup(encoding).name not in ("utf-8-sig", "utf-16", "utf-32"):
        text = text[1:]
    if not text:
        raise DecodeError(path, "empty file: only a byte-order mark")
    return text.replace("\r\n", "\n")


def json_text(data: bytes, path: str, encoding: str = "utf-8") -> str:
    """The text of a ``.json`` file, checked to parse; DecodeError saying where it does not."""
    text = decode_text(data, path, encoding)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise DecodeError(path, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return text


def read_tokenizer(path: str):
    """The ``tokenizers.Tokenizer`` in a local ``tokenizer.json``, as saved (padding and truncation
    settings included). ConfigError when the library is missing or the file is not one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            "--tokenizer needs the tokenizers library: pip install tokenizers (or pip install 'packer-datasets[text]')"
        ) from None
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exception for any bad file
        raise ConfigError(f"--tokenizer {path} is not a tokenizers file: {e}") from None


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, max_length: Optional[int] = None):
    """The tokenizer in a local ``tokenizer.json`` as packer runs it: no padding, truncated to
    ``max_length`` ids (special tokens kept) when given, else not at all; cached per process."""
    tokenizer = read_tokenizer(path)
    # Settings saved in the file would pad ids (stored as if they were text) or cut them without
    # the manifest saying so: only --max-length decides.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if max_length is not None:
        tokenizer.enable_truncation(max_length)
    return tokenizer


def pad_id(tokenizer) -> int:
    """The tokenizer's padding id: from its padding settings, else its pad token, else 0."""
    if tokenizer.padding and tokenizer.padding.get("pad_id") is not None:
        return int(tokenizer.padding["pad_id"])
    for token in ("[PAD]", "<pad>", "<|pad|>", "<PAD>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


def token_ids(text: str, path: str, tokenizer_path: str, max_length: Optional[int]) -> np.ndarray:
    """The int32 ids of ``text`` (special tokens added as the tokenizer's post-processor says),
    truncated to ``max_length`` by the tokenizer (which keeps the special tokens)."""
    tokenizer = load_tokenizer(tokenizer_path, max_length)
    try:
        ids = tokenizer.encode(text).ids
    except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exception
        raise DecodeError(path, f"the tokenizer failed on it: {e}") from None
    return np.asarray(ids, dtype=TOKEN_DTYPE)


__all__ = [
    "TextConfig",
    "decode_text",
    "json_text",
    "read_tokenizer",
    "load_tokenizer",
    "token_ids",
    "pad_id",
    "TEXT_EXTENSIONS",
    "JSON_EXTENSIONS",
    "TOKEN_DTYPE",
]
