"""packer.run.resume through convert(..., resume=True): which finished shards an interrupted run keeps,
and which it writes again (files changed since, records of older packers)."""

import json

import pytest
from conftest import add_varied_files, write_image
from helpers import as_older_sha256_record, interrupted_after, later_shards_unfinished

import packer.ops.convert
from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.output.files import staging_dir
from packer.run.plan import plan_shards
from packer.sources.discover import discover
from packer.spec.errors import OutputError
from packer.spec.manifest import MANIFEST_NAME

PRE = PreprocessConfig(size=(16, 12))


def _interrupt_after_first_shard(tree, out, config) -> None:
    """Run a conversion of ``tree`` (one worker, shards of 5) and stop it in its second shard."""
    interrupted_after(tree, out, config, 5)


def test_resume_writes_again_a_finished_shard_whose_files_changed(image_tree, tmp_path, caplog):
    """Each worker stamps its shard's files (size, times, inode) before reading them: a finished
    shard whose files changed since is written again from the files as they are now, as an
    uninterrupted run would; finished shards whose files did not change are kept."""
    from packer.output.files import DONE_SUFFIX, read_plan

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    assert [p.name for p in staging_dir(out).glob(f"*{DONE_SUFFIX}")] == [f"shard-00000{DONE_SUFFIX}"]
    assert read_plan(staging_dir(out))["sources"] == packer.ops.convert.SOURCES_PER_SHARD
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
    from packer.output.files import DONE_SUFFIX, read_plan, write_plan

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    stage = staging_dir(out)
    tasks = plan_shards(discover(image_tree).items, config.shard_size, 1.0)
    plan = read_plan(stage)
    write_plan(
        stage,
        {"fingerprint": packer.ops.convert.plan_fingerprint(config, tasks, stamps=True), "workers": plan["workers"]},
    )
    record = stage / f"shard-00000{DONE_SUFFIX}"
    older = json.loads(record.read_text())
    del older["sources"], older["plan"]  # neither in records of older packers
    record.write_text(json.dumps(older))
    if changed:
        write_image(image_tree / "cat" / "img_005.png", (9, 9), seed=99)  # even one in an unfinished shard
        with pytest.raises(OutputError, match="changed since the interrupted run"):
            convert(image_tree, out, config, workers=1, resume=True)
    else:
        assert convert(image_tree, out, config, workers=1, resume=True).processed == 10


def _interrupt_in_second_shard(source, out, config) -> None:
    """A one-worker run stopped as by Ctrl-C once its progress counts 8 files (with shards of 4
    samples: in the second shard, the first one finished)."""
    finished = []

    def stop_in_second_shard(n):
        finished.append(n)
        if sum(finished) >= 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), later_shards_unfinished():
        convert(source, out, config, workers=1, progress=stop_in_second_shard)


@pytest.mark.parametrize("older_record", [False, True])
def test_resume_keeps_the_statistics(image_tree, tmp_path, older_record):
    """Finished shards' stats come back from their records; a record without them (an older
    packer's) is not trusted and its shard is written again."""
    from packer.output.files import DONE_SUFFIX

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


def test_resume_rewrites_shards_whose_sources_an_older_packer_digested(image_tree, tmp_path, caplog):
    """Duplicates are found by comparing each source's digest across all shards, so a finished shard
    recorded with older packers' SHA-256 prefixes is written again; the duplicate in it, of a file
    in a later shard, is still reported."""
    import shutil

    from packer.output.files import DONE_SUFFIX

    shutil.copy(image_tree / "ant" / "img_000.png", image_tree / "cat" / "img_099.png")  # in shards 0 and 3
    config = ConvertConfig("npy", PreprocessConfig(size=(16, 12)), ShardSize(samples=4))
    whole = convert(image_tree, tmp_path / "whole", config, workers=1).manifest
    assert whole.duplicates == [["ant/img_000.png", "cat/img_099.png"]]
    out = tmp_path / "out"
    _interrupt_in_second_shard(image_tree, out, config)
    record = staging_dir(out) / f"shard-00000{DONE_SUFFIX}"
    d = json.loads(record.read_text())
    assert d["digest"] == "xxh3-128"
    record.write_text(json.dumps(as_older_sha256_record(d, image_tree)))
    resumed = convert(image_tree, out, config, workers=1, resume=True)
    assert resumed.processed == 16  # every shard, the first one again
    assert "shard-00000: recorded by an older packer (sha256-128 source digests); writing it again" in caplog.text
    assert resumed.manifest.duplicates == whole.duplicates
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "whole" / MANIFEST_NAME).read_bytes()


@pytest.mark.parametrize("fmt", ["hdf5", "lmdb"])
def test_resume_rewrites_shards_an_older_format_version_wrote(image_tree, tmp_path, caplog, fmt):
    """A shard finished by a packer before 0.3.0 (its record names no format version) has hdf5
    keys in the global heap or an lmdb file without its structure checksum: written again, so the
    output holds one layout, the one its manifest names."""
    from packer.output.files import DONE_SUFFIX

    config = ConvertConfig(fmt, PreprocessConfig(size=(16, 12)), ShardSize(samples=4))
    whole = convert(image_tree, tmp_path / "whole", config, workers=1).manifest
    out = tmp_path / "out"
    _interrupt_in_second_shard(image_tree, out, config)
    record = staging_dir(out) / f"shard-00000{DONE_SUFFIX}"
    d = json.loads(record.read_text())
    assert d["format_version"] == whole.format_version == (4 if fmt == "hdf5" else 1)
    del d["format_version"]
    record.write_text(json.dumps(d))
    resumed = convert(image_tree, out, config, workers=1, resume=True)
    assert resumed.processed == 15  # every shard, the first one again
    assert "shard-00000: written at another format version (before packer 0.3.0" in caplog.text
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "whole" / MANIFEST_NAME).read_bytes()


def test_resume_after_a_ctrl_c_among_the_renames(image_tree, tmp_path, monkeypatch):
    """A Ctrl-C after the first shard's files were renamed to their published names (but before the
    others'): --resume finds the renamed shard by its rename record, keeps every shard, and
    publishes what an uninterrupted run does."""
    import packer.output.finish
    from packer.output.files import RENAMED_SUFFIX

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    real = packer.output.finish.record_renamed
    calls: list[str] = []

    def stop_after_the_first(stage, planned, result):
        real(stage, planned, result)
        calls.append(planned)
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.output.finish, "record_renamed", stop_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        convert(image_tree, out, config, workers=1)
    monkeypatch.setattr(packer.output.finish, "record_renamed", real)
    stage = staging_dir(out)
    assert calls == ["shard-00000"] and [p.name for p in stage.glob(f"*{RENAMED_SUFFIX}")] == [
        f"shard-00000{RENAMED_SUFFIX}"
    ]
    renamed = json.loads((stage / f"shard-00000{RENAMED_SUFFIX}").read_text())["name"]
    assert renamed.startswith("shard-00000-") and (stage / f"{renamed}.images.npy").is_file()
    assert convert(image_tree, out, config, workers=1, resume=True).processed == 0
    convert(image_tree, tmp_path / "fresh", config, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()
    assert not list(out.glob(f"*{RENAMED_SUFFIX}"))


def test_a_renamed_shard_written_again_leaves_no_old_files(image_tree, tmp_path, monkeypatch):
    """A Ctrl-C among the renames, then the renamed shard's source changes: --resume writes that shard
    again, and its files under the old published name are not published beside the new ones."""
    import packer.output.finish
    from packer.output.files import is_packer_output
    from packer.output.verify import verify

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    real = packer.output.finish.record_renamed

    def stop_after_the_first(stage, planned, result):
        real(stage, planned, result)
        raise KeyboardInterrupt

    monkeypatch.setattr(packer.output.finish, "record_renamed", stop_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        convert(image_tree, out, config, workers=1)
    monkeypatch.setattr(packer.output.finish, "record_renamed", real)
    old = sorted(p.name for p in staging_dir(out).glob("shard-00000-*"))
    assert old
    write_image(image_tree / "ant" / "img_000.png", (9, 9), seed=97)  # in the renamed shard
    assert convert(image_tree, out, config, workers=1, resume=True).processed == 5
    assert is_packer_output(out) and verify(out) == []
    assert not set(old) & {p.name for p in out.iterdir()}  # the content tag changed with the content
    convert(image_tree, tmp_path / "fresh", config, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()


def test_kept_shards_are_trusted_by_their_stamps_not_read_again(image_tree, tmp_path, monkeypatch):
    """A finished shard whose files' size, times and inode are as recorded is kept without hashing
    them again; one whose file was written since (same bytes, even with its old modification time)
    is hashed, and kept when its SHA-256 still matches."""
    import os

    import packer.output.files
    from packer.output.files import DONE_SUFFIX, FILE_STAMPS

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    path = staging_dir(out) / f"shard-00000{DONE_SUFFIX}"
    record = json.loads(path.read_text())
    assert sorted(record[FILE_STAMPS]) == sorted(f["path"] for f in record["files"])
    for stamp in record[FILE_STAMPS].values():
        stamp[4] += 1  # recorded on another machine (a Ray node), whose NFS client numbers the mount otherwise
    path.write_text(json.dumps(record))
    hashed = []
    real = packer.output.files.sha256_of
    monkeypatch.setattr(packer.output.files, "sha256_of", lambda p: hashed.append(p.name) or real(p))
    assert convert(image_tree, out, config, workers=1, resume=True).processed == 10
    assert hashed == []

    out2 = tmp_path / "out2"
    _interrupt_after_first_shard(image_tree, out2, config)
    labels = staging_dir(out2) / "shard-00000.labels.npy"
    st = labels.stat()
    labels.write_bytes(labels.read_bytes())  # the same bytes, written again
    os.utime(labels, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert convert(image_tree, out2, config, workers=1, resume=True).processed == 10
    assert hashed == ["shard-00000.labels.npy"]
    assert (out2 / MANIFEST_NAME).read_bytes() == (out / MANIFEST_NAME).read_bytes()


def test_a_record_written_for_another_plan_is_not_kept(image_tree, tmp_path):
    """Workers record their own shards; one of an earlier run that outlived it (a Ray task on a lost
    node) may record a shard in the staging folder of a new run: --resume keeps only records of the
    plan it resumes."""
    from packer.output.files import DONE_SUFFIX, PLAN_OF_RECORD, read_plan

    config = ConvertConfig("npy", PRE, ShardSize(samples=5))
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    path = staging_dir(out) / f"shard-00000{DONE_SUFFIX}"
    record = json.loads(path.read_text())
    assert record[PLAN_OF_RECORD] == read_plan(staging_dir(out))["fingerprint"]
    path.write_text(json.dumps({**record, PLAN_OF_RECORD: "0" * 64}))
    assert convert(image_tree, out, config, workers=1, resume=True).processed == 15
    convert(image_tree, tmp_path / "fresh", config, workers=1)
    assert (out / MANIFEST_NAME).read_bytes() == (tmp_path / "fresh" / MANIFEST_NAME).read_bytes()


def test_a_shuffled_run_of_an_older_packer_is_refused_naming_the_versions(image_tree, tmp_path):
    """Shuffled plans are fingerprinted otherwise since 0.8.3: a run an older packer interrupted is
    refused with a message that says which packer started it, not only that files or options changed."""
    from packer import __version__
    from packer.output.files import read_plan, write_plan

    config = ConvertConfig("npy", PRE, ShardSize(samples=5), shuffle=3)
    out = tmp_path / "out"
    _interrupt_after_first_shard(image_tree, out, config)
    stage = staging_dir(out)
    plan = read_plan(stage)
    assert plan["packer"] == __version__
    write_plan(stage, {**{k: v for k, v in plan.items() if k != "packer"}, "fingerprint": "0" * 64})
    with pytest.raises(OutputError, match=r"started by packer before 0\.8\.3.*--shuffle"):
        convert(image_tree, out, config, workers=1, resume=True)
