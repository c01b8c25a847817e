"""packer: pack folders of small image and text files into large shard files that PyTorch reads fast.

The converter lives here (``packer.convert``); the ``readers`` package streams its outputs back.
Names are imported on first use, so ``import readers`` (which needs only the manifest and codecs)
does not load the converter's pipeline and writers.
"""

from __future__ import annotations

__version__ = "0.9.1"

_LAZY = {
    "ConvertConfig": "packer.config",
    "PreprocessConfig": "packer.config",
    "TextConfig": "packer.spec.text",
    "ConvertResult": "packer.ops.convert",
    "convert": "packer.ops.convert",
    "repack": "packer.ops.repack",
    "verify": "packer.output.verify",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'packer' has no attribute {name!r}")
