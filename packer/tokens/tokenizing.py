"""A corpus tokenized once: every document's ids, with its end-of-text (and beginning) token, in one
flat file in the staging folder, and each document's length.

The Hugging Face ``tokenizers`` library encodes a batch of documents on all usable cores (its Rust
threads, without the GIL), so this runs in one process with three threads overlapping: one reads
and parses the next batch of documents, one encodes, one turns the previous batch's ids into the
stored dtype and writes them. A batch the tokenizer fails on is encoded one document at a time, and
the document that fails is reported by its path and line.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from packer.records import Skipped
from packer.sources.corpus import BATCH_CHARACTERS, Document
from packer.spec.errors import ConfigError, DecodeError
from packer.spec.text import read_tokenizer
from packer.spec.token_blocks import token_dtype

EOS_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>")
"""End-of-text tokens looked for in a tokenizer's vocabulary, in this order, when ``--eos`` is not given."""
BOS_TOKENS = ("<|begin_of_text|>", "<|startoftext|>", "<s>", "<bos>", "<|bos|>", "[BOS]")
"""Beginning-of-text tokens looked for with ``--bos``."""


@dataclass(frozen=True)
class CorpusTokenizer:
    """The tokenizer a corpus is encoded with: its file, the ids added after (``eos``) and before
    (``bos``, None: nothing) each document, its vocabulary size and the stored dtype of its ids."""

    path: str
    eos: int
    bos: Optional[int]
    vocab_size: int

    @property
    def dtype(self) -> np.dtype:
        """The stored dtype of the ids: uint16 when the vocabulary fits, else uint32."""
        return token_dtype(self.vocab_size)

    def load(self):
        """The ``tokenizers.Tokenizer``, with no padding and no truncation (nothing is cut)."""
        tokenizer = read_tokenizer(self.path)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return tokenizer


def corpus_tokenizer(
    path: str, eos: Optional[int] = None, bos: bool = False, bos_id: Optional[int] = None
) -> CorpusTokenizer:
    """The ``CorpusTokenizer`` of ``tokenizer.json`` at ``path``: ``eos`` given, or the vocabulary's
    end-of-text token (``EOS_TOKENS``); with ``bos`` (or ``bos_id``) a beginning token too. ConfigError
    when the file does not load or a token cannot be found, saying which option to pass."""
    tokenizer = read_tokenizer(path)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    token_dtype(vocab)  # a vocabulary beyond uint32 is refused here
    if eos is None:
        eos = _find(tokenizer, EOS_TOKENS)
        if eos is None:
            raise ConfigError(
                f"the tokenizer {path} has none of the end-of-text tokens {', '.join(EOS_TOKENS)}: pass --eos ID"
            )
    if bos_id is None and bos:
        bos_id = _find(tokenizer, BOS_TOKENS)
        if bos_id is None:
            raise ConfigError(
                f"--bos: the tokenizer {path} has none of the beginning tokens {', '.join(BOS_TOKENS)}: "
                "pass --bos-id ID"
            )
    for name, value in (("--eos", eos), ("--bos-id", bos_id)):
        if value is not None and not 0 <= value < vocab:
            raise ConfigError(f"{name} {value} is not an id of the tokenizer's vocabulary of {vocab}")
    return CorpusTokenizer(str(path), int(eos), None if bos_id is None else int(bos_id), int(vocab))


def _find(tokenizer, names: tuple[str, ...]) -> Optional[int]:
    for name in names:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    return None


@dataclass
class Tokenized:
    """A tokenized corpus: its ids in ``path`` (raw ``dtype`` values, documents back to back) and each
    document's ``lengths`` (its ids with the added ones)."""

    path: Path
    dtype: np.dtype
    lengths: np.ndarray

    @property
    def tokens(self) -> int:
        """Every id stored, the added ones included."""
        return int(self.lengths.sum())

    def ids(self) -> np.ndarray:
        """The ids, memory-mapped (an empty array for an empty corpus)."""
        if not self.tokens:
            return np.zeros(0, self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.tokens,))


def lengths_path(out: Path) -> Path:
    """Where ``tokenize`` keeps the lengths of the documents it wrote to ``out`` (int64, appended)."""
    return Path(out).with_name(Path(out).name + ".lengths")


def tokenize(
    documents: Iterator[Document],
    tokenizer: CorpusTokenizer,
    out: Path,
    skipped: Callable[[Skipped], None],
    strict: bool = False,
    progress: Optional[Callable[[int], None]] = None,
    *,
    start: tuple[int, int] = (0, 0),
    written: Optional[Callable[[Document, int, int], None]] = None,
) -> Tokenized:
    """Encode every document of ``documents`` into ``out`` (see the module), each document's length
    into ``lengths_path(out)``. A document the tokenizer fails on is given to ``skipped``
    (``strict``: raised as a DecodeError); ``progress`` gets the count of each batch's documents as
    it is written.

    ``start``: ``(documents, ids)`` an interrupted run wrote (``--resume``): the files are cut there
    and written on (``documents`` holds the documents after those). ``written(last, documents,
    ids)`` is called once each batch is in the files (flushed): its last document, and the totals."""
    encoder = tokenizer.load()
    done, ids = start
    resuming = done or ids
    lengths = lengths_path(out)
    batches = _prefetched(_batches(documents))
    with open(out, "r+b" if resuming else "wb") as f, open(lengths, "r+b" if resuming else "wb") as lf:
        if resuming:  # what a killed run wrote after its last record goes
            f.truncate(ids * tokenizer.dtype.itemsize)
            lf.truncate(done * LENGTH_DTYPE.itemsize)
            f.seek(0, 2)
            lf.seek(0, 2)
            if progress is not None and done:
                progress(done)
        with ThreadPoolExecutor(1) as writer:
            pending = None
            for batch in batches:
                encodings = _encode(encoder, batch, skipped, strict)
                if pending is not None:
                    done, ids = _settled(pending, f, lf, done, ids, written)
                pending = (writer.submit(_write, f, lf, encodings, tokenizer, progress, len(batch)), batch[-1])
            if pending is not None:
                done, ids = _settled(pending, f, lf, done, ids, written)
    found = np.fromfile(lengths, dtype=LENGTH_DTYPE) if done else np.zeros(0, LENGTH_DTYPE)
    return Tokenized(Path(out), tokenizer.dtype, found)


LENGTH_DTYPE = np.dtype("<i8")
"""The stored dtype of the documents' lengths."""


def _settled(pending: tuple, f, lf, done: int, ids: int, written: Optional[Callable]) -> tuple[int, int]:
    """The totals once the batch ``pending`` (its write, its last document) is written; ``written``
    told, the files flushed first (the writer is idle: the next batch is not submitted yet)."""
    future, last = pending
    sizes = future.result()
    done, ids = done + len(sizes), ids + int(sizes.sum())
    if written is not None:
        f.flush()
        lf.flush()
        written(last, done, ids)
    return done, ids


def _batches(documents: Iterator[Document]) -> Iterator[list[Document]]:
    """``documents`` in batches of about ``BATCH_CHARACTERS`` characters."""
    batch: list[Document] = []
    size = 0
    for doc in documents:
        batch.append(doc)
        size += len(doc.text)
        if size >= BATCH_CHARACTERS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


_DONE = object()


def _prefetched(batches: Iterator[list[Document]]) -> Iterator[list[Document]]:
    """``batches``, read by a thread of their own one or two ahead (files are read and JSON parsed
    while the tokenizer encodes); its exceptions are raised here, in order."""
    ready: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def put(item: object) -> bool:
        """Hand ``item`` over unless the consumer has stopped (then it never takes another: a blocking
        put would hang this thread, and the consumer's join with it)."""
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            put(e)

    thread = threading.Thread(target=produce, name="packer-corpus-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _encode(encoder, batch: list[Document], skipped: Callable[[Skipped], None], strict: bool) -> list:
    """The encodings of a batch's documents (those the tokenizer encoded: one it fails on is skipped)."""
    texts = [d.text for d in batch]
    try:
        # encode_batch_fast (tokenizers 0.20, the oldest packer allows) leaves out the offsets.
        return encoder.encode_batch_fast(texts, add_special_tokens=False)
    except Exception:  # noqa: BLE001 - tokenizers raises plain exceptions: find the document it failed on
        pass
    encodings = []
    for doc in batch:
        try:
            encodings.append(encoder.encode(doc.text, add_special_tokens=False))
        except Exception as e:  # noqa: BLE001 - tokenizers raises plain exceptions
            if strict:
                raise DecodeError(doc.where, f"the tokenizer failed on it: {e}") from None
            skipped(Skipped(doc.where, f"the tokenizer failed on it: {e}"))
    return encodings


def _write(
    f, lf, encodings: list, tokenizer: CorpusTokenizer, progress: Optional[Callable[[int], None]], count: int
) -> np.ndarray:
    """Write a batch's ids, each document's with its added ids, to ``f``, and their lengths to ``lf``;
    returns the lengths."""
    # An array per document, then one concatenation: less of this thread's time (which the tokenizer's
    # threads share the cores with) than one Python iterator over every id of the batch.
    parts = [np.array(e.ids, tokenizer.dtype) for e in encodings]
    sizes = np.fromiter(map(len, parts), np.int64, count=len(parts))
    flat = np.concatenate(parts) if parts else np.zeros(0, tokenizer.dtype)
    ends = np.cumsum(sizes)
    # The added ids go in with one vectorized insert: before each document (bos), after it (eos).
    where = ends if tokenizer.bos is None else np.stack([ends - sizes, ends], axis=1).ravel()
    values = tokenizer.eos if tokenizer.bos is None else np.tile([tokenizer.bos, tokenizer.eos], len(parts))
    f.write(np.insert(flat, where, values).data)
    lengths = (sizes + (1 if tokenizer.bos is None else 2)).astype(LENGTH_DTYPE)
    lf.write(lengths.data)
    if progress is not None:
        progress(count)
    return lengths


__all__ = ["EOS_TOKENS", "BOS_TOKENS", "CorpusTokenizer", "corpus_tokenizer", "Tokenized", "tokenize", "lengths_path"]
