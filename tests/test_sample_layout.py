"""The sample layout: one record built from the configuration and from the manifest, and the one
place that decides how images are stored; the registry's version rule over its features."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from packer.config import ConvertConfig, ImageCodec, PreprocessConfig
from packer.spec.entries import TextField
from packer.spec.errors import ConfigError
from packer.spec.manifest import Manifest, ShardEntry
from packer.spec.registry import FORMATS, FormatSpec
from packer.spec.sample_layout import (
    ENCODED_IMAGES,
    ENCODED_SIZES,
    NO_IMAGE,
    RAW_SIZES,
    SAMPLE_GEOMETRY,
    TEXT_FIELDS,
    VARIABLE_RAW,
    ImageStorage,
    SampleLayout,
    choose,
)
from packer.spec.text import TextConfig

CASES = {
    "fixed raw": (ConvertConfig("npy"), ("image",)),
    "gray float32": (ConvertConfig("hdf5", PreprocessConfig(size=(8, 6), mode="L", dtype="float32")), ("image",)),
    "jpeg": (ConvertConfig("lmdb", codec=ImageCodec("jpeg", 75)), ("image",)),
    "png of own sizes": (
        ConvertConfig("wds", PreprocessConfig(resize="none"), codec=ImageCodec("png", 50)),
        ("image",),
    ),
    "raw of own sizes": (ConvertConfig("npy", PreprocessConfig(resize="none")), ("image",)),
    "text only": (ConvertConfig("npy", text=TextConfig()), ("text",)),
    "image, text, json": (ConvertConfig("lmdb", text=TextConfig(allow_missing=True)), ("image", "text", "json")),
}


def manifest_of(config: ConvertConfig, layout: SampleLayout) -> Manifest:
    """A manifest as the converter writes it for ``layout`` (no shards)."""
    spec = FORMATS[config.format]
    return Manifest(
        config.format,
        spec.version(layout),
        "0",
        0,
        None,
        layout.fields(),
        config.preprocess.to_dict(),
        [ShardEntry("shard-00000", 0, [])],
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_manifest_gives_back_the_layout_the_converter_wrote(case):
    config, fields = CASES[case]
    layout = SampleLayout.from_config(config, fields)
    again = SampleLayout.from_manifest(Manifest.from_dict(manifest_of(config, layout).to_dict()))
    assert again == layout
    assert again.image is layout.image and again.features() == layout.features()


def test_the_image_storage_is_decided_once_from_codec_shape_and_fields():
    kinds = {case: SampleLayout.from_config(*CASES[case]).image for case in CASES}
    assert kinds == {
        "fixed raw": ImageStorage.FIXED,
        "gray float32": ImageStorage.FIXED,
        "jpeg": ImageStorage.ENCODED,
        "png of own sizes": ImageStorage.ENCODED,
        "raw of own sizes": ImageStorage.VARIABLE,
        "text only": ImageStorage.NONE,
        "image, text, json": ImageStorage.FIXED,
    }
    gray = SampleLayout.from_config(*CASES["gray float32"])
    assert (gray.shape, gray.channels, gray.mode, gray.sample_bytes) == ((6, 8, 1), 1, "L", 6 * 8 * 4)
    batches_are_one_tensor = {case for case in CASES if SampleLayout.from_config(*CASES[case]).fixed_images}
    assert batches_are_one_tensor == {"fixed raw", "gray float32", "jpeg"}  # decoded jpegs of one size too


def test_features_name_what_a_layout_uses_beyond_fixed_raw_images():
    features = {case: SampleLayout.from_config(*CASES[case]).features() for case in CASES}
    assert features["fixed raw"] == features["gray float32"] == frozenset()
    assert features["jpeg"] == {ENCODED_IMAGES}
    assert features["png of own sizes"] == {ENCODED_IMAGES, ENCODED_SIZES}  # their sizes indexed (version 6)
    assert features["raw of own sizes"] == {VARIABLE_RAW, RAW_SIZES}
    assert features["text only"] == {NO_IMAGE, TEXT_FIELDS}
    assert features["image, text, json"] == {TEXT_FIELDS, SAMPLE_GEOMETRY}  # the json's image geometry beside it


def test_check_image_refuses_a_missing_image_or_another_shape():
    fixed = SampleLayout("uint8", (4, 5, 3), 3)
    fixed.check_image(np.zeros((4, 5, 3), "uint8"))
    with pytest.raises(ValueError, match=r"image of shape \(5, 4, 3\) in a shard of shape \(4, 5, 3\)"):
        fixed.check_image(np.zeros((5, 4, 3), "uint8"))
    with pytest.raises(ValueError, match="image of shape None"):
        replace(fixed, shape=None).check_image(None)


def test_a_storage_a_format_has_no_encoder_for_is_refused_by_name():
    layout = SampleLayout("uint8", None, 3)  # raw images of their own sizes
    assert choose(layout, {ImageStorage.VARIABLE: "enc"}, "npy") == "enc"
    with pytest.raises(ConfigError, match="the zarr format cannot store variable images"):
        choose(layout, {ImageStorage.FIXED: "enc"}, "zarr")


def test_the_version_rule_refuses_a_feature_the_format_does_not_list():
    spec = FormatSpec("toy", "m:W", "m:s", "r:R", {ENCODED_IMAGES: 2})
    assert spec.newest == 2
    assert spec.version(SampleLayout("uint8", (2, 2, 3), 3)) == 1
    assert spec.version(SampleLayout("uint8", (2, 2, 3), 3, ImageCodec("png"))) == 2
    text = SampleLayout("uint8", (2, 2, 3), 3, text=(TextField("text", "text"),))
    with pytest.raises(ConfigError, match="the toy format cannot store text fields"):
        spec.version(text)
    later = FormatSpec("toy", "m:W", "m:s", "r:R", {ENCODED_IMAGES: 2}, oldest_written=5)
    assert later.newest == 5 and later.version(SampleLayout("uint8", (2, 2, 3), 3)) == 5


def test_a_recorded_quality_is_read_back_only_for_jpeg_and_only_when_it_is_one():
    fields = SampleLayout("uint8", (2, 2, 3), 3, ImageCodec("jpeg", 70)).fields()
    manifest = Manifest("npy", 2, "0", 0, None, fields, PreprocessConfig().to_dict(), [ShardEntry("s", 0, [])])
    assert SampleLayout.from_manifest(manifest).codec == ImageCodec("jpeg", 70)
    for damaged in (0, 500, None, "90", True):
        manifest.fields["image"]["quality"] = damaged
        assert SampleLayout.from_manifest(manifest).codec == ImageCodec("jpeg", 90)
