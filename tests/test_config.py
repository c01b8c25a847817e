"""PreprocessConfig validation and the command-line value parsers."""

import json

import pytest

from packer.cli.option_values import parse_normalize, parse_shard_size, parse_size
from packer.config import (
    DEFAULT_SHARD_BYTES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ConvertConfig,
    ImageCodec,
    PreprocessConfig,
    ShardSize,
)
from packer.spec.errors import ConfigError

# --------------------------------------------------------------------------- ImageCodec


def test_codec_defaults_and_manifest_entries():
    assert ImageCodec() == ImageCodec("raw", 90) and not ImageCodec().encoded
    assert ConvertConfig("npy").codec == ImageCodec()
    assert ImageCodec().to_dict() == {"codec": "raw"}
    assert ImageCodec("png", 50).to_dict() == {"codec": "png"}
    assert ImageCodec("jpeg", 75).to_dict() == {"codec": "jpeg", "quality": 75} and ImageCodec("jpeg").encoded


@pytest.mark.parametrize(
    "kwargs", [{"name": "webp"}, {"name": "JPEG"}, {"name": "jpeg", "quality": 0}, {"name": "jpeg", "quality": 96}]
)
def test_bad_codec_raises(kwargs):
    with pytest.raises(ConfigError, match="--codec|--quality"):
        ImageCodec(**kwargs)


@pytest.mark.parametrize("codec", ["jpeg", "png"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_encoded_codecs_refuse_float_storage_and_say_what_to_do(codec, dtype):
    with pytest.raises(ConfigError, match=f"--codec {codec}.*--dtype {dtype}.*use --dtype uint8.*--codec raw"):
        ConvertConfig("npy", PreprocessConfig(dtype=dtype), codec=ImageCodec(codec))
    assert ConvertConfig("npy", PreprocessConfig(dtype=dtype)).codec.name == "raw"
    assert ConvertConfig("npy", PreprocessConfig(mode="L"), codec=ImageCodec(codec)).codec.name == codec


# --------------------------------------------------------------------------- PreprocessConfig


def test_defaults():
    cfg = PreprocessConfig()
    assert cfg.size == (224, 224)
    assert cfg.resize == "shorter-crop"
    assert cfg.mode == "RGB"
    assert cfg.channels == 3
    assert cfg.fill == (0, 0, 0)
    assert cfg.background == (255, 255, 255)
    assert cfg.mean == IMAGENET_MEAN
    assert cfg.std == IMAGENET_STD
    assert cfg.dtype == "uint8"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"resize": "crop"},
        {"resize": ""},
        {"mode": "RGBA"},
        {"mode": "rgb"},
        {"dtype": "float64"},
        {"dtype": "int8"},
        {"interpolation": "cubic"},
    ],
)
def test_bad_choices_raise(kwargs):
    with pytest.raises(ConfigError):
        PreprocessConfig(**kwargs)


def test_config_error_is_value_error():
    with pytest.raises(ValueError):
        PreprocessConfig(resize="bogus")


@pytest.mark.parametrize("size", [None, (0, 10), (10, 0), (224,), (1, 2, 3)])
def test_bad_size_raises(size):
    with pytest.raises(ConfigError):
        PreprocessConfig(size=size)


def test_resize_none_drops_size():
    cfg = PreprocessConfig(size=(10, 20), resize="none")
    assert cfg.size is None
    assert cfg.image_shape is None


def test_image_shape_is_height_width_channels():
    assert PreprocessConfig(size=(256, 192)).image_shape == (192, 256, 3)
    assert PreprocessConfig(size=(32, 24), mode="L").image_shape == (24, 32, 1)


def test_single_values_broadcast_to_rgb():
    cfg = PreprocessConfig(fill=(7,), background=(9,), mean=(0.5,), std=(0.25,))
    assert cfg.fill == (7, 7, 7)
    assert cfg.background == (9, 9, 9)
    assert cfg.mean == (0.5, 0.5, 0.5)
    assert cfg.std == (0.25, 0.25, 0.25)


def test_per_channel_values_kept_and_typed():
    cfg = PreprocessConfig(fill=(1.0, 2.0, 3.0), mean=(1, 0, 0), std=(1, 2, 3))
    assert cfg.fill == (1, 2, 3)
    assert all(isinstance(v, int) for v in cfg.fill)
    assert cfg.mean == (1.0, 0.0, 0.0)
    assert all(isinstance(v, float) for v in cfg.mean + cfg.std)


def test_grayscale_averages_rgb_settings():
    cfg = PreprocessConfig(mode="L")  # imagenet stats, RGB fill and background defaults
    assert cfg.channels == 1
    assert cfg.mean == pytest.approx((0.449,))
    assert cfg.std == pytest.approx((0.226,))
    assert len(cfg.mean) == len(cfg.std) == 1
    assert cfg.fill == (0,)
    assert cfg.background == (255,)
    cfg = PreprocessConfig(mode="L", fill=(10, 20, 60), background=(1, 2, 4))
    assert cfg.fill == (30,)
    assert cfg.background == (2,)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fill": (1, 2)},
        {"background": (1, 2, 3, 4)},
        {"mean": (0.1, 0.2), "std": (0.1, 0.2)},
        {"mode": "L", "fill": (1, 2)},
    ],
)
def test_wrong_value_count_raises(kwargs):
    with pytest.raises(ConfigError):
        PreprocessConfig(**kwargs)


def test_mean_without_std_raises():
    with pytest.raises(ConfigError):
        PreprocessConfig(mean=(0.5,), std=None)
    with pytest.raises(ConfigError):
        PreprocessConfig(mean=None, std=(0.5,))


@pytest.mark.parametrize("std", [(0.0,), (-1.0,), (0.2, 0.0, 0.2)])
def test_non_positive_std_raises(std):
    with pytest.raises(ConfigError):
        PreprocessConfig(mean=(0.5,), std=std)


def test_no_normalization():
    cfg = PreprocessConfig(mean=None, std=None)
    assert cfg.mean is None and cfg.std is None
    assert cfg.to_dict()["normalize"] is None


def test_to_dict_form():
    d = PreprocessConfig(size=(32, 24)).to_dict()
    assert "mean" not in d and "std" not in d
    assert d["normalize"] == {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
    assert tuple(d["size"]) == (32, 24)
    assert d["dtype"] == "uint8"


@pytest.mark.parametrize(
    "cfg",
    [
        PreprocessConfig(),
        PreprocessConfig(size=(32, 24), resize="pad", fill=(1, 2, 3), interpolation="lanczos"),
        PreprocessConfig(mode="L", dtype="float16", background=(5,)),
        PreprocessConfig(resize="none", mean=None, std=None, dtype="float32"),
        PreprocessConfig(size=(8, 8), resize="stretch", mean=(0.5,), std=(0.5,)),
        PreprocessConfig(mode="L", auto_normalize=True),
    ],
)
def test_dict_round_trip_through_json(cfg):
    d = json.loads(json.dumps(cfg.to_dict()))
    back = PreprocessConfig.from_dict(d)
    assert back == cfg
    assert back.to_dict() == cfg.to_dict()


# --------------------------------------------------------------------------- parse_size


@pytest.mark.parametrize(
    "text, expected",
    [
        ("224", (224, 224)),
        ("256x192", (256, 192)),
        ("256X192", (256, 192)),
        (" 32 x 24 ", (32, 24)),
        ("1", (1, 1)),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "0", "0x10", "10x0", "224x", "x224", "-5", "2.5", "10x10x3", "10,10"])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError):
        parse_size(text)


# --------------------------------------------------------------------------- parse_normalize


def norm(mean, std, auto=False):
    return {"mean": mean, "std": std, "auto_normalize": auto}


def test_parse_normalize_keywords():
    assert parse_normalize("imagenet") == norm(IMAGENET_MEAN, IMAGENET_STD)
    assert parse_normalize(" ImageNet ") == norm(IMAGENET_MEAN, IMAGENET_STD)
    assert parse_normalize("none") == norm(None, None)
    assert parse_normalize("NONE") == norm(None, None)
    assert parse_normalize(" Auto ") == norm(None, None, auto=True)


def test_parse_normalize_two_numbers():
    assert parse_normalize("0.5,0.5") == norm((0.5,), (0.5,))
    assert parse_normalize("0.1,0.2") == norm((0.1,), (0.2,))


def test_parse_normalize_six_numbers_means_first():
    parsed = parse_normalize("0.485,0.456,0.406,0.229,0.224,0.225")
    assert parsed["mean"] == (0.485, 0.456, 0.406)
    assert parsed["std"] == (0.229, 0.224, 0.225)


@pytest.mark.parametrize("text", ["0.5,0.25", "auto", "none"])
def test_parse_normalize_feeds_config(text):
    cfg = PreprocessConfig(**parse_normalize(text))
    expected = {"0.5,0.25": ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), "auto": (None, None), "none": (None, None)}
    assert (cfg.mean, cfg.std) == expected[text]
    assert cfg.auto_normalize == (text == "auto")


def test_auto_normalize_is_recorded_as_auto():
    """The plan fingerprint and the resume record see ``auto``, not the statistics filled in later."""
    cfg = PreprocessConfig(auto_normalize=True)  # the imagenet default gives way
    assert cfg.mean is None and cfg.std is None
    assert cfg.to_dict()["normalize"] == "auto" and "auto_normalize" not in cfg.to_dict()
    assert PreprocessConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_auto_normalize_refused_with_float_storage(dtype):
    with pytest.raises(ConfigError, match="--normalize auto needs --dtype uint8") as e:
        PreprocessConfig(auto_normalize=True, dtype=dtype)
    assert "statistics pass" in str(e.value) and "MEAN,STD" in str(e.value)


@pytest.mark.parametrize("text", ["", "0.5", "1,2,3", "a,b", "imagenet2", "0.5,,0.5", "0.5;0.5"])
def test_parse_normalize_rejects(text):
    with pytest.raises(ConfigError):
        parse_normalize(text)


# --------------------------------------------------------------------------- parse_shard_size


def test_parse_shard_size_auto():
    s = parse_shard_size("auto")
    assert s.is_auto
    assert s == ShardSize()
    assert s.describe() == "auto"
    assert parse_shard_size(" AUTO ").is_auto


def test_parse_shard_size_samples():
    s = parse_shard_size("1000")
    assert s == ShardSize(samples=1000)
    assert s.bytes is None and not s.is_auto
    assert s.describe() == "1000 samples"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("256MB", 256 * 1000**2),
        ("256mb", 256 * 1000**2),
        ("256 MB", 256 * 1000**2),
        ("1GiB", 1024**3),
        ("256MiB", DEFAULT_SHARD_BYTES),
        ("10kb", 10_000),
        ("1.5MB", 1_500_000),
        ("100b", 100),
        ("2g", 2 * 1000**3),
    ],
)
def test_parse_shard_size_bytes(text, expected):
    s = parse_shard_size(text)
    assert s == ShardSize(bytes=expected)
    assert s.samples is None
    assert s.describe() == f"{expected} bytes"


@pytest.mark.parametrize("text", ["1.5", "abc", "", "0", "-5", "10TB", "MB", "1e3"])
def test_parse_shard_size_rejects(text):
    with pytest.raises(ConfigError):
        parse_shard_size(text)


def test_shard_size_not_both():
    with pytest.raises(ConfigError):
        ShardSize(samples=1, bytes=1)
    with pytest.raises(ConfigError):
        ShardSize(bytes=0)


def test_decode_error_rebuilds_from_its_message_alone():
    from packer.spec.errors import DecodeError

    e = DecodeError("a/b.png: truncated")  # as torch's DataLoader rebuilds a worker's exception
    assert str(e) == "a/b.png: truncated"
    assert str(DecodeError("a/b.png", "truncated")) == "a/b.png: truncated"


def test_geometry_is_recorded_for_shorter_crop_only_and_older_records_mean_fractional():
    assert PreprocessConfig().to_dict()["geometry"] == "torchvision"
    assert "geometry" not in PreprocessConfig(resize="stretch").to_dict()  # other outputs' records as before
    old = PreprocessConfig().to_dict()
    del old["geometry"]  # a shorter-crop output of packer before 0.3.0
    assert PreprocessConfig.from_dict(old).geometry == "fractional"
    with pytest.raises(ConfigError, match="geometry"):
        PreprocessConfig(geometry="exact")
