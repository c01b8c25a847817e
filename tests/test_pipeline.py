"""packer.ops.convert: the whole conversion end to end: manifest, checksums, skips, labels, progress,
determinism, shuffling."""

import json
import os
import re
import sys
import time

import numpy as np
import pytest
from compare import assert_rows_equal, check_files, stored
from conftest import FORMATS, write_image
from helpers import no_staging, sizes

import packer.ops.convert
import packer.pixels.preprocess
from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ImageCodec, ShardSize
from packer.pixels import jpeg
from packer.pixels.preprocess import load_image
from packer.records import SourceItem
from packer.run.plan import shard_name
from packer.sources.discover import discover
from packer.spec.errors import DecodeError
from packer.spec.manifest import MANIFEST_NAME, read_manifest
from packer.spec.sample_layout import SampleLayout

PRE = PreprocessConfig(size=(16, 12))


def expected_rows(src, pre=PRE):
    return [(i.relpath, i.label, load_image(i.path, pre)) for i in discover(src).items]


# --------------------------------------------------------------------------- convert end to end


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_end_to_end(image_tree, tmp_path, fmt, workers):
    out = tmp_path / "out" / fmt
    result = convert(image_tree, out, ConvertConfig(fmt, PRE), workers=workers)
    m = read_manifest(out, expect_format=fmt)
    assert result.output == out
    assert json.loads(json.dumps(result.manifest.to_dict())) == m.to_dict()
    assert m.samples == 15
    assert m.classes == ["ant", "bee", "cat"]
    assert len(m.shards) == workers
    tag = m.shards[0].name.rsplit("-", 1)[1]
    assert [s.name for s in m.shards] == [f"{shard_name(i)}-{tag}" for i in range(workers)]
    assert re.fullmatch("[0-9a-f]{12}", tag)
    assert m.shard_offsets[-1] == 15
    assert m.skipped == [] and result.skipped == []
    assert m.source == {"files": 15, "ignored": {".txt": 1}}
    assert result.ignored == {".txt": 1}
    assert m.fields["image"]["shape"] == [12, 16, 3]
    assert m.preprocess == PRE.to_dict() | {
        "size": [16, 12],
        "fill": [0, 0, 0],
        "background": [255, 255, 255],
        "normalize": {"mean": list(PRE.mean), "std": list(PRE.std)},
        "jpeg_scaling": jpeg.SCALING,
    }
    assert m.sharding == {"shard_size": "auto", "balanced_for_workers": workers, "shuffle_seed": None}
    check_files(out, m)
    assert result.bytes == sum(f.bytes for s in m.shards for f in s.files)
    assert no_staging(out)
    assert sorted(p.name for p in out.parent.iterdir()) == [fmt]
    assert_rows_equal(stored(out, m), expected_rows(image_tree))


@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_sample_count_shards(image_tree, tmp_path, fmt):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig(fmt, PRE, ShardSize(samples=4)), workers=1)
    m = read_manifest(out)
    assert [s.samples for s in m.shards] == [4, 4, 4, 3]
    assert m.sharding == {"shard_size": "4 samples", "shuffle_seed": None}
    check_files(out, m)
    assert_rows_equal(stored(out, m), expected_rows(image_tree))


@pytest.mark.parametrize("codec", ["png", "jpeg"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_encoded_images_round_trip(image_tree, tmp_path, fmt, codec):
    pre = PreprocessConfig(size=(64, 48))
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig(fmt, pre, ShardSize(samples=6), codec=ImageCodec(codec, 90)), workers=2)
    m = read_manifest(out)
    assert m.format_version == {"hdf5": 4, "wds": 7}.get(fmt, 2) and m.image_codec == codec  # wds: always 7
    assert m.fields["image"] == {
        "dtype": "uint8",
        "shape": [48, 64, 3],
        "channels": 3,
        "layout": "HWC",
        "codec": codec,
        **({"quality": 90} if codec == "jpeg" else {}),
    }
    check_files(out, m)
    got, want = stored(out, m), expected_rows(image_tree, pre)
    assert [(k, lab) for k, lab, _ in got] == [(k, lab) for k, lab, _ in want]
    for (key, _, a), (_, _, b) in zip(got, want):
        assert a.dtype == np.uint8 and a.shape == b.shape == (48, 64, 3), key
        if codec == "png":
            assert np.array_equal(a, b), key
        else:  # the test images are saturated random colours, JPEG's worst case; photographs do better
            assert np.abs(a.astype(int) - b).mean() < 4, key


def test_raw_outputs_keep_format_version_1(image_tree, tmp_path):
    convert(image_tree, tmp_path / "o", ConvertConfig("npy", PRE), workers=1)
    m = read_manifest(tmp_path / "o")
    assert m.format_version == 1 and m.image_codec == "raw" and m.fields["image"]["codec"] == "raw"


@pytest.mark.parametrize("fmt", FORMATS)
def test_convert_resize_none_keeps_sizes(image_tree, tmp_path, fmt):
    pre = PreprocessConfig(resize="none")
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig(fmt, pre), workers=1)
    m = read_manifest(out)
    assert m.fields["image"]["shape"] is None
    rows = stored(out, m)
    assert len({im.shape for _, _, im in rows}) > 1
    assert_rows_equal(rows, expected_rows(image_tree, pre))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupt_image_skipped_and_listed(image_tree, tmp_path, fmt, workers):
    (image_tree / "bee" / "img_bad.png").write_bytes(b"\x89PNG not really")
    out = tmp_path / "out"
    result = convert(image_tree, out, ConvertConfig(fmt, PRE), workers=workers)
    m = read_manifest(out)
    assert m.samples == 15
    assert [s["path"] for s in m.skipped] == ["bee/img_bad.png"]
    assert m.skipped[0]["reason"]
    assert str(tmp_path) not in json.dumps(m.skipped)
    assert [s.path for s in result.skipped] == ["bee/img_bad.png"]
    assert m.source["files"] == 16
    check_files(out, m)
    rows = stored(out, m)
    assert "bee/img_bad.png" not in [k for k, _, _ in rows]
    assert_rows_equal(rows, _rows_without_bad(image_tree))


def _rows_without_bad(src):
    items = [i for i in discover(src).items if i.relpath != "bee/img_bad.png"]
    return [(i.relpath, i.label, load_image(i.path, PRE)) for i in items]


@pytest.mark.parametrize("fmt", ["npy", "hdf5", "lmdb", "wds"])
def test_every_file_of_a_shard_skipped(tmp_path, fmt):
    src = tmp_path / "src"
    write_image(src / "a" / "1.png", (20, 20))
    (src / "b").mkdir()
    (src / "b" / "2.png").write_bytes(b"")
    (src / "b" / "3.png").write_bytes(b"junk")
    out = tmp_path / "out"
    convert(src, out, ConvertConfig(fmt, PRE, ShardSize(samples=1)), workers=1)
    m = read_manifest(out)
    assert [s.samples for s in m.shards] == [1]  # the empty shards are not published (their files are gone)
    assert sorted(s["path"] for s in m.skipped) == ["b/2.png", "b/3.png"]
    check_files(out, m)
    assert not list(out.glob("shard-00001*")) and not list(out.glob("shard-00002*"))
    assert m.shards[0].name.startswith("shard-00000-")
    assert [k for k, _, _ in stored(out, m)] == ["a/1.png"]


def test_unlabelled_flat_folder(tmp_path):
    src = tmp_path / "flat"
    for i in range(3):
        write_image(src / f"{i}.png", (20, 16), seed=i)
    out = tmp_path / "out"
    convert(src, out, ConvertConfig("npy", PRE), workers=1)
    m = read_manifest(out)
    assert m.classes is None
    assert [lab for _, lab, _ in stored(out, m)] == [-1, -1, -1]


def test_root_file_beside_classes_in_manifest_skipped(image_tree, tmp_path):
    write_image(image_tree / "stray.png", (20, 16))
    out = tmp_path / "out"
    result = convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert [s["path"] for s in result.manifest.skipped] == ["stray.png"]
    assert result.manifest.samples == 15


def test_labels_file(image_tree, tmp_path):
    labels = tmp_path / "labels.csv"
    rows = [f"{i.relpath},{'odd' if n % 2 else 'even'}" for n, i in enumerate(discover(image_tree).items)]
    labels.write_text("path,label\n" + "\n".join(rows[1:]) + "\n")  # first file unlisted
    out = tmp_path / "out"
    result = convert(image_tree, out, ConvertConfig("hdf5", PRE), labels_file=labels, workers=1)
    m = read_manifest(out)
    assert m.classes == ["even", "odd"]
    assert m.samples == 14
    assert [s["path"] for s in m.skipped] == ["ant/img_000.png"]
    assert [lab for _, lab, _ in stored(out, m)] == [1, 0] * 7
    assert result.skipped[0].path == "ant/img_000.png"


def test_manifest_has_no_absolute_paths(image_tree, tmp_path):
    labels = tmp_path / "labels.csv"
    rows = [f"{i.relpath},x" for i in discover(image_tree).items] + ["gone/missing.png,x"]
    labels.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), labels_file=labels, workers=1)
    text = (out / MANIFEST_NAME).read_text()
    assert "gone/missing.png" in text
    assert str(tmp_path) not in text


def test_progress_and_on_plan(image_tree, tmp_path):
    seen = []
    planned = []
    convert(
        image_tree,
        tmp_path / "out",
        ConvertConfig("npy", PRE, ShardSize(samples=6)),
        workers=1,
        progress=seen.append,
        on_plan=lambda found, tasks: planned.append((len(found.items), sizes(tasks))),
    )
    assert sum(seen) == 15
    assert planned == [(15, [6, 6, 3])]


def test_the_items_of_its_own_discovery_are_released_once_the_shards_are_written(image_tree, tmp_path):
    """The parent drops the discovery's arrays before the manifest step (its memory would add to
    theirs); a discovery the caller gave (a split's) is the caller's and is kept."""
    import gc
    import weakref

    from packer.sources.item_table import ReleasedItems

    held = []
    convert(
        image_tree,
        tmp_path / "own",
        ConvertConfig("npy", PRE, ShardSize(samples=6)),
        workers=1,
        on_plan=lambda found, tasks: held.append((found, weakref.ref(found.items.records), tasks)),
    )
    found, offsets, tasks = held[0]
    gc.collect()
    assert offsets() is None and len(found.items) == 15 and [len(t.items) for t in tasks] == [6, 6, 3]
    with pytest.raises(ReleasedItems, match="released once their shards were written"):
        tasks[0].items[0]
    given = discover(image_tree)
    convert(image_tree, tmp_path / "given", ConvertConfig("npy", PRE), workers=1, discovery=given)
    assert given.items[0].relpath == "ant/img_000.png" and len(list(given.items)) == 15


def test_progress_with_worker_processes(image_tree, tmp_path):
    seen = []
    convert(image_tree, tmp_path / "out", ConvertConfig("wds", PRE), workers=2, progress=seen.append)
    assert sum(seen) == 15


@pytest.mark.skipif(sys.platform != "linux", reason="the patched function reaches the workers through fork")
def test_every_worker_keeps_pillows_image_memory(image_tree, tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setattr(packer.pixels.preprocess, "keep_image_memory", lambda: (marks / str(os.getpid())).touch())
    convert(image_tree, tmp_path / "out", ConvertConfig("npy", PRE, ShardSize(samples=6)), workers=2)
    assert len(list(marks.iterdir())) == 3  # one process per shard, none in the converter itself
    assert not (marks / str(os.getpid())).exists()


def test_output_parent_created(image_tree, tmp_path):
    out = tmp_path / "deep" / "er" / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    assert read_manifest(out).samples == 15


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fmt", ["npy", "wds", "hdf5"])
def test_two_runs_byte_identical(image_tree, tmp_path, fmt, workers):
    cfg = ConvertConfig(fmt, PRE, ShardSize(samples=6))
    a, b = tmp_path / "a", tmp_path / "b"
    convert(image_tree, a, cfg, workers=workers)
    convert(image_tree, b, cfg, workers=workers)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert len(names) > 1
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("codec", ["jpeg", "png"])
@pytest.mark.parametrize("fmt", ["npy", "wds", "hdf5"])
def test_two_runs_byte_identical_with_encoded_images(image_tree, tmp_path, fmt, codec):
    cfg = ConvertConfig(fmt, PRE, ShardSize(samples=6), codec=ImageCodec(codec))
    a, b = tmp_path / "a", tmp_path / "b"
    convert(image_tree, a, cfg, workers=2)
    convert(image_tree, b, cfg, workers=2)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and len(names) > 1
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_two_runs_identical_manifests_lmdb(image_tree, tmp_path):
    cfg = ConvertConfig("lmdb", PRE)
    convert(image_tree, tmp_path / "a", cfg, workers=1)
    convert(image_tree, tmp_path / "b", cfg, workers=1)
    ma, mb = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert [s.samples for s in ma.shards] == [s.samples for s in mb.shards]
    assert ma.to_dict() | {"shards": None} == mb.to_dict() | {"shards": None}


def test_overwrite_same_content_same_manifest(image_tree, tmp_path):
    out = tmp_path / "out"
    cfg = ConvertConfig("npy", PRE)
    convert(image_tree, out, cfg, workers=1)
    first = (out / MANIFEST_NAME).read_bytes()
    convert(image_tree, out, cfg, workers=1, overwrite=True)
    assert (out / MANIFEST_NAME).read_bytes() == first


def test_hdf5_bytes_do_not_depend_on_the_clock(image_tree, tmp_path):
    """Two runs more than a second apart: no timestamp may reach the file."""
    convert(image_tree, tmp_path / "a", ConvertConfig("hdf5", PRE), workers=1)
    time.sleep(1.1)
    convert(image_tree, tmp_path / "b", ConvertConfig("hdf5", PRE), workers=1)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_shuffle_stores_a_seeded_permutation_in_every_format(image_tree, tmp_path):
    from readers import open_dataset

    orders = {}
    for fmt in FORMATS:
        out = tmp_path / fmt
        result = convert(image_tree, out, ConvertConfig(fmt, PRE, ShardSize(samples=5), shuffle=7), workers=2)
        assert result.manifest.sharding["shuffle_seed"] == 7
        ds = open_dataset(out, return_meta=True, normalize=False)
        orders[fmt] = [m["key"] for _, _, m in ds] if fmt == "wds" else [ds[i][2]["key"] for i in range(len(ds))]
    sorted_keys = [i.relpath for i in discover(image_tree).items]
    expected = [sorted_keys[i] for i in np.random.default_rng(7).permutation(len(sorted_keys))]
    assert all(order == expected for order in orders.values())
    assert expected != sorted_keys
    labels = [k.split("/")[0] for k in expected[:5]]
    assert len(set(labels)) > 1  # the first shard mixes classes
    again = convert(image_tree, tmp_path / "again", ConvertConfig("wds", PRE, ShardSize(samples=5), shuffle=7))
    assert [f.sha256 for s in again.manifest.shards for f in s.files] == [
        f.sha256 for s in read_manifest(tmp_path / "wds").shards for f in s.files
    ]


def test_workers_read_files_ahead_in_a_row(image_tree, tmp_path, monkeypatch):
    """read_ahead: image-only files from a position on, stat before read, up to a sample of several
    files, a file known to crash the decoder, READ_AHEAD_FILES or READ_AHEAD_BYTES; a file that
    cannot be read is its DecodeError, for its turn."""
    import packer.run.worker as worker
    from packer.records import ShardTask
    from packer.run.shard_job import ShardJob
    from packer.run.worker import read_ahead

    items = list(discover(image_tree).items)  # 15 image-only samples
    (image_tree / "bee" / "img_001.png").unlink()  # listed, then gone
    items[9] = SourceItem(
        items[9].index,
        items[9].path,
        items[9].relpath,
        items[9].label,
        (("image", items[9].path), ("text", items[9].path)),
    )  # a paired sample
    job = ShardJob(
        0,
        ShardTask("s", tuple(items)),
        "npy",
        SampleLayout("uint8", (8, 8, 3), 3),
        PreprocessConfig(),
        str(tmp_path),
        poisoned={items[3].index: "decoder crashed"},
    )
    seen = []
    got = read_ahead(job, 0, seen.append)
    assert seen == [1, 2, 3] and len(got) == 3  # stops at the poisoned file, unopened
    assert [data for _, data in got] == [open(i.path, "rb").read() for i in items[:3]]
    assert all(st is not None and st.st_size == len(data) for st, data in got)
    got = read_ahead(job, 4)
    assert len(got) == 5  # 4..8, then the paired sample
    missing = got[2]  # bee/img_001.png, position 6
    assert missing[0] is None and isinstance(missing[1], DecodeError)
    assert "file not found" in missing[1].reason and missing[1].path == items[6].path
    monkeypatch.setattr(worker, "READ_AHEAD_FILES", 2)
    assert len(read_ahead(job, 10)) == 2
    monkeypatch.setattr(worker, "READ_AHEAD_FILES", 16)
    monkeypatch.setattr(worker, "READ_AHEAD_BYTES", 1)
    assert len(read_ahead(job, 10)) == 1  # the first file is read whatever its size
    assert read_ahead(job, 9) == [] and read_ahead(job, 15) == []
