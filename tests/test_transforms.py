"""Reader transforms as torchvision's pipelines expect them (issue 21, item 3): the stored uint8
pixels in, the output's normalization after a transform that leaves uint8, never twice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FORMATS, pack_every_format
from PIL import Image

from packer import PreprocessConfig
from packer.config import IMAGENET_MEAN, IMAGENET_STD
from packer.spec.errors import ConfigError
from readers import make_loader, open_dataset

MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict:
    return pack_every_format(tmp_path_factory, {"ant": 4, "bee": 4}, PreprocessConfig(size=(12, 10)), 4)


def first(ds):
    return next(iter(ds))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_transform_gets_the_stored_uint8_pixels(outputs, fmt):
    seen = []
    ds = open_dataset(outputs[fmt], transform=lambda image: seen.append(image) or image)
    raw = first(open_dataset(outputs[fmt], normalize=False))[0]
    image, _ = first(ds)
    assert seen[0].dtype == torch.uint8 and seen[0].shape == (3, 10, 12) and torch.equal(seen[0], raw)
    # it returned uint8: normalized after it, exactly as the reader without a transform gives it
    assert image.dtype == torch.float32 and torch.allclose(image, first(open_dataset(outputs[fmt]))[0])


def test_a_v2_style_pipeline_that_normalizes_itself_is_not_normalized_again(outputs):
    """ToImage, ToDtype(float32, scale=True), Normalize(IMAGENET), written with torch ops: the values
    ImageFolder would give, within float rounding (once -11.4 to 9.9: normalized twice)."""

    def pipeline(image: torch.Tensor) -> torch.Tensor:
        return (image.to(torch.float32) / 255 - MEAN) / STD

    ds = open_dataset(outputs["npy"], transform=pipeline)
    raw = open_dataset(outputs["npy"], normalize=False)
    for i in range(len(ds)):
        want = (raw[i][0].to(torch.float32) / 255 - MEAN) / STD
        assert torch.allclose(ds[i][0], want, atol=1e-6)
    assert -2.2 < float(ds[0][0].min()) and float(ds[0][0].max()) < 2.7


def test_a_flip_on_uint8_is_a_flip_of_the_normalized_image(outputs):
    flipped = open_dataset(outputs["lmdb"], transform=lambda image: image.flip(-1))
    plain = open_dataset(outputs["lmdb"])
    assert torch.allclose(flipped[3][0], plain[3][0].flip(-1))


def test_a_pipeline_that_wants_a_pil_image_says_so_or_gets_one(outputs):
    def to_tensor(pic):  # what torchvision's classic ToTensor does with a tensor
        if not isinstance(pic, Image.Image):
            raise TypeError(f"pic should be PIL Image or ndarray. Got {type(pic)}")
        return torch.from_numpy(np.asarray(pic, dtype=np.float32) / 255).permute(2, 0, 1)

    with pytest.raises(TypeError, match="open the dataset with transform_input='pil'"):
        open_dataset(outputs["hdf5"], transform=to_tensor)[0]
    ds = open_dataset(outputs["hdf5"], transform=to_tensor, transform_input="pil")
    raw = open_dataset(outputs["hdf5"], normalize=False)[0][0]
    assert torch.allclose(ds[0][0], raw.to(torch.float32) / 255)  # float from the pipeline: left as it is


def test_make_loader_batches_what_the_transform_gives(outputs):
    ds = open_dataset(outputs["npy"], transform=lambda image: image.flip(-2))
    images, labels = next(iter(make_loader(ds, 4, shuffle=False, num_workers=0)))
    plain = open_dataset(outputs["npy"])
    assert images.dtype == torch.float32 and torch.allclose(images[1], plain[1][0].flip(-2))
    assert labels.tolist() == [0, 0, 0, 0]


def test_float_storage_gives_the_transform_its_stored_values(tmp_path_factory):
    floats = pack_every_format(tmp_path_factory, {"ant": 2}, PreprocessConfig(size=(8, 8), dtype="float32"), 4)
    seen = []
    ds = open_dataset(floats["npy"], transform=lambda image: seen.append(image) or image)
    image, _ = ds[0]
    assert seen[0].dtype == torch.float32 and torch.equal(image, open_dataset(floats["npy"])[0][0])


def test_a_transform_assigned_after_opening_is_used(outputs):
    """ImageFolder code sets ``ds.transform = val_tf`` on an open dataset (or ``subset.dataset``)."""
    ds = open_dataset(outputs["npy"])
    plain = ds[2][0]
    ds.transform = lambda image: image.flip(-1)
    assert torch.allclose(ds[2][0], plain.flip(-1))
    images, _ = next(iter(make_loader(ds, 4, shuffle=False, num_workers=0)))
    assert torch.allclose(images[2], plain.flip(-1))
    ds.transform = None
    assert torch.equal(ds[2][0], plain) and ds[2][0].dtype == torch.float32


def test_transform_input_normalized_keeps_the_old_contract(outputs):
    """packer 0.2.0's transforms got normalized floats: ``transform_input="normalized"`` still does."""
    seen = []
    ds = open_dataset(outputs["npy"], transform=lambda image: seen.append(image) or image, transform_input="normalized")
    assert torch.equal(ds[1][0], open_dataset(outputs["npy"])[1][0]) and seen[0].dtype == torch.float32
    with pytest.raises(ConfigError, match="transform_input must be one of"):
        open_dataset(outputs["npy"], transform_input="numpy")
