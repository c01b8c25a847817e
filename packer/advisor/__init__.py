"""The loader advisor behind ``packer tune``, ``packer profile`` and ``packer bench``: it measures
instead of guessing, on this machine and this data.

- ``tune``: DataLoader worker count and prefetch factor by measurement (``packer.advisor.tune``);
- ``profile_folder`` / ``profile_output``: the time of each loading stage per sample;
- ``compare``: a packer output against the raw folder, same preprocessing, batch size and workers.
"""

from __future__ import annotations

from packer.advisor.compare import Comparison, compare, plot
from packer.advisor.folder import FolderDataset, folder_items
from packer.advisor.memory import PeakMemory
from packer.advisor.profile import Profile, profile_folder, profile_output
from packer.advisor.timing import Rate, time_loader
from packer.advisor.tune import LoaderMeasure, Measurement, Trial, TuneResult, recommended_code, tune

__all__ = [
    "Comparison",
    "compare",
    "plot",
    "FolderDataset",
    "folder_items",
    "PeakMemory",
    "Profile",
    "profile_folder",
    "profile_output",
    "Rate",
    "time_loader",
    "LoaderMeasure",
    "Measurement",
    "Trial",
    "TuneResult",
    "recommended_code",
    "tune",
]
