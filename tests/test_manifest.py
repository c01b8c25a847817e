"""The manifest: writing, reading, and refusing anything damaged, foreign or too new."""

import json
import re

import pytest

from packer.spec.entries import FileEntry, TextField
from packer.spec.errors import ManifestError
from packer.spec.listed_files import file_entry, sha256_of
from packer.spec.manifest import MANIFEST_NAME, MANIFEST_VERSION, Manifest, ShardEntry, read_manifest, write_manifest
from packer.spec.registry import FORMATS
from packer.spec.sample_layout import ImageCodec, SampleLayout

FORMAT_VERSIONS = {name: spec.newest for name, spec in FORMATS.items()}


def format_version(fmt, codec, text=False, shape=(8, 8, 3), image=True):
    text_fields = (TextField("text", "text"),) if text else ()
    return FORMATS[fmt].version(SampleLayout("uint8", shape, 3, ImageCodec(codec), image, text_fields))


def sample_manifest(fmt="npy", counts=(4, 4, 2)):
    shards = [
        ShardEntry(f"shard-{i:05d}", n, [FileEntry(f"shard-{i:05d}.x", 100 + i, f"{i:064x}")])
        for i, n in enumerate(counts)
    ]
    return Manifest(
        format=fmt,
        format_version=FORMAT_VERSIONS[fmt],
        packer_version="0.1.0",
        samples=sum(counts),
        classes=["ant", "bée"],
        fields={"image": {"dtype": "uint8", "shape": [8, 8, 3]}},
        preprocess={"size": [8, 8], "normalize": None},
        shards=shards,
        skipped=[{"path": "ant/bad.png", "reason": "corrupt"}],
        source={"files": 11, "ignored": {".txt": 1}},
        sharding={"shard_size": "auto", "balanced_for_workers": 2},
    )


def write_raw(directory, data):
    directory.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data)
    (directory / MANIFEST_NAME).write_text(text, encoding="utf-8")
    return directory / MANIFEST_NAME


def test_round_trip(tmp_path):
    m = sample_manifest()
    path = write_manifest(tmp_path, m)
    assert path == tmp_path / MANIFEST_NAME
    assert not (tmp_path / "manifest.json.tmp").exists()
    back = read_manifest(tmp_path)
    assert back == m
    assert back.to_dict() == m.to_dict()
    assert read_manifest(tmp_path, expect_format="npy") == m


def test_written_json_is_stable(tmp_path):
    m = sample_manifest()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_manifest(tmp_path / name, m)
    a = (tmp_path / "a" / MANIFEST_NAME).read_bytes()
    assert a == (tmp_path / "b" / MANIFEST_NAME).read_bytes()
    d = json.loads(a)
    assert list(d)[:3] == ["manifest_version", "format", "format_version"]
    assert d["manifest_version"] == MANIFEST_VERSION
    assert "bée" in a.decode("utf-8")


@pytest.mark.parametrize("fmt", sorted(FORMAT_VERSIONS))
def test_round_trip_every_format(tmp_path, fmt):
    m = sample_manifest(fmt)
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path, expect_format=fmt).format == fmt


def test_shard_offsets():
    assert sample_manifest(counts=(4, 4, 2)).shard_offsets == [0, 4, 8, 10]
    assert sample_manifest(counts=(3,)).shard_offsets == [0, 3]
    assert sample_manifest(counts=()).shard_offsets == [0]
    assert sample_manifest(counts=(0, 5, 0)).shard_offsets == [0, 0, 5, 5]


def test_shard_entry_file():
    s = ShardEntry(
        "shard-00000", 2, [FileEntry("shard-00000.images.npy", 1, "a"), FileEntry("shard-00000.labels.npy", 1, "b")]
    )
    assert s.file(".labels.npy") == "shard-00000.labels.npy"
    with pytest.raises(ManifestError, match="shard-00000"):
        s.file(".keys.npy")


def test_folder_without_manifest(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path / "out")
    assert str(tmp_path / "out") in str(exc.value)
    assert MANIFEST_NAME in str(exc.value)


def test_missing_folder(tmp_path):
    with pytest.raises(ManifestError, match="not a folder"):
        read_manifest(tmp_path / "nope")


def test_file_instead_of_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ManifestError) as exc:
        read_manifest(f)
    assert str(f) in str(exc.value)


def test_invalid_json(tmp_path):
    path = write_raw(tmp_path, "{not json")
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_json_not_an_object(tmp_path):
    path = write_raw(tmp_path, [1, 2])
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize("key", ["format", "format_version", "samples", "fields", "preprocess", "shards"])
def test_missing_keys(tmp_path, key):
    d = sample_manifest().to_dict()
    del d[key]
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)
    assert key in str(exc.value)


@pytest.mark.parametrize("key", ["name", "samples", "files"])
def test_missing_shard_keys(tmp_path, key):
    d = sample_manifest().to_dict()
    del d["shards"][1][key]
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_bad_value_types(tmp_path):
    d = sample_manifest().to_dict()
    d["samples"] = "ten"
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_shard_counts_not_summing(tmp_path):
    d = sample_manifest().to_dict()
    d["samples"] = 11
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)
    assert "10" in str(exc.value) and "11" in str(exc.value)


def test_newer_format_version(tmp_path):
    d = sample_manifest("lmdb").to_dict()
    d["format_version"] = FORMAT_VERSIONS["lmdb"] + 1
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError, match="(?i)upgrade") as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_format_version_is_1_for_raw_images_2_for_encoded_ones_3_with_text():
    for fmt in ("npy", "lmdb"):
        assert format_version(fmt, "raw") == 1
        assert format_version(fmt, "jpeg") == format_version(fmt, "png") == 2
        assert format_version(fmt, "raw", text=True) == format_version(fmt, "jpeg", text=True) == 3
        assert format_version(fmt, "raw", image=False, text=True) == 3
    assert FORMAT_VERSIONS["lmdb"] == FORMAT_VERSIONS["npy"] == 8  # the newest: token blocks (--pack)
    # hdf5 moved its keys off HDF5's global heap in version 4, which every hdf5 output is now
    assert {format_version("hdf5", codec, text) for codec in ("raw", "jpeg") for text in (False, True)} == {4}
    assert FORMAT_VERSIONS["hdf5"] == 8  # the newest: token blocks (--pack)
    # wds added other loaders' indexes (DALI's .idx, wids' shardindex.json) in version 7, which every wds output is now
    assert {
        format_version("wds", codec, text, shape, image)
        for codec in ("raw", "jpeg", "png", "source")
        for text in (False, True)
        for shape in ((8, 8, 3), None)
        for image in (True, False)
        if image or text
    } == {7}
    assert FORMAT_VERSIONS["wds"] == 8  # the newest: token blocks (--pack); its sample outputs stay at 7
    # raw images of their own sizes changed the npy and hdf5 layouts (3); version 6 indexed the sizes of
    # images of varying size in lmdb and wds, and of encoded ones in every format
    varying = {fmt: format_version(fmt, "raw", shape=None) for fmt in FORMATS}
    assert varying == {"npy": 3, "lmdb": 6, "hdf5": 4, "wds": 7}
    assert {fmt: format_version(fmt, "jpeg", shape=None) for fmt in FORMATS} == {
        "npy": 6,
        "lmdb": 6,
        "hdf5": 6,
        "wds": 7,
    }
    assert format_version("npy", "jpeg") == 2  # encoded images of one size: as before


def test_image_codec_defaults_to_raw(tmp_path):
    m = sample_manifest()
    assert "codec" not in m.fields["image"] and m.image_codec == "raw"
    m.fields["image"]["codec"] = "png"
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path).image_codec == "png"


def test_unknown_codec_is_refused(tmp_path):
    d = sample_manifest().to_dict()
    d["fields"]["image"]["codec"] = "webp"
    write_raw(tmp_path, d)
    with pytest.raises(ManifestError, match="codec 'webp' is unknown.*raw, jpeg, png.*Upgrade packer"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("change", [{"format_version": 1}, {"dtype": "float32"}])
def test_encoded_images_need_uint8_and_version_2(tmp_path, change):
    d = sample_manifest().to_dict()
    d["fields"]["image"]["codec"] = "jpeg"
    d["format_version"] = change.get("format_version", 2)
    d["fields"]["image"]["dtype"] = change.get("dtype", "uint8")
    write_raw(tmp_path, d)
    with pytest.raises(ManifestError, match="jpeg images need uint8 storage and format version 2"):
        read_manifest(tmp_path)


def test_newer_manifest_version(tmp_path):
    d = sample_manifest().to_dict()
    d["manifest_version"] = MANIFEST_VERSION + 1
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError, match="(?i)upgrade") as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_newer_manifest_version_with_changed_layout(tmp_path):
    write_raw(tmp_path, {"manifest_version": MANIFEST_VERSION + 1, "format": "npy", "datasets": []})
    with pytest.raises(ManifestError, match="(?i)upgrade"):
        read_manifest(tmp_path)


def test_unknown_format(tmp_path):
    d = sample_manifest().to_dict()
    d["format"] = "zarr"
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError, match="zarr") as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_expect_format_mismatch(tmp_path):
    write_manifest(tmp_path, sample_manifest("hdf5"))
    with pytest.raises(ManifestError) as exc:
        read_manifest(tmp_path, expect_format="npy")
    assert str(tmp_path) in str(exc.value)
    assert "hdf5" in str(exc.value) and "npy" in str(exc.value)


def test_optional_keys_default(tmp_path):
    d = sample_manifest().to_dict()
    for key in ("manifest_version", "packer_version", "classes", "class_map_sha256", "skipped", "source", "sharding"):
        del d[key]
    write_raw(tmp_path, d)
    m = read_manifest(tmp_path)
    assert m.manifest_version == 1
    assert m.classes is None and m.skipped == [] and m.source == {} and m.sharding == {}


def test_stats_round_trip_and_absent_in_older_manifests(tmp_path):
    m = sample_manifest()
    m.stats = {
        "pixels": {"scale": "0..1", "count": 640, "mean": [0.5, 0.25, 0.125], "std": [0.1, 0.2, 0.3]},
        "original_sizes": {
            "bins": [0, 32],
            "width": {"counts": [1, 9], "min": 8, "median": 40, "max": 90},
            "height": {"counts": [10, 0], "min": 8, "median": 8, "max": 9},
        },
    }
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path).stats == m.stats
    d = m.to_dict()
    del d["stats"]
    write_raw(tmp_path, d)
    assert read_manifest(tmp_path).stats is None


def test_stats_must_be_an_object(tmp_path):
    write_raw(tmp_path, sample_manifest().to_dict() | {"stats": [1, 2]})
    with pytest.raises(ManifestError, match="stats is not an object"):
        read_manifest(tmp_path)


def test_file_entry_and_sha256(tmp_path):
    import hashlib

    data = bytes(range(256)) * 5000  # > 1 MiB, several read blocks
    (tmp_path / "blob.bin").write_bytes(data)
    assert sha256_of(tmp_path / "blob.bin") == hashlib.sha256(data).hexdigest()
    e = file_entry(tmp_path, "blob.bin")
    assert e == FileEntry("blob.bin", len(data), hashlib.sha256(data).hexdigest())
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_of(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("name", ["x$(touch PWNED).tar", "a b.tar", "q'uote.tar", "x?.tar", "../up.tar", ".hidden"])
def test_shard_file_names_must_be_plain(tmp_path, name):
    d = sample_manifest().to_dict()
    d["shards"][0]["files"][0]["path"] = name
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="not a plain name"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d["shards"].append(d["shards"][0]), "shard-00000 is listed more than once"),
        (lambda d: d["shards"][0]["files"].append(d["shards"][1]["files"][0]), "is listed more than once"),
        (lambda d: d["shards"][0].update(samples=-1), "a shard's samples -1 is not a whole number"),
        (lambda d: d["shards"][0].update(samples="4"), "a shard's samples '4' is not a whole number"),
        (lambda d: d["shards"][0].update(samples=4.7), "a shard's samples 4.7 is not a whole number"),
        (lambda d: d["shards"][0].update(samples=True), "a shard's samples True is not a whole number"),
        (
            lambda d: (d["shards"][0].update(samples=10**18), d.update(samples=10**18 + 6)),
            "cannot hold 1000000000000000000 samples in 100 bytes",
        ),
        (lambda d: d.update(format_version=-1), "format_version -1 is not a whole number of at least 1"),
        (lambda d: d.update(format_version=0), "format_version 0 is not a whole number of at least 1"),
        (lambda d: d["shards"][0]["files"][0].update(bytes=-5), "a file's bytes -5 is not a whole number"),
        (lambda d: d["shards"][0]["files"][0].update(sha256="abc"), "has no SHA-256"),
        (lambda d: d["preprocess"].update(normalize={"mean": [0.5], "std": [0.0]}), "positive stds"),
        (lambda d: d["preprocess"].update(normalize={"mean": [0.5, 0.5], "std": [0.2]}), "positive stds"),
        (lambda d: d["preprocess"].update(normalize={"mean": ["x"], "std": [0.2]}), "finite means"),
        (lambda d: d["preprocess"].update(normalize=7), "finite means"),
    ],
)
def test_the_manifests_numbers_are_checked_as_strictly_as_its_names(tmp_path, damage, message):
    d = sample_manifest().to_dict()
    damage(d)
    path = write_raw(tmp_path, d)
    with pytest.raises(ManifestError, match=re.escape(message)) as exc:
        read_manifest(tmp_path)
    assert str(path) in str(exc.value)


def test_a_computed_normalization_and_none_pass():
    for norm in (None, "auto", {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.25]}):
        d = sample_manifest().to_dict()
        d["preprocess"]["normalize"] = norm
        assert Manifest.from_dict(d).preprocess["normalize"] == norm
