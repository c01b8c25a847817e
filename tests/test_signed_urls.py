"""readers.remote.signed_urls against an S3-compatible server on 127.0.0.1 (moto): an output in a
bucket is read by ranges over presigned URLs, not through s3fs's client; a URL the store refuses is
signed again, then the file is read through s3fs; a URL never appears in a message."""

from __future__ import annotations

import http.server
import threading

import pytest
from conftest import make_tree
from helpers import answer_range

from packer import ConvertConfig, PreprocessConfig, convert
from packer.config import ShardSize
from packer.spec.errors import ManifestError
from readers import open_dataset
from readers.remote import ranges, signed_urls, streams
from readers.remote.block_memory import MEMORY_LIMIT, BlockMemory
from readers.remote.signed_urls import SignedUrl, can_sign


@pytest.fixture(scope="module")
def output(s3_server, tmp_path_factory):
    """An npy output of 20 images of 32x24, shards of 8, in ``s3://data/signed`` and in a local
    folder: ``(fs, local folder)``."""
    src = tmp_path_factory.mktemp("src") / "images"
    make_tree(src, {"ant": 10, "bee": 10}, size=(40, 30))
    local = tmp_path_factory.mktemp("signed") / "npy"
    convert(src, local, ConvertConfig("npy", PreprocessConfig(size=(32, 24)), ShardSize(samples=8)), workers=1)
    s3_server.put(f"{local}/", "data/signed/", recursive=True)
    return s3_server, local


@pytest.fixture
def fresh_blocks(monkeypatch):
    """An empty block memory (every read goes to the server), and no bucket refused yet."""
    monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
    monkeypatch.setattr(signed_urls, "_PLAIN", set())
    for proxy in signed_urls._PROXIES:  # a proxy in the environment sends the ranges through s3fs
        monkeypatch.delenv(proxy, raising=False)


@pytest.fixture
def refusing():
    """An HTTP server on 127.0.0.1 that answers every request with ``status[0]``: ``(url, status, asked)``."""
    status, asked = [403], []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(status[0])
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", status, asked
    server.shutdown()
    server.server_close()


class _Fixed:
    """A signer whose URLs point at ``pattern`` (``{}``: the object's path), as a refusing store's."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def url(self, path: str, expires: int) -> str:
        return self.pattern.format(path)


def _images(ds, indices) -> list[bytes]:
    return [ds[i][0].numpy().tobytes() for i in indices]


def test_ranges_of_a_bucket_go_by_presigned_urls(output, fresh_blocks, monkeypatch):
    fs, local = output
    signed: list[str] = []
    real = SignedUrl.target
    monkeypatch.setattr(SignedUrl, "target", lambda self: signed.append(self.path) or real(self))

    async def through_s3fs(*a, **k):
        pytest.fail("a range went through s3fs's client although its URL was signed")

    monkeypatch.setattr(type(fs), "_cat_file", through_s3fs)
    ds = open_dataset("s3://data/signed")
    assert _images(ds, [0, 9, 17]) == _images(open_dataset(local), [0, 9, 17])
    assert signed and all(p.startswith("data/signed/shard-") for p in signed)


def test_a_refused_url_is_signed_again_then_the_file_read_through_s3fs(output, fresh_blocks, refusing, monkeypatch):
    fs, local = output
    url, _, asked = refusing
    monkeypatch.setattr(signed_urls, "_signer", lambda s3: _Fixed(f"{url}/{{}}?X-Amz-Signature=secret"))
    made: list[SignedUrl] = []
    real = SignedUrl.__init__
    monkeypatch.setattr(SignedUrl, "__init__", lambda self, *a: made.append(self) or real(self, *a))
    ds = open_dataset("s3://data/signed")
    assert _images(ds, [3, 12]) == _images(open_dataset(local), [3, 12])  # read through s3fs in the end
    assert asked  # the presigned URLs were tried first
    assert made and all(s.plain for s in made)  # refused fresh: never signed again
    assert signed_urls._PLAIN  # nor any other file of the bucket, in this process
    asked.clear()
    ds[5]
    assert asked == []


def test_a_presigned_url_answered_with_no_range_is_refused_too(output, fresh_blocks, refusing, monkeypatch):
    """S3 answers a URL signed for another region with a redirect (301) that fsspec does not raise
    for: an answer that is not the range asked for falls back to s3fs as a refusal does."""
    fs, local = output
    url, status, asked = refusing
    status[0] = 301
    monkeypatch.setattr(signed_urls, "_signer", lambda s3: _Fixed(f"{url}/{{}}?X-Amz-Signature=secret"))
    ds = open_dataset("s3://data/signed")
    assert _images(ds, [2, 15]) == _images(open_dataset(local), [2, 15])
    assert asked


def test_a_url_refused_after_a_while_is_signed_again(output, fresh_blocks, monkeypatch):
    fs, _ = output
    signed = SignedUrl(fs, "data/signed/manifest.json")
    first = signed.target()[1]
    assert first.startswith("http://127.0.0.1") and "X-Amz-Algorithm=AWS4-HMAC-SHA256" in first  # SigV4
    assert signed.target()[1] == first  # kept while it is young
    monkeypatch.setattr(signed_urls.time, "monotonic", lambda: signed.signed_at + signed_urls.FRESH + 1)
    signed.refused()  # an old URL refused (its credentials ran out): signed again
    assert not signed.plain and signed.url is None
    assert signed.target()[0] is not fs
    monkeypatch.setattr(signed_urls.time, "monotonic", lambda: signed.signed_at + 1)
    signed.refused()  # refused fresh: signing does not work for it
    assert signed.plain and signed.target() == (fs, "data/signed/manifest.json")


def test_a_url_is_signed_again_at_half_its_life(output, monkeypatch):
    fs, _ = output
    signed = SignedUrl(fs, "data/signed/manifest.json")
    signed.target()
    at = signed.signed_at
    monkeypatch.setattr(signed_urls.time, "monotonic", lambda: at + signed_urls.SIGNED_FOR / 2 + 1)
    signed.target()
    assert signed.signed_at == at + signed_urls.SIGNED_FOR / 2 + 1


def test_stores_a_url_cannot_serve_are_read_through_s3fs(s3_server, monkeypatch):
    import s3fs

    assert can_sign(s3_server)
    monkeypatch.setenv(signed_urls.SWITCH, "0")  # the user's switch
    assert not can_sign(s3_server)
    monkeypatch.delenv(signed_urls.SWITCH)
    assert not can_sign(s3fs.S3FileSystem(client_kwargs={"verify": "/etc/ca.pem"}, skip_instance_cache=True))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")  # botocore's requests go by a proxy
    assert not can_sign(s3_server)
    monkeypatch.delenv("HTTPS_PROXY")
    assert not can_sign(s3fs.S3FileSystem(requester_pays=True, skip_instance_cache=True))
    assert not can_sign(s3fs.S3FileSystem(s3_additional_kwargs={"SSECustomerKey": "k"}, skip_instance_cache=True))
    assert not can_sign(s3fs.S3FileSystem(anon=True, skip_instance_cache=True))
    import fsspec

    assert not can_sign(fsspec.filesystem("memory"))


def test_no_message_names_a_presigned_url(output, fresh_blocks, refusing, monkeypatch):
    fs, _ = output
    url, status, _ = refusing
    status[0] = 503  # busy for good: the error after the tries names the s3:// file, not the URL asked
    monkeypatch.setattr(streams, "RETRIES", 1)
    monkeypatch.setattr(streams, "backoff", lambda attempt, wait: 0.0)
    monkeypatch.setattr(signed_urls, "_signer", lambda s3: _Fixed(f"{url}/{{}}?X-Amz-Signature=secret"))
    with pytest.raises(ManifestError) as e:
        open_dataset("s3://data/signed")[1]
    assert "s3://data/signed/shard-" in str(e.value) and "503" in str(e.value)
    assert "secret" not in str(e.value) and url not in str(e.value)


def test_a_url_that_cannot_be_reached_before_it_ever_worked_falls_back_to_s3fs(output, fresh_blocks, monkeypatch):
    """A proxy or a private CA that fsspec's HTTP client does not know: s3fs, which does, reads it."""
    import socket

    fs, local = output
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setattr(signed_urls, "_signer", lambda s3: _Fixed(f"http://127.0.0.1:{port}/{{}}?X-Amz-Signature=s"))
    ds = open_dataset("s3://data/signed")
    assert _images(ds, [4, 11]) == _images(open_dataset(local), [4, 11])
    assert signed_urls._PLAIN == set()  # a failure to connect sends its file through s3fs, not the bucket


def test_fsspecs_log_never_shows_a_presigned_query(output, fresh_blocks, caplog):
    import logging

    with caplog.at_level(logging.DEBUG, logger="fsspec.http"):
        _images(open_dataset("s3://data/signed"), [6])
    assert "?<presigned>" in caplog.text and "X-Amz-Signature" not in caplog.text


def test_a_logged_traceback_never_shows_a_presigned_query(caplog):
    import logging

    signed_urls._http()  # the filter on fsspec's HTTP logger
    log = logging.getLogger("fsspec.http")
    with caplog.at_level(logging.DEBUG, logger="fsspec.http"):
        try:
            raise OSError("failed: http://127.0.0.1:9/data/x?X-Amz-Algorithm=AWS4&X-Amz-Signature=secret")
        except OSError:
            log.debug("while asking", exc_info=True)
    assert "while asking" in caplog.text and "OSError" in caplog.text and "secret" not in caplog.text


def test_only_the_refused_blocks_are_asked_again(output, fresh_blocks, monkeypatch):
    """Of a file's two runs of blocks in one round, the store refuses one: the other's blocks are
    kept, and only the refused run is asked again (through s3fs: the URL was refused fresh)."""
    import functools
    import re

    fs, local = output
    monkeypatch.setattr(ranges, "BLOCK", 2048)  # an image of 32x24 is 2,304 bytes: two blocks
    refuse = [0]

    class Ranges(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def send_head(self):  # noqa: ANN201 - http.server's own hook
            asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            path = self.translate_path(self.path.split("?")[0].replace("/data/signed", "", 1))
            if refuse[0] > 0:
                refuse[0] -= 1
                self.send_error(403)
                return None
            return answer_range(self, path, asked)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Ranges, directory=str(local)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setattr(signed_urls, "_signer", lambda s3: _Fixed(f"{url}/{{}}?X-Amz-Signature=s"))
        ds = open_dataset("s3://data/signed")
        near = open_dataset(local)
        ds[0], ds[7]  # the shard's small files read, and a first sample: every URL has worked
        monkeypatch.setattr(ranges, "MEMORY", BlockMemory(MEMORY_LIMIT))
        before = ranges.Requests.requests
        refuse[0] = 1  # the first of the batch's two runs of blocks is refused
        got = ds.__getitems__([1, 5])
        assert [g[0].numpy().tobytes() for g in got] == [s[0].numpy().tobytes() for s in near.__getitems__([1, 5])]
        assert ranges.Requests.requests - before == 3  # two runs, then the refused one again: not both
    finally:
        server.shutdown()
        server.server_close()
