"""packer.output.resume_records against an S3-compatible server on 127.0.0.1 (moto): a shard's
record is mirrored after its folder's plan, never before it; every object is reported before it is
written; ``restore`` brings the records back and names only parts a run of packer gives."""

from __future__ import annotations

import json
from concurrent.futures import Future

from packer.output.files import DONE_SUFFIX, PLAN_RECORD
from packer.output.resume_records import PARTS_OF_RECORD, ResumeRecords
from packer.output.upload import STATE, Destination

TOKEN = "0123456789ab" + "c" * 20


def _records(fs, local, before=frozenset()) -> tuple[ResumeRecords, list[str]]:
    wrote: list[str] = []
    dest = Destination("s3://data/records", fs, "data/records", TOKEN, False, set(before))
    return ResumeRecords(dest, local, wrote.append), wrote


def _done() -> Future:
    done: Future = Future()
    done.set_result(None)
    return done


def _stage(tmp_path):
    """A run's local output folder and its staging folder with a plan and one finished shard's record."""
    local = tmp_path / "run" / "out"
    stage = tmp_path / "run" / "out.packer-partial"
    stage.mkdir(parents=True)
    (stage / PLAN_RECORD).write_text(json.dumps({"fingerprint": "f" * 16, "workers": 1}))
    record = {"name": "shard-00000", "files": [{"path": "shard-00000.tar", "bytes": 10, "sha256": "a" * 64}]}
    (stage / f"shard-00000{DONE_SUFFIX}").write_text(json.dumps(record))
    return local, stage


def test_a_record_waits_for_its_plan_then_both_are_mirrored_in_order(s3_server, tmp_path):
    fs = s3_server
    local, stage = _stage(tmp_path)
    records, wrote = _records(fs, local)
    part = f".packer-parts/{TOKEN[:12]}-0/shard-00000.tar"
    records.keep_record(stage / f"shard-00000{DONE_SUFFIX}", {"shard-00000.tar": part}, [_done()])
    records.wait()
    assert wrote == [] and not records.resumable  # no plan yet: the record waits
    records.keep_plan(stage)
    records.wait()
    plan, shard = (f"{STATE}/out.packer-partial/{n}" for n in (PLAN_RECORD, f"shard-00000{DONE_SUFFIX}"))
    assert wrote == [plan, shard] and records.resumable
    mirrored = json.loads(fs.cat_file(f"data/records/{shard}"))
    assert mirrored[PARTS_OF_RECORD] == {"shard-00000.tar": part}
    records.stop(cancel=False)


def test_restore_brings_the_records_back_and_names_only_parts_of_packer(s3_server, tmp_path):
    fs = s3_server
    local, stage = _stage(tmp_path / "first")
    records, _ = _records(fs, local)
    good = f".packer-parts/{TOKEN[:12]}-0/shard-00000.tar"
    records.keep_plan(stage)
    records.keep_record(stage / f"shard-00000{DONE_SUFFIX}", {"shard-00000.tar": good}, [_done()])
    (stage / f"shard-00001{DONE_SUFFIX}").write_text(
        json.dumps({"name": "shard-00001", "files": [{"path": "shard-00001.tar", "bytes": 3, "sha256": "b" * 64}]})
    )
    records.keep_record(stage / f"shard-00001{DONE_SUFFIX}", {"shard-00001.tar": "../../etc/passwd"}, [_done()])
    records.wait()
    records.stop(cancel=False)
    names = {n.split("data/records/", 1)[1] for n in fs.find("data/records")}
    again, _ = _records(fs, tmp_path / "second" / "run" / "out", before=names)
    parts = again.restore()
    assert parts == {"shard-00000.tar": (good, 10, "a" * 64)}  # the record naming another object: not a part
    restored = tmp_path / "second" / "run" / "out.packer-partial"
    assert (restored / PLAN_RECORD).is_file() and again.resuming and again.resumable
    again.stop(cancel=False)
