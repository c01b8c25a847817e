"""PyTorch datasets over packer outputs: one reader per format, and ``open_dataset`` to pick it.

from readers import open_dataset
ds = open_dataset("packed/lmdb")          # the format is read from the output's manifest
loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)
"""

from __future__ import annotations

import os
from typing import Union

from packer.spec.registry import FORMATS
from readers.augment.buckets import AspectBuckets
from readers.augment.crops import CenterCrop, RandomResizedCrop
from readers.compose.combine import PackedChain, PackedConcat, check_same_classes, concat
from readers.compose.mixture import Mixture, open_mixture
from readers.datasets.base import ReaderBase
from readers.datasets.hdf5 import Hdf5Dataset
from readers.datasets.lmdb import LmdbDataset
from readers.datasets.mapstyle import PackedDataset
from readers.datasets.npy import NpyDataset
from readers.datasets.tensors import BatchNormalize, ImageConverter
from readers.datasets.token_blocks import OPTIONS as TOKEN_OPTIONS
from readers.datasets.token_blocks import TokenBlocks
from readers.datasets.token_stream import TokenStream
from readers.datasets.wds import WdsDataset
from readers.loading.collate import PackedBatch, detection_collate, packed_collate, pad_collate
from readers.loading.length_sampler import LengthBucketSampler, padding_ratio
from readers.loading.loader import make_loader
from readers.loading.packed_loader import PackedLoader
from readers.loading.sampler import EpochBatchSampler
from readers.remote.urls import is_url, open_manifest

AnyDataset = Union[NpyDataset, LmdbDataset, Hdf5Dataset, WdsDataset, TokenBlocks, TokenStream]


def open_dataset(root: str | os.PathLike, **options) -> AnyDataset:
    """Open a packer output with the reader of its format; ``options`` go to that reader.

    Common options: ``normalize`` (default True), ``transform``, ``target_transform`` (applied to
    each label, as torchvision's), ``return_meta``, ``crop`` (``RandomResizedCrop(224)``,
    ``CenterCrop(224, resize=256)``) and ``flip``, drawn from ``seed`` per epoch and sample
    (``readers.augment.crops``); the wds reader also takes ``shuffle`` (buffer size). ``root`` may be
    a URL (``https://``, ``s3://``, ``gs://``): wds outputs stream (``pipe:CMD {}`` too; see
    ``readers.remote.urls``), npy and hdf5 outputs are read by byte ranges (``readers.remote.ranges``),
    lmdb ones through downloaded shards; ``cache_dir=`` keeps what was read, ``cache_limit=`` bounds it.

    A token output (``packer convert CORPUS --pack BLOCK``) gives a ``TokenBlocks`` of its blocks
    (options ``return_dict``, ``block_mask``, ``vocab_size``, ``seed``; ``readers.datasets.token_blocks``),
    or, for a wds one at a URL without ``cache_dir``, a ``TokenStream`` that streams its tar shards
    (``readers.datasets.token_stream``).
    """
    manifest = open_manifest(root)
    if manifest.tokens is not None:  # a token output: blocks (readers.datasets.token_blocks)
        other = sorted(set(options) - set(TOKEN_OPTIONS))
        if other:
            raise TypeError(
                f"{root} holds token blocks, which take {', '.join(TOKEN_OPTIONS)}, not {', '.join(other)} "
                "(options of images and text samples)"
            )
        if is_url(root) and manifest.format == "wds" and options.get("cache_dir") is None:
            return TokenStream(root, **options)  # tar shards stream; with a cache_dir, read at random
        return TokenBlocks(root, **options)
    return FORMATS[manifest.format].reader_class()(root, **options)


__all__ = [
    "open_dataset",
    "open_mixture",
    "Mixture",
    "RandomResizedCrop",
    "CenterCrop",
    "AspectBuckets",
    "concat",
    "check_same_classes",
    "PackedConcat",
    "PackedChain",
    "detection_collate",
    "make_loader",
    "PackedLoader",
    "EpochBatchSampler",
    "LengthBucketSampler",
    "padding_ratio",
    "PackedBatch",
    "packed_collate",
    "pad_collate",
    "ReaderBase",
    "BatchNormalize",
    "PackedDataset",
    "ImageConverter",
    "NpyDataset",
    "LmdbDataset",
    "Hdf5Dataset",
    "WdsDataset",
    "TokenBlocks",
    "TokenStream",
]
