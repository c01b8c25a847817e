"""packer convert CORPUS --pack BLOCK (packer.ops.pack_tokens, packer.cli.pack): the stored blocks are
the tokenizer's ids of every document with its end-of-text id, read back with numpy alone; bad input
is reported by path and line; verify and info know token outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from helpers import corpus_texts, make_bpe_tokenizer

from packer.cli import cli
from packer.config import PackConfig, ShardSize
from packer.ops.pack_tokens import pack_corpus
from packer.output.verify import verify
from packer.spec.manifest import read_manifest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """A corpus of 60 documents in two .jsonl files and a tokenizer trained on it."""
    root = tmp_path_factory.mktemp("corpus")
    texts = corpus_texts(60, longest=120)
    (root / "docs").mkdir()
    for name, part in (("a.jsonl", texts[:25]), ("b.jsonl", texts[25:])):
        (root / "docs" / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    return root / "docs", make_bpe_tokenizer(root / "tokenizer.json", texts), texts


def _ids(tokenizer: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def _stock_blocks(out: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every block's ids and document starts, read with numpy alone from the files the manifest lists."""
    m = json.loads((out / "manifest.json").read_text())
    blocks = []
    for shard in m["shards"]:
        tokens, spans, docs = (
            np.load(out / f"{shard['name']}{s}", mmap_mode="r")
            for s in (".tokens.npy", ".blocks.npy", ".documents.npy")
        )
        for start, length in spans.tolist():
            inside = docs[(docs >= start) & (docs < start + length)].astype(np.int64) - start
            blocks.append((np.asarray(tokens[start : start + length]), inside))
    return blocks


def test_concat_is_every_document_then_its_eos_in_order_across_shards(corpus, tmp_path):
    src, tokenizer, texts = corpus
    out = tmp_path / "c"
    result = pack_corpus(src, out, PackConfig("npy", 16, str(tokenizer), shard_size=ShardSize(samples=7)))
    expected = np.concatenate([np.array(ids + [0]) for ids in _ids(tokenizer, texts)])
    blocks = _stock_blocks(out)
    assert len(read_manifest(out).shards) > 3  # several shards: their boundaries must lose nothing
    for i, (ids, _) in enumerate(blocks):
        np.testing.assert_array_equal(ids, expected[i * 16 : i * 16 + 17])
    assert 16 * (len(blocks) - 1) + len(blocks[-1][0]) == len(expected)
    s = result.manifest.tokens
    assert (s.documents, s.tokens, s.dropped, s.dtype, s.eos) == (60, len(expected), 0, "uint16", 0)
    assert s.padding == 17 - len(blocks[-1][0])
    assert np.load(next(out.glob("*.tokens.npy"))).dtype == np.uint16


def test_bos_and_a_shuffled_document_order(corpus, tmp_path):
    src, tokenizer, texts = corpus
    out = tmp_path / "s"
    pack_corpus(src, out, PackConfig("npy", 32, str(tokenizer), bos=True, shuffle_seed=3))
    ids = _ids(tokenizer, texts)
    order = np.random.default_rng(3).permutation(len(texts))
    expected = np.concatenate([np.array([1] + ids[d] + [0]) for d in order])  # <s> is id 1
    stream = np.concatenate([b[0][:-1] for b in _stock_blocks(out)[:-1]] + [_stock_blocks(out)[-1][0]])
    np.testing.assert_array_equal(stream, expected)


def test_best_fit_keeps_documents_whole_and_reports_its_padding(corpus, tmp_path):
    src, tokenizer, texts = corpus
    out = tmp_path / "b"
    block = 200
    result = pack_corpus(src, out, PackConfig("npy", block, str(tokenizer), packing="best-fit"))
    docs = [np.array(ids + [0]) for ids in _ids(tokenizer, texts)]
    found: list[np.ndarray] = []
    for ids, starts in _stock_blocks(out):
        bounds = list(starts) + [len(ids)]
        found += [ids[a:b] for a, b in zip(bounds, bounds[1:])]
    whole = sorted(tuple(d) for d in docs if len(d) <= block + 1)
    assert sorted(tuple(f) for f in found if any(len(f) == len(d) and np.array_equal(f, d) for d in docs)) == whole
    s = result.manifest.tokens
    assert s.stored == sum(len(b[0]) for b in _stock_blocks(out))
    assert s.padding == result.manifest.samples * (block + 1) - s.stored
    assert 0 < s.padding_share(result.manifest.samples) < 0.5


def test_cli_reports_bad_lines_by_path_and_line_and_verify_and_info_know_the_output(corpus, tmp_path):
    src, tokenizer, texts = corpus
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "c.jsonl").write_text(json.dumps({"text": texts[0]}) + "\n{oops\n" + json.dumps({"txt": "x"}) + "\n")
    (bad / "d.txt").write_bytes(b"\xff\xfe\xfa")
    out = tmp_path / "o"
    runner = CliRunner()
    r = runner.invoke(
        cli, ["convert", str(bad), "-f", "npy", "-o", str(out), "--tokenizer", str(tokenizer), "--pack", "8", "-q"]
    )
    assert r.exit_code == 0, r.output
    assert "wrote" in r.stdout and "1 documents" in r.stdout
    report = (out / "report.txt").read_text()
    for where in ("c.jsonl:2", "c.jsonl:3", "d.txt"):
        assert where in r.stderr and where in report
    assert verify(out) == []
    info = runner.invoke(cli, ["info", str(out)])
    assert "token output" in info.output and "1 documents" in info.output and "vocabulary 300" in info.output
    r = runner.invoke(
        cli,
        [
            "convert",
            str(bad),
            "-f",
            "npy",
            "-o",
            str(tmp_path / "s"),
            "--tokenizer",
            str(tokenizer),
            "--pack",
            "8",
            "--strict",
        ],
    )
    assert r.exit_code == 1 and "c.jsonl:2" in r.output and not (tmp_path / "s").exists()


def test_cli_refuses_what_a_token_conversion_cannot_do(corpus, tmp_path):
    src, tokenizer, _ = corpus
    runner = CliRunner()
    base = ["convert", str(src), "-o", str(tmp_path / "x"), "--pack", "8"]
    r = runner.invoke(cli, [*base, "-f", "npy"])
    assert r.exit_code == 2 and "--tokenizer" in r.output
    r = runner.invoke(cli, [*base, "-f", "npy", "--tokenizer", str(tokenizer), "--size", "64"])
    assert r.exit_code == 2 and "--size: not an option of a token conversion" in r.output
    r = runner.invoke(cli, [*base, "-f", "npy", "--tokenizer", str(tokenizer), "--eos", "300"])
    assert r.exit_code == 2 and "not an id of the tokenizer's vocabulary" in r.output
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    r = runner.invoke(cli, [*base, "-f", "npy", "--tokenizer", str(broken)])
    assert r.exit_code == 2 and "is not a tokenizers file" in r.output
    assert not (tmp_path / "x").exists()


def test_verify_finds_a_damaged_token_shard(corpus, tmp_path):
    src, tokenizer, _ = corpus
    out = tmp_path / "v"
    pack_corpus(src, out, PackConfig("npy", 16, str(tokenizer)))
    spans = next(out.glob("*.blocks.npy"))
    arr = np.load(spans)
    arr[3, 1] = 40  # a block longer than block + 1
    np.save(spans, arr)
    problems = verify(out)
    assert any("SHA-256" in p.message for p in problems)
    assert any("more than 17 tokens" in p.message for p in problems)


def _stock_arrays(out: Path, fmt: str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each shard's (tokens, blocks, documents) read with the format's stock library alone."""
    import io

    import h5py
    import lmdb

    m = json.loads((out / "manifest.json").read_text())
    found = []
    for shard in m["shards"]:
        name = shard["name"]
        if fmt == "npy":
            found.append(tuple(np.load(out / f"{name}.{k}.npy") for k in ("tokens", "blocks", "documents")))
        elif fmt == "hdf5":
            with h5py.File(out / f"{name}.h5", "r") as f:
                found.append(tuple(f[k][()] for k in ("tokens", "blocks", "documents")))
        elif fmt == "wds":  # webdataset's own reader: a shard is one sample of three arrays
            import webdataset

            (sample,) = list(webdataset.WebDataset(str(out / f"{name}.tar"), shardshuffle=False).decode())
            found.append(tuple(sample[f"{k}.npy"] for k in ("tokens", "blocks", "documents")))
        else:
            env = lmdb.open(str(out / f"{name}.lmdb"), subdir=False, readonly=True, lock=False)
            with env.begin() as txn:
                found.append(tuple(np.load(io.BytesIO(txn.get(k))) for k in (b"tokens", b"blocks", b"documents")))
            env.close()
    return found


@pytest.mark.long
def test_every_format_holds_the_same_blocks_read_with_its_own_library(corpus, tmp_path):
    src, tokenizer, _ = corpus
    stored = {}
    for fmt in ("npy", "lmdb", "hdf5", "wds"):
        out = tmp_path / fmt
        result = pack_corpus(src, out, PackConfig(fmt, 16, str(tokenizer), shard_size=ShardSize(samples=40)))
        assert result.manifest.format == fmt and result.manifest.format_version == 8
        assert verify(out) == []
        stored[fmt] = _stock_arrays(out, fmt)
    for fmt in ("lmdb", "hdf5", "wds"):
        assert len(stored[fmt]) == len(stored["npy"]) > 1
        for a, b in zip(stored[fmt], stored["npy"]):
            for x, y in zip(a, b):
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)


@pytest.mark.long
def test_a_tar_token_output_is_read_and_verified_as_the_others(corpus, tmp_path):
    from packer.spec.errors import ManifestError
    from readers import make_loader, open_dataset

    src, tokenizer, _ = corpus
    outputs = {}
    for fmt in ("npy", "wds"):
        outputs[fmt] = tmp_path / fmt
        command = ["convert", str(src), "-f", fmt, "-o", str(outputs[fmt]), "--tokenizer", str(tokenizer)]
        r = CliRunner().invoke(cli, [*command, "--pack", "8", "--shard-size", "30", "-q"])
        assert r.exit_code == 0, r.output
    assert not (outputs["wds"] / "shardindex.json").exists()  # wids' list counts samples, a token tar holds one
    tars = sorted(p.name for p in outputs["wds"].iterdir() if p.name != "manifest.json" and p.name != "report.txt")
    assert tars and all(name.endswith(".tar") for name in tars)
    batches = {fmt: list(make_loader(open_dataset(out), 8, shuffle=True, seed=3)) for fmt, out in outputs.items()}
    assert len(batches["wds"]) == len(batches["npy"]) > 1
    for a, b in zip(batches["wds"], batches["npy"]):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(a[key], b[key])
    assert CliRunner().invoke(cli, ["verify", str(outputs["wds"]), "-q"]).exit_code == 0
    tar = outputs["wds"] / tars[0]
    data = bytearray(tar.read_bytes())
    data[512 + 5] ^= 0xFF  # inside the blocks member's .npy header
    tar.write_bytes(bytes(data))
    r = CliRunner().invoke(cli, ["verify", str(outputs["wds"])])
    assert r.exit_code == 1 and tars[0] in r.output
    with pytest.raises(ManifestError, match=tars[0].removesuffix(".tar")):
        list(make_loader(open_dataset(outputs["wds"]), 8))


def test_append_adds_the_new_files_as_new_shards_and_refuses_what_would_mix(corpus, tmp_path):
    src, tokenizer, texts = corpus
    grow = tmp_path / "grow"
    grow.mkdir()
    (grow / "a.jsonl").write_text((src / "a.jsonl").read_text())
    out = tmp_path / "o"
    base = ["convert", str(grow), "-f", "npy", "-o", str(out), "--tokenizer", str(tokenizer), "--pack", "16", "-q"]
    runner = CliRunner()
    assert runner.invoke(cli, base).exit_code == 0
    before = read_manifest(out)
    old_files = {f.path: f.sha256 for s in before.shards for f in s.files}
    (grow / "b.jsonl").write_text((src / "b.jsonl").read_text())
    r = runner.invoke(cli, [*base, "--append"])
    assert r.exit_code == 0, r.output
    after = read_manifest(out)
    assert {f.path: f.sha256 for s in after.shards[: len(before.shards)] for f in s.files} == old_files
    assert after.tokens.documents == 60 and after.samples > before.samples and verify(out) == []
    assert after.history[-1]["action"] == "append" and "appended" in r.stdout
    # the new shards hold b.jsonl's documents as a conversion of b.jsonl alone packs them
    alone = tmp_path / "b"
    only_b = tmp_path / "only_b"
    only_b.mkdir()
    (only_b / "b.jsonl").write_text((src / "b.jsonl").read_text())
    pack_corpus(only_b, alone, PackConfig("npy", 16, str(tokenizer)))
    new = _stock_blocks(out)[before.samples :]
    assert len(new) == read_manifest(alone).samples
    for (x, _), (y, _) in zip(new, _stock_blocks(alone)):
        np.testing.assert_array_equal(x, y)
    r = runner.invoke(cli, [*base, "--append"])
    assert r.exit_code == 1 and "nothing to append" in r.output
    (grow / "a.jsonl").write_text(json.dumps({"text": "changed"}) + "\n")
    (grow / "c.jsonl").write_text(json.dumps({"text": texts[0]}) + "\n")
    r = runner.invoke(cli, [*base, "--append"])
    assert r.exit_code == 1 and "a.jsonl has changed since it was packed" in r.output
    (grow / "a.jsonl").write_text((src / "a.jsonl").read_text())
    r = runner.invoke(cli, [*base[:-2], "32", "-q", "--append"])
    assert r.exit_code == 1 and "block 16, not 32" in r.output
    other = make_bpe_tokenizer(tmp_path / "other.json", texts, vocab_size=280)
    r = runner.invoke(cli, [*base[:7], str(other), *base[8:], "--append"])
    assert r.exit_code == 1 and "is not the tokenizer" in r.output
    assert read_manifest(out).samples == after.samples


def test_commands_for_samples_refuse_a_token_output_with_what_to_do(corpus, tmp_path):
    src, tokenizer, _ = corpus
    out = tmp_path / "t"
    pack_corpus(src, out, PackConfig("npy", 16, str(tokenizer)))
    runner = CliRunner()
    r = runner.invoke(cli, ["convert", str(out), "-f", "lmdb", "-o", str(tmp_path / "r")])
    assert r.exit_code == 1 and "not repacked yet: convert its corpus again with -f lmdb" in r.output
    r = runner.invoke(cli, ["preview", str(out), "--text"])
    assert r.exit_code == 1 and "holds token blocks, not pictures" in r.output
    for command in (["tune", str(out)], ["profile", str(out)], ["bench", str(out), "--compare", str(src)]):
        r = runner.invoke(cli, command)
        assert r.exit_code == 1 and "holds token blocks: packer" in r.output, command
