"""packer.run.job: ConvertJob.validate is the one place that refuses options that cannot go together,
before any work; the CLI gives its refusals as usage errors (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import DetectionConfig, MaskConfig
from packer.output.files import staging_dir
from packer.run.job import ConvertJob, Selection
from packer.spec.errors import ConfigError

BOXES = ConvertConfig("npy", detection=DetectionConfig("ann.json", "coco"))
MASKS = ConvertConfig("npy", masks=MaskConfig("masks"))
PLAIN = ConvertConfig("npy")


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        (PLAIN, {"selection": Selection(add_classes=True)}, "--add-classes extends the class map of --classes"),
        (MASKS, {"selection": Selection(labels_file="l.csv")}, "with --masks the labels are the masks' indices"),
        (MASKS, {"selection": Selection(classes=["a"])}, "with --masks the labels are the masks' indices"),
        (BOXES, {"selection": Selection(labels_file="l.csv")}, "with --annotations the labels are the boxes'"),
        (BOXES, {"splits": True}, "--annotations with splits: convert each split on its own"),
        (MASKS, {"splits": True}, "--masks with splits"),
        (BOXES, {"nodes": 2}, "--annotations with --num-nodes is not supported yet"),
        (PLAIN, {"nodes": 2, "splits": True}, "--num-nodes converts one output"),
        (PLAIN, {"nodes": 2, "ray": True}, "with --executor ray, Ray spreads the shards"),
        (PLAIN, {"nodes": 2, "resume": True}, "--resume is implied with --num-nodes"),
    ],
)
def test_options_that_cannot_go_together_are_refused_with_what_to_do(tmp_path, config, options, message):
    job = ConvertJob(tmp_path / "src", tmp_path / "out", config, **options)
    with pytest.raises(ConfigError, match=message):
        job.validate()


@pytest.mark.parametrize(
    ("config", "options"),
    [
        (PLAIN, {"selection": Selection(classes=["a"], add_classes=True)}),
        (BOXES, {"selection": Selection(classes=["a"])}),  # --classes orders the categories
        (PLAIN, {"nodes": 2}),
        (PLAIN, {"splits": True, "resume": True}),
        (BOXES, {"ray": True}),
    ],
)
def test_options_that_go_together_pass(tmp_path, config, options):
    job = ConvertJob(tmp_path / "src", tmp_path / "out", config, **options)
    assert job.validate() is job


def test_boxes_of_a_container_source_are_refused(tmp_path):
    parquet = tmp_path / "images.parquet"
    parquet.write_bytes(b"PAR1")  # the name says container: refused before it is read
    with pytest.raises(ConfigError, match="is a container of images: --annotations and --masks pair"):
        ConvertJob(parquet, tmp_path / "out", BOXES).validate()


def test_convert_refuses_before_any_work(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"cat": 2})
    out = tmp_path / "out"
    config = ConvertConfig("npy", PreprocessConfig(size=(8, 8)), masks=MaskConfig(str(tmp_path / "masks")))
    with pytest.raises(ConfigError, match="with --masks the labels"):
        convert(src, out, config, classes=["cat"])
    assert not out.exists() and not staging_dir(out).exists()
    assert not list(Path(tmp_path).glob(".out.*"))  # not even the lock file


def test_the_cli_gives_a_refusal_as_a_usage_error(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"cat": 2})
    labels = str(tmp_path / "labels.csv")
    Path(labels).write_text("cat/img_000.png,cat\n")
    result = CliRunner().invoke(
        cli, ["convert", str(src), "-f", "npy", "-o", str(tmp_path / "out"), "--masks", str(src), "--labels", labels]
    )
    assert result.exit_code == 2 and "with --masks the labels are the masks' indices" in result.output
    result = CliRunner().invoke(
        cli,
        ["convert", str(src), "-f", "npy", "-o", str(tmp_path / "o"), "--num-nodes", "2", "--node-rank", "0"]
        + ["--resume"],
    )
    assert result.exit_code == 2 and "--resume is implied with --num-nodes" in result.output
