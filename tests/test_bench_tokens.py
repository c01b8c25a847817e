"""scripts/bench_tokens.py on a corpus of a megabyte: every figure it reports comes out, and the
bare gather it compares with reads the blocks packer stores."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_tokens  # noqa: E402


@pytest.mark.long
def test_a_small_run_reports_the_floor_both_packings_the_size_and_the_reads(tmp_path, capsys):
    args = bench_tokens.parser().parse_args(
        ["--corpus-mb", "1", "--vocab", "400", "--block", "64", "--seconds", "0.2", "--work", str(tmp_path)]
        + ["--stream", "--resume-check"]
    )
    results = bench_tokens.run(args)
    assert results["floor"]["tokens"] > 0 and results["documents"] > 100
    assert results["floor-fast"]["tokens"] == results["floor"]["tokens"]  # the same ids, without offsets
    for mode in ("concat", "best-fit"):
        row = results[f"packer-{mode}"]
        assert row["tokens"] == results["floor"]["tokens"]  # every document's ids and its end-of-text id
        assert 2.0 <= row["bytes"] / row["tokens"] < 2.35  # blocks of 64: 8 bytes of (start, length) a 64 ids
    assert results["reads"]["packer 0 workers"] > 0 and results["reads"]["np.memmap gather, 1 process"] > 0
    assert results["resume"]["same_shards"]  # stopped or not (a small corpus may end first), the same output
    streamed = [rate for name, rate in results["reads"].items() if "streamed over HTTP" in name]
    assert len(streamed) == 2 and all(rate > 0 for rate in streamed)
    out = capsys.readouterr().out
    assert "| packer --pack 64 --pack-mode best-fit |" in out and "| tokenizers encode_batch_fast" in out
    assert isinstance(bench_tokens.markdown(results, argparse.Namespace(workers=2, batch=16)), str)


def test_a_conversion_that_ends_before_its_stop_is_not_resumed(tmp_path):
    """The stop comes after 70% of the fresh run's time; on a fast host a small corpus is done by then,
    and ``--resume`` of a finished output is refused: the check says so instead of failing."""
    files = bench_tokens.make_corpus(tmp_path / "corpus", 1)
    tokenizer = bench_tokens.make_tokenizer(tmp_path / "tokenizer.json", files, 300)
    r = bench_tokens.resume_check(tmp_path / "corpus", tokenizer, tmp_path / "out", 64, fresh=1.0, share=60.0)
    assert r["exit"] == 0 and r["resumed"] is None
    assert (tmp_path / "out" / "manifest.json").is_file()
