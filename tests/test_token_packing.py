"""packer.tokens.packing: concat cuts one stream into overlapping blocks without losing a token;
best-fit keeps documents whole unless longer than a block."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.tokens.packing import best_fit_plan, concat_plan, document_order, split_document


def _docs(lengths: list[int]) -> list[np.ndarray]:
    """Documents whose ids say where they are: document d's ids are d * 1000 + position."""
    return [np.arange(n, dtype=np.int64) + 1000 * d for d, n in enumerate(lengths)]


def _shard_streams(plan, docs) -> list[np.ndarray]:
    return [
        np.concatenate([docs[d][s : s + n] for d, s, n in shard.pieces.tolist()]) if len(shard.pieces) else np.zeros(0)
        for shard in plan.shards
    ]


def _blocks(plan, docs) -> list[np.ndarray]:
    out = []
    for shard, stream in zip(plan.shards, _shard_streams(plan, docs)):
        out += [stream[s : s + n] for s, n in shard.spans.tolist()]
    return out


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    block=st.integers(1, 12),
    per_shard=st.integers(1, 5),
    seed=st.one_of(st.none(), st.integers(0, 3)),
)
def test_concat_blocks_are_the_stream_cut_with_one_token_overlap(lengths, block, per_shard, seed):
    docs = _docs(lengths)
    order = document_order(len(docs), seed)
    stream = np.concatenate([docs[d] for d in order])
    plan = concat_plan(np.array(lengths), order, block, per_shard)
    blocks = _blocks(plan, docs)
    expected = [stream[i * block : i * block + block + 1] for i in range(max(1, -(-(len(stream) - 1) // block)))]
    assert len(blocks) == len(expected) == plan.blocks
    for got, want in zip(blocks, expected):
        np.testing.assert_array_equal(got, want)
    # every token is in a block; every token but the first is some block's target
    assert plan.padding == plan.blocks * (block + 1) - sum(len(b) for b in blocks)
    assert all(s.blocks <= per_shard for s in plan.shards)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30), block=st.integers(1, 12))
def test_best_fit_keeps_documents_whole_unless_longer_than_a_block(lengths, block):
    docs = _docs(lengths)
    plan = best_fit_plan(np.array(lengths), document_order(len(docs), None), block, 4)
    seen: dict[int, list[tuple[int, int]]] = {}
    for shard in plan.shards:
        block_starts, at = set(shard.spans[:, 0].tolist()), 0
        for d, s, n in shard.pieces.tolist():
            seen.setdefault(d, []).append((s, n))
            # a document's remainder opens its block: no position before it in the block learns to
            # predict an id from the middle of a document
            assert s == 0 or at in block_starts
            at += n
        for s, n in shard.spans.tolist():
            assert n <= block + 1 and s + n <= shard.tokens
    for d, n in enumerate(lengths):
        pieces = sorted(seen[d])
        if n <= block + 1:
            assert pieces == [(0, n)]  # whole, in one block
        else:
            assert pieces == list(split_document(n, block))
            covered = set()
            for s, m in pieces:
                covered |= set(range(s, s + m))
            assert covered == set(range(n))  # no token lost
    blocks = _blocks(plan, docs)
    assert plan.padding == plan.blocks * (block + 1) - sum(len(b) for b in blocks)
    assert plan.stored == sum(len(b) for b in blocks)


def test_best_fit_fills_blocks_better_than_one_document_each():
    lengths = np.array([9, 2, 7, 4, 1, 5, 3, 6])
    plan = best_fit_plan(lengths, document_order(len(lengths), None), 9, 100)
    assert plan.blocks == 4  # 37 tokens in blocks of 10: 4 is the least
    assert plan.padding == 4 * 10 - 37


def test_split_document_overlaps_by_one_and_drops_no_target():
    assert list(split_document(5, 4)) == [(0, 5)]
    assert list(split_document(9, 4)) == [(0, 5), (4, 5)]
    assert list(split_document(10, 4)) == [(0, 5), (4, 5), (8, 2)]


def test_document_order_is_seeded():
    np.testing.assert_array_equal(document_order(5, None), np.arange(5))
    a, b = document_order(50, 1), document_order(50, 1)
    np.testing.assert_array_equal(a, b)
    assert sorted(a.tolist()) == list(range(50)) and not np.array_equal(a, document_order(50, 2))


@pytest.mark.parametrize("plan", [concat_plan, best_fit_plan])
def test_one_token_corpus(plan):
    result = plan(np.array([1]), np.array([0]), 4, 10)
    assert result.blocks == 1 and result.stored == 1
