"""readers.datasets.tensors: stored pixels to normalized float32, in every layout a crop comes in and
every layout a batch is written in (NCHW, channels-last), with the same values; and
make_loader(..., memory_format=torch.channels_last) over real outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
import torch
from conftest import pack_every_format
from helpers import stop_workers

from packer import PreprocessConfig
from readers import RandomResizedCrop, make_loader, open_dataset
from readers.datasets.tensors import BatchNormalize, ImageConverter

ROOT = Path(__file__).resolve().parent.parent
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class Manifest:
    """What the converters read of a manifest: its normalization (``channels`` values), or none."""

    def __init__(self, channels: int = 3, normalized: bool = True) -> None:
        norm = {"mean": MEAN[:channels], "std": STD[:channels]} if normalized else None
        self.preprocess = {"normalize": norm}


def layouts(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """One HWC uint8 image as each kind of source gives it, all (C, H, W) views: pixels side by side
    (OpenCV, a stored raw image), a view of a wider image (a crop of a memory map), planes (torch's
    resize), and a read-only array."""
    h, w, c = pixels.shape
    wide = np.zeros((h, w + 7, c), np.uint8)
    wide[:, 3 : 3 + w] = pixels
    frozen = pixels.copy()
    frozen.setflags(write=False)
    return {
        "hwc": pixels.transpose(2, 0, 1),
        "crop of a wider image": wide[:, 3 : 3 + w].transpose(2, 0, 1),
        "planar": np.ascontiguousarray(pixels.transpose(2, 0, 1)),
        "read-only": frozen.transpose(2, 0, 1),
    }


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("normalized", [True, False], ids=["mean-std", "x/255"])
def test_normalize_gives_x_over_255_minus_mean_over_std_in_every_layout(channels, normalized):
    pixels = np.random.default_rng(channels).integers(0, 256, (37, 53, channels), dtype=np.uint8)
    pixels[0, 0], pixels[-1, -1] = 0, 255  # both ends of the range
    mean = np.array(MEAN[:channels] if normalized else [0.0] * channels, np.float64)
    std = np.array(STD[:channels] if normalized else [1.0] * channels, np.float64)
    exact = ((pixels / 255.0 - mean) / std).transpose(2, 0, 1)
    normalize = BatchNormalize(Manifest(channels, normalized))
    results = []
    for name, source in layouts(pixels).items():
        nchw = np.full((channels, 37, 53), np.nan, np.float32)
        normalize.normalize_into(source, nchw)
        nhwc = np.full((37, 53, channels), np.nan, np.float32)
        normalize.normalize_into(source, nhwc.transpose(2, 0, 1))  # a channels-last batch's slot
        assert np.abs(nchw - exact).max() <= 4 * np.finfo(np.float32).eps * np.abs(exact).max(), name
        results += [nchw, nhwc.transpose(2, 0, 1)]
    assert all(np.array_equal(results[0], r) for r in results)  # every layout: the same float32 values


def test_batches_of_either_layout_equal_value_for_value_on_the_cpu():
    batch = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (4, 6, 5, 3), dtype=np.uint8)).permute(
        0, 3, 1, 2
    )
    nchw = BatchNormalize(Manifest())(batch)
    nhwc = BatchNormalize(Manifest(), torch.channels_last)(batch)
    assert nchw.is_contiguous() and nhwc.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nchw, nhwc)
    with pytest.raises(ValueError, match="torch.contiguous_format .* or torch.channels_last"):
        BatchNormalize(Manifest(), torch.preserve_format)


def test_stored_values_stay_nhwc_whatever_the_memory_format():
    assert ImageConverter(Manifest(), normalize=False).channels_last
    assert not ImageConverter(Manifest()).channels_last
    assert ImageConverter(Manifest(), memory_format=torch.channels_last).channels_last


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """18 images in 3 classes, stored at their own 64x48 size, as npy and wds."""
    pre = PreprocessConfig(size=None, resize="none")
    return pack_every_format(tmp_path_factory, {"a": 6, "b": 6, "c": 6}, pre, 5, ("npy", "wds"))


@pytest.mark.parametrize("fmt", ["npy", "wds"])
@pytest.mark.parametrize("workers", [0, 2])
def test_channels_last_batches_equal_the_nchw_ones(packed, fmt, workers):
    """make_loader(memory_format=torch.channels_last): NHWC memory from the workers' ring slots (or the
    main process), the same values as NCHW batches, cropped and flipped alike."""

    def batches(memory_format):
        ds = open_dataset(packed[fmt], crop=RandomResizedCrop(40), flip=True)
        loader = make_loader(ds, 4, seed=2, num_workers=workers, memory_format=memory_format)
        assert (loader.ring is not None) == (workers > 0)  # the workers write into reused shared slots
        out = [(x.clone(memory_format=torch.preserve_format), y) for x, y in loader]
        stop_workers(loader)
        return out

    nchw, nhwc = batches(None), batches(torch.channels_last)
    assert len(nchw) == len(nhwc) == 5
    for (a, la), (b, lb) in zip(nchw, nhwc):
        assert a.is_contiguous() and b.is_contiguous(memory_format=torch.channels_last) and not b.is_contiguous()
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_batches_stacked_from_samples_are_laid_out_as_asked_too(packed):
    """With return_meta (or a transform, targets, text) batches are stacked from samples, NCHW: the
    loader copies them into the layout asked for, the same values."""
    ds = open_dataset(packed["npy"], crop=RandomResizedCrop(32), flip=True, return_meta=True)
    nchw = [x for x, _, _ in make_loader(ds, 6, num_workers=0, seed=1)]
    nhwc = [x for x, _, _ in make_loader(ds, 6, num_workers=0, seed=1, memory_format=torch.channels_last)]
    assert all(b.is_contiguous(memory_format=torch.channels_last) for b in nhwc)
    assert all(torch.equal(a, b) for a, b in zip(nchw, nhwc, strict=True))


def test_the_datasets_own_memory_format_is_the_loaders_default(packed):
    ds = open_dataset(packed["npy"], crop=RandomResizedCrop(32), memory_format=torch.channels_last)
    images, _ = next(iter(make_loader(ds, 6, num_workers=0)))
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert ds.batch_normalizer().memory_format == torch.channels_last
    assert ds[0][0].is_contiguous()  # single samples stay CHW
    images, _ = next(iter(make_loader(ds, 6, num_workers=0, memory_format=torch.contiguous_format)))
    assert images.is_contiguous()
    with pytest.raises(ValueError, match="memory_format takes"):
        open_dataset(packed["npy"], memory_format="nhwc")


def test_the_normalize_microbenchmark_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_normalize.py"), "--smoke"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("Host: ") and "channels-last: normalize_into (chosen)" in out.stdout


@pytest.mark.parametrize("channels", [2, 4])
def test_any_channel_count_and_any_slot_layout_gives_the_same_values(channels):
    """Channel counts the unrolled RGB loop does not take, and a slot that is neither NCHW nor
    channels-last (written through a buffer), give numpy's two float32 roundings exactly."""
    pixels = np.random.default_rng(channels).integers(0, 256, (9, 11, channels), dtype=np.uint8)
    normalize = BatchNormalize(Manifest(channels, normalized=False))
    scale, bias = np.float32(1 / 255), np.float32(0)
    expected = (pixels.transpose(2, 0, 1).astype(np.float32) * scale + bias).astype(np.float32)
    for name, source in layouts(pixels).items():
        for slot in (
            np.empty((channels, 9, 11), np.float32),
            np.empty((9, 11, channels), np.float32).transpose(2, 0, 1),
            np.empty((channels, 9, 22), np.float32)[:, :, ::2],  # every other column: strided
        ):
            normalize.normalize_into(source, slot)
            assert np.array_equal(slot, expected), name


def aligned_floats(shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
    """A float32 array of ``shape`` whose first element lies ``offset`` floats past a 64-byte
    boundary, NaN-filled (as a batch tensor's slots lie on one, or do not)."""
    size = int(np.prod(shape))
    raw = np.full(size + 32, np.nan, np.float32)
    start = (-raw.ctypes.data // 4) % 16 + offset
    return raw[start : start + size].reshape(shape)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize("offset", [0, 1], ids=["on a cache line", "off a cache line"])
def test_streamed_stores_give_the_loops_values_in_every_layout(channels, offset):
    """Slots on a 64-byte boundary with planes or images a multiple of 16 floats (224 x 224: a batch
    tensor's) take the streamed stores, which ``normalize_into`` says; others the plain loops. Both
    give numpy's two roundings, and a store past the image's end would show in the NaN after it."""
    pixels = np.random.default_rng(7).integers(0, 256, (32, 48, channels), dtype=np.uint8)
    pixels[0, 0], pixels[-1, -1] = 0, 255
    manifest = Manifest(channels)
    manifest.preprocess["normalize"] = {"mean": [0.5, 0.4, 0.3, 0.2][:channels], "std": [0.2, 0.3, 0.4, 0.5][:channels]}
    normalize = BatchNormalize(manifest)
    scale, bias = (f.reshape(-1) for f in (normalize._np_scale, normalize._np_bias))
    expected = (pixels.astype(np.float32) * scale).astype(np.float32) + bias
    for name, source in layouts(pixels).items():
        nchw = aligned_floats((channels * 32 * 48 + 16,), offset)
        streamed = normalize.normalize_into(source, nchw[:-16].reshape(channels, 32, 48))
        nhwc = aligned_floats((32 * 48 * channels + 16,), offset)
        streamed_cl = normalize.normalize_into(source, nhwc[:-16].reshape(32, 48, channels).transpose(2, 0, 1))
        assert np.array_equal(nchw[:-16].reshape(channels, 32, 48), expected.transpose(2, 0, 1)), name
        assert np.array_equal(nhwc[:-16].reshape(32, 48, channels), expected), name
        assert np.isnan(nchw[-16:]).all() and np.isnan(nhwc[-16:]).all(), name
        planar = name == "planar" and channels > 1  # the loops that stream each pair of layouts:
        assert streamed == (offset == 0 and (planar or channels in (1, 3))), name  # any planes; 1 or 3 side by side
        assert streamed_cl == (offset == 0 and (not planar or channels == 3)), name  # side by side; RGB planes


def test_a_batch_tensors_slots_take_the_streamed_stores_and_a_single_image_does_not():
    """torch aligns a batch's memory to 64 bytes, so each 224 x 224 slot and each of its planes starts
    on a cache line: those slots are written past the cache, in both layouts; ``stream=False``, and a
    single image (``ImageConverter``: read right after), stay in it."""
    crop = np.random.default_rng(3).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    normalize = BatchNormalize(Manifest())
    expected = crop.transpose(2, 0, 1).astype(np.float32) * normalize._np_scale + normalize._np_bias
    nchw = torch.empty((2, 3, 224, 224), dtype=torch.float32).numpy()
    nhwc = torch.empty((2, 224, 224, 3), dtype=torch.float32).numpy().transpose(0, 3, 1, 2)
    for batch in (nchw, nhwc):
        assert normalize.normalize_into(crop.transpose(2, 0, 1), batch[1])
        assert np.array_equal(batch[1], expected)
        assert not normalize.normalize_into(crop.transpose(2, 0, 1), batch[0], stream=False)
        assert np.array_equal(batch[0], expected)
    calls = []
    real = normalize.normalize_into
    normalize.normalize_into = lambda *a, **k: calls.append(k) or real(*a, **k)  # type: ignore[method-assign]
    convert = ImageConverter(Manifest())
    convert.normalize = normalize
    assert torch.equal(convert(crop), torch.from_numpy(expected)) and calls == [{"stream": False}]


def test_the_loops_refuse_arrays_they_would_misread():
    """The streamed stores index from the data pointer: a strided or wrongly typed array is refused
    when numba compiles the call, never written past its view."""
    from numba.core.errors import TypingError

    from readers.datasets import normalize_kernel

    factors = np.ones(48, np.float32)
    with pytest.raises(TypingError, match="C-contiguous"):
        normalize_kernel.planes_to_planes(
            np.zeros(32, np.uint8), np.zeros(64, np.float32)[::2], 1, factors, factors, True
        )
    with pytest.raises(TypingError, match="C-contiguous"):
        normalize_kernel.pixels_to_planes(
            np.zeros(96, np.uint8), np.zeros(192, np.float32)[::2], 3, factors, factors, True
        )
    # one channel's lanes of RGB pixels: a shuffle fixed when compiled, so the channel is a constant
    channel = normalize_kernel._stream16_channel
    src, dst = np.zeros(48, np.uint8), np.zeros(16, np.float32)

    @numba.njit
    def any_channel(c):
        channel(src, 0, dst, 0, factors, factors, c)

    @numba.njit
    def fourth_channel():
        channel(src, 0, dst, 0, factors, factors, 3)

    for call, args in ((any_channel, (1,)), (fourth_channel, ())):
        with pytest.raises(TypingError, match="constant 0, 1 or 2"):
            call(*args)


def test_normalize_refuses_what_it_cannot_write_and_takes_empty_images():
    normalize = BatchNormalize(Manifest())
    normalize.normalize_into(np.empty((3, 0, 5), np.uint8), np.empty((3, 0, 5), np.float32))
    with pytest.raises(ValueError, match="uint8 CHW into float32"):
        normalize.normalize_into(np.zeros((3, 2, 2), np.uint8), np.empty((3, 2, 2), np.float64))
    with pytest.raises(ValueError, match="uint8 CHW into float32"):
        normalize.normalize_into(np.zeros((3, 2, 2), np.uint8), np.empty((3, 2, 3), np.float32))


def test_a_source_that_shares_memory_with_its_slot_is_read_before_it_is_overwritten():
    """A uint8 image whose bytes lie at the start of the float32 slot it is normalized into."""
    pixels = np.random.default_rng(3).integers(0, 256, (5, 6, 3), dtype=np.uint8)
    expected = np.empty((3, 5, 6), np.float32)
    normalize = BatchNormalize(Manifest())
    normalize.normalize_into(pixels.transpose(2, 0, 1), expected)
    for planar in (True, False):
        buffer = np.zeros(3 * 5 * 6 * 4, np.uint8)
        laid = np.ascontiguousarray(pixels.transpose(2, 0, 1) if planar else pixels)
        buffer[: laid.size] = laid.reshape(-1)
        src = buffer[: laid.size].reshape(laid.shape)
        slot = buffer.view(np.float32).reshape(3, 5, 6)
        normalize.normalize_into(src if planar else src.transpose(2, 0, 1), slot)
        assert np.array_equal(slot, expected), planar


def test_kernels_load_for_the_outputs_channel_count(monkeypatch):
    """The loops are loaded where a reader of uint8 images is made, for its own channel count (a
    4-channel normalization must not trip over an RGB warm-up), and equal numpy's values."""
    from readers.datasets import tensors

    monkeypatch.setattr(tensors, "_KERNEL", [])  # as in a fresh process
    manifest = Manifest(3)
    manifest.preprocess["normalize"] = {"mean": [0.5, 0.4, 0.3, 0.2], "std": [0.2, 0.3, 0.4, 0.5]}
    manifest.uint8_images = True
    convert = ImageConverter(manifest)  # type: ignore[arg-type]
    assert tensors._KERNEL  # loaded here, before any image
    pixels = np.random.default_rng(4).integers(0, 256, (7, 9, 4), dtype=np.uint8)
    scale = (1.0 / (255.0 * np.array([0.2, 0.3, 0.4, 0.5], np.float32))).astype(np.float32)
    bias = (-np.array([0.5, 0.4, 0.3, 0.2], np.float32) / np.array([0.2, 0.3, 0.4, 0.5], np.float32)).astype(np.float32)
    expected = (pixels.astype(np.float32) * scale).astype(np.float32) + bias
    assert torch.equal(convert(pixels), torch.from_numpy(expected.transpose(2, 0, 1).copy()))


def test_the_loops_run_uncached_where_numba_finds_nowhere_to_cache(tmp_path):
    """A read-only install and home: numba's cache has no locator; the loops compile in the process."""
    script = (
        "import numba.core.caching as caching\n"
        "caching.CacheImpl._locator_classes = []\n"
        "import numpy as np\n"
        "from readers.datasets import normalize_kernel as k\n"
        "src = np.arange(12, dtype=np.uint8)\n"
        "dst = np.empty(12, np.float32)\n"
        "two, one = np.full(3, 2, np.float32), np.ones(3, np.float32)\n"
        "assert not k.pixels_to_planes(src, dst, 3, np.repeat(two, 16), np.repeat(one, 16), True)\n"
        "assert dst.tolist() == [1 + 2 * v for v in [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11]], dst\n"
        "print(type(k.pixels_to_planes._cache).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "NullCache"  # numba's stand-in where nothing is cached
