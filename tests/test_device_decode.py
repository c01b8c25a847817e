"""make_loader(..., decode="device"): JPEG bytes and crop placements cross from the workers, and the
loader decodes, crops, flips and normalizes them where the batches go. Checked here on the CPU (the
same code as on CUDA but for the decoder): the batches are decode="workers"' batches within a level
of each pixel, in every crop mode, with PNG and EXIF-turned source files rendered by the workers."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
import torch
from conftest import write_image
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from readers import CenterCrop, RandomResizedCrop, make_loader, open_dataset
from readers.augment import jpeg_region
from readers.augment.device_decode import DeviceDecoder, EncodedBatch
from readers.loading.batch_buffers import BatchBuffers

MAX = PreprocessConfig(resize="max", size=(72, 72))
STD = 0.225  # the smallest of ImageNet's stds: a level is at most 1 / (255 * STD) of a normalized value


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    """Images of several sizes stored at their own (``--resize max 72``) as JPEG (npy, lmdb), raw
    (npy), and as ``--codec source`` with a PNG and an EXIF-turned JPEG among plain JPEGs."""
    src = tmp_path_factory.mktemp("src") / "images"
    sizes = [(120, 80), (60, 90), (200, 50), (72, 72), (40, 30), (90, 160)]
    for i in range(18):
        write_image(src / f"c{i % 3}" / f"{i:02d}.png", sizes[i % len(sizes)], seed=i)
    sources = tmp_path_factory.mktemp("sources") / "images"
    for i in range(10):
        write_image(sources / f"c{i % 2}" / f"{i:02d}.jpg", (64 + 4 * i, 48), seed=i, quality=90)
    write_image(sources / "c0" / "png.png", (50, 70), seed=20)
    turned = write_image(sources / "c1" / "turned.jpg", (60, 40), seed=21, quality=90)
    with Image.open(turned) as img:
        exif = img.getexif()
        exif[0x0112] = 6
        img.save(turned, exif=exif, quality=90)
    out = tmp_path_factory.mktemp("out")
    found = {}
    for name, fmt, codec, source in [
        ("npy", "npy", "jpeg", src),
        ("lmdb", "lmdb", "jpeg", src),
        ("raw", "npy", "raw", src),
        ("wds", "wds", "jpeg", src),
        ("source", "npy", "source", sources),
    ]:
        convert(source, out / name, ConvertConfig(fmt, MAX, ShardSize(samples=7), codec=ImageCodec(codec)), workers=1)
        found[name] = out / name
    return found


def _pairs(path, crop, workers: int = 2, normalize: bool = True, **kw):
    ds = open_dataset(path, crop=crop, flip=True, normalize=normalize)
    plain = make_loader(ds, 5, num_workers=workers, seed=4, **kw)
    device = make_loader(ds, 5, num_workers=workers, seed=4, decode="device", **kw)
    return list(zip(plain, device))


def _levels(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) * (255 * STD if a.dtype == torch.float32 else 1)


@pytest.mark.parametrize("name", ["npy", "lmdb", "source"])
@pytest.mark.parametrize(
    "crop",
    [RandomResizedCrop(48), CenterCrop(40, resize=56), CenterCrop(64)],
    ids=["random", "resize-centre", "padding-centre"],
)
def test_device_batches_are_the_workers_batches_within_a_level(outputs, name, crop):
    pairs = _pairs(outputs[name], crop)
    assert len(pairs) == (4 if name != "source" else 3)
    for (images, labels), (on_device, their_labels) in pairs:
        assert torch.equal(labels, their_labels)
        assert on_device.shape == images.shape and on_device.dtype == torch.float32 and on_device.is_contiguous()
        assert _levels(images, on_device) <= 1.01


def test_uint8_batches_without_normalization_and_no_workers(outputs):
    pairs = _pairs(outputs["npy"], RandomResizedCrop(48), workers=0, normalize=False)
    assert len(pairs) == 4  # 18 samples in batches of 5
    for (images, labels), (on_device, their_labels) in pairs:
        assert on_device.dtype == torch.uint8 and torch.equal(labels, their_labels)
        assert _levels(images, on_device) <= 1


def test_workers_send_jpeg_bytes_and_render_only_what_the_device_cannot(outputs):
    """The plain JPEGs cross as their stored bytes; the PNG, the EXIF-turned file and the boxes that
    pad are rendered by the worker."""
    ds = open_dataset(outputs["source"], crop=RandomResizedCrop(48), flip=True)
    ds = ds.for_loader(BatchBuffers(encoded=True), 0)
    batch = ds.__getitems__(list(range(len(ds))))
    assert isinstance(batch, EncodedBatch) and len(batch.labels) == 12
    assert len(batch.rows) == 10 and len(batch.done) == 2  # the PNG and the turned JPEG
    ends = [0, *batch.ends.tolist()]
    assert all(bytes(batch.data[a:b].numpy()).startswith(b"\xff\xd8") for a, b in zip(ends, ends[1:]))
    padded = open_dataset(outputs["npy"], crop=CenterCrop(300))
    padded = padded.for_loader(BatchBuffers(encoded=True), 0)
    assert len(padded.__getitems__([0, 1, 2]).done) == 3


def test_resume_mid_epoch_gives_the_rest_of_the_uninterrupted_epoch(outputs):
    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(48), flip=True)
    whole = [b[0] for b in make_loader(ds, 5, num_workers=2, seed=1, decode="device")]
    first = make_loader(ds, 5, num_workers=2, seed=1, decode="device")
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    again = make_loader(ds, 5, num_workers=2, seed=1, decode="device")
    again.load_state_dict(state)
    rest = [b[0] for b in again]
    assert len(rest) == len(whole) - 1 and all(torch.equal(a, b) for a, b in zip(rest, whole[1:]))


@pytest.mark.parametrize(
    "case,message",
    [
        ("raw", "this output stores raw"),
        ("wds", "tar shards"),
        ("no crop", "crop=RandomResizedCrop"),
        ("transform", "a transform"),
        ("collate", "collate_fn"),
        ("where", "decode='gpu'"),
    ],
)
def test_what_the_device_cannot_decode_is_refused_with_the_reason(outputs, case, message):
    path = outputs["raw" if case == "raw" else "wds" if case == "wds" else "npy"]
    crop = None if case == "no crop" else RandomResizedCrop(48)
    ds = open_dataset(path, crop=crop, transform=(lambda x: x) if case == "transform" else None)
    kw = {"collate_fn": list} if case == "collate" else {}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make_loader(ds, 5, decode="gpu" if case == "where" else "device", **kw)


def test_cuda_without_torchvision_says_what_to_install(outputs, monkeypatch):
    real = builtins.__import__

    def no_torchvision(name, *args, **kwargs):
        if name.startswith("torchvision"):
            raise ImportError("No module named 'torchvision'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(48))
    with pytest.raises(ImportError, match="pip install torchvision"):
        make_loader(ds, 5, device="cuda", decode="device")


def test_same_pixels_as_pillow_within_two_levels(outputs):
    """A device crop against Pillow cropping and resizing the decoded stored image (the issue's check
    of the workers' crops, applied to the device's)."""
    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(48), normalize=False)
    ds = ds.for_loader(BatchBuffers(encoded=True), 0)
    batch = ds.__getitems__([0])
    from readers.augment.device_decode import DeviceDecoder

    image = DeviceDecoder(None, "RGB", None)(batch)[0][0].permute(1, 2, 0).numpy()
    x0, y0, x1, y1 = batch.boxes[0].tolist()
    ends = batch.ends.tolist()
    with Image.open(__import__("io").BytesIO(bytes(batch.data[: ends[0]].numpy()))) as img:
        expected = np.asarray(img.convert("RGB").crop((x0, y0, x1, y1)).resize((48, 48), Image.Resampling.BILINEAR))
    assert np.abs(image.astype(int) - expected.astype(int)).max() <= 2


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """JPEGs stored in full (``--resize none``) at ten times the crops below: reduced-scale decodes apply."""
    src = tmp_path_factory.mktemp("large") / "images"
    for i in range(6):
        write_image(src / f"c{i % 2}" / f"{i:02d}.png", (640 + 16 * i, 480), seed=i)
    out = tmp_path_factory.mktemp("large-out") / "npy"
    convert(
        src,
        out,
        ConvertConfig(
            "npy", PreprocessConfig(resize="none", size=None), ShardSize(samples=4), codec=ImageCodec("jpeg")
        ),
        workers=1,
    )
    return out


@pytest.mark.parametrize(
    "crop",
    [RandomResizedCrop(32, reduced_decode=True), CenterCrop(32, resize=40, reduced_decode=True), RandomResizedCrop(4)],
    ids=["random-reduced", "centre-reduced", "shrunk-over-32x"],
)
def test_reduced_decodes_and_large_shrinks_are_rendered_by_the_workers_as_before(large, crop):
    """The device decodes in full and CUDA's antialiased kernel refuses large shrinks: such crops are
    the workers' own (the same pixels exactly)."""
    pairs = _pairs(large, crop, workers=0, normalize=False)
    assert len(pairs) == 2  # 6 samples in batches of 5
    for (images, labels), (on_device, their_labels) in pairs:
        assert torch.equal(labels, their_labels) and torch.equal(images.contiguous(), on_device)


def test_no_device_decode_of_images_held_decoded_in_memory(tmp_path):
    write_image(tmp_path / "src" / "a" / "0.png", (40, 30))
    out = convert(
        tmp_path / "src",
        tmp_path / "out",
        ConvertConfig("npy", PreprocessConfig(size=(32, 32)), codec=ImageCodec("jpeg")),
        workers=1,
    ).output
    ds = open_dataset(out, crop=RandomResizedCrop(24), in_memory=True)
    with pytest.raises(ValueError, match="in_memory"):
        make_loader(ds, 5, decode="device")


def test_a_file_the_gpu_decoder_refuses_is_decoded_as_the_workers_decode_it(outputs):
    """nvJPEG fails a whole batched call for one file it does not take (arithmetic coding, say): the
    batch is decoded file by file, that one by libjpeg-turbo."""
    from readers.augment.device_decode import DeviceDecoder

    ds = open_dataset(outputs["npy"], crop=RandomResizedCrop(48), normalize=False)
    ds = ds.for_loader(BatchBuffers(encoded=True), 0)
    batch = ds.__getitems__(list(range(6)))
    plain = DeviceDecoder(None, "RGB", None)
    calls: list[int] = []

    def picky(files, mode, device):
        calls.append(len(files))
        if any(len(f) == len(files[0]) for f in files) and len(files) > 1 or len(calls) == 2:
            raise RuntimeError("nvjpeg: unsupported JPEG")
        return [plain._on_cpu(f) for f in files]

    refusing = DeviceDecoder(None, "RGB", None)
    refusing._jpeg = picky
    assert torch.equal(refusing(batch)[0], plain(batch)[0])
    assert calls[0] == 6 and calls[1:] == [1] * 6  # the batch, then each file (the first by the CPU)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_only_the_mcus_under_each_box_cross_to_the_device(tmp_path, monkeypatch, mode):
    """A box inside a stored JPEG sends the MCUs around it alone (16 pixels of context on each side in
    colour, none in gray), which decode to the same crop as the whole file."""
    for i in range(6):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i}.png", (256, 192), seed=i)
    pre = PreprocessConfig(resize="max", size=(256, 256), mode=mode)
    cfg = ConvertConfig("npy", pre, codec=ImageCodec("jpeg"))
    convert(tmp_path / "src", tmp_path / "out", cfg, workers=1)
    ds = open_dataset(tmp_path / "out", crop=RandomResizedCrop(32), flip=True)
    ds = ds.for_loader(BatchBuffers(encoded=True), 0)
    cut = ds.__getitems__(list(range(6)))
    monkeypatch.setattr(jpeg_region, "splice", lambda *args: None)
    whole = ds.__getitems__(list(range(6)))
    assert len(cut.rows) == len(whole.rows) == 6
    assert len(cut.data) < 0.9 * len(whole.data)  # random crops keep about half an image
    assert not torch.equal(cut.boxes, whole.boxes)  # moved onto the parts sent
    decoder = DeviceDecoder(None, mode, None)  # the device's decode on the CPU: libjpeg-turbo's pixels
    assert torch.equal(decoder(cut)[0], decoder(whole)[0])
