"""scripts/bench.py: the baseline the peers and the floor run is Pillow alone, on the same task as packer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_image

from packer.config import PreprocessConfig
from packer.pixels import jpeg
from packer.pixels.preprocess import load_image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench  # noqa: E402


@pytest.mark.parametrize("size, mode", [((500, 375), "RGB"), ((375, 500), "RGB"), ((333, 250), "L")])
def test_peer_load_gives_packers_full_decode_pixels_without_packers_decoder(tmp_path, monkeypatch, size, mode):
    path = write_image(tmp_path / "x.jpg", size, mode, seed=sum(size), quality=90)
    expected = load_image(path, PreprocessConfig(reduced_decode=False))

    def refuse(*args, **kwargs):
        raise AssertionError("the peers' baseline went through packer's libjpeg-turbo decoder")

    monkeypatch.setattr(jpeg.simplejpeg, "decode_jpeg", refuse)
    got = bench.load(str(path))
    assert got.dtype == np.uint8 and got.shape == (224, 224, 3)
    assert np.array_equal(got, expected)


def _task(rows: list[dict], **more) -> dict:
    """A training-task result of 3 images, 2 workers, 1 epoch, with ``rows`` (what bench_train.run gives)."""
    return {
        "images": 3,
        "workers": 2,
        "epochs": 1,
        "default_bytes": 2**20,
        "default_convert_s": 1.0,
        "rows": rows,
        **more,
    }


def test_training_task_folder_pipeline_and_table(tmp_path):
    import bench_train

    for i in range(3):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg", (120, 90), seed=i, quality=90)
    items = bench_train.items_of(tmp_path / "src")
    assert [label for _, label in items] == [0, 0, 1]
    image, label = bench_train.FolderTrainSet(items)[2]
    assert image.shape == (3, 224, 224) and str(image.dtype) == "torch.float32"
    assert label == 1 and -3 < float(image.min()) < float(image.max()) < 3  # normalized, not 0..255
    results = _task(
        [
            {"tool": "packer", "stored": "max 256, raw", "rate": 300.0, "bytes": 2**21, "convert_s": 1.0},
            {"tool": "FFCV", "stored": "max 256, raw", "rate": 200.0, "bytes": 2**21, "convert_s": 1.0},
            {
                "tool": "folder (Pillow, torchvision-style)",
                "stored": "source files",
                "rate": 100.0,
                "bytes": 2**20,
                "convert_s": 0.0,
            },
        ]
    )
    table = bench_train.markdown(results)
    assert "| packer | max 256, raw | 300 | 3.00x | 1.50x | 2.0 | 1.0 |" in table
    # uint8 batches (the GPU path) against FFCV's float32 channels-last batches, its default
    both = [*results["rows"], {"tool": "packer", "stored": "max 256, raw, uint8 batches", "rate": 900.0}]
    both.append({"tool": "FFCV", "stored": "max 256, raw, channels-last", "rate": 450.0})
    for row in both[3:]:
        row.update(bytes=2**21, convert_s=1.0)
    table = bench_train.markdown(_task(both))
    assert "| packer | max 256, raw, uint8 batches | 900 | 9.00x | 2.00x | 2.0 | 1.0 |" in table
    # With rounds: medians, and each ratio's range over the rounds' own pairs.
    results["rounds"] = 3
    results["rows"][0].update(rates=[300.0, 280.0, 330.0], rate=bench_train.median([300.0, 280.0, 330.0]))
    results["rows"][1].update(rates=[200.0, 140.0, 220.0], rate=200.0)
    results["rows"][2].update(rates=[100.0, 100.0, 110.0], rate=100.0)
    table = bench_train.markdown(results)
    assert "| packer | max 256, raw | 300 | 3.00x [2.80-3.00] | 1.50x [1.50-2.00] | 2.0 | 1.0 |" in table
    assert "3 rounds (medians" in table
    assert "| folder (Pillow, torchvision-style) | source files | 100 | 1.00x |  |" in table
    assert bench_train.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    costs = bench_train.source_costs(items)
    assert set(costs) == {"keep_ms", "eighth_decode_ms", "default_ms"} and all(v > 0 for v in costs.values())
    results["source_costs"] = {"keep_ms": 0.5, "eighth_decode_ms": 0.4, "default_ms": 1.25}
    results["rows"].append(
        {
            "tool": "packer",
            "stored": "none, source",
            "rate": 150.0,
            "bytes": 2**20,
            "convert_s": 0.5,
            "convert_runs": [0.5],
        }
    )
    results["default_convert_runs"] = [1.0]
    table = bench_train.markdown(results)
    assert "2.00x the speed of the default conversion (each round: 2.00x)" in table
    assert (
        "check of a kept JPEG 0.500 ms (its 1/8-scale decode alone 0.400 ms), the default preprocessing "
        "1.250 ms: at most 2.50x" in table
    )


def test_training_task_measures_the_region_decode_against_whole_decodes(tmp_path):
    import bench_train

    from readers import RandomResizedCrop, make_loader, open_dataset

    for i in range(6):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg", (400, 300), seed=i, quality=90)
    out = tmp_path / "npy-max-jpeg"
    bench_train.packer_convert(tmp_path / "src", out, "jpeg", 1)
    costs = bench_train.crop_decode_costs(out)
    assert costs["whole_ms"] > 0 and costs["region_ms"] > 0 and 0 < costs["cut"] <= 1

    def first_batch():
        ds = open_dataset(out, crop=RandomResizedCrop(224), flip=True)
        return next(iter(make_loader(ds, 6, num_workers=0)))[0]

    # The GPU path's row reads the same crops as uint8, unnormalized (NHWC bytes)
    uint8 = next(iter(bench_train.packer_loader(out, 0, normalize=False)))[0]
    assert uint8.dtype == torch.uint8 and tuple(uint8.shape) == (6, 3, 224, 224)
    assert uint8.is_contiguous(memory_format=torch.channels_last)

    # The baseline decodes every file whole, and gives the same batch: the two rows time equal work.
    region = first_batch()
    with bench_train.whole_jpeg_decodes():
        from readers.augment import render

        assert render._region(b"", "RGB", None) is None
        whole = first_batch()
    assert render._region.__name__ == "_region"
    assert torch.equal(region, whole)
    folder = {"tool": "folder (Pillow, torchvision-style)", "stored": "source files", "rate": 100.0}
    folder.update(bytes=2**20, convert_s=0.0)
    table = bench_train.markdown(_task([folder], crop_decode_costs={"whole_ms": 0.2, "region_ms": 0.125, "cut": 0.97}))
    assert "the whole file 0.200 ms, the MCUs under the box alone 0.125 ms (1.60x; 97% of the boxes cut" in table


def test_training_task_compares_with_the_fastest_folder_pipeline_and_names_its_host():
    import bench_train

    from packer.advisor.host import describe_host

    row = {"stored": "source files", "bytes": 2**20, "convert_s": 0.0}
    results = _task(
        [
            {
                "tool": "packer",
                "stored": "max 256, raw, channels-last",
                "rate": 600.0,
                "bytes": 2**21,
                "convert_s": 1.0,
            },
            {"tool": "FFCV", "stored": "max 256, raw, channels-last", "rate": 200.0, "bytes": 2**21, "convert_s": 1.0},
            {
                "tool": "FFCV (os_cache)",
                "stored": "max 256, raw, channels-last",
                "rate": 300.0,
                "bytes": 2**21,
                "convert_s": 1.0,
            },
            {"tool": "folder (Pillow, torchvision-style)", "rate": 100.0, **row},
            {"tool": "SPDL folder pipeline (4 threads)", "rate": 150.0, **row},
        ],
        machine=describe_host().to_dict(),
    )
    table = bench_train.markdown(results)
    assert table.startswith(describe_host().line())
    assert "vs folder: against the fastest folder pipeline here, SPDL folder pipeline (4 threads)" in table
    assert "| packer | max 256, raw, channels-last | 600 | 4.00x | 2.00x | 2.0 | 1.0 |" in table  # FFCV's faster
    assert "| folder (Pillow, torchvision-style) | source files | 100 | 0.67x |  |" in table


def test_scale_tree_is_byte_distinct_32px_jpegs_and_extrapolates_through_the_two_largest(tmp_path):
    import bench_scale
    from PIL import Image

    root = bench_scale.make_tree(tmp_path / "tree", 60, folders=3)
    files = sorted(root.rglob("*.jpg"))
    assert [f.relative_to(root).as_posix() for f in files[:2]] == ["c0/0000000.jpg", "c0/0000003.jpg"]
    assert len({f.read_bytes() for f in files}) == 60  # the COM segment makes every file distinct
    with Image.open(files[-1]) as img:
        assert img.size == (32, 32) and img.format == "JPEG"
    (root / "c0" / "0000000.jpg").unlink()
    assert bench_scale.make_tree(tmp_path / "tree", 60, folders=3) == root  # complete: reused as it is
    assert not (root / "c0" / "0000000.jpg").exists()
    slope, intercept, at = bench_scale.extrapolate([(10, 99.0), (100, 2.0), (1000, 11.0)], at=10_000)
    assert (slope, intercept, at) == (0.01, 1.0, 101.0)
    assert "| 1,000 | npy | 2.50 |" in bench_scale.table(["size", "format", "s"], [[1000, "npy", 2.5]], markdown=True)


def test_a_recorded_runs_chart_is_drawn_again_with_its_host_date_and_commit(tmp_path, monkeypatch):
    import matplotlib.figure

    from packer.advisor.host import describe_host

    read = {"float32/N": 900.0, "uint8/N": 2000.0}
    record = {
        "images": 3000,
        "workers": 2,
        "rows": [
            {"tool": "packer", "format": "npy/raw", "convert": {"images_per_s": 1100.0}, "read": read},
            {"tool": "litdata", "format": "npy bytes", "convert": {"images_per_s": 700.0}, "read": read},
        ],
        "machine": describe_host().to_dict(),
        "floor": 900.0,
        "plain": {"float32/N": 100.0, "uint8/N": 120.0},
        "date": "2026-12-05",
        "commit": "abc1234",
    }
    (tmp_path / "bench.json").write_text(json.dumps(record))
    titles = []
    real = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.figure.Figure, "suptitle", lambda self, t, **kw: titles.append(t) or real(self, t, **kw)
    )
    chart = tmp_path / "chart.png"
    monkeypatch.setattr(sys, "argv", ["bench.py", "--plot-from", str(tmp_path / "bench.json"), "--plot", str(chart)])
    bench.main()
    assert chart.read_bytes().startswith(b"\x89PNG")
    host = record["machine"]
    where = f"{host['cpu']}, {host['cores']} cores, {host['simd']}"
    assert titles == [f"packer bench: 3000 images, 2 workers; {where}; 2026-12-05, abc1234"]


def test_the_readmes_pictures_are_in_docs_images():
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    for name in ("sample_data.png", "bench.png"):
        assert f"docs/images/{name}" in readme
        assert (root / "docs" / "images" / name).read_bytes().startswith(b"\x89PNG")
    record = json.loads((root / "docs" / "images" / "bench.json").read_text())
    assert record["date"] and record["commit"] and record["machine"]["cpu"]  # where and when it was measured


def test_the_classification_tables_put_packer_against_the_faster_folder_pipeline():
    from packer.advisor.host import describe_host

    plain = {"float32/0": 100.0, "float32/N": 180.0, "uint8/0": 110.0, "uint8/N": 200.0, "peak": 2**30}
    spdl = {"float32/0": 90.0, "float32/N": 240.0, "uint8/0": 95.0, "uint8/N": 190.0, "float32/N_threads": 4}
    read = {"float32/0": 900.0, "float32/N": 1200.0, "uint8/0": 1000.0, "uint8/N": 2000.0, "peak": 2**30}
    convert = {"images_per_s": 1100.0, "ratio": 1.1, "bytes": 2**20}
    results = {
        "images": 3000,
        "workers": 2,
        "repeat": 1,
        "floor": 900.0,
        "own_floor": 1000.0,
        "machine": {**describe_host().to_dict(), "python": "3.11", "torch": "2.13"},
        "plain": plain,
        "spdl": spdl,
        "rows": [{"tool": "packer", "format": "npy/raw", "convert": convert, "read": read}],
    }
    table = bench.markdown(results)
    assert "| SPDL folder pipeline (threads) | - | - | - | - | - | - | - | 90 (0.9x) | 240 (1.3x) |" in table
    # each read against the faster of the two: SPDL's float32 with threads, the plain one elsewhere
    assert "float32/N 240 (SPDL)" in table and "uint8/N 200 (plain)" in table
    assert "| npy/raw | 9.0x | 5.0x | 9.1x | 10.0x |" in table
    del results["spdl"]  # SPDL not installed: the plain folder alone, as before
    assert "SPDL" not in bench.markdown(results)
