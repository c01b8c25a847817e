"""Format writers, checked against the documented layout with the stock libraries only."""

import hashlib
import io
import json
import tarfile
import zlib
from dataclasses import replace

import h5py
import lmdb
import numpy as np
import pytest
from PIL import Image

import packer.formats.lmdb as lmdb_format
from packer.config import ImageCodec
from packer.formats.lmdb import LmdbWriter
from packer.formats.wds import ustar_header
from packer.records import Sample
from packer.spec.checksums import fields_crc32, image_crc32
from packer.spec.codecs import encode_image
from packer.spec.errors import ConfigError
from packer.spec.listed_files import file_entry
from packer.spec.manifest import ShardEntry
from packer.spec.registry import FORMAT_NAMES, FORMATS, get_format
from packer.spec.sample_layout import SampleLayout

H, W, C = 6, 5, 3
FIXED = SampleLayout("uint8", (H, W, C), C)


def make_samples(n, shape=(H, W, C), start=10, seed=0, dtype=np.uint8):
    """``n`` random samples with global indices from ``start``, unicode keys and varied labels."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        if dtype == np.uint8:
            image = rng.integers(0, 256, size=shape, dtype=np.uint8)
        else:
            image = rng.standard_normal(shape).astype(dtype)
        out.append(Sample(start + j, f"clåss{j % 3}/img_{j:03d}.png", image, j % 3 if j != 1 else -1))
    return out


def write(fmt, directory, samples, layout=FIXED, capacity=None, name="shard-00003"):
    writer = FORMATS[fmt].writer_class()(directory, name, layout, len(samples) if capacity is None else capacity)
    for s in samples:
        writer.add(s)
    return writer.close()


def test_checksums_are_the_crc32_zlib_computes():
    """What anyone recomputes with zlib or binascii without packer, for every stored dtype, C order."""
    rng = np.random.default_rng(7)
    cases = [("uint8", (224, 224, 3)), ("float16", (31, 17, 1)), ("float32", (5, 3, 3)), ("uint8", (0, 4, 3))]
    for dtype, shape in cases:
        a = rng.integers(0, 255, shape).astype(dtype)
        assert image_crc32(a) == zlib.crc32(a.tobytes())
        assert image_crc32(a.transpose(1, 0, 2)) == zlib.crc32(a.transpose(1, 0, 2).tobytes())  # not contiguous
    fields = [b"caption", b"", "été".encode(), rng.bytes(100_000)]
    assert fields_crc32(fields, 12345) == zlib.crc32(b"".join(fields), 12345)
    sample = Sample(0, "k", None, encoded=rng.bytes(5000), fields={"text": b"abc"})
    assert sample.crc32 == zlib.crc32(sample.encoded + b"abc")


def test_each_format_description_names_its_writer_scanner_and_reader():
    import readers

    assert list(FORMATS) == list(FORMAT_NAMES) == ["npy", "lmdb", "hdf5", "wds"]
    for name, spec in FORMATS.items():
        assert spec.name == name and spec.writer_class().name == name
        assert callable(spec.scan) and spec.scanner.startswith(f"packer.formats.{name}:")
        reader = spec.reader_class()
        assert reader.format_name == name and getattr(readers, reader.__name__) is reader
        # 6: --codec source (5: detection targets; hdf5 4: keys off HDF5's global heap); wds 7: other loaders' indexes
        assert spec.newest == 8  # token outputs (wds: its sample outputs stay at 7)


def test_get_format():
    for name, spec in FORMATS.items():
        assert get_format(name) is spec
    with pytest.raises(ConfigError, match="zarr"):
        get_format("zarr")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_files_returned_are_all_the_files(tmp_path, fmt):
    files = write(fmt, tmp_path, make_samples(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    assert all(f.startswith("shard-00003") for f in files)


def test_layout_fields_and_bytes():
    assert FIXED.sample_bytes == H * W * C
    assert SampleLayout("float32", (2, 3, 1), 1).sample_bytes == 24
    assert SampleLayout("uint8", None, 3).sample_bytes is None
    f = FIXED.fields()
    assert f["image"] == {"dtype": "uint8", "shape": [H, W, C], "channels": C, "layout": "HWC", "codec": "raw"}
    assert f["label"]["dtype"] == "int64"


# --------------------------------------------------------------------------- npy


@pytest.mark.parametrize("n", [0, 1, 70])
def test_npy_layout(tmp_path, n):
    samples = make_samples(n)
    files = write("npy", tmp_path, samples)
    assert files == [
        "shard-00003.images.npy",
        "shard-00003.labels.npy",
        "shard-00003.keys.npy",
        "shard-00003.crc32.npy",
    ]
    images = np.load(tmp_path / files[0], mmap_mode="r")
    labels = np.load(tmp_path / files[1], mmap_mode="r")
    keys = np.load(tmp_path / files[2])
    crcs = np.load(tmp_path / files[3])
    assert isinstance(images, np.memmap)
    assert images.shape == (n, H, W, C) and images.dtype == np.uint8
    assert labels.shape == (n,) and labels.dtype == np.int64
    assert keys.shape == (n,) and keys.dtype.kind == "U"
    assert crcs.shape == (n,) and crcs.dtype == np.uint32
    for i, s in enumerate(samples):
        assert np.array_equal(images[i], s.image)
        assert labels[i] == s.label
        assert keys[i] == s.key
        assert crcs[i] == zlib.crc32(s.image.tobytes())


def test_npy_fewer_samples_than_capacity(tmp_path):
    samples = make_samples(3)
    files = write("npy", tmp_path, samples, capacity=50)
    images = np.load(tmp_path / files[0], mmap_mode="r")
    assert images.shape == (3, H, W, C)
    assert (tmp_path / files[0]).stat().st_size == images.offset + 3 * H * W * C
    assert np.array_equal(images[2], samples[2].image)


def test_npy_capacity_digits_grow(tmp_path):
    """The header is written for the capacity first; a much larger final count must still fit."""
    samples = make_samples(12, shape=(1, 1, 1))
    files = write("npy", tmp_path, samples, layout=SampleLayout("uint8", (1, 1, 1), 1), capacity=1)
    images = np.load(tmp_path / files[0])
    assert images.shape == (12, 1, 1, 1)
    assert [int(v) for v in images.ravel()] == [int(s.image.ravel()[0]) for s in samples]


def test_npy_float32(tmp_path):
    layout = SampleLayout("float32", (H, W, C), C)
    samples = make_samples(4, dtype=np.float32)
    files = write("npy", tmp_path, samples, layout=layout)
    images = np.load(tmp_path / files[0], mmap_mode="r")
    assert images.dtype == np.float32
    assert np.array_equal(images[3], samples[3].image)


# --------------------------------------------------------------------------- hdf5


@pytest.mark.parametrize("n", [0, 1, 70])
def test_hdf5_layout(tmp_path, n):
    samples = make_samples(n)
    files = write("hdf5", tmp_path, samples)
    assert files == ["shard-00003.h5"]
    with h5py.File(tmp_path / files[0], "r") as f:
        assert set(f.keys()) == {"images", "labels", "keys_bytes", "keys_offsets", "crc32"}
        images, labels = f["images"], f["labels"]
        offsets, flat = f["keys_offsets"][:], f["keys_bytes"][:]
        assert f["keys_bytes"].dtype == np.uint8 and offsets.shape == (n + 1,) and offsets[0] == 0
        assert f["crc32"].dtype == np.uint32
        assert f["crc32"][:].tolist() == [zlib.crc32(s.image.tobytes()) for s in samples]
        assert images.shape == (n, H, W, C) and images.dtype == np.uint8
        assert images.chunks == (1, H, W, C)
        assert labels.shape == (n,) and labels.dtype == np.int64
        key_values = [flat[a:b].tobytes().decode("utf-8") for a, b in zip(offsets, offsets[1:])]
        image_values = images[:]
        label_values = labels[:]
    for i, s in enumerate(samples):
        assert np.array_equal(image_values[i], s.image)
        assert label_values[i] == s.label
        assert key_values[i] == s.key


def test_hdf5_float16(tmp_path):
    layout = SampleLayout("float16", (H, W, 1), 1)
    samples = make_samples(3, shape=(H, W, 1), dtype=np.float16)
    files = write("hdf5", tmp_path, samples, layout=layout)
    with h5py.File(tmp_path / files[0], "r") as f:
        assert f["images"].dtype == np.float16
        assert np.array_equal(f["images"][2], samples[2].image)


@pytest.mark.parametrize("fmt", ["npy", "hdf5"])
def test_fixed_formats_refuse_wrong_shape(tmp_path, fmt):
    writer = FORMATS[fmt].writer_class()(tmp_path, "shard-00000", FIXED, 2)
    with pytest.raises(ValueError):
        writer.add(make_samples(1, shape=(H + 1, W, C))[0])
    writer.close()


# --------------------------------------------------------------------------- lmdb


def read_lmdb(path):
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return dict(txn.cursor())
    finally:
        env.close()


def check_lmdb(path, samples, varying: bool = False):
    data = read_lmdb(path)
    n = len(samples)
    assert data[b"length"] == str(n).encode("ascii")
    labels = np.load(io.BytesIO(data[b"labels"]), allow_pickle=False)
    assert labels.dtype == np.int64
    assert labels.tolist() == [s.label for s in samples]
    crcs = np.load(io.BytesIO(data[b"crc32"]), allow_pickle=False)
    assert crcs.dtype == np.uint32 and crcs.tolist() == [zlib.crc32(s.image.tobytes()) for s in samples]
    expected_keys = {b"length", b"labels", b"crc32"}
    for i, s in enumerate(samples):
        expected_keys |= {b"%08d.image" % i, b"%08d.key" % i}
        image = np.load(io.BytesIO(data[b"%08d.image" % i]), allow_pickle=False)
        assert image.dtype == s.image.dtype and np.array_equal(image, s.image)
        assert data[b"%08d.key" % i].decode("utf-8") == s.key
    if varying:  # images of varying size: their (H, W, C), apart from the images (format version 6)
        shapes = np.load(io.BytesIO(data[b"image_shapes"]), allow_pickle=False)
        assert shapes.dtype == np.int64 and shapes.tolist() == [list(s.image.shape) for s in samples]
        expected_keys.add(b"image_shapes")
    assert set(data) == expected_keys


@pytest.mark.parametrize("n", [0, 1, 70])
def test_lmdb_layout(tmp_path, n):
    samples = make_samples(n)
    files = write("lmdb", tmp_path, samples)
    assert files == ["shard-00003.lmdb"]
    assert (tmp_path / files[0]).is_file()
    check_lmdb(tmp_path / files[0], samples)
    if n:
        data = read_lmdb(tmp_path / files[0])
        assert np.array_equal(np.load(io.BytesIO(data[b"00000000.image"])), samples[0].image)
        assert data[b"00000000.key"] == "clåss0/img_000.png".encode("utf-8")


def test_lmdb_variable_shapes(tmp_path):
    samples = [Sample(i, f"k{i}", np.full((2 + i, 3 + 2 * i, 3), i, np.uint8), i) for i in range(4)]
    files = write("lmdb", tmp_path, samples, layout=SampleLayout("uint8", None, 3))
    check_lmdb(tmp_path / files[0], samples, varying=True)


def test_lmdb_map_grows_from_tiny(tmp_path, monkeypatch):
    """A map far too small for the data grows before it could fill; nothing is lost."""

    class TinyMap(LmdbWriter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._map_size = 32 * 1024
            self._env.set_mapsize(self._map_size)

    monkeypatch.setattr(lmdb_format, "COMMIT_BYTES", 50_000)  # several commits, each may overflow
    samples = make_samples(40, shape=(48, 64, 3))  # ~9 KiB each, ~370 KiB in all
    writer = TinyMap(tmp_path, "shard-00000", SampleLayout("uint8", (48, 64, 3), 3), len(samples))
    for s in samples:
        writer.add(s)
    files = writer.close()
    assert writer._map_size > 32 * 1024
    check_lmdb(tmp_path / files[0], samples)


@pytest.mark.parametrize("commit_bytes", [1, 30_000, 10**9])
def test_lmdb_map_never_fills_whatever_the_sizes(tmp_path, monkeypatch, commit_bytes):
    """Values from a few bytes to several pages, around page boundaries, from the smallest map, with
    a commit after every sample, every few, or only at the end: the map's growth comes first."""
    monkeypatch.setattr(lmdb_format, "COMMIT_BYTES", commit_bytes)
    monkeypatch.setattr(lmdb_format, "VARIABLE_SIZE_GUESS", 1)
    rng = np.random.default_rng(5)
    shapes = [(1, 1, 3), (1, 1341, 3), (1, 1366, 3), (1, 1367, 3), (40, 100, 3)]
    shapes += [(int(rng.integers(1, 60)), int(rng.integers(1, 90)), 3) for _ in range(300)]
    samples = [
        Sample(i, f"k{i}" * int(rng.integers(1, 40)), np.full(shape, i % 256, np.uint8), i)
        for i, shape in enumerate(shapes)
    ]
    writer = LmdbWriter(tmp_path, "shard-00000", SampleLayout("uint8", None, 3), 1)
    writer._map_size = 32 * 1024
    writer._env.set_mapsize(writer._map_size)
    for s in samples:
        writer.add(s)
    check_lmdb(tmp_path / writer.close()[0], samples, varying=True)


def test_lmdb_map_grows_with_underestimated_variable_size(tmp_path, monkeypatch):
    """The real sizing path: a variable layout with a tiny per-sample guess overflows the 16 MiB floor."""
    monkeypatch.setattr(lmdb_format, "VARIABLE_SIZE_GUESS", 1)
    samples = [Sample(i, f"big{i}", np.full((1000, 1000, 3), i, np.uint8), i) for i in range(6)]  # ~18 MB
    writer = LmdbWriter(tmp_path, "shard-00000", SampleLayout("uint8", None, 3), len(samples))
    assert writer._map_size == 16 * 1024**2
    for s in samples:
        writer.add(s)
    files = writer.close()
    assert writer._map_size >= 32 * 1024**2
    check_lmdb(tmp_path / files[0], samples, varying=True)


# --------------------------------------------------------------------------- wds


@pytest.mark.parametrize("n", [1, 70])
def test_wds_tar_members(tmp_path, n):
    samples = make_samples(n)
    files = write("wds", tmp_path, samples)
    assert files == ["shard-00003.tar", "shard-00003.idx"]
    with tarfile.open(tmp_path / files[0]) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        expected = [f"{s.index:09d}.{ext}" for s in samples for ext in ("cls", "json", "npy")]
        assert names == expected
        # DALI's wds2idx index: a header line, then per sample each member's "EXT DATA-OFFSET SIZE NAME"
        index = (tmp_path / files[1]).read_text(encoding="ascii").splitlines()
        assert index == [f"v1.2 {n}"] + [
            " ".join(f"{m.name.partition('.')[2]} {m.offset_data} {m.size} {m.name}" for m in members[i : i + 3])
            for i in range(0, len(members), 3)
        ]
        assert all(m.isfile() and m.mtime == 0 for m in members)
        for s in samples:
            key = f"{s.index:09d}"
            assert tar.extractfile(f"{key}.cls").read() == str(s.label).encode("ascii")
            meta = json.loads(tar.extractfile(f"{key}.json").read())
            assert meta == {"key": s.key, "label": s.label, "crc32": zlib.crc32(s.image.tobytes())}
            image = np.load(io.BytesIO(tar.extractfile(f"{key}.npy").read()), allow_pickle=False)
            assert np.array_equal(image, s.image)


def _tarfile_header(name, size):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o444
    info.uname = info.gname = "packer"
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


@pytest.mark.parametrize(
    "name,size",
    [
        ("000000007.npy", 150_656),
        ("000000007.cls", 1),
        ("000000007.json", 0),
        ("000000007.tokens.npy", 8**11 - 1),
        ("n" * 100, 513),  # the longest name the template takes
        ("d" * 80 + "/" + "n" * 40, 5),  # longer: tarfile splits it into prefix and name
        ("clåss/ü.txt", 3),  # not ASCII: tarfile encodes it
    ],
)
def test_ustar_header_is_what_tarfile_writes(name, size):
    header = ustar_header(name, size)
    parsed = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")  # also checks the checksum
    assert (
        parsed.name,
        parsed.size,
        parsed.mode,
        parsed.mtime,
        parsed.uid,
        parsed.gid,
        parsed.uname,
        parsed.gname,
        parsed.type,
    ) == (name, size, 0o444, 0, 0, 0, "packer", "packer", tarfile.REGTYPE)
    expected = _tarfile_header(name, size)
    if expected[329:345] == bytes(16):  # tarfile leaves the device fields of a file empty (3.11.4 and later)
        assert header == expected


def test_ustar_header_refuses_what_ustar_cannot_hold():
    with pytest.raises(ValueError):  # 8 GiB and more needs 12 octal digits; tarfile refuses it too
        ustar_header("big.npy", 8**11)


def test_wds_empty_shard_is_a_valid_tar(tmp_path):
    files = write("wds", tmp_path, [])
    with tarfile.open(tmp_path / files[0]) as tar:
        assert tar.getmembers() == []


def test_wds_read_by_webdataset(tmp_path):
    import webdataset

    samples = make_samples(5)
    samples.append(Sample(99, "odd/size.png", np.full((3, 9, 3), 7, np.uint8), 2))  # variable shape
    files = write("wds", tmp_path, samples, layout=SampleLayout("uint8", None, 3))
    ds = webdataset.WebDataset(str(tmp_path / files[0]), shardshuffle=False).decode()
    got = list(ds)
    assert [g["__key__"] for g in got] == [f"{s.index:09d}" for s in samples]
    for g, s in zip(got, samples):
        assert g["cls"] == s.label
        assert g["json"] == {"key": s.key, "label": s.label, "crc32": zlib.crc32(s.image.tobytes())}
        assert isinstance(g["npy"], np.ndarray)
        assert np.array_equal(g["npy"], s.image)


# --------------------------------------------------------------------------- scanners


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("n", [0, 7])
def test_scanner_reads_back_what_the_writer_wrote(tmp_path, fmt, n):
    samples = make_samples(n)
    files = write(fmt, tmp_path, samples)
    entry = ShardEntry("shard-00003", n, [file_entry(tmp_path, f) for f in files])
    got = list(FORMATS[fmt].scan(tmp_path, entry, FIXED))
    assert [g.local for g in got] == list(range(n))
    for g, s in zip(got, samples):
        assert (g.key, g.label, g.crc32) == (s.key, s.label, s.crc32)
        assert np.array_equal(g.image, s.image)


# --------------------------------------------------------------------------- encoded images (jpeg, png)

CODECS = ("jpeg", "png")


def encoded_layout(codec, shape=(H, W, C)):
    return SampleLayout("uint8", shape, shape[2] if shape else C, ImageCodec(codec))


def encoded_samples(n, codec, shape=(H, W, C)):
    """``make_samples`` with each image's JPEG/PNG bytes, as the worker encodes them."""
    return [replace(s, encoded=encode_image(s.image, codec)) for s in make_samples(n, shape)]


def open_stored_images(fmt, directory, files, n):
    """The stored bytes of each image, read the way docs/FORMATS.md shows (stock libraries only)."""
    if fmt == "npy":
        flat = np.load(directory / files[0], mmap_mode="r")
        offsets = np.load(directory / files[1])
        assert flat.dtype == np.uint8 and offsets.dtype == np.int64 and offsets.shape == (n + 1,)
        return [flat[offsets[i] : offsets[i + 1]].tobytes() for i in range(n)]
    if fmt == "hdf5":
        with h5py.File(directory / files[0], "r") as f:
            flat, offsets = f["images_bytes"], f["images_offsets"][:]
            assert "images" not in f and offsets.shape == (n + 1,)
            return [flat[offsets[i] : offsets[i + 1]].tobytes() for i in range(n)]
    if fmt == "lmdb":
        data = read_lmdb(directory / files[0])
        return [data[b"%08d.image" % i] for i in range(n)]
    with tarfile.open(directory / files[0]) as tar:
        return [tar.extractfile(m).read() for m in tar.getmembers() if not m.name.endswith((".cls", ".json"))]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("n", [0, 7])
def test_encoded_images_are_stored_as_their_bytes(tmp_path, fmt, codec, n):
    samples = encoded_samples(n, codec)
    files = write(fmt, tmp_path, samples, layout=encoded_layout(codec))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    if fmt == "npy":
        assert files == [f"shard-00003.{s}.npy" for s in ("images.bytes", "images.offsets", "labels", "keys", "crc32")]
        assert np.load(tmp_path / files[4]).tolist() == [zlib.crc32(s.encoded) for s in samples]
    assert open_stored_images(fmt, tmp_path, files, n) == [s.encoded for s in samples]
    for s in samples:
        with Image.open(io.BytesIO(s.encoded)) as img:
            assert img.format == codec.upper()
            if codec == "png":
                assert np.array_equal(np.asarray(img), s.image)
    entry = ShardEntry("shard-00003", n, [file_entry(tmp_path, f) for f in files])
    got = list(FORMATS[fmt].scan(tmp_path, entry, encoded_layout(codec)))
    assert [(g.local, g.key, g.label, g.image, g.encoded, g.crc32) for g in got] == [
        (i, s.key, s.label, None, s.encoded, zlib.crc32(s.encoded)) for i, s in enumerate(samples)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_wds_encoded_members_decode_with_stock_webdataset(tmp_path, codec):
    import webdataset

    samples = encoded_samples(3, codec)
    odd = Sample(99, "odd/size.png", np.full((3, 9, 3), 7, np.uint8), 2)  # any size: wds holds variable shapes
    samples.append(replace(odd, encoded=encode_image(odd.image, codec)))
    files = write("wds", tmp_path, samples, layout=encoded_layout(codec, None))
    ext = {"jpeg": "jpg", "png": "png"}[codec]
    with tarfile.open(tmp_path / files[0]) as tar:
        names = [m.name for m in tar.getmembers()]
    assert names == [f"{s.index:09d}.{e}" for s in samples for e in ("cls", "json", ext)]
    got = list(webdataset.WebDataset(str(tmp_path / files[0]), shardshuffle=False).decode("rgb8"))
    for g, s in zip(got, samples, strict=True):
        assert g["json"] == {"key": s.key, "label": s.label, "crc32": zlib.crc32(s.encoded)} and g["cls"] == s.label
        assert g[ext].dtype == np.uint8 and g[ext].shape == s.image.shape
        if codec == "png":
            assert np.array_equal(g[ext], s.image)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_jpeg_sample_opens_as_the_docs_show(tmp_path, fmt):
    """Each format's snippet in docs/FORMATS.md: stock library plus PIL give the pixels back."""
    shape = (24, 32, 3)
    pixels = np.asarray(Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5).resize((32, 24)))
    sample = Sample(0, "a/b.jpg", pixels, 1, encode_image(pixels, "jpeg", 95))
    files = write(fmt, tmp_path, [sample], layout=encoded_layout("jpeg", shape))
    if fmt == "npy":
        flat = np.load(tmp_path / "shard-00003.images.bytes.npy", mmap_mode="r")
        offsets = np.load(tmp_path / "shard-00003.images.offsets.npy")
        image = np.asarray(Image.open(io.BytesIO(flat[offsets[0] : offsets[1]])).convert("RGB"))
    elif fmt == "hdf5":
        with h5py.File(tmp_path / files[0], "r") as f:
            a, b = f["images_offsets"][0:2]
            image = np.asarray(Image.open(io.BytesIO(f["images_bytes"][a:b].tobytes())).convert("RGB"))
    elif fmt == "lmdb":
        env = lmdb.open(str(tmp_path / files[0]), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            image = np.asarray(Image.open(io.BytesIO(txn.get(b"00000000.image"))).convert("RGB"))
        env.close()
    else:
        import webdataset

        image = next(iter(webdataset.WebDataset(str(tmp_path / files[0]), shardshuffle=False).decode("rgb8")))["jpg"]
    assert image.shape == shape and np.abs(image.astype(int) - pixels).mean() < 3


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_encoded_layout_needs_encoded_samples(tmp_path, fmt):
    writer = FORMATS[fmt].writer_class()(tmp_path, "shard-00000", encoded_layout("png"), 1)
    with pytest.raises(ValueError, match="png shard stores encoded images"):
        writer.add(make_samples(1)[0])
    writer.close()


def test_encoded_layout_fields():
    assert encoded_layout("jpeg").fields()["image"] == {
        "dtype": "uint8",
        "shape": [H, W, C],
        "channels": C,
        "layout": "HWC",
        "codec": "jpeg",
        "quality": 90,
    }
    assert FIXED.fields()["image"]["codec"] == "raw"


@pytest.mark.parametrize(
    "fmt,capacity,hashed",
    [("npy", None, [".images.npy"]), ("npy", 9, []), ("wds", None, [".tar"]), ("lmdb", None, []), ("hdf5", None, [])],
)
def test_digests_a_writer_gives_are_its_files_sha256(tmp_path, fmt, capacity, hashed):
    writer = FORMATS[fmt].writer_class()(tmp_path, "shard-00000", FIXED, 6 if capacity is None else capacity)
    for s in make_samples(6):
        writer.add(s)
    files = writer.close()
    digests = writer.digests
    # npy planned for 9 samples but given 6 rewrites its header: the manifest reads that file back
    assert sorted(digests) == sorted(f"shard-00000{suffix}" for suffix in hashed)
    for name, digest in digests.items():
        assert name in files and digest == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
