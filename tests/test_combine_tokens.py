"""packer combine of token outputs (packer.ops.combine_tokens): the inputs' blocks in order, their
counts added, and inputs whose blocks mean other things refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import corpus_texts, make_bpe_tokenizer

from packer.config import PackConfig, ShardSize
from packer.ops.combine import combine
from packer.ops.pack_tokens import append_corpus, pack_corpus
from packer.output.verify import verify
from packer.spec.errors import InputError
from readers import open_dataset


def _corpus(root: Path, texts: list[str]) -> Path:
    root.mkdir(parents=True)
    (root / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return root


@pytest.mark.parametrize("fmt", ["npy", "lmdb"])
def test_combined_blocks_are_the_inputs_blocks_in_order(tmp_path, fmt):
    texts = corpus_texts(40, longest=80)
    tokenizer = make_bpe_tokenizer(tmp_path / "tokenizer.json", texts)
    config = PackConfig(fmt, 16, str(tokenizer), shard_size=ShardSize(samples=20))
    a = pack_corpus(_corpus(tmp_path / "ca", texts[:25]), tmp_path / "a", config).manifest
    b = pack_corpus(_corpus(tmp_path / "cb", texts[25:]), tmp_path / "b", config).manifest
    result = combine([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")
    m = result.manifest
    assert m.samples == a.samples + b.samples and verify(tmp_path / "ab") == []
    assert m.tokens.documents == 40 and m.tokens.tokens == a.tokens.tokens + b.tokens.tokens
    assert m.tokens.padding == a.tokens.padding + b.tokens.padding and m.history[0]["action"] == "combine"
    ab, da, db = (open_dataset(tmp_path / n) for n in ("ab", "a", "b"))
    expected = [da[i]["input_ids"] for i in range(len(da))] + [db[i]["input_ids"] for i in range(len(db))]
    assert all(torch.equal(ab[i]["input_ids"], e) for i, e in enumerate(expected))
    with pytest.raises(InputError, match="records no corpus files"):  # what it holds of a corpus is unknown
        append_corpus(tmp_path / "ca", tmp_path / "ab", config)


def test_blocks_of_another_tokenizer_size_or_kind_are_refused(tmp_path):
    texts = corpus_texts(30, longest=60)
    one = make_bpe_tokenizer(tmp_path / "one.json", texts)
    other = make_bpe_tokenizer(tmp_path / "other.json", texts, vocab_size=280)
    src = _corpus(tmp_path / "c", texts)
    pack_corpus(src, tmp_path / "a", PackConfig("npy", 16, str(one)))
    pack_corpus(src, tmp_path / "t", PackConfig("npy", 16, str(other)))
    pack_corpus(src, tmp_path / "s", PackConfig("npy", 32, str(one)))
    with pytest.raises(InputError, match="another tokenizer"):
        combine([tmp_path / "a", tmp_path / "t"], tmp_path / "x")
    with pytest.raises(InputError, match="another block"):
        combine([tmp_path / "a", tmp_path / "s"], tmp_path / "x")
    (tmp_path / "img").mkdir()
    from conftest import make_tree

    from packer import ConvertConfig, convert

    make_tree(tmp_path / "img", {"a": 2, "b": 2})
    convert(tmp_path / "img", tmp_path / "i", ConvertConfig(format="npy"))
    with pytest.raises(InputError, match="only one holds token blocks"):
        combine([tmp_path / "a", tmp_path / "i"], tmp_path / "x")
    assert not (tmp_path / "x").exists()
