"""readers.datasets.token_blocks and make_loader over token outputs: the blocks as numpy reads them,
the same batches with 0, 1 and 2 workers and on 2 ranks, resume mid-epoch exact to the token."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import corpus_texts, make_bpe_tokenizer, rank_result, run_ranks

from packer.config import PackConfig, ShardSize
from packer.ops.pack_tokens import pack_corpus
from packer.spec.errors import ManifestError
from readers import TokenBlocks, make_loader, open_dataset


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[str, Path]:
    """A corpus packed with blocks of 24 both ways, in shards of 9 blocks."""
    root = tmp_path_factory.mktemp("tokens")
    texts = corpus_texts(80, longest=60)
    (root / "corpus").mkdir()
    (root / "corpus" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = make_bpe_tokenizer(root / "tokenizer.json", texts)
    out = {}
    for mode in ("concat", "best-fit"):
        out[mode] = root / mode
        config = PackConfig("npy", 24, str(tokenizer), packing=mode, shard_size=ShardSize(samples=9))
        pack_corpus(root / "corpus", out[mode], config)
    return out


def _numpy_block(out: Path, index: int) -> tuple[np.ndarray, np.ndarray]:
    m = json.loads((out / "manifest.json").read_text())
    for shard in m["shards"]:
        if index < shard["samples"]:
            name = shard["name"]
            tokens, spans, docs = (
                np.load(out / f"{name}{s}") for s in (".tokens.npy", ".blocks.npy", ".documents.npy")
            )
            start, length = spans[index]
            inside = docs[(docs >= start) & (docs < start + length)].astype(np.int64) - start
            return tokens[start : start + length].astype(np.int64), inside
        index -= shard["samples"]
    raise IndexError(index)


@pytest.mark.parametrize("mode", ["concat", "best-fit"])
def test_each_block_is_what_numpy_reads_with_position_ids_per_document(packed, mode):
    ds = open_dataset(packed[mode])
    assert isinstance(ds, TokenBlocks) and ds.block_size == 24 and ds.vocab_size == 300
    for i in range(len(ds)):
        sample = ds[i]
        ids, starts = _numpy_block(packed[mode], i)
        n = min(len(ids), 24)
        assert sample["input_ids"].dtype == torch.int64 and sample["input_ids"].shape == (24,)
        np.testing.assert_array_equal(sample["input_ids"][:n], ids[:n])
        np.testing.assert_array_equal(sample["labels"][: len(ids) - 1], ids[1:])
        assert (sample["labels"][len(ids) - 1 :] == -100).all()
        runs = [0, *[s for s in starts.tolist() if 0 < s < n], *([n] if n < 24 else []), 24]
        assert sample["cu_seqlens"].tolist() == runs
        for a, b in zip(runs, runs[1:]):
            assert sample["position_ids"][a:b].tolist() == list(range(b - a))
    x, y = open_dataset(packed[mode], return_dict=False)[0]
    assert torch.equal(x, ds[0]["input_ids"]) and torch.equal(y, ds[0]["labels"])


def test_block_mask_lets_a_position_see_its_own_document_before_it_only(packed):
    ds = open_dataset(packed["best-fit"], block_mask=True)
    sample = ds[0]
    mask = sample["attention_mask"][0]
    pos = sample["position_ids"]
    for q in range(24):
        begin = q - int(pos[q])
        assert mask[q].tolist() == [begin <= k <= q for k in range(24)]


def _epoch(loader) -> list[list[int]]:
    return [batch["input_ids"][:, :4].tolist() for batch in loader]


def test_same_batches_with_0_1_2_workers_and_a_new_order_each_epoch(packed):
    ds = open_dataset(packed["concat"])
    runs = [_epoch(make_loader(ds, 5, num_workers=w, seed=4)) for w in (0, 1, 2)]
    assert runs[0] == runs[1] == runs[2]
    loader = make_loader(ds, 5, seed=4)
    first, second = _epoch(loader), _epoch(loader)
    assert first == runs[0] and first != second
    assert sorted(map(tuple, sum(first, []))) == sorted(map(tuple, sum(second, [])))
    assert len(sum(first, [])) == len(ds)


def _every_part(loader) -> list:
    return [{k: (v.tolist() if torch.is_tensor(v) else v) for k, v in batch.items()} for batch in loader]


def test_workers_send_chunks_of_batches_equal_in_every_part_to_one_process(packed):
    from readers.loading.sampler import BatchChunks

    ds = open_dataset(packed["best-fit"])
    alone, workers = make_loader(ds, 3, seed=5), make_loader(ds, 3, num_workers=2, seed=5)
    chunks = workers.loader.batch_sampler
    assert isinstance(chunks, BatchChunks) and len(alone) % chunks.per_chunk  # several chunks, the last partial
    expected = _every_part(alone)
    assert _every_part(workers) == expected and len(workers) == len(expected) == len(alone)
    assert _every_part(workers) != expected  # the next epoch: another order
    pairs = make_loader(open_dataset(packed["best-fit"], return_dict=False), 3, num_workers=2, seed=5)
    assert [[x.tolist(), y.tolist()] for x, y in pairs] == [[b["input_ids"], b["labels"]] for b in expected]


def _until_saved(loader, stop: int) -> tuple[list, dict]:
    """The first ``stop + 1`` batches' first tokens and the loader's state saved after them."""
    got = []
    for i, batch in enumerate(loader):
        got.append(batch["input_ids"][:, :4].tolist())
        if i == stop:
            return got, loader.state_dict()
    raise AssertionError(f"fewer than {stop + 1} batches")


@pytest.mark.parametrize("workers", [2, 1, 0])
def test_resume_mid_chunk_with_workers_equals_the_uninterrupted_run(packed, workers):
    """Saved with 2 workers inside the first chunk (its other batches read, never handed out), resumed
    on as many workers, or on fewer."""
    ds = open_dataset(packed["concat"])
    expected = _epoch(make_loader(ds, 2, seed=3, num_workers=2))
    got, state = _until_saved(make_loader(ds, 2, seed=3, num_workers=2), 2)
    resumed = make_loader(open_dataset(packed["concat"]), 2, seed=3, num_workers=workers)
    resumed.load_state_dict(state)
    got += _epoch(resumed)
    assert got == expected


def test_a_small_shared_memory_takes_smaller_chunks_before_none(packed, monkeypatch):
    """A container's small /dev/shm holds a batch's ring but not a whole chunk's: the chunks shrink
    until the ring fits, rather than every batch going through fresh shared memory."""
    from readers.loading import token_loader
    from readers.loading.batch_buffers import SlotRing

    ds = open_dataset(packed["concat"])
    per_worker, block = 4, ds.block_size  # prefetch 2 + 2, as the loader sizes its ring
    one_batch = SlotRing.bytes_needed(2, per_worker, (3 * 2, 1, 1, block), torch.int64)
    monkeypatch.setattr(token_loader, "shared_memory_free", lambda: 5 * one_batch)  # a ring of 2 batches fits, of 4 not
    loader = make_loader(ds, 2, seed=3, num_workers=2)
    assert loader.ring is not None and loader.loader.batch_sampler.per_chunk == 2
    assert _epoch(loader) == _epoch(make_loader(ds, 2, seed=3))


def test_resume_mid_epoch_equals_the_uninterrupted_run(packed):
    ds = open_dataset(packed["best-fit"])
    whole = make_loader(ds, 4, seed=2)
    _epoch(whole)
    expected = _epoch(whole)  # epoch 1
    loader = make_loader(ds, 4, seed=2)
    _epoch(loader)
    got, state = _until_saved(loader, 2)
    resumed = make_loader(open_dataset(packed["best-fit"]), 4, seed=2)
    resumed.load_state_dict(state)
    got += _epoch(resumed)
    assert got == expected


def _rank_blocks(rank, world, port, payload, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    loader = make_loader(open_dataset(payload), 3, seed=1)
    seen = [b["input_ids"].tolist() for b in loader]
    rank_result(out, rank, seen)
    dist.destroy_process_group()


def test_two_ranks_get_equal_disjoint_shares_of_every_block(packed, tmp_path):
    ranks = run_ranks(_rank_blocks, str(packed["concat"]), tmp_path)
    assert len(ranks[0]) == len(ranks[1])
    rows = [tuple(r) for rank in ranks for batch in rank for r in batch]
    ds = open_dataset(packed["concat"])
    every = {tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds))}
    assert set(rows) == every  # every block read, on one rank or the other (the last batch evened out)


def test_refusals(packed, tmp_path):
    with pytest.raises(ValueError, match="vocabulary of 300"):
        open_dataset(packed["concat"], vocab_size=50257)
    with pytest.raises(ValueError, match="pass cache_dir="):
        TokenBlocks("s3://bucket/tokens")
    with pytest.raises(ValueError, match="no images"):
        make_loader(open_dataset(packed["concat"]), 4, bucket_by_length=True)
    damaged = tmp_path / "damaged"
    import shutil

    shutil.copytree(packed["concat"], damaged)
    tokens = sorted(damaged.glob("*.tokens.npy"))[0]
    tokens.write_bytes(tokens.read_bytes()[:-10])
    with pytest.raises(ManifestError, match="the manifest says"):
        open_dataset(damaged)[0]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_lmdb_and_hdf5_read_the_blocks_npy_does_in_workers_too(packed, fmt, tmp_path):
    corpus, tokenizer = packed["concat"].parent / "corpus", packed["concat"].parent / "tokenizer.json"
    out = tmp_path / fmt
    pack_corpus(corpus, out, PackConfig(fmt, 24, str(tokenizer), shard_size=ShardSize(samples=9)))
    ds, npy = open_dataset(out), open_dataset(packed["concat"])
    for i in range(len(npy)):
        assert all(torch.equal(ds[i][k], npy[i][k]) for k in ("input_ids", "labels", "position_ids", "cu_seqlens"))
    twice = open_dataset(out)  # a second reader of the same files in this process
    assert torch.equal(twice[3]["input_ids"], ds[3]["input_ids"])
    assert _epoch(make_loader(ds, 5, num_workers=2, seed=4)) == _epoch(make_loader(npy, 5, seed=4))


def test_a_mixture_of_token_outputs_weighs_its_parts_by_tokens(packed):
    from readers import open_mixture

    mix = open_mixture({"c": (packed["concat"], 3), "b": (packed["best-fit"], 1)}, epoch_size=40, seed=5)
    shares = mix.token_shares()
    assert abs(shares["c"] - 0.75) < 0.03 and abs(shares["b"] - 0.25) < 0.03
    parts = {"c": open_dataset(packed["concat"]), "b": open_dataset(packed["best-fit"])}
    batches = [_epoch(make_loader(mix, 6, num_workers=w)) for w in (0, 2)]
    assert batches[0] == batches[1]
    batch = next(iter(make_loader(mix, 40, shuffle=False)))
    for i in range(40):
        k, j = mix.draw(i, 0)
        assert torch.equal(batch["input_ids"][i], parts[mix.names[k]][j]["input_ids"])
    loader = make_loader(mix, 6)
    whole = _epoch(loader)
    again = make_loader(mix, 6)
    got = []
    for i, b in enumerate(again):
        got.append(b["input_ids"][:, :4].tolist())
        if i == 1:
            state = again.state_dict()
            break
    resumed = make_loader(mix, 6)
    resumed.load_state_dict(state)
    assert got + _epoch(resumed) == whole


def test_token_blocks_do_not_mix_with_samples(packed, image_tree, tmp_path):
    from conftest import write_image

    from packer import ConvertConfig, convert
    from readers import open_mixture

    flat = tmp_path / "flat"
    for i in range(3):
        write_image(flat / f"{i}.png", seed=i)
    for name, source in (("labelled", image_tree), ("unlabelled", flat)):
        convert(source, tmp_path / name, ConvertConfig(format="npy"))
        with pytest.raises(ValueError, match="holds token blocks and part 'i' samples"):
            open_mixture({"t": (packed["concat"], 1), "i": (tmp_path / name, 1)})
    with pytest.raises(
        TypeError, match="take return_dict, block_mask, vocab_size, seed, verify, cache_dir, not normalize"
    ):
        open_dataset(packed["concat"], normalize=False)


def test_shards_beyond_the_open_limit_are_closed_and_opened_again(packed, tmp_path, monkeypatch):
    import readers.datasets.token_blocks as token_blocks

    monkeypatch.setattr(token_blocks, "MAX_OPEN_SHARDS", 2)
    corpus, tokenizer = packed["concat"].parent / "corpus", packed["concat"].parent / "tokenizer.json"
    for fmt in ("npy", "lmdb", "hdf5"):
        out = tmp_path / fmt
        pack_corpus(corpus, out, PackConfig(fmt, 24, str(tokenizer), shard_size=ShardSize(samples=3)))
        ds, npy = open_dataset(out), open_dataset(packed["concat"])
        order = np.random.default_rng(0).permutation(len(ds)).tolist()
        for i in order + order:
            assert torch.equal(ds.__getitems__([i])["input_ids"][0], npy[i]["input_ids"])
            assert len(ds.handles.open) <= 3  # the limit, plus the shard of the batch being read
        if fmt == "lmdb":  # the same files by another spelling of their path, in this process
            other = open_dataset(Path(os.path.relpath(out)))
            assert torch.equal(other[0]["input_ids"], ds[0]["input_ids"])


def test_a_hugging_face_causal_lm_takes_the_blocks_as_already_shifted_labels(packed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    ).eval()
    ds = open_dataset(packed["best-fit"])
    batch = next(iter(make_loader(ds, len(ds), seed=1)))  # every block: best-fit pads some
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            labels=batch["labels"],
            shift_labels=batch["labels"],
        )
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
    assert (batch["labels"] == -100).any()  # best-fit padding is ignored
    assert torch.allclose(out.loss, expected)
