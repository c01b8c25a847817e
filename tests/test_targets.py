"""packer.targets: the kind of targets is chosen once from the options, and each kind gives the run
what it asks (the worker's part, the resume digest, the manifest's summary)."""

from __future__ import annotations

import os

import pytest
from conftest import make_tree, write_image

from packer import ConvertConfig
from packer.config import DetectionConfig, MaskConfig
from packer.records import ShardTask
from packer.sources.discover import discover
from packer.spec.errors import InputError
from packer.targets.attached import Boxes, Masks, Targets, targets_for


def test_the_kind_is_chosen_from_the_options():
    assert type(targets_for(ConvertConfig("npy"))) is Targets
    assert isinstance(targets_for(ConvertConfig("npy", detection=DetectionConfig("a.json", "coco"))), Boxes)
    assert isinstance(targets_for(ConvertConfig("npy", masks=MaskConfig("masks"))), Masks)


def test_no_targets_leave_the_samples_and_the_jobs_alone(tmp_path):
    make_tree(tmp_path / "src", {"cat": 2})
    found = discover(tmp_path / "src")
    targets = Targets()
    assert targets.attach(found, None, False) is found
    assert targets.job_for(ShardTask("shard-00000", tuple(found.items))) == {}
    assert targets.digest() == "" and targets.summary() is None


def test_masks_pair_each_image_with_its_file_and_stamp_it_for_resume(tmp_path):
    src, masks = tmp_path / "src", tmp_path / "masks"
    make_tree(src, {"cat": 2})
    for name in ("img_000", "img_001"):
        write_image(masks / "cat" / f"{name}.png", (64, 48), mode="L")
    targets = Masks(MaskConfig(str(masks)))
    with pytest.raises(RuntimeError, match="before attach"):
        targets.digest()
    found = targets.attach(discover(src), None, False)
    assert [it.relpath for it in found.items] == ["cat/img_000.png", "cat/img_001.png"]
    job = targets.job_for(ShardTask("shard-00000", tuple(found.items)))["segmentation"]
    assert sorted(job.masks.values()) == sorted(str(p) for p in sorted(masks.rglob("*.png")))
    first = targets.digest()
    path = masks / "cat" / "img_000.png"
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a mask touched: resume must see it
    assert targets.digest() != first


def test_targets_pair_only_with_image_samples(tmp_path):
    src = tmp_path / "src"
    make_tree(src, {"cat": 1})
    (src / "cat" / "img_000.txt").write_text("a caption")
    found = discover(src)
    assert found.fields == ("image", "text")
    with pytest.raises(InputError, match="--masks pairs masks with images, but the samples of .* pass --fields image"):
        Masks(MaskConfig(str(tmp_path))).attach(found, None, False)
