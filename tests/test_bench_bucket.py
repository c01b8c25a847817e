"""scripts/bench_bucket.py on a handful of photographs against its own loopback S3 server: every
figure it reports comes out, the CPU of packer's processes and of the server's apart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import s3fs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_bucket  # noqa: E402

from packer.output.shard_uploads import AHEAD  # noqa: E402


@pytest.mark.long
def test_a_small_run_reports_the_conversions_their_cpu_and_every_read(tmp_path, monkeypatch, capsys):
    for name in [*bench_bucket.AWS, "AWS_ENDPOINT_URL"]:  # start_server sets them: put back after the test
        monkeypatch.setenv(name, "unset")
    for name in (*bench_bucket.UNREAD, "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)  # start_server removes them: put back after the test
    args = bench_bucket.parser().parse_args(
        ["--images", "24", "--repeat", "1", "--batch", "8", "--shard-size", "8", "--workers", "0", "--warm"]
        + ["--range-server", "python"]  # nginx is not a dependency
        + ["--work", str(tmp_path)]
    )
    try:
        results = bench_bucket.run(args)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    c = results["conversion"]
    assert c["shards"] == 3 and c["output_bytes"] > 0
    # the shard being written (no worker: one) and AHEAD more waiting for their upload, and a shard's
    # worth for the rest (records, hashes): not the output's size, which a 3-shard output may reach
    assert 0 < c["peak_local_bytes"] <= (1 + AHEAD + 1) * c["largest_shard_bytes"]
    for key in ("local_s", "bucket_s", "local_cpu_s", "bucket_cpu_s", "server_cpu_s"):
        assert len(c[key]) == 1 and c[key][0] > 0, key
    # each shard file is put and copied to its published name, at least: the count is the server's
    assert len(c["bucket_requests"]) == 1 and c["bucket_requests"][0] >= 3 * 2 * 3
    reads = results["reads"]
    assert reads["batches"] == 3 and not reads["local_cold"]
    for name in bench_bucket.READS:
        assert reads[name] > 0 and reads[f"{name}_requests_per_batch"] >= 0, name
    assert reads["ranges_requests_per_batch"] > 0  # no cache: every batch asks the server
    assert reads["http_ranges"] > 0 and reads["http_ranges_requests_per_batch"] > 0
    # the lean server's reads: each round after a read of the local output, medians of the rounds
    assert reads["http_local"] > 0 and reads["http_local_runs"] == [reads["http_local"]]
    assert all(reads[f"http_{name}_runs"] == [reads[f"http_{name}"]] for name in bench_bucket.HTTP_READS)
    assert reads["local_cpu_s"] > 0 and reads["http_ranges_reader_cpu_s"] > 0
    # The range server runs in a process of its own, whose CPU comes in clock ticks (10 ms): three
    # small batches may cost it less than one on a fast host, so only the figure's presence is checked.
    assert all(reads[f"http_{name}_server_cpu_s"] >= 0 for name in bench_bucket.HTTP_READS)
    # no worker here: the workers' CPU is none, but it is reported for every bucket read
    assert all(reads[f"{name}_workers_cpu_s"] == 0 for name in bench_bucket.READS)
    out = capsys.readouterr().out
    assert "Requests the S3 server answered for each conversion into it: " in out
    assert "| into the bucket |" in out
    assert "the same from the lean range server (Python's http.server), rounds: 1" in out
    assert f"| byte ranges, no cache ({reads['http_ranges']:.0f}) | {reads['http_ranges']:.0f} |" in out
    assert "through s3fs's client (no presigned URLs)" in out and "ms less for each request" in out


@pytest.mark.long
def test_a_server_of_its_own_is_measured_without_counting_its_requests(s3_server, tmp_path, monkeypatch, capsys):
    """``--endpoint``: a server already running (here the fixture's moto, found as a store on another
    machine would be), its credentials from the environment; nothing of it is counted."""
    import os

    endpoint = os.environ["AWS_ENDPOINT_URL"]  # the fixture's server, found as a user's would be
    s3_server.mkdir("elsewhere")  # a bucket of the user's own, there already
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # start_server sets it: put back after the test
    args = bench_bucket.parser().parse_args(
        ["--images", "16", "--repeat", "1", "--batch", "8", "--shard-size", "8", "--workers", "0", "--warm"]
        + ["--range-server", "python", "--endpoint", endpoint, "--bucket", "elsewhere", "--work", str(tmp_path)]
    )
    try:
        results = bench_bucket.run(args)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    c = results["conversion"]
    assert c["shards"] == 2 and c["bucket_s"][0] > 0 and c["bucket_requests"] == [None] and c["server_cpu_s"] is None
    assert s3_server.exists("elsewhere/wds/manifest.json") and s3_server.exists("elsewhere/npy/manifest.json")
    assert results["reads"]["ranges"] > 0 and results["reads"]["ranges_requests_per_batch"] is None
    out = capsys.readouterr().out
    assert "answered for each conversion into it: not counted." in out
    assert "(the requests of a server of its own are not counted)." in out
