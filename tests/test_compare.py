"""packer bench: the packed output against the raw folder, the chart, and the command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_tree
from helpers import exited_cleanly

from packer import ConvertConfig, PreprocessConfig, convert
from packer.advisor.compare import compare, plot
from packer.cli import cli
from packer.config import ShardSize
from readers import open_dataset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """(source folder of 12 PNGs, its npy output at 24x24)."""
    root = tmp_path_factory.mktemp("src") / "images"
    make_tree(root, {"a": 6, "b": 6}, size=(48, 40))
    out = tmp_path_factory.mktemp("out") / "npy"
    convert(root, out, ConvertConfig("npy", PreprocessConfig(size=(24, 24)), ShardSize(samples=6)), workers=1)
    return root, out


def test_compare_times_both_sides_alike(pair, tmp_path):
    src, out = pair
    c = compare(open_dataset(out), src, batch_size=4, num_workers=0, seconds=0.3)
    assert c.num_workers == 0 and c.batch_size == 4 and c.folder_images == c.output_samples == 12
    for rate in (c.packed, c.folder):
        assert rate.samples > 0 and rate.seconds > 0 and rate.samples_per_s > 0
    assert c.speedup == pytest.approx(c.packed.samples_per_s / c.folder.samples_per_s)
    d = c.to_dict()
    assert {"packed", "folder", "speedup", "batch_size", "num_workers"} <= set(d)
    assert d["packed"]["samples_per_s"] == c.packed.samples_per_s
    png = plot(c, tmp_path / "chart.png")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_bench_command_text_plot_and_json(pair, tmp_path):
    src, out = pair
    chart = tmp_path / "bench.png"
    text = CliRunner().invoke(
        cli,
        [
            "bench",
            str(out),
            "--compare",
            str(src),
            "-b",
            "4",
            "-j",
            "1",
            "--seconds",
            "0.5",
            "--plot",
            str(chart),
            "-q",
        ],
    )
    assert text.exit_code == 0, text.output
    assert "raw folder" in text.stdout and "packed npy" in text.stdout and "speed-up" in text.stdout
    assert "1 worker(s) each" in text.stdout and "24x24 shorter-crop" in text.stdout
    assert chart.read_bytes()[:8] == PNG_MAGIC
    result = CliRunner().invoke(
        cli, ["bench", str(out), "--compare", str(src), "-b", "6", "-j", "0", "--seconds", "0.5", "--json", "-q"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["num_workers"] == 0 and data["batch_size"] == 6 and data["plot"] is None
    assert data["packed"]["samples_per_s"] > 0 and data["folder"]["samples_per_s"] > 0 and data["speedup"] > 0


def test_bench_notes_a_folder_that_does_not_match(pair, tmp_path):
    _, out = pair
    other = tmp_path / "other"
    make_tree(other, {"x": 3}, size=(30, 30))
    result = CliRunner().invoke(
        cli, ["bench", str(out), "--compare", str(other), "-b", "3", "-j", "0", "--seconds", "0.5", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert "holds 3 usable image(s)" in result.stderr


def test_bench_errors_are_messages(pair, tmp_path, monkeypatch):
    src, out = pair
    not_output = CliRunner().invoke(cli, ["bench", str(src), "--compare", str(src), "-q"])
    assert not_output.exit_code == 1 and "not a packer output" in not_output.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(cli, ["bench", str(out), "--compare", str(tmp_path / "empty"), "--seconds", "0.5", "-q"])
    assert empty.exit_code == 1 and "no usable images" in empty.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    missing = CliRunner().invoke(cli, ["bench", str(out), "--compare", str(src), "--plot", str(tmp_path / "x.png")])
    assert missing.exit_code == 1 and "pip install matplotlib" in missing.output
    assert exited_cleanly(missing) and not (tmp_path / "x.png").exists()
