"""The loader advisor behind ``packer tune``, ``packer profile`` and ``packer bench``: it measures
instead of guessing, on this machine and this data."""

from __future__ import annotations

from readers.advisor.folder import FolderDataset, folder_items
from readers.advisor.memory import PeakMemory
from readers.advisor.timing import Rate, time_loader

__all__ = ["FolderDataset", "folder_items", "PeakMemory", "Rate", "time_loader"]
