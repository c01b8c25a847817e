"""Shard planning and the whole conversion: manifest, checksums, skips, determinism, output safety."""

import hashlib
import json
import os
import sys
import time

import numpy as np
import pytest
from compare import assert_rows_equal, stored
from conftest import FORMATS, write_image
from PIL import Image

import packer.pipeline
import packer.preprocess
from packer import ConvertConfig, PreprocessConfig, convert, jpeg
from packer.config import DEFAULT_SHARD_BYTES, ImageCodec, ShardSize
from packer.discover import discover
from packer.errors import ConfigError, DecodeError, InputError, OutputError
from packer.manifest import MANIFEST_NAME, read_manifest
from packer.output import STAGING_MARK, staging_dir
from packer.plan import estimate_sample_bytes, plan_shards, shard_name
from packer.preprocess import load_image
from packer.records import SourceItem
from packer.report import REPORT_NAME
from packer.sample_layout import SampleLayout
from packer.stats import SIZE_BINS

PRE = PreprocessConfig(size=(16, 12))
MiB = 1024**2


def items(n):
    return [SourceItem(i, f"/src/{i}.png", f"{i}.png", i % 2) for i in range(n)]


def sizes(tasks):
    return [len(t.items) for t in tasks]


def flat(tasks):
    return [i for t in tasks for i in t.items]


# --------------------------------------------------------------------------- plan_shards


def test_shard_name():
    assert shard_name(0) == "shard-00000"
    assert shard_name(42) == "shard-00042"


def test_plan_sample_count_last_shard_smaller():
    src = items(10)
    tasks = plan_shards(src, ShardSize(samples=4), sample_bytes=100, workers=3)
    assert sizes(tasks) == [4, 4, 2]
    assert [t.name for t in tasks] == ["shard-00000", "shard-00001", "shard-00002"]
    assert flat(tasks) == src


def test_plan_sample_count_exact_multiple():
    assert sizes(plan_shards(items(8), ShardSize(samples=4), 1)) == [4, 4]
    assert sizes(plan_shards(items(3), ShardSize(samples=100), 1)) == [3]


def test_plan_byte_size():
    src = items(10)
    tasks = plan_shards(src, ShardSize(bytes=1000), sample_bytes=300)
    assert sizes(tasks) == [3, 3, 3, 1]
    assert flat(tasks) == src


def test_plan_byte_size_smaller_than_a_sample():
    assert sizes(plan_shards(items(3), ShardSize(bytes=10), sample_bytes=300)) == [1, 1, 1]


@pytest.mark.parametrize(
    "n, workers, sample_bytes, expected",
    [
        (10, 1, 100, [10]),
        (10, 4, 100, [3, 3, 2, 2]),
        (10, 2, 100, [5, 5]),
        (3, 4, 100, [1, 1, 1]),
        (1, 8, 100, [1]),
        (100, 3, 10 * MiB, [17, 17, 17, 17, 16, 16]),  # 1000 MiB -> 4 shards -> 6 for 3 workers
        (100, 1, 10 * MiB, [25, 25, 25, 25]),
    ],
)
def test_plan_auto(n, workers, sample_bytes, expected):
    src = items(n)
    tasks = plan_shards(src, ShardSize(), sample_bytes, workers)
    assert sizes(tasks) == expected
    assert flat(tasks) == src
    assert [t.name for t in tasks] == [shard_name(i) for i in range(len(tasks))]


@pytest.mark.parametrize("n", [1, 2, 5, 7, 16, 33, 100, 257])
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("sample_bytes", [1, 150_528, 3 * MiB, 40 * MiB])
def test_plan_auto_properties(n, workers, sample_bytes):
    src = items(n)
    tasks = plan_shards(src, ShardSize(), sample_bytes, workers)
    s = sizes(tasks)
    assert flat(tasks) == src
    assert 1 <= len(tasks) <= n
    assert len(tasks) % workers == 0 or len(tasks) == n
    assert max(s) - min(s) <= 1
    assert min(s) >= 1


def test_plan_auto_respects_256_mib():
    tasks = plan_shards(items(5), ShardSize(), sample_bytes=100 * MiB, workers=1)
    assert max(sizes(tasks)) * 100 * MiB <= DEFAULT_SHARD_BYTES


def test_plan_empty():
    assert plan_shards([], ShardSize(), 100, 4) == []
    assert plan_shards([], ShardSize(samples=3), 100) == []
    assert plan_shards([], ShardSize(bytes=3), 100) == []


def test_estimate_sample_bytes(tmp_path):
    assert estimate_sample_bytes(SampleLayout("uint8", (12, 16, 3), 3), []) == 12 * 16 * 3
    assert estimate_sample_bytes(SampleLayout("float32", (2, 2, 1), 1), []) == 16
    a = write_image(tmp_path / "a.png", (10, 20))
    b = write_image(tmp_path / "b.jpg", (30, 40))
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image")
    src = [SourceItem(0, str(a), "a.png"), SourceItem(1, str(b), "b.jpg"), SourceItem(2, str(junk), "junk.png")]
    # exact stored sizes from the headers (the unreadable file is left out of the mean)
    assert estimate_sample_bytes(SampleLayout("uint8", None, 3), src) == (10 * 20 * 3 + 30 * 40 * 3) / 2
    assert estimate_sample_bytes(SampleLayout("float16", None, 1), src[:1]) == 10 * 20 * 2
    assert estimate_sample_bytes(SampleLayout("uint8", None, 3), []) == 1024**2


# --------------------------------------------------------------------------- helpers for outputs


def check_files(out, manifest):
    """Every file in the manifest exists with its size and SHA-256; nothing else is in the folder."""
    listed = set()
    for shard in manifest.shards:
        assert shard.files
        for f in shard.files:
            data = (out / f.path).read_bytes()
            assert f.bytes == len(data)
            assert f.sha256 == hashlib.sha256(data).hexdigest()
            assert f.path.startswith(shard.name)
            listed.add(f.path)
    on_disk = {p.name for p in out.iterdir()}
    assert on_disk == listed | {MANIFEST_NAME, REPORT_NAME}


def expected_rows(src, pre=PRE):
    return [(i.relpath, i.label, load_image(i.path, pre)) for i in discover(src).items]


def no_staging(out):
    return not staging_dir(out).exists()


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
    assert [s.name for s in m.shards] == [shard_name(i) for i in range(workers)]
    assert m.shard_offsets[-1] == 15
    assert m.skipped == [] and result.skipped == []
    assert m.source == {"files": 15, "ignored": {".txt": 1}}
    assert result.ignored == {".txt": 1}
    assert m.fields["image"]["shape"] == [12, 16, 3]
    assert m.preprocess == PRE.to_dict() | {"size": [16, 12], "fill": [0, 0, 0], "background": [255, 255, 255],
                                            "normalize": {"mean": list(PRE.mean), "std": list(PRE.std)},
                                            "jpeg_scaling": jpeg.SCALING}
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
    assert m.format_version == 2 and m.image_codec == codec
    assert m.fields["image"] == {"dtype": "uint8", "shape": [48, 64, 3], "channels": 3, "layout": "HWC",
                                 "codec": codec, **({"quality": 90} if codec == "jpeg" else {})}
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
    assert [s.samples for s in m.shards] == [1, 0, 0]
    assert sorted(s["path"] for s in m.skipped) == ["b/2.png", "b/3.png"]
    check_files(out, m)
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
        image_tree, tmp_path / "out", ConvertConfig("npy", PRE, ShardSize(samples=6)), workers=1,
        progress=seen.append, on_plan=lambda found, tasks: planned.append((len(found.items), sizes(tasks))),
    )
    assert sum(seen) == 15
    assert planned == [(15, [6, 6, 3])]


def test_progress_with_worker_processes(image_tree, tmp_path):
    seen = []
    convert(image_tree, tmp_path / "out", ConvertConfig("wds", PRE), workers=2, progress=seen.append)
    assert sum(seen) == 15


@pytest.mark.skipif(sys.platform != "linux", reason="the patched function reaches the workers through fork")
def test_every_worker_keeps_pillows_image_memory(image_tree, tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setattr(packer.preprocess, "keep_image_memory", lambda: (marks / str(os.getpid())).touch())
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


# --------------------------------------------------------------------------- output safety


def test_existing_output_without_overwrite(image_tree, tmp_path):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(OutputError, match="overwrite"):
        convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert no_staging(out)


def test_existing_output_with_overwrite_replaced(image_tree, tmp_path):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    convert(image_tree, out, ConvertConfig("wds", PRE), workers=1, overwrite=True)
    m = read_manifest(out)
    assert m.format == "wds"
    check_files(out, m)  # no npy file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "out"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_non_packer_folder_refused(image_tree, tmp_path, overwrite):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(OutputError, match="not a packer output"):
        convert(image_tree, out, ConvertConfig("npy", PRE), workers=1, overwrite=overwrite)
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "years of work"
    assert no_staging(out)


def test_output_is_a_file_refused(image_tree, tmp_path):
    out = tmp_path / "file"
    out.write_text("x")
    with pytest.raises(OutputError):
        convert(image_tree, out, ConvertConfig("npy", PRE), workers=1, overwrite=True)
    assert out.read_text() == "x"


def test_empty_existing_folder_used(image_tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    assert read_manifest(out).samples == 15


def test_stale_staging_folder_replaced(image_tree, tmp_path):
    out = tmp_path / "out"
    stage = staging_dir(out)
    stage.mkdir()
    (stage / STAGING_MARK).write_text("old")
    (stage / "shard-00000.tar").write_bytes(b"half")
    convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert no_staging(out)
    check_files(out, read_manifest(out))


def test_foreign_staging_folder_refused(image_tree, tmp_path):
    out = tmp_path / "out"
    stage = staging_dir(out)
    stage.mkdir()
    (stage / "mine.txt").write_text("keep")
    with pytest.raises(OutputError):
        convert(image_tree, out, ConvertConfig("wds", PRE), workers=1)
    assert (stage / "mine.txt").read_text() == "keep"
    assert not out.exists()


def _boom(*args, **kwargs):
    raise RuntimeError("merge failed")


@pytest.mark.parametrize("fmt", FORMATS)
def test_failure_leaves_no_output_and_no_staging(image_tree, tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(packer.pipeline, "build_manifest", _boom)  # fails after every shard is written
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="merge failed"):
        convert(image_tree, out, ConvertConfig(fmt, PRE), workers=1)
    assert not out.exists()
    assert no_staging(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_failure_keeps_old_output(image_tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", PRE), workers=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(packer.pipeline, "build_manifest", _boom)
    with pytest.raises(RuntimeError):
        convert(image_tree, out, ConvertConfig("wds", PRE), workers=1, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert no_staging(out)


def test_hdf5_bytes_do_not_depend_on_the_clock(image_tree, tmp_path):
    """Two runs more than a second apart: no timestamp may reach the file."""
    convert(image_tree, tmp_path / "a", ConvertConfig("hdf5", PRE), workers=1)
    time.sleep(1.1)
    convert(image_tree, tmp_path / "b", ConvertConfig("hdf5", PRE), workers=1)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_output_inside_the_source_is_not_read_as_a_class(image_tree):
    first = convert(image_tree, image_tree / "packed", ConvertConfig("npy", PRE), workers=1)
    again = convert(image_tree, image_tree / "packed", ConvertConfig("npy", PRE), workers=1, overwrite=True)
    assert again.manifest.classes == first.manifest.classes == ["ant", "bee", "cat"]
    assert again.manifest.samples == first.manifest.samples == 15


def test_empty_source_is_an_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(InputError, match="no images or texts found"):
        convert(tmp_path / "src", tmp_path / "out", ConvertConfig("npy", PRE))
    assert not (tmp_path / "out").exists()


def _interrupt_after_first_shard(tree, out, config) -> None:
    """Run a conversion of ``tree`` (one worker, shards of 5) and stop it in its second shard."""
    finished: list[int] = []

    def stop_in_second_shard(n):
        finished.append(n)
        if sum(finished) > 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(tree, out, config, workers=1, progress=stop_in_second_shard)


def test_resume_writes_again_a_finished_shard_whose_files_changed(image_tree, tmp_path, caplog):
    """Each worker stamps its shard's files (size, times, inode) before reading them: a finished
    shard whose files changed since is written again from the files as they are now, as an
    uninterrupted run would; finished shards whose files did not change are kept."""
    from packer.output import DONE_SUFFIX, read_plan

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    assert [p.name for p in staging_dir(out).glob(f"*{DONE_SUFFIX}")] == [f"shard-00000{DONE_SUFFIX}"]
    assert read_plan(staging_dir(out))["sources"] == packer.pipeline.SOURCES_PER_SHARD
    write_image(image_tree / "ant" / "img_000.png", (9, 9), seed=99)  # in the finished shard
    with caplog.at_level("WARNING", logger="packer"):
        resumed = convert(image_tree, out, config, workers=1, resume=True)
    assert resumed.processed == 15  # all three shards: the finished one's file changed
    assert "shard-00000: its source files changed since the interrupted run" in caplog.text
    convert(image_tree, tmp_path / "fresh", config, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()

    out2 = tmp_path / "out2"
    _interrupt_after_first_shard(image_tree, out2, config)
    write_image(image_tree / "cat" / "img_005.png", (9, 9), seed=98)  # in the last shard, not finished
    assert convert(image_tree, out2, config, workers=1, resume=True).processed == 10  # the finished shard is kept
    convert(image_tree, tmp_path / "fresh2", config, workers=1)
    assert (out2 / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh2" / MANIFEST_NAME).read_bytes()


@pytest.mark.parametrize("changed", [False, True])
def test_resume_of_an_older_packers_run_checks_every_file(image_tree, tmp_path, changed):
    """Older packers stamped every source file into the plan's fingerprint and their shard records
    have no stamps: such a run resumes with its finished shards when no file changed, and is
    refused when one did."""
    from packer.output import DONE_SUFFIX, read_plan, write_plan

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    stage = staging_dir(out)
    tasks = plan_shards(discover(image_tree).items, config.shard_size, 1.0)
    plan = read_plan(stage)
    write_plan(stage, {"fingerprint": packer.pipeline.plan_fingerprint(config, tasks, stamps=True),
                       "workers": plan["workers"]})
    record = stage / f"shard-00000{DONE_SUFFIX}"
    older = json.loads(record.read_text())
    del older["sources"]
    record.write_text(json.dumps(older))
    if changed:
        write_image(image_tree / "cat" / "img_005.png", (9, 9), seed=99)  # even one in an unfinished shard
        with pytest.raises(OutputError, match="changed since the interrupted run"):
            convert(image_tree, out, config, workers=1, resume=True)
    else:
        assert convert(image_tree, out, config, workers=1, resume=True).processed == 10


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
        f.sha256 for s in read_manifest(tmp_path / "wds").shards for f in s.files]


# --------------------------------------------------------------------------- dataset statistics


def add_varied_files(root):
    """Originals in more size bins (a wide and a tall one) and a file every run skips."""
    write_image(root / "ant" / "wide.png", (300, 20), seed=5)
    write_image(root / "cat" / "tall.jpg", (20, 700), seed=6)
    (root / "bee" / "bad.png").write_bytes(b"not an image")


def pixel_values(out, m):
    """Every stored pixel value as read back with the stock libraries: (pixels, channels) float64."""
    images = [im for _, _, im in stored(out, m)]
    return np.concatenate([im.reshape(-1, im.shape[2]) for im in images]).astype(np.float64)


def expected_sizes(src, skip=("bee/bad.png",)):
    """The manifest's original_sizes computed directly from the source files' headers."""
    sizes = []
    for item in discover(src).items:
        if item.relpath not in skip:
            with Image.open(item.path) as img:
                sizes.append(img.size)
    edges = list(SIZE_BINS) + [float("inf")]

    def side(values):
        values = sorted(values)
        return {"counts": [sum(lo <= v < hi for v in values) for lo, hi in zip(edges, edges[1:])],
                "min": values[0], "median": values[(len(values) - 1) // 2], "max": values[-1]}

    return {"bins": list(SIZE_BINS), "width": side(w for w, _ in sizes), "height": side(h for _, h in sizes)}


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_stats_equal_numpy_over_the_stored_pixels(image_tree, tmp_path, fmt, mode):
    add_varied_files(image_tree)
    out = tmp_path / "out"
    pre = PreprocessConfig(size=(16, 12), mode=mode)
    result = convert(image_tree, out, ConvertConfig(fmt, pre, ShardSize(samples=7)), workers=2)
    m = read_manifest(out)
    assert [s.samples for s in m.shards] == [6, 7, 4] and [s["path"] for s in m.skipped] == ["bee/bad.png"]
    assert m.stats == json.loads(json.dumps(result.manifest.stats))
    values = pixel_values(out, m) / 255
    px = m.stats["pixels"]
    assert px["scale"] == "0..1" and px["count"] == len(values) == 17 * 16 * 12
    np.testing.assert_allclose(px["mean"], values.mean(0), rtol=1e-12)
    np.testing.assert_allclose(px["std"], values.std(0), rtol=1e-12)
    assert m.stats["original_sizes"] == expected_sizes(image_tree)
    assert m.stats["original_sizes"]["width"]["counts"][SIZE_BINS.index(256)] == 1  # the wide one


@pytest.mark.parametrize("dtype,mode", [("float16", "RGB"), ("float32", "L")])
def test_stats_of_float_storage_are_of_the_stored_normalized_values(image_tree, tmp_path, dtype, mode):
    add_varied_files(image_tree)
    out = tmp_path / "out"
    pre = PreprocessConfig(size=(16, 12), mode=mode, dtype=dtype)
    convert(image_tree, out, ConvertConfig("npy", pre, ShardSize(samples=7)), workers=2)
    m = read_manifest(out)
    values = pixel_values(out, m)
    px = m.stats["pixels"]
    assert px["scale"] == "stored" and px["count"] == len(values)
    np.testing.assert_allclose(px["mean"], values.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(px["std"], values.std(0), rtol=1e-9)
    assert m.stats["original_sizes"] == expected_sizes(image_tree)


@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_stats_of_encoded_images_are_of_the_pixels_encoded(image_tree, tmp_path, codec):
    """As with raw images: exact for png; for jpeg, of the pixels before encoding (what decodes
    is close on average, smoother in detail)."""
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("hdf5", PRE, ShardSize(samples=7), codec=ImageCodec(codec)), workers=1)
    raw = convert(image_tree, tmp_path / "raw", ConvertConfig("hdf5", PRE, ShardSize(samples=7)), workers=1)
    m = read_manifest(out)
    assert m.stats == raw.manifest.stats
    values = pixel_values(out, m) / 255
    tol = {"rtol": 1e-12} if codec == "png" else {"atol": 0.02}
    np.testing.assert_allclose(m.stats["pixels"]["mean"], values.mean(0), **tol)
    if codec == "png":
        np.testing.assert_allclose(m.stats["pixels"]["std"], values.std(0), **tol)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_normalize_auto_makes_readers_give_zero_mean_unit_std(image_tree, tmp_path, mode):
    import torch

    from readers import open_dataset

    add_varied_files(image_tree)
    out = tmp_path / "out"
    pre = PreprocessConfig(size=(16, 12), mode=mode, auto_normalize=True)
    m = convert(image_tree, out, ConvertConfig("wds", pre, ShardSize(samples=5)), workers=2).manifest
    px = m.stats["pixels"]
    assert m.preprocess["normalize"] == {"mean": px["mean"], "std": px["std"], "auto": True}
    assert len(px["mean"]) == pre.channels
    x = torch.stack([image for image, _ in open_dataset(out)]).double()
    assert x.shape == (17, pre.channels, 12, 16)
    assert torch.allclose(x.mean(dim=(0, 2, 3)), torch.zeros(pre.channels, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(x.std(dim=(0, 2, 3), unbiased=False), torch.ones(pre.channels, dtype=torch.float64),
                          atol=1e-5)


def _interrupt_in_second_shard(source, out, config) -> None:
    """A one-worker run stopped as by Ctrl-C once its progress counts 8 files (with shards of 4
    samples: in the second shard, the first one finished)."""
    finished = []

    def stop_in_second_shard(n):
        finished.append(n)
        if sum(finished) >= 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(source, out, config, workers=1, progress=stop_in_second_shard)


@pytest.mark.parametrize("older_record", [False, True])
def test_resume_keeps_the_statistics(image_tree, tmp_path, older_record):
    """Finished shards' stats come back from their records; a record without them (an older
    packer's) is not trusted and its shard is written again."""
    from packer.output import DONE_SUFFIX

    add_varied_files(image_tree)
    config = ConvertConfig("npy", PreprocessConfig(size=(16, 12), auto_normalize=True), ShardSize(samples=4))
    whole = convert(image_tree, tmp_path / "whole", config, workers=1).manifest
    out = tmp_path / "out"
    _interrupt_in_second_shard(image_tree, out, config)
    records = list(staging_dir(out).glob(f"*{DONE_SUFFIX}"))
    assert [p.name for p in records] == [f"shard-00000{DONE_SUFFIX}"]
    if older_record:
        d = json.loads(records[0].read_text())
        del d["stats"]
        records[0].write_text(json.dumps(d))
    resumed = convert(image_tree, out, config, workers=1, resume=True)
    assert resumed.processed == (18 if older_record else 14)
    assert resumed.manifest.stats == whole.stats and resumed.manifest.preprocess == whole.preprocess
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "whole" / MANIFEST_NAME).read_bytes()


def test_normalize_auto_refused_with_float_storage(image_tree, tmp_path):
    with pytest.raises(ConfigError, match="--normalize auto needs --dtype uint8"):
        convert(image_tree, tmp_path / "out", ConvertConfig("npy", PreprocessConfig(auto_normalize=True,
                                                                                     dtype="float32")))
    assert not (tmp_path / "out").exists()


def test_resume_rewrites_shards_whose_sources_an_older_packer_digested(image_tree, tmp_path, caplog):
    """Duplicates are found by comparing each source's digest across all shards, so a finished shard
    recorded with older packers' SHA-256 prefixes is written again; the duplicate in it, of a file
    in a later shard, is still reported."""
    import shutil

    from packer.output import DONE_SUFFIX

    shutil.copy(image_tree / "ant" / "img_000.png", image_tree / "cat" / "img_099.png")  # in shards 0 and 3
    config = ConvertConfig("npy", PreprocessConfig(size=(16, 12)), ShardSize(samples=4))
    whole = convert(image_tree, tmp_path / "whole", config, workers=1).manifest
    assert whole.duplicates == [["ant/img_000.png", "cat/img_099.png"]]
    out = tmp_path / "out"
    _interrupt_in_second_shard(image_tree, out, config)
    record = staging_dir(out) / f"shard-00000{DONE_SUFFIX}"
    d = json.loads(record.read_text())
    assert d["digest"] == "xxh3-128"
    del d["digest"]
    d["digests"] = [hashlib.sha256((image_tree / key).read_bytes()).hexdigest()[:32] for key in d["keys"]]
    record.write_text(json.dumps(d))
    resumed = convert(image_tree, out, config, workers=1, resume=True)
    assert resumed.processed == 16  # every shard, the first one again
    assert "shard-00000: recorded by an older packer (sha256-128 source digests); writing it again" in caplog.text
    assert resumed.manifest.duplicates == whole.duplicates
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "whole" / MANIFEST_NAME).read_bytes()


def test_workers_read_files_ahead_in_a_row(image_tree, tmp_path, monkeypatch):
    """read_ahead: image-only files from a position on, stat before read, up to a sample of several
    files, a file known to crash the decoder, READ_AHEAD_FILES or READ_AHEAD_BYTES; a file that
    cannot be read is its DecodeError, for its turn."""
    import packer.worker as worker
    from packer.records import ShardTask
    from packer.worker import ShardJob, read_ahead

    items = list(discover(image_tree).items)  # 15 image-only samples
    (image_tree / "bee" / "img_001.png").unlink()  # listed, then gone
    items[9] = SourceItem(items[9].index, items[9].path, items[9].relpath, items[9].label,
                          (("image", items[9].path), ("text", items[9].path)))  # a paired sample
    job = ShardJob(0, ShardTask("s", tuple(items)), "npy", SampleLayout("uint8", (8, 8, 3), 3), PreprocessConfig(),
                   str(tmp_path), poisoned={items[3].index: "decoder crashed"})
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
