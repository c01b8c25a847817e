"""packer.tokens.tokenizing: the end-of-text and beginning ids found or refused, every document's ids
written with them, a document the tokenizer fails on reported by its place, and a failure that
stops the run never leaves the reading thread waiting."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import corpus_texts, make_bpe_tokenizer

import packer.tokens.tokenizing as tokenizing
from packer.records import Skipped
from packer.sources.corpus import Document
from packer.spec.errors import ConfigError, DecodeError
from packer.tokens.tokenizing import corpus_tokenizer, tokenize


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return make_bpe_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", corpus_texts(30))


def test_end_and_beginning_ids_found_given_or_refused(tokenizer, tmp_path):
    found = corpus_tokenizer(str(tokenizer))
    assert (found.eos, found.bos, found.vocab_size, found.dtype) == (0, None, 300, np.uint16)
    assert corpus_tokenizer(str(tokenizer), bos=True).bos == 1  # <s>
    assert corpus_tokenizer(str(tokenizer), eos=7, bos_id=9).eos == 7
    with pytest.raises(ConfigError, match="not an id of the tokenizer's vocabulary of 300"):
        corpus_tokenizer(str(tokenizer), bos_id=300)
    from tokenizers import Tokenizer, models

    plain = tmp_path / "plain.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(plain))
    with pytest.raises(ConfigError, match="pass --eos ID"):
        corpus_tokenizer(str(plain))
    with pytest.raises(ConfigError, match="pass --bos-id ID"):
        corpus_tokenizer(str(plain), eos=0, bos=True)


def test_every_document_then_its_ids_in_order(tokenizer, tmp_path):
    from tokenizers import Tokenizer

    texts = corpus_texts(12, seed=3)
    docs = iter([Document(t, "c.jsonl", i + 1) for i, t in enumerate(texts)])
    spec = corpus_tokenizer(str(tokenizer), bos=True)
    result = tokenize(docs, spec, tmp_path / "ids", lambda s: None)
    tok = Tokenizer.from_file(str(tokenizer))
    expected = np.concatenate([[1, *tok.encode(t, add_special_tokens=False).ids, 0] for t in texts])
    np.testing.assert_array_equal(result.ids(), expected)
    assert result.lengths.tolist() == [len(tok.encode(t, add_special_tokens=False).ids) + 2 for t in texts]


class _Fails:
    """An encoder whose batch call fails and whose single call fails on one text (tokenizers raises
    plain exceptions on input it cannot take)."""

    def __init__(self, real, bad: str) -> None:
        self.real, self.bad = real, bad

    def encode_batch_fast(self, texts, add_special_tokens=False):
        raise Exception("batch failed")

    def encode(self, text, add_special_tokens=False):
        if text == self.bad:
            raise Exception("cannot take it")
        return self.real.encode(text, add_special_tokens=add_special_tokens)


def test_a_document_the_tokenizer_fails_on_is_reported_by_its_place(tokenizer):
    from tokenizers import Tokenizer

    encoder = _Fails(Tokenizer.from_file(str(tokenizer)), "bad text")
    batch = [Document("good one", "a.jsonl", 1), Document("bad text", "a.jsonl", 2), Document("fine", "a.jsonl", 3)]
    skipped: list[Skipped] = []
    encodings = tokenizing._encode(encoder, batch, skipped.append, strict=False)
    assert len(encodings) == 2 and skipped == [Skipped("a.jsonl:2", "the tokenizer failed on it: cannot take it")]
    with pytest.raises(DecodeError, match="a.jsonl:2"):
        tokenizing._encode(encoder, batch, skipped.append, strict=True)


def test_a_failure_while_encoding_ends_the_run_without_waiting_on_the_reader(tokenizer, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        time.sleep(0.5)  # long enough for the reader to read all and wait with its queue full
        raise DecodeError("x.jsonl:1", "stopped")

    monkeypatch.setattr(tokenizing, "_encode", fail)
    monkeypatch.setattr(tokenizing, "BATCH_CHARACTERS", 1)  # one document a batch: the reader fills its queue
    docs = iter([Document(f"text {i}", "x.jsonl", i + 1) for i in range(3)])  # the reader ends with its queue full
    outcome: list = []

    def run() -> None:
        try:
            tokenize(docs, corpus_tokenizer(str(tokenizer)), tmp_path / "ids", lambda s: None)
        except DecodeError as e:
            outcome.append(str(e))  # not the exception: its traceback would keep the generator alive

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive() and len(outcome) == 1
