"""packer preview (packer/cli/preview.py, readers/preview/sheet.py): contact sheets of what the readers
return, boxes in their category's colour where the box is, captions, the crops of an epoch, a line a
sample with --text, and damaged or wrong input reported without a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import DetectionConfig
from readers.preview.sheet import CAPTION, PALETTE

TILE = 96


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """6 grey 96x64 images, each with a red rectangle and its COCO box (category "red"), in two class
    folders; converted to npy with boxes, and plain to npy and wds."""
    root = tmp_path_factory.mktemp("preview")
    images, anns = [], []
    for i in range(6):
        folder = root / "images" / ("left" if i < 3 else "right")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.full((64, 96, 3), 128, np.uint8)
        x0, y0 = 10 + 5 * i, 12
        pixels[y0 : y0 + 30, x0 : x0 + 40] = (220, 20, 20)
        Image.fromarray(pixels).save(folder / f"{i}.png")
        images.append({"id": i + 1, "file_name": f"{folder.name}/{i}.png", "width": 96, "height": 64})
        anns.append(
            {"id": i + 1, "image_id": i + 1, "category_id": 7, "bbox": [x0, y0, 40, 30], "area": 1200, "iscrowd": 0}
        )
    (root / "coco.json").write_text(
        json.dumps({"images": images, "annotations": anns, "categories": [{"id": 7, "name": "red"}]})
    )
    own = PreprocessConfig(size=None, resize="none")
    out = {}
    for name, config in {
        "boxes": ConvertConfig("npy", own, detection=DetectionConfig(str(root / "coco.json"), coords="stored")),
        "npy": ConvertConfig("npy", own),
        "wds": ConvertConfig("wds", own),
    }.items():
        convert(root / "images", root / name, config, workers=1)
        out[name] = root / name
    return out


def run(*args: str) -> "object":
    return CliRunner().invoke(cli, ["preview", *map(str, args)])


def test_boxes_are_drawn_in_their_categorys_colour_where_they_are(outputs, tmp_path):
    result = run(outputs["boxes"], "-o", tmp_path / "sheet.png", "--samples", "0,4", "--grid", "2x1", "--tile", TILE)
    assert result.exit_code == 0, result.output
    sheet = np.asarray(Image.open(tmp_path / "sheet.png").convert("RGB"))
    assert sheet.shape == (TILE + CAPTION, 2 * TILE, 3)
    scale = TILE / 96  # 96x64 images fitted into 96x96 tiles: scale 1, centred vertically
    for column, i in enumerate((0, 4)):
        ox, oy = column * TILE, (TILE - round(64 * scale)) // 2
        left, top = ox + round((10 + 5 * i) * scale), oy + round(12 * scale)
        colour = PALETTE[0]  # category "red" is category 0 of the output
        edge = sheet[top + 10, left : left + 2]  # the box's left edge, 2 pixels wide
        assert any(np.abs(px.astype(int) - colour).max() <= 2 for px in edge), (edge, colour)
        inside = sheet[top + 15, left + 20]
        assert np.abs(inside.astype(int) - (220, 20, 20)).max() <= 25  # the image itself under the box
        caption = sheet[TILE + 1 :, ox : ox + TILE]
        assert (caption.max(axis=-1) > 200).any()  # its caption written (light text on the dark strip)


def test_text_says_each_samples_key_class_and_boxes(outputs):
    result = run(outputs["boxes"], "--text", "--samples", "1,3")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].split("\t")[:2] == ["1", "left/1.png"] and lines[0].endswith("1 box(es): red")
    assert lines[1].split("\t")[:3] == ["3", "right/3.png", ""]  # boxes, not a class, label these samples


def test_a_class_and_random_samples_are_chosen_as_asked(outputs):
    result = run(outputs["npy"], "--text", "--class", "right")
    assert [line.split("\t")[2] for line in result.output.strip().splitlines()] == ["right"] * 3
    picked = run(outputs["npy"], "--text", "--random", "4", "--seed", "3").output
    assert picked == run(outputs["npy"], "--text", "--random", "4", "--seed", "3").output
    assert len(picked.strip().splitlines()) == 4
    bad = run(outputs["npy"], "--text", "--class", "middle")
    assert bad.exit_code == 1 and "no class 'middle'" in bad.output and "left, right" in bad.output


def test_train_draws_the_crops_of_the_epoch_asked(outputs, tmp_path):
    def sheet(epoch: int) -> np.ndarray:
        path = tmp_path / f"e{epoch}.png"
        result = run(outputs["npy"], "-o", path, "--train", "--crop", "48", "--flip", "--epoch", epoch, "--grid", "3x2")
        assert result.exit_code == 0, result.output
        return np.asarray(Image.open(path))

    assert np.array_equal(sheet(0), sheet(0)) and not np.array_equal(sheet(0), sheet(1))


def test_tar_shards_are_previewed_in_one_pass(outputs, tmp_path):
    result = run(outputs["wds"], "--text", "--samples", "5,0")
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[0] for line in result.output.strip().splitlines()] == ["5", "0"]


def test_a_damaged_shard_is_reported_and_the_rest_drawn(outputs, tmp_path):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(outputs["npy"], damaged)
    first = sorted(damaged.glob("*.images.bytes.npy"))[0]
    first.write_bytes(first.read_bytes()[:-100])  # a truncated shard
    result = CliRunner().invoke(cli, ["preview", str(damaged), "-o", str(tmp_path / "d.png")])
    assert result.exit_code == 0, result.output
    assert "sample 0 could not be read" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "d.png").is_file()


def test_what_is_not_an_output_gets_a_clear_error(tmp_path):
    result = run(tmp_path, "-o", tmp_path / "x.png")
    assert result.exit_code == 1 and "Error:" in result.output and "Traceback" not in result.output
    assert run(tmp_path).exit_code == 2  # neither -o nor --text


def test_a_mask_is_laid_over_in_its_classs_colour_and_the_ignore_index_left_clear():
    import torch

    from readers.preview.sheet import Shown, contact_sheet

    image = np.full((40, 40, 3), 100, np.uint8)
    mask = torch.zeros((40, 40), dtype=torch.uint8)
    mask[:, :20], mask[:, 30:] = 1, 255  # class 1 on the left, the ignore index on the right
    sheet = np.asarray(contact_sheet([Shown(0, "a.png", image, -1, mask)], 1, tile=40, ignore_index=255))
    blended = (0.5 * 100 + 0.5 * np.array(PALETTE[1])).astype(int)
    assert np.abs(sheet[20, 5].astype(int) - blended).max() <= 2
    assert (sheet[20, 25] == 100).all() and (sheet[20, 35] == 100).all()  # background and ignored: clear


def test_a_source_folder_is_drawn_with_its_annotations_before_conversion(outputs, tmp_path):
    source = outputs["npy"].parent / "images"
    coco = outputs["npy"].parent / "coco.json"
    sheet = tmp_path / "source.png"
    result = run(source, "-o", sheet, "--annotations", coco, "--box-coords", "stored")
    assert result.exit_code == 0, result.output
    result = run(source, "-o", sheet, "--annotations", coco, "--samples", "0,4", "--grid", "2x1", "--tile", TILE)
    assert result.exit_code == 0, result.output
    drawn = np.asarray(Image.open(sheet).convert("RGB"))
    assert drawn.shape == (TILE + CAPTION, 2 * TILE, 3)
    for column, i in enumerate((0, 4)):  # the same boxes where the output's preview draws them
        left, top = column * TILE + 10 + 5 * i, (TILE - 64) // 2 + 12
        edge = drawn[top + 10, left : left + 2]
        assert any(np.abs(px.astype(int) - PALETTE[0]).max() <= 2 for px in edge), edge
    text = run(source, "--text", "--annotations", coco, "--samples", "1")
    assert text.exit_code == 0 and "1\tleft/1.png\t\t96x64\t1 box(es): red" in text.output  # boxes are its labels


def test_a_source_with_a_bad_image_is_drawn_and_the_image_named(tmp_path):
    folder = tmp_path / "src" / "a"
    folder.mkdir(parents=True)
    Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(folder / "good.png")
    (folder / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    result = CliRunner().invoke(cli, ["preview", str(tmp_path / "src"), "-o", str(tmp_path / "s.png")])
    assert result.exit_code == 0, result.output
    assert "sample 0 (a/bad.jpg) could not be read" in result.output and "Traceback" not in result.output
    assert Image.open(tmp_path / "s.png").size[0] > 0
    train = CliRunner().invoke(cli, ["preview", str(tmp_path / "src"), "-o", str(tmp_path / "t.png"), "--train"])
    assert train.exit_code == 2 and "--train" in train.output


def test_compare_draws_each_source_image_beside_its_stored_sample_with_the_same_boxes(outputs, tmp_path):
    source = outputs["npy"].parent / "images"
    coco = outputs["npy"].parent / "coco.json"
    sheet = tmp_path / "compare.png"
    args = ["--compare", source, "--annotations", coco, "--box-coords", "stored"]
    result = run(outputs["boxes"], "-o", sheet, *args, "--samples", "2", "--grid", "2x1", "--tile", TILE)
    assert result.exit_code == 0, result.output
    drawn = np.asarray(Image.open(sheet).convert("RGB"))
    assert drawn.shape == (TILE + CAPTION, 2 * TILE, 3)
    for column in (0, 1):  # left the source image, right the stored sample: the box at one place
        left, top = column * TILE + 10 + 5 * 2, (TILE - 64) // 2 + 12
        edge = drawn[top + 10, left : left + 2]
        assert any(np.abs(px.astype(int) - PALETTE[0]).max() <= 2 for px in edge), (column, edge)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "left").mkdir(parents=True)
    Image.fromarray(np.full((8, 8, 3), 50, np.uint8)).save(elsewhere / "left" / "other.png")
    missing = run(outputs["npy"], "-o", tmp_path / "m.png", "--compare", elsewhere, "--samples", "0")
    assert missing.exit_code == 0 and f"left/0.png is not in {elsewhere}" in missing.output
    assert run(outputs["npy"], "-o", tmp_path / "a.png", "--annotations", coco).exit_code == 2
