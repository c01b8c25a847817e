"""Text fields end to end: decoding rules, tokenization, and round trips of text and paired samples
through every format (exact strings, exact ids), with lengths from the index and verify."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FORMATS, pair_tree, write_image
from helpers import shard_file
from torch.utils.data import DataLoader

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.output.verify import verify
from packer.pixels.preprocess import load_image
from packer.spec.errors import ConfigError, DecodeError
from packer.spec.text import TextConfig, decode_text, json_text, load_tokenizer, token_ids
from readers import make_loader, open_dataset

TEXTS = {
    "pos/a.txt": "good film\nreally good",
    "pos/b.txt": "\u00e9t\u00e9 caf\u00e9 \u2014 \u65e5\u672c",  # non-ASCII survives
    "pos/c.txt": "good " * 40,
    "neg/a.txt": "bad",
    "neg/b.txt": "  leading and trailing spaces kept  ",
}


def make_tokenizer(path: Path) -> Path:
    """A small word-level tokenizer with [CLS] ... [SEP] around every text, saved as tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = "good film really bad leading and trailing spaces kept".split()
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(path))
    return path


def text_tree(root: Path) -> Path:
    for rel, text in TEXTS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def close(ds) -> None:
    """Close a map-style reader's shards (verify opens LMDB files itself, and py-lmdb refuses a second
    open of one file in a process)."""
    if hasattr(ds, "close"):
        ds.close()


def read_all(ds) -> list:
    return (
        list(ds)
        if not hasattr(ds, "__getitem__") or type(ds).__name__ == "WdsDataset"
        else [ds[i] for i in range(len(ds))]
    )


# Decoding rules ------------------------------------------------------------------------------------
def test_bom_dropped_and_crlf_made_lf():
    assert decode_text(b"\xef\xbb\xbfone\r\ntwo\r\n", "x.txt") == "one\ntwo\n"
    assert decode_text(b"lone\rcr", "x.txt") == "lone\rcr"  # documented: only CRLF is normalised


def test_invalid_utf8_names_the_byte_and_suggests_encoding():
    with pytest.raises(DecodeError) as e:
        decode_text(b"ok \xff no", "x.txt")
    assert "not valid UTF-8 text" in e.value.reason and "byte 3" in e.value.reason and "--encoding" in e.value.reason
    assert decode_text("caf\u00e9\r\n".encode("latin-1"), "x.txt", "latin-1") == "caf\u00e9\n"
    assert decode_text("hi".encode("utf-16"), "x.txt", "utf-16") == "hi"  # utf-16 writes a BOM, and drops it
    assert decode_text("\ufeffhi".encode("utf-16-le"), "x.txt", "utf-16-le") == "hi"  # a BOM this codec keeps


def test_a_second_byte_order_mark_is_the_texts_own():
    """Only one leading BOM is dropped, as Python's decoders drop it: the U+FEFF after it is text."""
    for encoding, data in (
        ("utf-8", b"\xef\xbb\xbf" + "\ufeffword".encode()),
        ("utf-16", "\ufeffword".encode("utf-16")),
        ("utf-32", "\ufeffword".encode("utf-32")),
    ):
        assert decode_text(data, "x.txt", encoding) == data.decode(encoding + ("-sig" if encoding == "utf-8" else ""))
        assert decode_text(data, "x.txt", encoding) == "\ufeffword"


def test_a_file_of_only_a_bom_is_empty():
    with pytest.raises(DecodeError, match="only a byte-order mark"):
        decode_text(b"\xef\xbb\xbf", "x.txt")


def test_json_must_parse():
    assert json_text(b'{"a": 1}', "x.json") == '{"a": 1}'
    with pytest.raises(DecodeError, match="not valid JSON: .* line 1"):
        json_text(b'{"a": ', "x.json")


def test_text_options_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="encoding Python knows"):
        TextConfig(encoding="no-such-codec")
    with pytest.raises(ConfigError, match="needs --tokenizer"):
        TextConfig(max_length=8)
    with pytest.raises(ConfigError, match="not a file"):
        TextConfig(tokenizer=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="--fields"):
        TextConfig(fields=("image", "audio"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a tokenizers file"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_token_ids_truncate_and_keep_special_tokens(tmp_path):
    tok = str(make_tokenizer(tmp_path / "tok.json"))
    assert token_ids("good film", "x", tok, None).tolist() == [2, 4, 5, 3]
    ids = token_ids("good " * 10, "x", tok, 5)
    assert ids.dtype == np.int32 and ids.tolist() == [2, 4, 4, 4, 3]


# Round trips -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_outputs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("text")
    src = text_tree(base / "src")
    (src / "neg" / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    (src / "neg" / "empty.txt").write_bytes(b"")
    (src / "neg" / "crlf.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo")
    tok = make_tokenizer(base / "tok.json")
    out = {}
    for fmt in FORMATS:
        config = ConvertConfig(fmt, shard_size=ShardSize(samples=3))
        out[fmt] = convert(src, base / f"text-{fmt}", config, workers=2)
        tconfig = ConvertConfig(fmt, shard_size=ShardSize(samples=3), text=TextConfig(tokenizer=str(tok), max_length=6))
        out[fmt, "tokens"] = convert(src, base / f"tokens-{fmt}", tconfig, workers=2)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_text_round_trip_is_exact(text_outputs, fmt):
    result = text_outputs[fmt]
    expected = {**TEXTS, "neg/crlf.txt": "one\ntwo"}
    ds = open_dataset(result.output, return_meta=True)
    got = {meta["key"]: (text, label) for text, label, meta in read_all(ds)}
    classes = ds.classes
    assert got == {k: (v, classes.index(k.split("/")[0])) for k, v in expected.items()}
    m = result.manifest
    assert m.format_version == {"hdf5": 4, "wds": 7}.get(fmt, 3) and m.sample_fields == ("text",) and not m.has_image
    assert m.fields["text"]["kind"] == "text" and m.fields["text"]["length_unit"] == "bytes"
    reasons = {s.path: s.reason for s in result.skipped}
    assert "not valid UTF-8 text" in reasons["neg/latin.txt"] and reasons["neg/empty.txt"].startswith("empty file")
    # lengths come from the index, in dataset order, in UTF-8 bytes
    keys = [meta["key"] for _, _, meta in read_all(ds)]
    assert ds.lengths().tolist() == [len(expected[k].encode("utf-8")) for k in keys]
    close(ds)
    assert verify(result.output) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_token_round_trip_is_exact(text_outputs, fmt, tmp_path):
    result = text_outputs[fmt, "tokens"]
    tok = str(make_tokenizer(tmp_path / "tok.json"))
    ds = open_dataset(result.output, return_meta=True)
    samples = read_all(ds)
    expected = {**TEXTS, "neg/crlf.txt": "one\ntwo"}
    assert sorted(meta["key"] for _, _, meta in samples) == sorted(expected)  # every text, once
    for ids, _, meta in samples:
        text = expected[meta["key"]]
        assert ids.dtype == torch.int64 and ids.tolist() == token_ids(text, "x", tok, 6).tolist()
    assert ds.lengths().tolist() == [len(ids) for ids, _, _ in samples]
    assert ds.pad_id == 0 and result.manifest.fields["text"]["tokenizer"]["max_length"] == 6
    close(ds)
    assert verify(result.output) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_paired_samples_round_trip(tmp_path, fmt):
    src = pair_tree(tmp_path / "src")
    pre = PreprocessConfig(size=(16, 16))
    result = convert(src, tmp_path / "out", ConvertConfig(fmt, pre, ShardSize(samples=2)), workers=2)
    assert result.manifest.sample_fields == ("image", "text", "json")
    assert [(s.path, s.reason.split(":")[0]) for s in result.skipped] == [("dogs/0002", "missing json")]
    ds = open_dataset(result.output, return_meta=True, normalize=False)
    got = read_all(ds)
    assert len(got) == 5
    for image, text, obj, label, meta in got:
        cls, stem = meta["key"].split("/")
        i = int(stem)
        expected = load_image(src / cls / f"{stem}.png", pre)
        assert torch.equal(image, torch.from_numpy(np.array(expected)).permute(2, 0, 1))
        assert text == f"a {cls[:-1]} number {i}" and obj == {"n": i, "cls": cls} and label == ds.classes.index(cls)
    close(ds)
    assert verify(result.output) == []


def test_allow_missing_stores_the_field_empty(tmp_path):
    src = pair_tree(tmp_path / "src")
    config = ConvertConfig("npy", PreprocessConfig(size=(16, 16)), text=TextConfig(allow_missing=True))
    result = convert(src, tmp_path / "out", config, workers=1)
    assert result.skipped == []
    ds = open_dataset(result.output, return_meta=True)
    by_key = {meta["key"]: (text, obj) for _, text, obj, _, meta in read_all(ds)}
    assert by_key["dogs/0002"] == ("a dog number 2", None)
    assert verify(result.output) == []
    from readers import packed_collate, pad_collate

    for collate in (pad_collate, packed_collate):  # the None of the missing json batches too
        batches = list(DataLoader(open_dataset(result.output), batch_size=3, collate_fn=collate))
        assert sum(len(b["json"]) for b in batches) == len(ds) and None in [j for b in batches for j in b["json"]]
        assert batches[0]["images"].shape[1:] == (3, 16, 16) and len(batches[0]["texts"]) == 3


def test_a_bad_file_in_a_pair_skips_the_sample_naming_the_file(tmp_path):
    src = pair_tree(tmp_path / "src")
    (src / "cats" / "0001.txt").write_bytes(b"\xff\xfe bad")
    (src / "cats" / "0002.json").write_text("{not json")
    config = ConvertConfig("lmdb", PreprocessConfig(size=(16, 16)), text=TextConfig(allow_missing=True))
    result = convert(src, tmp_path / "out", config, workers=1)
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons["cats/0001"].startswith("not valid UTF-8 text") and reasons["cats/0001"].endswith("[0001.txt]")
    assert reasons["cats/0002"].startswith("not valid JSON") and reasons["cats/0002"].endswith("[0002.json]")
    assert result.manifest.samples == 4


def test_a_flipped_byte_in_a_text_field_is_traced_to_its_sample(text_outputs, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(text_outputs["npy"].output, out)
    shard = text_outputs["npy"].manifest.shards[0]
    flat = out / shard.file(".text.bytes.npy")
    data = bytearray(flat.read_bytes())
    data[-1] ^= 0x20  # the last byte of the shard's last text
    flat.write_bytes(bytes(data))
    problems = [p for p in verify(out) if p.sample is not None]
    assert len(problems) == 1 and problems[0].sample == shard.samples - 1
    assert "CRC-32" in problems[0].message


def test_text_only_outputs_open_with_stock_libraries(text_outputs):
    import h5py
    import lmdb

    npy_out = text_outputs["npy"].output
    shard = text_outputs["npy"].manifest.shards[0]
    flat = np.load(npy_out / shard.file(".text.bytes.npy"), mmap_mode="r")
    offsets = np.load(npy_out / shard.file(".text.offsets.npy"))
    first = bytes(flat[offsets[0] : offsets[1]]).decode("utf-8")
    # each output's shards carry its own content tag: each output's first shard, by its manifest
    with h5py.File(shard_file(text_outputs["hdf5"].output, 0, ".h5")) as f:
        assert bytes(f["text_bytes"][f["text_offsets"][0] : f["text_offsets"][1]]).decode() == first
    env = lmdb.open(str(shard_file(text_outputs["lmdb"].output, 0, ".lmdb")), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(b"00000000.text").decode("utf-8") == first
    env.close()
    import webdataset as wds

    tar = str(shard_file(text_outputs["wds", "tokens"].output, 0, ".tar"))
    sample = next(iter(wds.WebDataset(tar, shardshuffle=False).decode()))
    assert sample["tokens.npy"].dtype == np.int32 and sample["tokens.npy"][0] == 2


# Loading -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_make_loader_pads_token_batches(text_outputs, fmt):
    ds = open_dataset(text_outputs[fmt, "tokens"].output)
    loader = make_loader(ds, 3, num_workers=2, bucket_by_length=fmt != "wds", seed=1)
    seen = 0
    for batch in loader:
        ids, mask, lengths = batch["input_ids"], batch["attention_mask"], batch["lengths"]
        assert ids.shape == mask.shape and ids.shape[1] == int(lengths.max())
        assert mask.sum(1).tolist() == lengths.tolist() and (ids[mask == 0] == ds.pad_id).all()
        seen += len(batch["labels"])
    assert seen == len(ds)


def test_bucketing_cuts_padding_on_a_packed_output(tmp_path):
    from readers import EpochBatchSampler, LengthBucketSampler, padding_ratio

    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"{i:04d}.txt").write_text("word " * int(rng.lognormal(3, 1) + 1))
    ds = open_dataset(convert(src, tmp_path / "out", ConvertConfig("npy"), workers=2).output)
    lengths = ds.lengths()
    random = padding_ratio(EpochBatchSampler(len(ds), 16, seed=0).batches(0), lengths)
    bucketed = padding_ratio(LengthBucketSampler(lengths, 16, seed=0).batches(0), lengths)
    assert bucketed < random / 2


def test_padding_and_truncation_saved_in_the_tokenizer_file_are_not_applied(tmp_path):
    from tokenizers import Tokenizer

    path = make_tokenizer(tmp_path / "tok.json")
    tok = Tokenizer.from_file(str(path))
    tok.enable_padding(length=12, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(3)
    tok.save(str(path))
    assert token_ids("good film", "x", str(path), None).tolist() == [2, 4, 5, 3]
    assert TextConfig(tokenizer=str(path)).tokenizer_info()["pad_id"] == 0


def test_tokenizer_without_text_field_is_refused(tmp_path):
    write_image(tmp_path / "src" / "a" / "1.png")
    tok = make_tokenizer(tmp_path / "tok.json")
    with pytest.raises(Exception, match="no text field"):
        convert(tmp_path / "src", tmp_path / "out", ConvertConfig("npy", text=TextConfig(tokenizer=str(tok))))


def test_missing_json_in_wds_opens_with_stock_webdataset(tmp_path):
    import webdataset as wds

    src = pair_tree(tmp_path / "src")
    config = ConvertConfig("wds", PreprocessConfig(size=(16, 16)), text=TextConfig(allow_missing=True))
    result = convert(src, tmp_path / "out", config, workers=1)
    tars = sorted(str(p) for p in result.output.glob("*.tar"))
    samples = list(wds.WebDataset(tars, shardshuffle=False).decode())
    assert len(samples) == 6 and sum("data.json" not in s for s in samples) == 1
    assert verify(result.output) == []


def test_make_loader_batches_json_of_any_type(tmp_path):
    src = tmp_path / "src"
    for i, value in enumerate(([1, 2], 7, "word", None, {"k": 1})):
        (src / f"{i}.txt").parent.mkdir(parents=True, exist_ok=True)
        (src / f"{i}.txt").write_text(f"text {i}")
        if value is not None:
            (src / f"{i}.json").write_text(json.dumps(value))
    config = ConvertConfig("lmdb", text=TextConfig(allow_missing=True))
    ds = open_dataset(convert(src, tmp_path / "out", config, workers=1).output)
    assert ds.manifest.sample_fields == ("text", "json")
    batch = next(iter(make_loader(ds, 5, shuffle=False, num_workers=0)))
    assert batch["texts"] == [f"text {i}" for i in range(5)]
    assert batch["json"] == [[1, 2], 7, "word", None, {"k": 1}] and batch["labels"].tolist() == [-1] * 5


def test_resume_refuses_another_bucketing(text_outputs):
    ds = open_dataset(text_outputs["npy", "tokens"].output)
    loader = make_loader(ds, 2, num_workers=0, bucket_by_length=True)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ValueError, match="bucket_by_length"):
        make_loader(ds, 2, num_workers=0).load_state_dict(state)
    make_loader(ds, 2, num_workers=0, bucket_by_length=True).load_state_dict(state)


def test_sample_texts_convert_as_the_readme_says(tmp_path):
    src = Path(__file__).resolve().parents[1] / "sample_data" / "texts"
    result = convert(src, tmp_path / "texts", ConvertConfig("npy"), workers=1)
    ds = open_dataset(result.output, return_meta=True)
    got = {meta["key"]: text for text, _, meta in read_all(ds)}
    assert len(got) == 24 and result.skipped == [] and ds.classes == ["negative", "positive"]
    assert "\r" not in got["negative/08.txt"] and "\n" in got["negative/08.txt"]
    assert not got["positive/09.txt"].startswith("\ufeff")


def test_a_too_large_text_file_is_skipped_saying_why(tmp_path, monkeypatch):
    import packer.spec.text

    monkeypatch.setattr(packer.spec.text, "MAX_TEXT_BYTES", 16)  # read in this process (workers=1 forks it too)
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "small.txt").write_text("short")
    (src / "a" / "big.txt").write_text("x" * 100)
    result = convert(src, tmp_path / "out", ConvertConfig("npy"), workers=1)
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons == {"a/big.txt": "file too large: 100 bytes, more than a text or json file may have (16)"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_batched_reads_equal_per_sample_reads(text_outputs, fmt, tmp_path):
    if fmt == "wds":
        pytest.skip("tar shards are iterable: no random access by index")
    ds = open_dataset(text_outputs[fmt, "tokens"].output)
    indices = [4, 0, -1, 2, 4]
    batch = ds.__getitems__(indices)
    for got, i in zip(batch, indices, strict=True):
        ids, label = ds[i]
        assert torch.equal(got[0], ids) and got[1] == label
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds)])
