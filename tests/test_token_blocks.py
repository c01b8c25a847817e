"""packer.spec.token_blocks: what a reader makes of a block (labels, position ids, cu_seqlens), and
the manifest's tokens section checked as it is read."""

from __future__ import annotations

import numpy as np
import pytest

from packer.spec.errors import ConfigError, ManifestError
from packer.spec.token_blocks import IGNORE_INDEX, TokenSection, read_blocks, split_blocks, token_dtype


def test_a_full_block_with_two_documents():
    tokens = np.array([10, 11, 0, 20, 21, 22], np.uint16)  # doc A (10 11 eos), doc B from position 3
    b = read_blocks([tokens], [np.array([0, 3])], 5, pad_id=0)
    np.testing.assert_array_equal(b.input_ids[0], [10, 11, 0, 20, 21])
    np.testing.assert_array_equal(b.labels[0], [11, 0, 20, 21, 22])
    np.testing.assert_array_equal(b.position_ids[0], [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(b.cu_seqlens, [0, 3, 5])
    assert b.max_seqlen == 3 and b.input_ids.dtype == np.int64


def test_a_short_block_is_padded_and_its_padding_ignored():
    tokens = np.array([5, 6, 7], np.uint16)  # a document continued from the block before
    b = read_blocks([tokens], [np.array([], np.int64)], 6, pad_id=9)
    np.testing.assert_array_equal(b.input_ids[0], [5, 6, 7, 9, 9, 9])
    np.testing.assert_array_equal(b.labels[0], [6, 7, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX])
    np.testing.assert_array_equal(b.position_ids[0], [0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(b.cu_seqlens, [0, 3, 6])


def test_a_batch_flattens_cu_seqlens_and_ignores_a_start_at_the_target_only_position():
    full = np.arange(1, 6, dtype=np.uint16)  # 5 ids for block 4: the last is a target only
    b = read_blocks([full, full], [np.array([0, 2, 4]), np.array([1])], 4, pad_id=0)
    np.testing.assert_array_equal(b.cu_seqlens, [0, 2, 4, 5, 8])
    np.testing.assert_array_equal(b.position_ids, [[0, 1, 0, 1], [0, 0, 1, 2]])
    np.testing.assert_array_equal(b.labels, [[2, 3, 4, 5], [2, 3, 4, 5]])


def test_a_chunk_split_into_batches_gives_each_what_reading_it_alone_gives():
    rng = np.random.default_rng(3)
    pieces = [rng.integers(1, 50, int(n)) for n in (6, 3, 6, 2, 6, 5, 6)]  # full and short blocks (padded)
    starts = [np.array(sorted({0, *rng.integers(0, len(p), 2).tolist()})) for p in pieces]
    whole = read_blocks(pieces, starts, 5, pad_id=0)
    first = 0
    for size, part in zip((3, 3, 1), split_blocks(whole, (3, 3, 1))):
        alone = read_blocks(pieces[first : first + size], starts[first : first + size], 5, pad_id=0)
        for name in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(getattr(part, name), getattr(alone, name), err_msg=name)
        assert part.cu_seqlens.dtype == alone.cu_seqlens.dtype and part.max_seqlen == alone.max_seqlen
        first += size


def test_token_dtype_by_vocabulary():
    assert token_dtype(50257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(128256) == np.uint32
    with pytest.raises(ConfigError, match="does not fit uint32"):
        token_dtype(2**32 + 1)


def _section(**change) -> dict:
    d = TokenSection(8, "uint16", "concat", 0, None, 0, 300, {"file": "t.json"}).to_dict()
    d.update(change)
    return d


def test_section_round_trips_and_damage_is_refused():
    assert TokenSection.from_dict(_section(), "m").to_dict() == _section()
    for bad in (
        {"block": 0},
        {"packing": "zip"},
        {"dtype": "int8"},
        {"vocab_size": 70000},
        {"tokens": -1},
        {"eos": "0"},
    ):
        with pytest.raises(ManifestError, match="tokens section"):
            TokenSection.from_dict(_section(**bad), "m")
    with pytest.raises(ManifestError, match="not one this packer reads"):
        TokenSection.from_dict({**_section(), "future": 1}, "m")
