"""Map-style outputs read from a bucket by byte ranges (readers.remote.ranges, npy_ranges, block_cache,
sample_checks), against an S3-compatible server on 127.0.0.1 through s3fs and botocore: the same
samples and batches as the local output, a batch's requests joined and made at once, a bounded block
cache shared by later readers, and a changed or removed object refused, never mixed in."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from conftest import make_tree
from helpers import answer_range

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.spec.errors import ConfigError, ManifestError
from packer.spec.manifest import read_manifest
from packer.spec.sample_layout import ImageCodec
from readers import make_loader, open_dataset
from readers.remote import range_requests, ranges
from readers.remote.block_cache import BlockCache
from readers.remote.block_memory import MEMORY_LIMIT, BlockMemory
from readers.remote.ranges import Requests


@pytest.fixture(scope="module")
def outputs(s3_server, tmp_path_factory):
    """npy and hdf5 outputs, raw and jpeg, of 30 images of 32x24 in shards of 12, with a text field,
    in ``s3://data/ranges/NAME`` and in a local folder: ``(fs, {NAME: local folder})``."""
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 16, "bee": 14}, size=(40, 30))
    for image in sorted(src.rglob("*.png")):
        image.with_suffix(".txt").write_text(f"caption of {image.stem} " * (len(image.stem) % 4 + 1))
    root = tmp_path_factory.mktemp("ranges")
    made = {}
    for fmt in ("npy", "hdf5"):
        for codec in ("raw", "jpeg"):
            name = f"{fmt}-{codec}"
            config = ConvertConfig(fmt, PreprocessConfig(size=(32, 24)), ShardSize(samples=12), codec=ImageCodec(codec))
            convert(src, root / name, config, workers=2)
            s3_server.put(f"{root / name}/", f"data/ranges/{name}/", recursive=True)
            made[name] = root / name
    return s3_server, made


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 2 KiB (an image of 32x24 is 2,304 bytes), and an empty memory: every sample spans
    block boundaries and every read goes to the server or the disk cache."""
    monkeypatch.setattr(ranges, "BLOCK", 2048)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))


def _sample(item) -> tuple:
    image, *rest = item
    return (image.numpy().tobytes(), *rest)


def _batch(batch) -> tuple:
    """A loader's batch as comparable values (tensors as their bytes)."""
    return tuple(v.numpy().tobytes() if hasattr(v, "numpy") else repr(v) for v in batch)


@pytest.mark.parametrize("name", ["npy-raw", "npy-jpeg", "hdf5-raw", "hdf5-jpeg"])
def test_samples_read_by_ranges_are_the_local_ones(outputs, small_blocks, tmp_path, name):
    fs, local = outputs
    remote = open_dataset(f"s3://data/ranges/{name}", return_meta=True)
    near = open_dataset(local[name], return_meta=True)
    assert remote.files.ranged and len(remote) == len(near) == 30
    order = [17, 0, 29, 5, 12, 11, 23]
    assert [_sample(remote[i]) for i in order] == [_sample(near[i]) for i in order]
    batches = [
        [_batch(b) for b in make_loader(open_dataset(d), 8, num_workers=2, seed=4)]
        for d in (f"s3://data/ranges/{name}", local[name])
    ]
    assert batches[0] == batches[1]


def test_opening_shards_reads_their_small_files_in_one_round_without_asking_their_sizes(
    outputs, small_blocks, monkeypatch
):
    fs, local = outputs
    rounds: list[list[str]] = []
    sized: list[str] = []
    answers, bounded = range_requests.answers, range_requests.bounded

    def answers_seen(fs, runs, *more):
        rounds.append(sorted({source.url.rsplit("/", 1)[1] for source, *_ in runs}))
        return answers(fs, runs, *more)

    def bounded_seen(fs, method, timeout, *args, **kwargs):
        if method == "size":
            sized.append(args[0].rsplit("/", 1)[1])
        return bounded(fs, method, timeout, *args, **kwargs)

    monkeypatch.setattr(range_requests, "answers", answers_seen)
    monkeypatch.setattr(range_requests, "bounded", bounded_seen)
    ds = open_dataset("s3://data/ranges/npy-raw")
    batch = [0, 13, 25]  # one sample of each of the three shards, none open yet
    got = ds.__getitems__(batch)
    shards = read_manifest(local["npy-raw"]).shards
    small = sorted(f.path for shard in shards for f in shard.files if f.bytes <= ranges.BLOCK)
    large = sorted(f.path for shard in shards for f in shard.files if f.bytes > ranges.BLOCK)
    assert len(small) >= 9 and any(p.endswith(".images.npy") for p in large)
    # at once: every shard's labels, keys, checksums and offsets whole, its images file's header
    assert rounds[0] == sorted(small + large)
    assert len(rounds) == 2  # then the samples' blocks
    assert sorted(sized) == large  # the size of a file read whole is not asked: its SHA-256 is checked
    assert [_sample(s) for s in got] == [_sample(s) for s in open_dataset(local["npy-raw"]).__getitems__(batch)]


def test_opening_a_dataset_by_ranges_imports_the_client_for_its_workers(outputs, monkeypatch):
    # A DataLoader worker forked from the process that opened the dataset finds fsspec's backend (and
    # for s3://, the HTTP one its presigned URLs go through: aiohttp) imported there: each worker
    # would otherwise import it before its first batch.
    import fsspec

    asked: list[str] = []
    real = fsspec.get_filesystem_class
    monkeypatch.setattr(fsspec, "get_filesystem_class", lambda name: asked.append(name) or real(name))
    open_dataset("s3://data/ranges/npy-raw")
    assert asked[-2:] == ["s3", "http"]
    assert "fsspec.implementations.http" in sys.modules and "aiohttp" in sys.modules


@pytest.mark.parametrize("name", ["npy-raw", "hdf5-raw"])
def test_a_batch_is_one_round_of_joined_requests_then_served_from_the_cache(outputs, small_blocks, tmp_path, name):
    fs, local = outputs
    ds = open_dataset(f"s3://data/ranges/{name}", cache_dir=tmp_path / "cache")
    near = open_dataset(local[name])
    ds[0], ds[12], ds[24]  # every shard opened: headers and indexes read
    batch = [1, 2, 3, 4, 20, 21]  # two runs of neighbours
    calls: list[int] = []
    real = ranges._request
    ranges._request = lambda wanted, *more: calls.append(len(wanted)) or real(wanted, *more)
    try:
        before = Requests.requests
        got = ds.__getitems__(batch)
        asked = Requests.requests - before
    finally:
        ranges._request = real
    assert calls == [2]  # one round: both shards' blocks asked for together
    assert 2 <= asked <= 4  # the neighbours' blocks joined: one request per run (a chunk table may split one)
    assert [_sample(s) for s in got] == [_sample(s) for s in near.__getitems__(batch)]
    # a later reader (another process, say) finds the blocks in cache_dir: no request at all
    ranges.MEMORY = BlockMemory(MEMORY_LIMIT)
    again = open_dataset(f"s3://data/ranges/{name}", cache_dir=tmp_path / "cache")
    again[0], again[12], again[24]
    before = Requests.requests
    assert [_sample(s) for s in again.__getitems__(batch)] == [_sample(s) for s in near.__getitems__(batch)]
    assert Requests.requests == before


def test_the_block_cache_stays_within_its_limit(outputs, small_blocks, tmp_path):
    fs, local = outputs
    limit = 16 << 10
    (tmp_path / "cache" / "mine").mkdir(parents=True)
    (tmp_path / "cache" / "mine" / "notes.txt").write_text("kept")
    ds = open_dataset("s3://data/ranges/npy-raw", cache_dir=tmp_path / "cache", cache_limit=limit)
    near = open_dataset(local["npy-raw"])
    for _ in range(2):
        assert [_batch(b) for b in make_loader(ds, 5, seed=1)] == [_batch(b) for b in make_loader(near, 5, seed=1)]
    held = sum(p.stat().st_size for p in (tmp_path / "cache" / "blocks").rglob("*") if p.is_file())
    assert 0 < held <= limit + limit // 8 + 4 * 2048  # trimmed after each eighth written, by up to a batch
    assert (tmp_path / "cache" / "mine" / "notes.txt").read_text() == "kept"  # not the cache's: never removed
    with pytest.raises(ValueError, match="positive"):
        BlockCache(tmp_path / "x", 0)


def _byte_of_sample(path, name: str, local: int) -> int:
    """The file offset of a byte inside sample ``local``'s stored image in the shard file ``path``."""
    if name == "npy-raw":
        return path.stat().st_size - 2304 * (12 - local) + 100
    import h5py

    with h5py.File(path) as f:
        if name == "hdf5-raw":
            return int(f["images"].id.get_chunk_info_by_coord((local, 0, 0, 0)).byte_offset) + 100
        at = int(f["images_offsets"][local]) + 10  # inside the JPEG's bytes, in the flat dataset's chunks
        chunk = f["images_bytes"].chunks[0]
        return int(f["images_bytes"].id.get_chunk_info_by_coord((at // chunk * chunk,)).byte_offset) + at % chunk


@pytest.mark.parametrize("name", ["npy-raw", "hdf5-raw", "hdf5-jpeg"])
def test_an_object_changed_under_a_reader_is_refused_never_mixed(outputs, small_blocks, tmp_path, name):
    fs, local = outputs
    fs.cp(f"data/ranges/{name}/", f"data/changed-{name}/", recursive=True)
    ds = open_dataset(f"s3://data/changed-{name}")
    first = _sample(ds[3])
    shard = read_manifest(local[name]).shards[0]
    images = next(f.path for f in shard.files if "images" in f.path or f.path.endswith(".h5"))
    data = bytearray((local[name] / images).read_bytes())
    data[_byte_of_sample(local[name] / images, name, 7)] ^= 0xFF
    fs.pipe(f"data/changed-{name}/{images}", bytes(data))  # same size, one byte other
    assert _sample(ds[3]) == first  # its blocks are held: the same bytes as before
    with pytest.raises(ManifestError, match="sample 7 of .* does not match its checksum"):
        ds[7]
    fs.pipe(f"data/changed-{name}/{images}", (local[name] / images).read_bytes())  # put back
    assert _sample(ds[7]) == _sample(open_dataset(local[name])[7])  # the damaged blocks were not kept
    fs.pipe(f"data/changed-{name}/{images}", bytes(data[:-10]))  # shorter: refused where it is opened
    ranges.MEMORY = BlockMemory(MEMORY_LIMIT)
    with pytest.raises(ManifestError, match="not the .* of the manifest"):
        open_dataset(f"s3://data/changed-{name}")[7]
    fs.rm(f"data/changed-{name}/{images}")
    with pytest.raises(ManifestError, match="gone: the output was replaced or removed"):
        open_dataset(f"s3://data/changed-{name}")[7]


@pytest.mark.parametrize("cut", [10, -10])
def test_a_small_file_read_whole_and_changed_is_named_changed(outputs, small_blocks, cut):
    # its size is not asked (its SHA-256 is checked): a longer object of other bytes fails the SHA-256,
    # a shorter one comes short; either way the object is named changed, not a server that ignores
    # ranges (an object only added to at its end gives the manifest's bytes, which are read)
    fs, local = outputs
    name = "changed-labels-longer" if cut > 0 else "changed-labels-shorter"
    fs.cp("data/ranges/npy-raw/", f"data/{name}/", recursive=True)
    labels = next(f.path for f in read_manifest(local["npy-raw"]).shards[0].files if f.path.endswith(".labels.npy"))
    data = (local["npy-raw"] / labels).read_bytes()
    fs.pipe(f"data/{name}/{labels}", bytes([data[0] ^ 1]) + data[1:] + b"x" * cut if cut > 0 else data[:cut])
    with pytest.raises(ManifestError, match="changed or damaged after the manifest was written; run packer verify"):
        open_dataset(f"s3://data/{name}").__getitems__([0, 1])


@pytest.mark.parametrize("name", ["hdf5-raw", "hdf5-jpeg"])
def test_an_hdf5_object_relabelled_under_a_reader_is_refused(outputs, small_blocks, tmp_path, name):
    """Labels are not under a sample's CRC-32: the index's checksum in the manifest catches a shard
    replaced by one of the same images and size with other labels (or keys, or offsets)."""
    import h5py

    fs, local = outputs
    shard = read_manifest(local[name]).shards[0]
    h5 = next(f.path for f in shard.files if f.path.endswith(".h5"))
    relabelled = tmp_path / h5
    relabelled.write_bytes((local[name] / h5).read_bytes())
    with h5py.File(relabelled, "r+") as f:
        f["labels"][0] = 1 - f["labels"][0]  # in place: the same size, every sample's bytes the same
    assert relabelled.stat().st_size == (local[name] / h5).stat().st_size
    fs.cp(f"data/ranges/{name}/", f"data/relabelled-{name}/", recursive=True)
    ds = open_dataset(f"s3://data/relabelled-{name}")
    fs.pipe(f"data/relabelled-{name}/{h5}", relabelled.read_bytes())
    with pytest.raises(ManifestError, match="labels, keys or offsets are not the ones the manifest records"):
        ds[0]
    (tmp_path / "local").mkdir()
    for f in local[name].iterdir():  # the same on a local disk: refused before h5py reads it
        (tmp_path / "local" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "local" / h5).write_bytes(relabelled.read_bytes())
    with pytest.raises(ManifestError, match="structure checksum does not match"):
        open_dataset(tmp_path / "local")[0]


def test_lmdb_from_a_bucket_needs_the_download_cache(outputs, tmp_path):
    fs, local = outputs
    src = tmp_path / "images"
    make_tree(src, {"ant": 3})
    convert(src, tmp_path / "lmdb", ConvertConfig("lmdb", PreprocessConfig(size=(16, 12))), workers=1)
    fs.put(f"{tmp_path / 'lmdb'}/", "data/ranges-lmdb/", recursive=True)
    with pytest.raises(ConfigError, match="its pages cannot be read by byte ranges.*pass cache_dir="):
        open_dataset("s3://data/ranges-lmdb")
    ds = open_dataset("s3://data/ranges-lmdb", cache_dir=tmp_path / "cache")
    assert not ds.files.ranged and len(ds) == 3 and ds[2][0].shape == (3, 12, 16)


def test_a_batch_larger_than_the_memory_is_still_one_round(outputs, small_blocks, monkeypatch):
    fs, local = outputs
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(4096))  # two blocks: far less than a batch
    ds = open_dataset("s3://data/ranges/npy-raw")
    ds[0], ds[12], ds[24]
    before = Requests.requests
    got = ds.__getitems__(list(range(1, 12)))
    assert Requests.requests - before == 2  # one run of blocks in each file (images, captions), kept for the batch
    assert [_sample(s) for s in got] == [
        _sample(s) for s in open_dataset(local["npy-raw"]).__getitems__(list(range(1, 12)))
    ]


def test_options_that_do_not_go_together_are_refused(outputs, tmp_path):
    fs, local = outputs
    with pytest.raises(ConfigError, match="cache_limit= bounds .* pass cache_dir= too"):
        open_dataset("s3://data/ranges/npy-raw", cache_limit=1 << 20)
    with pytest.raises(ConfigError, match="not read by ranges"):
        open_dataset("s3://data/ranges/npy-raw", cache_dir=tmp_path, download=True, cache_limit=1 << 20)
    with pytest.raises(ConfigError, match="above 0"):
        open_dataset("s3://data/ranges/npy-raw", cache_dir=tmp_path, cache_limit=0)
    with pytest.raises(ConfigError, match="download=True .* is a local folder"):
        open_dataset(local["npy-raw"], download=True)


def test_download_true_reads_whole_checked_files(outputs, tmp_path):
    fs, local = outputs
    ds = open_dataset("s3://data/ranges/npy-raw", cache_dir=tmp_path / "cache", download=True)
    assert not ds.files.ranged
    assert np.array_equal(ds[29][0].numpy(), open_dataset(local["npy-raw"])[29][0].numpy())
    assert any(p.name.endswith(".images.npy") for p in (tmp_path / "cache").rglob("*"))


def test_a_reader_during_an_overwrite_sees_the_old_output_or_refuses(outputs, small_blocks, tmp_path):
    from click.testing import CliRunner

    from packer.cli import cli

    fs, _ = outputs
    src = tmp_path / "images"
    make_tree(src, {"ant": 4, "bee": 4})
    command = ["convert", str(src), "-f", "npy", "-o", "s3://data/overwritten", "--size", "16", "--shard-size", "3"]
    assert CliRunner().invoke(cli, [*command, "-q"]).exit_code == 0
    old = open_dataset("s3://data/overwritten")
    first = _sample(old[0])
    make_tree(src, {"cat": 3})  # another output: other shards, other names
    assert CliRunner().invoke(cli, [*command, "-q", "--overwrite"]).exit_code == 0
    assert _sample(old[0]) == first  # its blocks are held: the old sample, whole
    ranges.MEMORY = BlockMemory(MEMORY_LIMIT)
    with pytest.raises(ManifestError, match="is gone: the output was replaced or removed"):
        old[7]  # another shard of the old output: its objects were removed once the new manifest was in place
    new = open_dataset("s3://data/overwritten")
    assert len(new) == 11 and len(old) == 8


@pytest.fixture
def throttling(outputs, tmp_path):
    """The local npy-raw output served over HTTP on 127.0.0.1 with byte ranges, each range asked for
    answered first ``busy[0]`` times with 503 (``Retry-After: 0``), ``stalled[0]`` times late, and
    ``dropped[0]`` times not at all (the connection closed): ``(url, busy, answered, stalled, dropped)``."""
    import functools
    import http.server
    import re
    import threading

    _, local = outputs
    busy, answered, stalled, dropped = [0], [0], [0], [0]

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def send_head(self):
            asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if asked is None:
                return super().send_head()
            if dropped[0] > 0:  # the connection closed with no answer at all (a reset, a lost server)
                dropped[0] -= 1
                self.close_connection = True
                return None
            if stalled[0] > 0:  # a request that gets no answer for 6 s (its connection held open)
                stalled[0] -= 1
                time.sleep(6)
            if busy[0] > 0:
                busy[0] -= 1
                self.send_response(503)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            answered[0] += 1
            return answer_range(self, self.translate_path(self.path), asked)

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 64  # socketserver's 5 would drop a batch's connections

    server = Server(("127.0.0.1", 0), functools.partial(Handler, directory=str(local["npy-raw"])))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", busy, answered, stalled, dropped
    server.shutdown()
    server.server_close()


def test_a_busy_server_is_asked_again_then_named(outputs, small_blocks, throttling, monkeypatch):
    from readers.remote import streams

    fs, local = outputs
    url, busy, answered, *_ = throttling
    near = open_dataset(local["npy-raw"])
    busy[0] = 3  # three 503s, then the ranges: read after waits of 0 s (Retry-After)
    ds = open_dataset(url)
    assert [_sample(ds[i]) for i in (4, 17)] == [_sample(near[i]) for i in (4, 17)]
    assert busy[0] == 0 and answered[0] > 0  # the three were answered 503, then asked again
    monkeypatch.setattr(streams, "RETRIES", 2)
    busy[0] = 1000  # busy for good: an error naming the file and the tries
    with pytest.raises(ManifestError, match=r"reading http://.*\.npy failed \(after 3 tries\): .*503"):
        open_dataset(url)[25]


def test_a_request_without_an_answer_is_asked_again_then_named_never_a_hang(
    outputs, small_blocks, throttling, monkeypatch
):
    """The stall rule over a round of range requests: no answer within the window (patched to 2 s)
    and the round is asked again; a server that never answers in time is a ManifestError naming the
    file. The held answers come 6 s late, well past the window (2 s, which fsspec checks once a second)."""
    from readers.remote import streams

    fs, local = outputs
    url, _, answered, stalled, _ = throttling
    near = open_dataset(local["npy-raw"])
    ds = open_dataset(url)
    monkeypatch.setattr(streams, "STALL_WINDOW", 2.0)
    stalled[0] = 1  # the first range request goes unanswered past the window: asked again
    assert _sample(ds[5]) == _sample(near[5])
    assert stalled[0] == 0 and answered[0] > 0
    monkeypatch.setattr(streams, "RETRIES", 1)
    stalled[0] = 1000  # never answered in time
    with pytest.raises(ManifestError, match=r"reading http://.*\.npy stalled: no answer within 2 s .*2 times"):
        ds[27]


def test_reads_across_blocks_are_the_file_bytes_and_views_where_one_block_holds_them(outputs, small_blocks):
    from packer.spec.entries import FileEntry
    from packer.spec.listed_files import sha256_of

    fs, local = outputs
    path = next(local["npy-raw"].glob("*.images.npy"))
    whole = path.read_bytes()
    entry = FileEntry(path.name, len(whole), sha256_of(path))
    source = ranges.RangeSource(f"s3://data/ranges/npy-raw/{path.name}", entry)
    size = len(whole)
    spans = [(0, 10), (100, 2048), (2040, 2060), (10, 7000), (4096, 6144), (size - 5, size), (3, 3)]
    for start, end in spans:
        got = source.read(start, end)
        assert bytes(got) == whole[start:end], (start, end)
        assert isinstance(got, bytes) or got.readonly  # never a buffer a reader could write into the cache
    one_block = source.read(2050, 4000)  # inside block 1: a view of the cached block, no copy
    assert isinstance(one_block, memoryview) and one_block.obj is not None
    assert np.frombuffer(source.read(0, 64), np.uint8).flags.writeable is False


def _images_source(local: dict, cache=None) -> tuple:
    """A RangeSource of the images file of npy-raw's first shard in the bucket, and the file's bytes."""
    from packer.spec.entries import FileEntry
    from packer.spec.listed_files import sha256_of

    path = sorted(local["npy-raw"].glob("*.images.npy"))[0]
    entry = FileEntry(path.name, path.stat().st_size, sha256_of(path))
    return ranges.RangeSource(f"s3://data/ranges/npy-raw/{path.name}", entry, cache), path.read_bytes()


def test_a_batchs_samples_bring_their_own_bytes_not_the_blocks_around_them(outputs, monkeypatch, tmp_path):
    """``fetch_all(exact=True)``, without a disk cache: each run of blocks is asked for from its
    samples' first byte to their last (to a page), one request a run as before, and each sample is
    read from its answer; with a disk cache, whole blocks, which the cache keeps."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 4096)
    monkeypatch.setattr(ranges, "PAGE", 512)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    source, whole = _images_source(local)
    samples = [(128 + 2304 * i, 128 + 2304 * (i + 1)) for i in (1, 9)]  # blocks 0-1, and block 5
    asked, brought = Requests.requests, Requests.bytes
    ranges.fetch_all([(source, samples)], exact=True)
    assert Requests.requests - asked == 2  # one request a run of blocks, as whole blocks would be
    assert Requests.bytes - brought == (5120 - 2048) + (23552 - 20480)  # from page to page, not 12,288 bytes
    asked = Requests.requests
    for start, end in samples:
        got = source.read(start, end)
        assert bytes(got) == whole[start:end] and isinstance(got, memoryview) and got.readonly
    assert Requests.requests == asked  # every sample from the batch's answers
    # with a disk cache, the blocks are asked for whole: the cache keeps them for later readers
    cached, _ = _images_source(local, BlockCache(tmp_path / "cache", 1 << 20))
    brought = Requests.bytes
    ranges.fetch_all([(cached, samples)], exact=True)
    assert Requests.bytes - brought == 2 * 4096 + 4096
    assert bytes(cached.read(*samples[1])) == whole[slice(*samples[1])]


def test_a_sample_half_in_a_block_held_already_is_read_from_whole_blocks(outputs, monkeypatch):
    """A run whose sample goes on into a block the memory holds is asked for whole: the sample is
    then read from the two blocks, with no request more."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 4096)
    monkeypatch.setattr(ranges, "PAGE", 512)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    source, whole = _images_source(local)
    ranges.fetch_all([(source, [(4200, 4300)])])  # block 1, whole, kept in memory
    sample = (128 + 2304 * 3, 128 + 2304 * 4)  # 7,040 to 9,344: blocks 1 and 2
    asked, brought = Requests.requests, Requests.bytes
    ranges.fetch_all([(source, [sample])], exact=True)
    assert Requests.requests - asked == 1 and Requests.bytes - brought == 4096  # block 2, whole
    assert bytes(source.read(*sample)) == whole[slice(*sample)]
    assert Requests.requests - asked == 1
    assert ranges._trimmed(4096, 8192, [(7040, 9344)]) == (4096, 8192)  # a span past the run's end, too
    assert ranges._trimmed(4096, 12288, [(5000, 5100), (9000, 9100)]) == (4608, 9216)


def test_a_later_batchs_sample_that_the_memory_keeps_is_not_asked_again(outputs, monkeypatch):
    """The cut answers are kept in the process's memory as blocks are (persistent workers read a
    small output from memory after their first epoch); past the memory's limit, the least recently
    used go, and their samples are asked for again."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 4096)
    monkeypatch.setattr(ranges, "PAGE", 512)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    source, whole = _images_source(local)
    first, second = [(128 + 2304 * i, 128 + 2304 * (i + 1)) for i in (1, 9)]
    ranges.fetch_all([(source, [first])], exact=True)
    ranges.fetch_all([(source, [second])], exact=True)  # another batch: the first's answer is no longer its
    assert source.key not in ranges.MEMORY.spans or all(a != 2048 for a, _, _ in ranges.MEMORY.spans[source.key])
    asked = Requests.requests
    ranges.fetch_all([(source, [first, second])], exact=True)
    assert Requests.requests == asked  # both from the kept answers
    assert [bytes(source.read(*s)) for s in (first, second)] == [whole[slice(*s)] for s in (first, second)]
    assert Requests.requests == asked
    small = BlockMemory(1)  # keeps only the newest
    monkeypatch.setattr(ranges, "MEMORY", small)
    ranges.fetch_all([(source, [first])], exact=True)
    ranges.fetch_all([(source, [second])], exact=True)
    assert list(small.cuts[source.key]) == [(20480, 23552)] and small.held == 23552 - 20480
    asked = Requests.requests
    ranges.fetch_all([(source, [first])], exact=True)
    assert Requests.requests == asked + 1 and bytes(source.read(*first)) == whole[slice(*first)]


def test_the_whole_blocks_inside_a_cut_answer_are_kept_as_blocks(outputs, monkeypatch):
    """A sample over three blocks, cut at both ends: the middle block, whole in the answer, is kept
    as a block (the file's bytes); the two it holds parts of are not."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 1024)
    monkeypatch.setattr(ranges, "PAGE", 256)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    source, whole = _images_source(local)
    sample = (128 + 2304 * 9, 128 + 2304 * 10)  # 20,864 to 23,168: blocks 20, 21 and 22
    brought = Requests.bytes
    ranges.fetch_all([(source, [sample])], exact=True)
    assert Requests.bytes - brought == 23296 - 20736
    assert bytes(ranges.MEMORY.get((source.key, 21))) == whole[21504:22528]
    assert ranges.MEMORY.get((source.key, 20)) is None and ranges.MEMORY.get((source.key, 22)) is None
    ranges.MEMORY.drop_spans(source.key)  # the answer forgotten: its whole block stays
    asked = Requests.requests
    assert bytes(source.read(21600, 22000)) == whole[21600:22000] and Requests.requests == asked


def test_samples_read_in_order_ask_for_each_block_once(outputs, monkeypatch):
    """Batches of neighbouring samples, in order: a run of them keeps its blocks' end, so the next
    batch finds its samples in memory, as whole blocks did (not one request a batch)."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 16384)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    source, whole = _images_source(local)
    spans = [(128 + 2304 * i, 128 + 2304 * (i + 1)) for i in range(12)]
    asked = Requests.requests
    for batch in (spans[0:4], spans[4:8], spans[8:12]):
        ranges.fetch_all([(source, batch)], exact=True)
        assert [bytes(source.read(*s)) for s in batch] == [whole[slice(*s)] for s in batch]
    assert Requests.requests - asked == 2  # the file's two blocks, each once
    assert ranges._trimmed(0, 16384, [(5000, 6000), (6000, 7000)]) == (4096, 16384)  # side by side
    assert ranges._trimmed(0, 16384, [(5000, 6000), (6500, 7000)]) == (4096, 8192)  # apart: cut


@pytest.mark.parametrize("name", ["npy-raw", "hdf5-raw"])
def test_a_shuffled_batch_is_read_from_its_one_round_of_cut_requests(outputs, monkeypatch, tmp_path, name):
    """Without a disk cache, a batch's samples (and their text) come from the requests of its one
    round: none is asked for while the samples are read, and fewer bytes come than the whole blocks
    a reader with a disk cache asks for."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 8192)
    near = open_dataset(local[name])
    batch = [22, 3, 15, 9, 28]
    real = ranges._request
    brought = {}
    for options in ({}, {"cache_dir": tmp_path / "cache"}):
        monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
        ds = open_dataset(f"s3://data/ranges/{name}", **options)
        ds.__getitems__([0, 12, 24])  # every shard opened: its small files and index read
        rounds: list[bool] = []
        monkeypatch.setattr(ranges, "_request", lambda wanted, *more: rounds.append(bool(more)) or real(wanted, *more))
        before = Requests.bytes
        got = ds.__getitems__(batch)
        monkeypatch.setattr(ranges, "_request", real)
        assert rounds == [True], options  # the batch's round, and no request from a read
        brought["cache_dir" in options] = Requests.bytes - before
        assert [_sample(s) for s in got] == [_sample(s) for s in near.__getitems__(batch)]
    assert 0 < brought[False] < brought[True]  # its samples' bytes, against whole blocks


def test_a_sample_that_fails_its_check_is_fetched_again_from_the_store(outputs, monkeypatch):
    """``forget`` drops the batch's answers of the file as well as its blocks: the next read asks again."""
    fs, local = outputs
    monkeypatch.setattr(ranges, "BLOCK", 4096)
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    source, whole = _images_source(local)
    sample = (128 + 2304 * 9, 128 + 2304 * 10)
    ranges.fetch_all([(source, [sample])], exact=True)
    source.forget([sample])
    asked = Requests.requests
    assert bytes(source.read(*sample)) == whole[slice(*sample)] and Requests.requests == asked + 1


def test_a_connection_closed_without_an_answer_is_asked_again(outputs, small_blocks, throttling, monkeypatch):
    from readers.remote import streams

    fs, local = outputs
    url, _, answered, _, dropped = throttling
    monkeypatch.setattr(streams, "backoff", lambda attempt, wait: 0.0)
    near = open_dataset(local["npy-raw"])
    ds = open_dataset(url)
    dropped[0] = 2  # two range requests get their connection closed: asked again
    assert _sample(ds[9]) == _sample(near[9])
    assert dropped[0] == 0 and answered[0] > 0
