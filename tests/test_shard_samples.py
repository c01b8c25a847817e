"""packer.output.shard_samples: the side file of a shard record that the parent reads after the workers."""

from __future__ import annotations

import os

import numpy as np

from packer.output.assemble import _add_labels, find_duplicates
from packer.output.files import finished_shards, record_shard
from packer.output.shard_samples import SAMPLES_SUFFIX, forget_samples, read_samples
from packer.recorded_columns import forget_read_records
from packer.records import ShardResult


def result(name, keys, digests, labels=None):
    labels = [int(k.startswith("b")) for k in keys] if labels is None else labels
    return ShardResult(name, len(keys), [], keys=keys, labels=labels, digests=digests).packed()


def kept(tmp_path):
    return [
        record_shard(tmp_path, result("shard-00000", ["a/1", "a/2"], ["1" * 32, "2" * 32])),
        record_shard(tmp_path, result("shard-00001", ["b/1", "b/2"], ["3" * 32, "1" * 32])),
    ]


def test_side_file_holds_each_samples_digest_and_label(tmp_path):
    shards = kept(tmp_path)
    table = read_samples(shards[1])
    assert table is not None and table["label"].tolist() == [1, 1]
    assert [bytes(d).hex() for d in table["digest"]] == ["3" * 32, "1" * 32]
    again = finished_shards(tmp_path, ["shard-00000", "shard-00001"])  # --resume finds it through the record
    assert read_samples(again["shard-00000"])["label"].tolist() == [0, 0]


def test_a_side_file_not_written_with_its_record_is_not_read(tmp_path):
    """Replaced behind the record's back (another run's, a damaged copy): the record's own columns are read."""
    shards = kept(tmp_path)
    side = tmp_path / f"shard-00001{SAMPLES_SUFFIX}"
    table = np.load(side)
    table["label"] = 7
    table["digest"] = np.frombuffer(b"\x22" * 32, "V16")
    np.save(side, table)
    forget_samples()
    forget_read_records()
    assert read_samples(shards[1]) is None
    counts = np.zeros(2, np.int64)
    assert find_duplicates(shards, lambda r: _add_labels(counts, r)) == [["a/1", "b/2"]]
    assert counts.tolist() == [2, 2]
    os.unlink(side)
    assert read_samples(shards[1]) is None and find_duplicates(shards) == [["a/1", "b/2"]]


def test_labels_past_int32_stay_in_the_record_alone(tmp_path):
    shard = record_shard(tmp_path, result("shard-00000", ["a", "b"], ["1" * 32, "1" * 32], labels=[2**40, 0]))
    assert not (tmp_path / f"shard-00000{SAMPLES_SUFFIX}").exists() and read_samples(shard) is None
    assert find_duplicates([shard]) == [["a", "b"]] and list(shard.labels) == [2**40, 0]


def test_side_files_are_not_published(image_tree, tmp_path):
    from packer import ConvertConfig, PreprocessConfig, convert

    convert(image_tree, tmp_path / "out", ConvertConfig("npy", PreprocessConfig(size=(16, 16))), workers=1)
    assert not list((tmp_path / "out").glob(f"*{SAMPLES_SUFFIX}"))
    assert not list((tmp_path / "out").glob("*.done.json"))


def test_scratch_left_by_a_killed_run_is_not_published(image_tree, tmp_path, monkeypatch):
    """The duplicate search's bucket folder of a run killed outright (no Ctrl-C to clean it up),
    found again by a --resume in the same staging folder, is removed on publishing."""
    import packer.ops.convert
    from packer import ConvertConfig, PreprocessConfig, convert
    from packer.output.files import SCRATCH_PREFIX

    real = packer.ops.convert.build_manifest

    def after_a_kill(*args, scratch=None, **kwargs):
        (scratch / f"{SCRATCH_PREFIX}old").mkdir()
        (scratch / f"{SCRATCH_PREFIX}old" / "000.u64").write_bytes(b"\0" * 8)
        return real(*args, scratch=scratch, **kwargs)

    monkeypatch.setattr(packer.ops.convert, "build_manifest", after_a_kill)
    convert(image_tree, tmp_path / "out", ConvertConfig("npy", PreprocessConfig(size=(16, 16))), workers=1)
    assert not list((tmp_path / "out").glob(f"{SCRATCH_PREFIX}*"))
