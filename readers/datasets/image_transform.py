"""A reader's ``transform`` called as torchvision's pipelines expect: on the stored uint8 tensor or a PIL
image, the output's normalization after it when it still gives uint8 (``ImageTransform``)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from PIL import Image

from readers.datasets.samples import Transform
from readers.datasets.tensors import BatchNormalize

TRANSFORM_INPUTS = ("tensor", "pil", "normalized")
"""What a reader's transform gets: the stored uint8 tensor, a PIL image, or (``normalized``, packer
0.2.0's way) the normalized float32 tensor."""


class ImageTransform:
    """A reader's ``transform`` as torchvision's pipelines expect to be called on ImageFolder's images.

    The transform gets the stored pixels: a uint8 C x H x W tensor (what torchvision v2's
    ``ToImage`` gives, so v2 pipelines take it as they are), or with ``input="pil"`` a PIL image
    (for classic pipelines that start with ``ToTensor``). When the reader normalizes and what the
    transform returns is still a uint8 image, the output's normalization is applied to it then;
    a pipeline that makes floats (``ToDtype(scale=True)``, ``Normalize``) is left as it made them,
    never normalized twice. Outputs stored as floats are already normalized: the transform gets
    them as they are.
    """

    def __init__(self, transform: Transform, normalize: Optional[BatchNormalize], input: str = "tensor") -> None:
        self.transform, self.normalize, self.input = transform, normalize, input

    def __call__(self, image: Any) -> Any:
        if self.input == "pil" and torch.is_tensor(image) and image.dtype == torch.uint8:
            image = _pil(image)
        try:
            out = self.transform(image)
        except TypeError as e:
            if "PIL" in str(e) and self.input != "pil":
                raise TypeError(
                    f"{e}. This transform wants a PIL image (torchvision's classic transforms, such "
                    "as ToTensor, do): open the dataset with transform_input='pil', or use "
                    "torchvision.transforms.v2, which takes the uint8 tensor the reader gives"
                ) from e
            raise
        if self.normalize is not None and torch.is_tensor(out) and out.dtype == torch.uint8 and out.dim() == 3:
            out = self.normalize(out)
        return out


def _pil(image: torch.Tensor) -> Any:
    """A PIL image of a uint8 C x H x W tensor (RGB or L)."""

    hwc = image.permute(1, 2, 0).numpy()
    return Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc, "L" if hwc.shape[2] == 1 else "RGB")


__all__ = ["ImageTransform", "TRANSFORM_INPUTS"]
