"""PyTorch datasets over packer outputs: one reader per format, and ``open_dataset`` to pick it.

    from readers import open_dataset
    ds = open_dataset("packed/lmdb")          # the format is read from the output's manifest
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)
"""

from __future__ import annotations

import os
from typing import Sequence, Union

from torch.utils.data import ChainDataset, ConcatDataset, IterableDataset

from packer.registry import FORMATS
from readers.base import ReaderBase, check_same_classes
from readers.collate import PackedBatch, packed_collate, pad_collate
from readers.hdf5 import Hdf5Dataset
from readers.lmdb import LmdbDataset
from readers.loader import PackedLoader, make_loader
from readers.mapstyle import PackedDataset
from readers.npy import NpyDataset
from readers.remote import open_manifest
from readers.sampler import EpochBatchSampler, LengthBucketSampler, padding_ratio
from readers.tensors import BatchNormalize, ImageConverter
from readers.wds import WdsDataset

AnyDataset = Union[NpyDataset, LmdbDataset, Hdf5Dataset, WdsDataset]


def open_dataset(root: str | os.PathLike, **options) -> AnyDataset:
    """Open a packer output with the reader of its format; ``options`` go to that reader.

    Common options: ``normalize`` (default True), ``transform``, ``target_transform`` (applied to
    each label, as torchvision's), ``return_meta``; the wds reader
    also takes ``shuffle`` (buffer size) and ``seed``. ``root`` may be a URL for wds outputs
    (``https://``, ``s3://``, ``pipe:CMD {}``; see ``readers.remote``), with ``cache_dir=``.
    """
    manifest = open_manifest(root)
    return FORMATS[manifest.format].reader_class()(root, **options)


def concat(datasets: Sequence[ReaderBase]) -> Union[ConcatDataset, ChainDataset]:
    """The datasets as one (torch's ConcatDataset; ChainDataset for wds streams), refused with ValueError
    when their class maps differ: a label must mean the same class in every part."""
    datasets = list(datasets)
    if not datasets:
        raise ValueError("concat needs at least one dataset")
    check_same_classes(datasets)
    if all(isinstance(d, IterableDataset) for d in datasets):
        return ChainDataset(datasets)
    if any(isinstance(d, IterableDataset) for d in datasets):
        raise ValueError("concat cannot mix wds streams with map-style datasets; convert them to one kind")
    return ConcatDataset(datasets)


__all__ = ["open_dataset", "concat", "check_same_classes",
           "make_loader", "PackedLoader", "EpochBatchSampler", "LengthBucketSampler", "padding_ratio",
           "PackedBatch", "packed_collate", "pad_collate",
           "ReaderBase", "BatchNormalize", "PackedDataset", "ImageConverter",
           "NpyDataset", "LmdbDataset", "Hdf5Dataset", "WdsDataset"]
