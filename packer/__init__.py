"""packer: pack folders of small image files into large shard files that PyTorch reads fast.

The converter lives here (``packer.convert``); the ``readers`` package streams its outputs back.
"""

from __future__ import annotations

__version__ = "0.1.0"

from packer.config import ConvertConfig, PreprocessConfig  # noqa: E402
from packer.pipeline import ConvertResult, convert  # noqa: E402

__all__ = ["__version__", "ConvertConfig", "PreprocessConfig", "ConvertResult", "convert"]
