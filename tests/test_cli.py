"""The command line, in-process through click's runner and once as real subprocesses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import exited_cleanly

from packer.cli import cli
from packer.spec.manifest import read_manifest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_convert_prints_summary_and_skips_bad_files(image_tree, tmp_path):
    (image_tree / "bee" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = tmp_path / "out"
    result = run("convert", str(image_tree), "--format", "npy", "-o", str(out), "--size", "32x24", "-q")
    assert result.exit_code == 0, result.output
    assert "wrote 15 samples" in result.output
    assert "skipped 1 file(s)" in result.output and "bee/broken.jpg" in result.output
    assert "ignored 1 file(s) that are not images (.txt x1)" in result.output
    m = read_manifest(out)
    assert m.samples == 15 and m.fields["image"]["shape"] == [24, 32, 3]
    assert [s["path"] for s in m.skipped] == ["bee/broken.jpg"]


def test_default_output_is_beside_the_source(image_tree):
    result = run("convert", str(image_tree), "-f", "wds", "-q", "--size", "16")
    assert result.exit_code == 0, result.output
    assert read_manifest(image_tree.parent / "images-wds").format == "wds"


def test_info_human_and_json(image_tree, tmp_path):
    out = tmp_path / "lmdb"
    assert run("convert", str(image_tree), "-f", "lmdb", "-o", str(out), "-q", "--size", "16").exit_code == 0
    human = run("info", str(out))
    assert human.exit_code == 0
    assert "lmdb output" in human.output and "15 in" in human.output
    assert "ant (5), bee (4), cat (6)" in human.output
    data = json.loads(run("info", str(out), "--json").output)
    assert data["format"] == "lmdb" and data["samples"] == 15 and data["classes"] == ["ant", "bee", "cat"]


def test_info_shows_the_statistics_and_auto_normalization(image_tree, tmp_path):
    out = tmp_path / "npy"
    result = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "16", "--normalize", "auto")
    assert result.exit_code == 0, result.output
    m = read_manifest(out)
    px = m.stats["pixels"]
    human = run("info", str(out)).output
    means = ", ".join(f"{v:.4f}" for v in px["mean"])
    assert f"normalize mean [{means}]" in human and "(computed: --normalize auto) (applied by readers)" in human
    assert f"pixels    mean [{means}], std [" in human and f"(of pixel/255, {15 * 16 * 16:,} per channel)" in human
    assert "widths    64..99, median 78 (original; 64-127: 15)" in human
    assert "heights   48..54, median 51 (original; 32-63: 15)" in human
    data = json.loads(run("info", str(out), "--json").output)
    assert data["stats"] == m.stats and data["preprocess"]["normalize"]["auto"] is True


def test_info_of_an_output_without_statistics(image_tree, tmp_path):
    """Outputs of packers before statistics existed read and describe as before."""
    out = tmp_path / "npy"
    assert run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "16").exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["stats"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    human = run("info", str(out))
    assert human.exit_code == 0 and "15 in" in human.output
    assert "pixels    mean" not in human.output and "widths" not in human.output
    assert json.loads(run("info", str(out), "--json").output)["stats"] is None


def test_normalize_auto_with_float_storage_is_a_usage_error(image_tree, tmp_path):
    result = run(
        "convert", str(image_tree), "-f", "npy", "-o", str(tmp_path / "o"), "--normalize", "auto", "--dtype", "float16"
    )
    assert result.exit_code == 2 and "--normalize auto needs --dtype uint8" in result.output
    assert "MEAN,STD" in result.output and not (tmp_path / "o").exists()


def test_usage_errors_exit_2_with_a_message(image_tree, tmp_path):
    bad_size = run("convert", str(image_tree), "-f", "npy", "-o", str(tmp_path / "o"), "--size", "big")
    assert bad_size.exit_code == 2 and "WIDTHxHEIGHT" in bad_size.output
    bad_norm = run("convert", str(image_tree), "-f", "npy", "-o", str(tmp_path / "o"), "--normalize", "1,2,3")
    assert bad_norm.exit_code == 2 and "--normalize" in bad_norm.output
    no_format = run("convert", str(image_tree))
    assert no_format.exit_code == 2 and "--format" in no_format.output
    assert not (tmp_path / "o").exists()


def test_run_errors_exit_1_without_traceback(image_tree, tmp_path):
    out = tmp_path / "o"
    assert run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "8").exit_code == 0
    again = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "8")
    assert again.exit_code == 1 and "--overwrite" in again.output and exited_cleanly(again)
    again = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "8", "--overwrite")
    assert again.exit_code == 0
    jpeg_float = run(
        "convert", str(image_tree), "-f", "hdf5", "-o", str(tmp_path / "h"), "--codec", "jpeg", "--dtype", "float32"
    )
    assert jpeg_float.exit_code == 2 and "--dtype uint8" in jpeg_float.output  # a combination of options: usage
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = run("convert", str(empty), "-f", "npy", "-o", str(tmp_path / "e"), "-q")
    assert nothing.exit_code == 1 and "no images or texts found" in nothing.output
    not_output = run("info", str(image_tree))
    assert not_output.exit_code == 1 and "no manifest.json" in not_output.output


def test_help_lists_every_option_with_its_default():
    text = " ".join(run("convert", "--help").output.split())
    for option, default in [
        ("--size", "224"),
        ("--resize", "shorter-crop"),
        ("--normalize", "imagenet"),
        ("--dtype", "uint8"),
        ("--shard-size", "auto"),
        ("--mode", "RGB"),
        ("--codec", "raw"),
        ("--quality", "90; 1<=x<=95"),
    ]:
        assert option in text and f"[default: {default}]" in text


@pytest.mark.parametrize("codec,quality", [("jpeg", "75"), ("png", None), ("raw", None)])
def test_codec_and_quality_reach_the_manifest(image_tree, tmp_path, codec, quality):
    out = tmp_path / "o"
    args = ["convert", str(image_tree), "-f", "hdf5", "-o", str(out), "-q", "--size", "16", "--codec", codec]
    result = run(*args, *(["--quality", quality] if quality else []))
    assert result.exit_code == 0, result.output
    image = read_manifest(out).fields["image"]
    assert image["codec"] == codec and image.get("quality") == (int(quality) if quality else None)
    described = {"jpeg": "stored as JPEG quality 75", "png": "stored as PNG", "raw": "raw pixels"}[codec]
    assert described in run("info", str(out)).output
    assert run("verify", str(out), "-q").exit_code == 0


def test_codec_usage_errors(image_tree, tmp_path):
    out = tmp_path / "o"
    floats = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "--codec", "jpeg", "--dtype", "float32")
    assert floats.exit_code == 2 and "use --dtype uint8" in floats.output and "--codec raw" in floats.output
    quality = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "--codec", "jpeg", "--quality", "100")
    assert quality.exit_code == 2 and "--quality" in quality.output
    unknown = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "--codec", "webp")
    assert unknown.exit_code == 2 and "raw" in unknown.output and "jpeg" in unknown.output
    assert not out.exists()


@pytest.mark.skipif(shutil.which("packer") is None, reason="the packer script is not installed")
def test_installed_script_converts_sample_data(tmp_path):
    """The README's first command, as a real subprocess on the real sample photographs."""
    out = tmp_path / "lmdb"
    proc = subprocess.run(
        ["packer", "convert", str(ROOT / "sample_data" / "images"), "--format", "lmdb", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 40 samples" in proc.stdout
    m = read_manifest(out)
    assert m.classes == ["cat", "coffee", "space", "texture"] and m.samples == 40 and not m.skipped
    from readers import open_dataset

    image, label = open_dataset(out)[39]
    assert tuple(image.shape) == (3, 224, 224) and label == 3


def test_python_dash_m_packer():
    proc = subprocess.run([sys.executable, "-m", "packer", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "packer, version" in proc.stdout


def test_nothing_packable_is_an_error_and_verbose_logs_each_skip(tmp_path):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "x.jpg").write_bytes(b"")
    (src / "y.png").write_text("not a png")
    result = run("-v", "convert", str(tmp_path / "src"), "-f", "npy", "-o", str(tmp_path / "o"), "-q")
    assert result.exit_code == 1
    assert "all 2 were skipped (1 x empty file, 1 x not an image)" in result.output
    assert not (tmp_path / "o").exists()


def test_resume_of_a_complete_output_says_there_is_nothing_to_resume(image_tree, tmp_path):
    out = tmp_path / "o"
    assert run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "8").exit_code == 0
    again = run("convert", str(image_tree), "-f", "npy", "-o", str(out), "-q", "--size", "8", "--resume")
    assert again.exit_code == 1 and "nothing to resume" in again.output
