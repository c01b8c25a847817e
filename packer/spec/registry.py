"""The formats: one description per format, in one registry, keyed by the name users type.

A description names the format's writer and scanner (``packer/formats/NAME.py``) and its reader
(``readers/NAME.py``) by import path, so that reading the registry loads none of them: ``import
readers`` must not load the writers (and their libraries), and ``packer`` never imports
``readers``. It also holds the format's version rule: from which on-disk version it stores each
layout feature (``packer.spec.sample_layout``). Adding a format is one entry here and its two modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional

from packer.spec.errors import ConfigError
from packer.spec.sample_layout import (
    DETECTION_TARGETS,
    ENCODED_IMAGES,
    ENCODED_SIZES,
    NO_IMAGE,
    RAW_SIZES,
    SAMPLE_GEOMETRY,
    SEGMENTATION_MASKS,
    SOURCE_BYTES,
    TEXT_FIELDS,
    VARIABLE_RAW,
    SampleLayout,
)
from packer.spec.shard_names import HDF5_FLAT_KEYS_SINCE, NPY_CRC32, NPY_KEYS

if TYPE_CHECKING:
    from pathlib import Path

    from packer.formats.base import ShardWriter
    from packer.records import StoredSample
    from packer.spec.manifest import Manifest, ShardEntry

ENCODED_SINCE = 2
"""The format version that added jpeg and png images (``fields.image.codec``). Raw outputs are
still written as version 1: their shards are byte for byte what earlier packers wrote, so readers
that know only version 1 keep reading them, and refuse encoded outputs, which they cannot read."""

TEXT_SINCE = 3
"""The format version that added text, token-id and json fields, samples without an image, and (npy,
hdf5) raw images of varying sizes."""

DETECTION_SINCE = 5
"""The format version that added detection targets (the ``target`` field, ``annotations`` in the
manifest) and segmentation masks (the ``mask`` field): older packers refuse such outputs instead of
reading their images without the boxes or masks; also each image's geometry beside a paired json
(the ``geometry`` field), which readers return in the meta dict."""

SOURCE_SINCE = 6
"""The format version that added ``--codec source`` (``fields.image.codec`` ``source``): stored images
that are JPEG or PNG by their content, a kept file with its EXIF orientation still to apply, and
the manifest's ``image_sources`` per shard; and an index of the (H, W, C) of images of varying size
in every format (npy and hdf5 had it for raw images since version 3)."""

INDEXES_SINCE = 7
"""The wds format version that added the other loaders' indexes: ``NAME.idx`` beside each tar (NVIDIA
DALI) and ``shardindex.json`` (``wids``). Every wds output is written at it; readers read older ones."""

TOKENS_SINCE = 8
"""The format version that added token outputs (``packer convert CORPUS --pack BLOCK``): samples that
are blocks of token ids, described by the manifest's ``tokens`` section (``packer.spec.token_blocks``)."""

_COMMON = {
    ENCODED_IMAGES: ENCODED_SINCE,
    TEXT_FIELDS: TEXT_SINCE,
    NO_IMAGE: TEXT_SINCE,
    DETECTION_TARGETS: DETECTION_SINCE,
    SEGMENTATION_MASKS: DETECTION_SINCE,
    SAMPLE_GEOMETRY: DETECTION_SINCE,
    SOURCE_BYTES: SOURCE_SINCE,
    ENCODED_SIZES: SOURCE_SINCE,
}


@dataclass(frozen=True)
class FormatSpec:
    """Everything packer knows of one format.

    ``since`` maps each layout feature the format stores to the oldest format version that
    describes it; a feature it does not list, it cannot store. ``oldest_written`` is the oldest
    version written for any output (a change every output of the format took). ``whole_file`` formats keep a shard
    in one file that their library memory-maps whole (``verify`` scans a truncated one from a padded
    copy); ``random_access`` formats are read map-style (any sampler, ``in_memory``), the others as
    streams. ``structure`` names a function ``(path) -> int`` that checksums the parts of a shard
    file its library trusts (``packer.spec.lmdb_pages``): recorded at conversion, compared by readers
    before the library opens the file. ``output_files`` names a function ``(manifest) -> {name:
    bytes}``: files of the whole output made from its manifest (other loaders' shard lists), written
    beside it and checked by ``verify`` against it, from version ``output_files_since``. ``indexer``
    names a function ``(directory, shard, layout) -> (keys, crc32s)`` that reads those of a shard's
    samples without their images (``packer combine``'s duplicate report, ``--append``).
    """

    name: str
    writer: str
    scanner: str
    reader: str
    since: Mapping[str, int] = field(default_factory=dict)
    oldest_written: int = 1
    whole_file: bool = False
    random_access: bool = True
    structure: str = ""
    output_files: str = ""
    output_files_since: int = 0
    indexer: str = ""
    index_files: tuple[str, ...] = ()
    """The suffixes of the files of a shard that ``indexer`` reads (empty: all of them): what an
    append into a bucket fetches of each shard (``packer.output.held_files``)."""
    intact_scanner: str = ""
    """``scan`` of a shard whose files verify found as the manifest records them, where the format can
    trust its own index then (wds: members sliced where ``NAME.idx`` says, headers not walked again);
    empty: ``scanner``."""
    token_writer: str = ""
    """The class that writes one token shard (``packer convert CORPUS --pack``); empty: the format
    stores no token blocks yet."""
    token_shard: str = ""
    """The function ``(directory, shard name) -> TokenShard`` that opens a token shard with the
    format's stock library (``packer.spec.token_shards``), for the readers and ``verify``."""

    @property
    def newest(self) -> int:
        """The newest on-disk version of this format that this packer writes and reads."""
        return max((self.oldest_written, *self.since.values(), TOKENS_SINCE if self.token_writer else 0))

    def check_tokens(self) -> None:
        """ConfigError unless this format stores token blocks, naming those that do."""
        if not self.token_writer:
            able = ", ".join(f.name for f in FORMATS.values() if f.token_writer)
            raise ConfigError(f"the {self.name} format does not store token blocks yet; use --format {able}")

    def token_writer_class(self) -> type:
        """The class that writes one token shard of this format (``packer.formats.npy.NpyTokenWriter``)."""
        self.check_tokens()
        return resolve(self.token_writer)

    def open_token_shard(self, directory: "Path", shard: str) -> Any:
        """One token shard's ``TokenShard`` (``packer.spec.token_shards``), read with the stock library."""
        self.check_tokens()
        return resolve(self.token_shard)(directory, shard)

    def version(self, layout: SampleLayout) -> int:
        """The version written for an output of ``layout``: the oldest that describes it (as numpy
        writes npy version 1.0 whenever its header allows). ConfigError for a feature it cannot store."""
        missing = sorted(layout.features() - set(self.since))
        if missing:
            raise ConfigError(f"the {self.name} format cannot store {', '.join(missing)}; choose another --format")
        return max((self.oldest_written, *(self.since[f] for f in layout.features())))

    def writer_class(self) -> "type[ShardWriter]":
        """The class that writes one shard of this format."""
        return resolve(self.writer)

    def scan(
        self, directory: "Path", shard: "ShardEntry", layout: SampleLayout, start: int = 0
    ) -> "Iterator[StoredSample]":
        """Every sample of one shard from sample ``start`` on, in order, read back with the format's
        stock library (``verify``; a repack reads a run of a shard from where it starts)."""
        return resolve(self.scanner)(directory, shard, layout, start)

    def scan_intact(self, directory: "Path", shard: "ShardEntry", layout: SampleLayout) -> "Iterator[StoredSample]":
        """``scan`` of a shard whose files are byte for byte as recorded (``intact_scanner``)."""
        if not self.intact_scanner:
            return self.scan(directory, shard, layout)
        return resolve(self.intact_scanner)(directory, shard, layout)

    def structure_checksum(self) -> "Optional[Callable[[Path], int]]":
        """The function that checksums a shard file's structure (see the class), or None."""
        return resolve(self.structure) if self.structure else None

    def read_index(self, directory: "Path", shard: "ShardEntry", layout: SampleLayout) -> "tuple[list[str], Any]":
        """The keys and stored CRC-32s (an int64 array) of one shard's samples, read without images."""
        return resolve(self.indexer)(directory, shard, layout)

    def reads_for_index(self, path: str) -> bool:
        """Whether ``read_index`` reads the shard file ``path`` (see ``index_files``)."""
        return not self.index_files or path.endswith(self.index_files)

    def files_of_output(self, manifest: "Manifest") -> dict[str, bytes]:
        """The files made from ``manifest`` that an output of its version holds (see the class)."""
        if not self.output_files or manifest.format_version < self.output_files_since:
            return {}
        return resolve(self.output_files)(manifest)

    def reader_class(self) -> type:
        """The ``readers`` Dataset class of this format (imports ``readers``: call it from there)."""
        return resolve(self.reader)

    def import_modules(self) -> None:
        """Import the writer's and the scanner's module (and their libraries: h5py, lmdb) now, so
        that processes forked after this start with them instead of each importing them again."""
        resolve(self.writer)
        resolve(self.scanner)


FORMATS: dict[str, FormatSpec] = {
    spec.name: spec
    for spec in (
        FormatSpec(
            "npy",
            "packer.formats.npy:NpyWriter",
            "packer.formats.npy:scan_shard",
            "readers.datasets.npy:NpyDataset",
            {**_COMMON, VARIABLE_RAW: TEXT_SINCE, RAW_SIZES: TEXT_SINCE},
            indexer="packer.formats.npy:scan_index",
            index_files=(NPY_KEYS, NPY_CRC32),
            token_writer="packer.formats.npy:NpyTokenWriter",
            token_shard="packer.spec.token_shards:open_npy_token_shard",
        ),
        FormatSpec(
            "lmdb",
            "packer.formats.lmdb:LmdbWriter",
            "packer.formats.lmdb:scan_shard",
            "readers.datasets.lmdb:LmdbDataset",
            {**_COMMON, VARIABLE_RAW: 1, RAW_SIZES: SOURCE_SINCE},
            whole_file=True,
            structure="packer.spec.lmdb_pages:structure_crc32",
            indexer="packer.formats.lmdb:scan_index",
            token_writer="packer.formats.lmdb:LmdbTokenWriter",
            token_shard="packer.spec.token_shards:open_lmdb_token_shard",
        ),
        FormatSpec(
            "hdf5",
            "packer.formats.hdf5:Hdf5Writer",
            "packer.formats.hdf5:scan_shard",
            "readers.datasets.hdf5:Hdf5Dataset",
            {**_COMMON, VARIABLE_RAW: TEXT_SINCE, RAW_SIZES: TEXT_SINCE},
            oldest_written=HDF5_FLAT_KEYS_SINCE,
            whole_file=True,
            structure="packer.spec.hdf5_index:structure_crc32",
            indexer="packer.formats.hdf5:scan_index",
            token_writer="packer.formats.hdf5:Hdf5TokenWriter",
            token_shard="packer.spec.token_shards:open_hdf5_token_shard",
        ),
        FormatSpec(
            "wds",
            "packer.formats.wds:WdsWriter",
            "packer.formats.wds:scan_shard",
            "readers.datasets.wds:WdsDataset",
            {**_COMMON, VARIABLE_RAW: 1, RAW_SIZES: SOURCE_SINCE},
            oldest_written=INDEXES_SINCE,
            random_access=False,
            output_files="packer.formats.wds:output_files",
            output_files_since=INDEXES_SINCE,
            indexer="packer.formats.wds:scan_index",
            intact_scanner="packer.formats.wds:scan_intact_shard",
            token_writer="packer.formats.wds:WdsTokenWriter",
            token_shard="packer.spec.token_shards:open_wds_token_shard",
        ),
    )
}
"""Every format, in the order the CLI lists them."""

FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)


def get_format(name: str) -> FormatSpec:
    """The description of format ``name``; ConfigError naming the known formats otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown format {name!r}; choose one of {', '.join(FORMATS)}") from None


def resolve(ref: str) -> Any:
    """The object an import path ``module:attribute`` names."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)
