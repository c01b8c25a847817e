"""What kinds of source file make up a sample: the extensions discovery looks for, by field.

Shared by discovery and the text reader, which both need them (and neither needs the other).
"""

from __future__ import annotations

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif"})
"""torchvision's ``IMG_EXTENSIONS`` (a folder ``ImageFolder`` reads is packed whole), and ``.gif``.
Pillow decodes them all; ``.ppm`` and ``.pgm`` are the netpbm colour and gray formats."""
TEXT_EXTENSIONS = frozenset({".txt"})
JSON_EXTENSIONS = frozenset({".json"})
FIELD_KINDS = ("image", "text", "json")
"""The fields a sample can have, in the order they are stored and returned: an image file, a
``.txt`` file, a ``.json`` file."""
