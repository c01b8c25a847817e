"""The raw-folder baseline: the same samples as a packer reader gives, bad files left out."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tree

from packer import ConvertConfig, PreprocessConfig, convert
from packer.advisor.folder import FolderDataset, folder_items
from packer.spec.errors import InputError
from readers import open_dataset


@pytest.mark.parametrize("normalize", ["imagenet", "none"])
def test_folder_samples_equal_the_readers(image_tree, tmp_path, normalize):
    (image_tree / "bee" / "broken.png").write_bytes(b"not a png")
    mean, std = ((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)) if normalize == "imagenet" else (None, None)
    pre = PreprocessConfig(size=(20, 12), resize="pad", mean=mean, std=std)
    out = tmp_path / "out"
    convert(image_tree, out, ConvertConfig("npy", pre), workers=1)
    reader = open_dataset(out)
    items = folder_items(image_tree, reader.manifest)
    assert len(items) == len(reader) == 15  # broken.png, skipped by the conversion, is left out
    folder = FolderDataset(items, PreprocessConfig.from_dict(reader.manifest.preprocess))
    for i in range(len(reader)):
        (a, la), (b, lb) = reader[i], folder[i]
        assert la == lb and a.dtype == b.dtype == torch.float32 and torch.allclose(a, b, atol=1e-6)


def test_folder_items_need_an_image(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no usable images"):
        folder_items(tmp_path / "empty")
    make_tree(tmp_path / "flat" / "x", {"only": 2})
    assert [label for _, label in folder_items(tmp_path / "flat" / "x")] == [0, 0]  # unlabelled: 0 as a label


def test_uint8_when_not_normalizing(image_tree):
    folder = FolderDataset(folder_items(image_tree), PreprocessConfig(size=(8, 8)), normalize=False)
    image, label = folder[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 8, 8) and label == 0
