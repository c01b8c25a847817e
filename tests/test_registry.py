"""packer.spec.registry: every format's import paths load the objects they name, reading the registry loads
none of them, an unknown name is refused with the choices, and each real format's version rule over the
layout features."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from packer.spec import sample_layout
from packer.spec.entries import TextField
from packer.spec.errors import ConfigError
from packer.spec.lmdb_pages import structure_crc32
from packer.spec.registry import FORMAT_NAMES, FORMATS, FormatSpec, get_format, resolve
from packer.spec.sample_layout import ImageCodec, SampleLayout

FIXED = SampleLayout("uint8", (8, 8, 3), 3)
FEATURES = {
    sample_layout.ENCODED_IMAGES,
    sample_layout.TEXT_FIELDS,
    sample_layout.NO_IMAGE,
    sample_layout.VARIABLE_RAW,
    sample_layout.DETECTION_TARGETS,
    sample_layout.SEGMENTATION_MASKS,
    sample_layout.SAMPLE_GEOMETRY,
    sample_layout.SOURCE_BYTES,
    sample_layout.ENCODED_SIZES,
    sample_layout.RAW_SIZES,
}
"""Every layout feature ``SampleLayout.features`` can name."""


def layout(**changes) -> SampleLayout:
    fields = {"dtype": "uint8", "shape": (8, 8, 3), "channels": 3, **changes}
    return SampleLayout(**fields)


def test_the_formats_in_the_order_the_cli_lists_them():
    assert FORMAT_NAMES == ("npy", "lmdb", "hdf5", "wds") == tuple(FORMATS)


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_every_import_path_names_an_object_of_the_formats_own_modules(name):
    spec = get_format(name)
    assert spec.writer.startswith(f"packer.formats.{name}:") and spec.reader.startswith(f"readers.datasets.{name}:")
    assert inspect.isclass(resolve(spec.writer)) and spec.writer_class() is resolve(spec.writer)
    assert inspect.isclass(spec.reader_class()) and spec.reader_class().format_name == name
    for ref in (spec.scanner, spec.indexer, spec.intact_scanner, spec.output_files, spec.structure):
        if ref:
            assert callable(resolve(ref)), ref
    assert list(inspect.signature(resolve(spec.scanner)).parameters)[:4] == ["directory", "shard", "layout", "start"]


def test_lmdb_and_hdf5_checksum_their_structure_and_only_wds_writes_files_of_the_whole_output():
    from packer.spec import hdf5_index

    assert {n: FORMATS[n].structure_checksum() for n in FORMAT_NAMES} == {
        "npy": None,
        "lmdb": structure_crc32,
        "hdf5": hdf5_index.structure_crc32,  # its index: labels, keys, offsets
        "wds": None,
    }
    assert [n for n in FORMAT_NAMES if FORMATS[n].output_files] == ["wds"]
    assert [n for n in FORMAT_NAMES if not FORMATS[n].random_access] == ["wds"]
    assert [n for n in FORMAT_NAMES if FORMATS[n].whole_file] == ["lmdb", "hdf5"]


def test_reading_the_registry_loads_no_writer_reader_or_their_libraries():
    code = (
        "import sys\nfrom packer.spec.registry import FORMATS\n"
        "print(sorted(m for m in sys.modules if m.startswith(('packer.formats', 'readers', 'h5py', 'lmdb', 'torch'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_an_unknown_format_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"^unknown format 'NPY'; choose one of npy, lmdb, hdf5, wds$"):
        get_format("NPY")


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_every_format_stores_every_feature_a_layout_can_have(name):
    assert set(FORMATS[name].since) == FEATURES


def test_the_version_written_is_the_oldest_that_describes_the_layout():
    source = layout(shape=None, codec=ImageCodec("source"))
    detection = layout(text=(TextField("target", "detection"),))
    varying_raw = layout(shape=None)
    cases = {"fixed raw": FIXED, "jpeg": layout(codec=ImageCodec("jpeg")), "detection": detection}
    cases |= {"source": source, "raw of own sizes": varying_raw}
    versions = {case: [FORMATS[n].version(lay) for n in FORMAT_NAMES] for case, lay in cases.items()}
    assert versions == {  # npy, lmdb, hdf5 (keys off the heap from 4), wds (other loaders' indexes from 7)
        "fixed raw": [1, 1, 4, 7],
        "jpeg": [2, 2, 4, 7],
        "detection": [5, 5, 5, 7],
        "source": [6, 6, 6, 7],
        "raw of own sizes": [3, 6, 4, 7],  # lmdb and wds index their sizes apart from the images from 6
    }
    assert all(FORMATS[n].version(lay) <= FORMATS[n].newest for n in FORMAT_NAMES for lay in cases.values())


def test_a_feature_the_format_does_not_list_is_refused_naming_each():
    spec = FormatSpec("toy", "m:W", "m:s", "r:R", {sample_layout.ENCODED_IMAGES: 2})
    no_image = SampleLayout.without_image((TextField("text", "text"),))
    with pytest.raises(ConfigError, match="^the toy format cannot store samples without an image, text fields; "):
        spec.version(no_image)
    assert spec.version(layout(codec=ImageCodec("png"))) == 2
