"""readers.datasets.token_stream: a wds token output streamed from a URL gives the blocks TokenBlocks
reads from the same output on disk; make_loader shares its shards out over workers and ranks, gives
every block once an epoch, resumes mid-epoch exactly, and refuses a damaged shard by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import corpus_texts, make_bpe_tokenizer, rank_result, run_ranks, served_folder

from packer.config import PackConfig, ShardSize
from packer.ops.pack_tokens import pack_corpus
from packer.spec.errors import ManifestError
from readers import TokenBlocks, TokenStream, make_loader, open_dataset, open_mixture


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A corpus packed best-fit into wds shards of 7 blocks of 24 (``local``), and the same output
    served over HTTP on 127.0.0.1 (``url``), beside an npy one (``base``/npy); ``requests`` lists
    the paths asked for."""
    root = tmp_path_factory.mktemp("tokens")
    texts = corpus_texts(90, longest=60)
    (root / "corpus").mkdir()
    (root / "corpus" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = make_bpe_tokenizer(root / "tokenizer.json", texts)
    config = PackConfig("wds", 24, str(tokenizer), packing="best-fit", shard_size=ShardSize(samples=7))
    pack_corpus(root / "corpus", root / "site" / "wds", config)
    pack_corpus(root / "corpus", root / "site" / "npy", PackConfig("npy", 24, str(tokenizer), packing="best-fit"))
    site = root / "site"
    with served_folder(site) as (url, requests):
        yield {"local": site / "wds", "url": f"{url}/wds", "site": site, "base": url, "requests": requests}


def _rows(batches) -> list[tuple]:
    return [tuple(row) for batch in batches for row in batch["input_ids"].tolist()]


def test_the_stream_gives_the_blocks_token_blocks_reads_in_stored_order(served):
    stream = open_dataset(served["url"])
    local = open_dataset(served["local"])
    assert isinstance(stream, TokenStream) and isinstance(local, TokenBlocks)
    assert len(stream) == len(local) > 14 and stream.vocab_size == local.vocab_size == 300
    blocks = list(stream)
    assert len(blocks) == len(local)
    for i, block in enumerate(blocks):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(block[key], local[i][key]), (i, key)
    x, y = next(iter(open_dataset(served["url"], return_dict=False)))
    assert torch.equal(x, local[0]["input_ids"]) and torch.equal(y, local[0]["labels"])
    # a cache_dir asks for random access: the shards downloaded into it, a TokenBlocks
    assert isinstance(open_dataset(served["url"], cache_dir=served["site"] / "cache"), TokenBlocks)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_block_once_an_epoch_in_a_new_order_each(served, workers):
    local = open_dataset(served["local"])
    stored = [tuple(local[i]["input_ids"].tolist()) for i in range(len(local))]
    loader = make_loader(open_dataset(served["url"], seed=5), 4, num_workers=workers)
    first, second = list(loader), list(loader)
    assert len(first) == len(second) == len(loader) >= -(-len(local) // 4)  # a partial batch a worker
    assert sorted(_rows(first)) == sorted(_rows(second)) == sorted(stored)
    assert _rows(first) != _rows(second)
    # in order without a shuffle, with no worker: the stored order, in batches
    plain = list(make_loader(open_dataset(served["url"]), 4, shuffle=False, num_workers=0))
    assert _rows(plain) == stored
    assert all(torch.is_tensor(b["cu_seqlens"]) and b["position_ids"].shape == b["input_ids"].shape for b in plain)


def test_resume_mid_epoch_equals_the_uninterrupted_run(served):
    whole = make_loader(open_dataset(served["url"], seed=2), 3, num_workers=2)
    list(whole)
    expected = _rows(whole)  # epoch 1
    loader = make_loader(open_dataset(served["url"], seed=2), 3, num_workers=2)
    list(loader)
    got = []
    for i, batch in enumerate(loader):
        got += _rows([batch])
        if i == 2:
            state = loader.state_dict()
            break
    resumed = make_loader(open_dataset(served["url"], seed=2), 3, num_workers=2)
    resumed.load_state_dict(state)
    got += _rows(resumed)
    assert got == expected
    for other in ({"num_workers": 1}, {"num_workers": 2, "shuffle": False}, {"num_workers": 2, "seed": 3}):
        with pytest.raises(ValueError):  # each worker reads other shards, or in another order
            make_loader(open_dataset(served["url"], seed=2), 3, **other).load_state_dict(state)


def test_a_resumed_loader_streams_only_the_shards_it_makes_batches_of(served):
    loader = make_loader(open_dataset(served["url"], seed=2), 3, num_workers=0)
    batches = len(loader)
    for i, _ in enumerate(loader):
        if i == batches - 3:
            state = loader.state_dict()
            break
    served["requests"].clear()
    resumed = make_loader(open_dataset(served["url"], seed=2), 3, num_workers=0)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 2
    tars = [r for r in served["requests"] if r.endswith(".tar")]
    shards = len(json.loads((served["local"] / "manifest.json").read_text())["shards"])
    assert 0 < len(tars) < shards  # the batches drawn before the state were not streamed again


def test_make_loader_leaves_the_reader_as_it_was_and_states_do_not_cross_readers(served):
    stream = open_dataset(served["url"], seed=2)
    blocks = len(stream)
    first, second = make_loader(stream, 4, num_workers=0), make_loader(stream, 2, num_workers=0)
    assert len(stream) == blocks and len(list(first)) == -(-blocks // 4) and len(list(second)) == -(-blocks // 2)
    state = first.state_dict()
    cached = open_dataset(served["url"], seed=2, cache_dir=served["site"] / "cache-states")
    with pytest.raises(ValueError):  # the same output read at random: another order
        make_loader(cached, 4).load_state_dict(state)
    with pytest.raises(ValueError):
        make_loader(open_dataset(served["url"], seed=2), 4, num_workers=0).load_state_dict(
            make_loader(cached, 4).state_dict()
        )
    with pytest.raises(ValueError, match="cache_dir="):
        open_mixture({"a": (stream, 1.0)})


def _rank_rows(rank, world, port, payload, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    loader = make_loader(open_dataset(payload, seed=1), 3)
    rank_result(out, rank, [b["input_ids"].tolist() for b in loader])
    dist.destroy_process_group()


def test_two_ranks_get_equal_batch_counts_of_their_own_shards(served, tmp_path):
    ranks = run_ranks(_rank_rows, served["url"], tmp_path)
    assert len(ranks[0]) == len(ranks[1]) > 0
    rows = [[tuple(r) for batch in rank for r in batch] for rank in ranks]
    local = open_dataset(served["local"])
    assert set(rows[0]) | set(rows[1]) == {tuple(local[i]["input_ids"].tolist()) for i in range(len(local))}


def test_a_damaged_shard_is_refused_by_name_before_a_block_of_it_is_used(served):
    copy = served["site"] / "damaged"
    shutil.copytree(served["local"], copy)
    tar = sorted(copy.glob("*.tar"))[1]
    data = bytearray(tar.read_bytes())
    data[-2000] ^= 0xFF  # a token id of the stream: the tar still reads, its SHA-256 differs
    tar.write_bytes(bytes(data))
    stream = open_dataset(f"{served['base']}/damaged")
    with pytest.raises(ManifestError, match=tar.name):
        list(stream)
    with pytest.raises(ValueError, match="only tar shards"):
        TokenStream(f"{served['base']}/npy")
    with pytest.raises(ValueError, match="pass cache_dir="):
        open_dataset(f"{served['base']}/npy")  # npy blocks are read at random: through a cache
