"""packer.tokens.progress: a token conversion interrupted while it tokenizes goes on with --resume from
where it stood, tokenizing only what it had not, to the output an uninterrupted run gives; a changed
corpus is refused; the documents and lines reported are reported once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import corpus_texts, make_bpe_tokenizer

from packer.cli import cli
from packer.config import PackConfig, ShardSize
from packer.ops.pack_tokens import pack_corpus
from packer.output.files import staging_dir
from packer.spec.errors import OutputError
from packer.tokens import progress, tokenizing
from packer.tokens.progress import PROGRESS_NAME


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, Path]:
    """Four .jsonl files of 40 documents, two bad lines among them, and a tokenizer trained on them."""
    texts = corpus_texts(160, longest=80)
    (tmp_path / "docs").mkdir()
    for k in range(4):
        lines = [json.dumps({"text": t}) for t in texts[40 * k : 40 * (k + 1)]]
        if k in (1, 2):
            lines.insert(7, "{not json")
        (tmp_path / "docs" / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path / "docs", make_bpe_tokenizer(tmp_path / "tokenizer.json", texts)


def _small_batches(monkeypatch) -> list[int]:
    """Batches of a few documents, a record after each; the documents each batch encodes, counted."""
    monkeypatch.setattr(tokenizing, "BATCH_CHARACTERS", 2000)
    monkeypatch.setattr(progress, "EVERY", 0.0)
    encoded: list[int] = []
    encode = tokenizing._encode

    def counted(encoder, batch, skipped, strict):
        encoded.append(len(batch))
        return encode(encoder, batch, skipped, strict)

    monkeypatch.setattr(tokenizing, "_encode", counted)
    return encoded


@pytest.fixture
def small_batches(monkeypatch) -> list[int]:
    return _small_batches(monkeypatch)


def _interrupt_at(monkeypatch, batch: int) -> None:
    encode = tokenizing._encode
    calls = []

    def stopped(encoder, docs, skipped, strict):
        calls.append(1)
        if len(calls) == batch:
            raise KeyboardInterrupt
        return encode(encoder, docs, skipped, strict)

    monkeypatch.setattr(tokenizing, "_encode", stopped)


def _files(out: Path) -> dict:
    m = json.loads((out / "manifest.json").read_text())
    return {"shards": [(f["path"], f["sha256"]) for s in m["shards"] for f in s["files"]], "tokens": m["tokens"]}


def _config(tokenizer: Path, block: int = 16) -> PackConfig:
    return PackConfig("npy", block, str(tokenizer), shard_size=ShardSize(samples=20))


@pytest.mark.parametrize("killed", [False, True], ids=["ctrl-c", "killed after its record"])
def test_an_interrupted_tokenizing_resumes_where_it_stood(corpus, tmp_path, monkeypatch, small_batches, killed):
    src, tokenizer = corpus
    pack_corpus(src, tmp_path / "whole", _config(tokenizer))
    total = sum(small_batches)
    small_batches.clear()
    _interrupt_at(monkeypatch, 6)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack_corpus(src, out, _config(tokenizer))
    stage = staging_dir(out)
    assert not out.exists() and (stage / PROGRESS_NAME).is_file()
    record = json.loads((stage / PROGRESS_NAME).read_text())
    assert record["documents"] > 0 and record["file"] >= 1  # into the second file at least
    if killed:  # a kill after the record: the files hold more than it says, cut back on resume
        for name in ("corpus.ids", "corpus.ids.lengths"):
            with open(stage / name, "ab") as f:
                f.write(b"\x01" * 64)
    monkeypatch.undo()
    encoded = _small_batches(monkeypatch)
    result = pack_corpus(src, out, _config(tokenizer), resume=True)
    assert sum(encoded) == total - record["documents"] > 0  # only the documents after the record
    assert _files(out) == _files(tmp_path / "whole")  # byte for byte
    reports = [s["path"] for s in json.loads((out / "manifest.json").read_text())["skipped"]]
    assert sorted(reports) == ["part-1.jsonl:8", "part-2.jsonl:8"]  # each once
    assert [s.path for s in result.skipped] == reports
    assert not stage.exists() and not (out / PROGRESS_NAME).exists() and not (out / "corpus.ids").exists()


def test_the_blocks_may_change_the_corpus_may_not(corpus, tmp_path, monkeypatch, small_batches):
    src, tokenizer = corpus
    pack_corpus(src, tmp_path / "whole-32", _config(tokenizer, 32))
    _interrupt_at(monkeypatch, 5)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack_corpus(src, out, _config(tokenizer, 16))
    monkeypatch.undo()
    # blocks are planned from the ids alone: another block size goes on from the same tokenizing
    pack_corpus(src, out, _config(tokenizer, 32), resume=True)
    assert _files(out)["shards"] == _files(tmp_path / "whole-32")["shards"]
    # a corpus file changed since: refused, the interrupted run kept
    _small_batches(monkeypatch)
    _interrupt_at(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        pack_corpus(src, tmp_path / "again", _config(tokenizer))
    monkeypatch.undo()
    (src / "part-3.jsonl").write_text(json.dumps({"text": "a new document"}) + "\n")
    with pytest.raises(OutputError, match="corpus files or the tokenizing options changed"):
        pack_corpus(src, tmp_path / "again", _config(tokenizer), resume=True)
    assert (staging_dir(tmp_path / "again") / PROGRESS_NAME).is_file()


def test_the_command_says_what_was_kept_and_takes_resume(corpus, tmp_path, monkeypatch, small_batches):
    src, tokenizer = corpus
    command = ["convert", str(src), "-f", "npy", "-o", str(tmp_path / "cli"), "--tokenizer", str(tokenizer)]
    command += ["--pack", "16", "--shard-size", "20", "-q"]
    _interrupt_at(monkeypatch, 5)
    r = CliRunner().invoke(cli, command)
    assert r.exit_code == 130 and "run the same command with --resume" in r.output, r.output
    monkeypatch.undo()
    r = CliRunner().invoke(cli, [*command, "--resume"])
    assert r.exit_code == 0 and (tmp_path / "cli" / "manifest.json").is_file(), r.output


def test_shards_an_interrupted_run_wrote_are_not_published_by_the_next(corpus, tmp_path, monkeypatch):
    from packer.output.verify import verify
    from packer.run.staging import Staging

    src, tokenizer = corpus
    name_shards = Staging.name_shards

    def named_then_interrupted(self, *args, **kwargs):
        name_shards(self, *args, **kwargs)
        raise KeyboardInterrupt  # tokenized whole, every shard written and named

    monkeypatch.setattr(Staging, "name_shards", named_then_interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack_corpus(src, out, _config(tokenizer, 16))
    assert list(staging_dir(out).glob("shard-*"))
    monkeypatch.undo()
    pack_corpus(src, out, _config(tokenizer, 24), resume=True)  # other blocks: other shards
    pack_corpus(src, tmp_path / "whole", _config(tokenizer, 24))
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert verify(out) == []


def test_kept_work_survives_a_failure_a_bad_option_and_a_lost_page(corpus, tmp_path, monkeypatch, caplog):
    from packer.ops import pack_tokens
    from packer.spec.errors import ConfigError

    src, tokenizer = corpus
    pack_corpus(src, tmp_path / "whole", _config(tokenizer))
    out = tmp_path / "out"
    stage = staging_dir(out)
    _small_batches(monkeypatch)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pack_tokens, "_write_shards", full_disk)  # tokenized whole, then the disk fills
    with pytest.raises(OutputError, match="No space left"):
        pack_corpus(src, out, _config(tokenizer))
    assert (stage / PROGRESS_NAME).is_file() and "run the same command with --resume" in caplog.text
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="--shard-size"):  # refused before the kept work is touched
        pack_corpus(src, out, PackConfig("npy", 16, str(tokenizer), shard_size=ShardSize(samples=10**9)), resume=True)
    assert (stage / PROGRESS_NAME).is_file()
    # the machine crashed: the record counts ids the spill lost
    spill = stage / "corpus.ids"
    spill.write_bytes(spill.read_bytes()[:-10])
    caplog.clear()
    pack_corpus(src, out, _config(tokenizer), resume=True)
    assert "shorter than their record; tokenizing again" in caplog.text
    assert _files(out) == _files(tmp_path / "whole")


def test_a_plain_run_says_it_discards_an_interrupted_one(corpus, tmp_path, monkeypatch, caplog):
    src, tokenizer = corpus
    _small_batches(monkeypatch)
    _interrupt_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        pack_corpus(src, tmp_path / "out", _config(tokenizer))
    monkeypatch.undo()
    pack_corpus(src, tmp_path / "out", _config(tokenizer))
    assert "discarding the unfinished run" in caplog.text and "--resume" in caplog.text


def _first_half(src: Path, tmp_path: Path) -> Path:
    """The corpus's last two files moved aside (into the returned folder), to be appended later."""
    later = tmp_path / "later"
    later.mkdir()
    for name in ("part-2.jsonl", "part-3.jsonl"):
        (src / name).rename(later / name)
    return later


def _grow(src: Path, later: Path) -> None:
    for f in later.iterdir():
        f.rename(src / f.name)


def test_a_token_append_resumes_where_it_stood(corpus, tmp_path, monkeypatch, small_batches):
    from packer.ops.pack_tokens import append_corpus

    src, tokenizer = corpus
    later = _first_half(src, tmp_path)
    pack_corpus(src, tmp_path / "whole", _config(tokenizer))
    pack_corpus(src, tmp_path / "out", _config(tokenizer))
    _grow(src, later)
    append_corpus(src, tmp_path / "whole", _config(tokenizer))
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    _interrupt_at(monkeypatch, 4)
    command = ["convert", str(src), "-f", "npy", "-o", str(tmp_path / "out"), "--tokenizer", str(tokenizer)]
    command += ["--pack", "16", "--shard-size", "20", "--append", "-q"]
    r = CliRunner().invoke(cli, command)
    assert r.exit_code == 130 and "is as it was. The documents tokenized so far are kept in" in r.output, r.output
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before
    record = json.loads((staging_dir(tmp_path / "out") / PROGRESS_NAME).read_text())
    monkeypatch.undo()
    encoded = _small_batches(monkeypatch)
    r = CliRunner().invoke(cli, [*command, "--resume"])
    assert r.exit_code == 0, r.output
    assert sum(encoded) == 80 - record["documents"] > 0  # only the new documents after the record
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")  # byte for byte the uninterrupted append


def test_a_resumed_append_refuses_an_output_changed_since(corpus, tmp_path, monkeypatch, small_batches):
    src, tokenizer = corpus
    later = _first_half(src, tmp_path)
    out = tmp_path / "out"
    pack_corpus(src, out, _config(tokenizer))
    _grow(src, later)
    _interrupt_at(monkeypatch, 4)
    command = ["convert", str(src), "-f", "npy", "-o", str(out), "--tokenizer", str(tokenizer)]
    command += ["--pack", "16", "--shard-size", "20", "--append", "-q"]
    assert CliRunner().invoke(cli, command).exit_code == 130
    monkeypatch.undo()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.setdefault("history", []).append({"action": "a note"})  # another run changed the output meanwhile
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = CliRunner().invoke(cli, [*command, "--resume"])
    assert r.exit_code == 1 and "the output appended to, the corpus files" in r.output, r.output


def _objects(fs, prefix: str) -> dict:
    fs.invalidate_cache()
    return {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)} if fs.exists(prefix) else {}


@pytest.mark.parametrize("append", [False, True], ids=["conversion", "append"])
def test_a_token_conversion_into_a_bucket_resumes_where_it_stood(
    s3_server, corpus, tmp_path, monkeypatch, small_batches, append
):
    fs, url = s3_server, f"s3://data/tokens-resumed-{int(append)}"
    src, tokenizer = corpus
    options = ["-f", "npy", "--tokenizer", str(tokenizer), "--pack", "16", "--shard-size", "150", "-q"]
    if append:
        later = _first_half(src, tmp_path)
        for out in (url, str(tmp_path / "whole")):
            assert CliRunner().invoke(cli, ["convert", str(src), "-o", out, *options]).exit_code == 0
        _grow(src, later)
        options.append("--append")
    assert CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "whole"), *options]).exit_code == 0
    before = _objects(fs, url[5:])
    small_batches.clear()
    _interrupt_at(monkeypatch, 4)
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options])
    assert r.exit_code == 130 and f"nothing was published to {url}" in r.output, r.output
    assert "The documents tokenized so far are kept in" in r.output and "--resume" in r.output
    assert _objects(fs, url[5:]) == before  # nothing of the run's in the bucket
    kept = Path(r.output.split("kept in ")[1].split(":")[0])
    record = json.loads(next(kept.rglob(PROGRESS_NAME)).read_text())
    monkeypatch.undo()
    encoded = _small_batches(monkeypatch)
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--resume"])
    assert r.exit_code == 0, r.output
    assert sum(encoded) == (80 if append else 160) - record["documents"] > 0  # only the documents after the record
    remote = json.loads(fs.cat_file(f"{url[5:]}/manifest.json"))
    local = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert remote["shards"] == local["shards"] and remote["tokens"] == local["tokens"]
    assert not kept.exists()  # published: the local folder goes
    assert CliRunner().invoke(cli, ["verify", url, "-q"]).exit_code == 0


def test_a_token_conversion_whose_upload_fails_keeps_its_tokenizing(s3_server, corpus, tmp_path, monkeypatch):
    """Tokenized whole, then the upload fails (the store went away): the tokenizing is kept on the
    local disk, and --resume publishes without tokenizing anything again."""
    from conftest import failing_uploads

    fs, url = s3_server, "s3://data/tokens-upload-failed"
    src, tokenizer = corpus
    options = ["-f", "npy", "--tokenizer", str(tokenizer), "--pack", "16", "--shard-size", "150", "-q"]
    assert CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "whole"), *options]).exit_code == 0
    failing_uploads(monkeypatch, "report.txt")
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options])
    assert r.exit_code == 1 and "connection reset" in r.output, r.output
    assert _objects(fs, url[5:]) == {}
    monkeypatch.undo()
    encoded = _small_batches(monkeypatch)
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--resume"])
    assert r.exit_code == 0, r.output
    assert encoded == []  # nothing tokenized again
    remote = json.loads(fs.cat_file(f"{url[5:]}/manifest.json"))
    assert remote["shards"] == json.loads((tmp_path / "whole" / "manifest.json").read_text())["shards"]


def test_the_folder_of_a_bucket_run_is_this_users_alone(tmp_path, monkeypatch):
    import os
    import stat

    from packer.cli.run_folder import RunFolder
    from packer.spec.errors import OutputError

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    folder = RunFolder("s3://data/x", resume=False)
    assert folder.path.parent == tmp_path and stat.S_IMODE(os.lstat(folder.path).st_mode) == 0o700
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    other = RunFolder("s3://data/x", resume=False)
    assert other.path != folder.path  # another store's bucket of the same name: another folder
    other.path.rmdir()
    (tmp_path / "elsewhere").mkdir()
    other.path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputError, match="is not a folder of this user's"):
        RunFolder("s3://data/x", resume=False)


def test_a_killed_token_conversion_into_a_bucket_resumes_where_it_stood(s3_server, corpus, tmp_path, monkeypatch):
    """A kill leaves the tokenizing in the run's staging folder, not set aside: --resume finds it there."""
    import shutil

    from packer.output.shard_uploads import KEPT

    url = "s3://data/tokens-killed"
    src, tokenizer = corpus
    options = ["-f", "npy", "--tokenizer", str(tokenizer), "--pack", "16", "--shard-size", "150", "-q"]
    _small_batches(monkeypatch)
    _interrupt_at(monkeypatch, 4)
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options])
    assert r.exit_code == 130, r.output
    folder = Path(r.output.split("kept in ")[1].split(":")[0])
    for item in sorted(p for p in (folder / KEPT).rglob("*") if p.is_file()):  # where a kill leaves them
        target = folder / item.relative_to(folder / KEPT)
        target.parent.mkdir(parents=True, exist_ok=True)
        item.rename(target)
    shutil.rmtree(folder / KEPT)
    record = json.loads(next(folder.rglob(PROGRESS_NAME)).read_text())
    monkeypatch.undo()
    encoded = _small_batches(monkeypatch)
    r = CliRunner().invoke(cli, ["convert", str(src), "-o", url, *options, "--resume"])
    assert r.exit_code == 0, r.output
    assert sum(encoded) == 160 - record["documents"] > 0
