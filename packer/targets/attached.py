"""The targets attached to a conversion's samples, as one object chosen once (``targets_for``).

A conversion carries no targets, detection boxes (``--annotations``) or segmentation masks
(``--masks``). Each kind is a small class with what the rest of the run asks of it: pair the
discovered images with their targets (``attach``), give each shard's worker its part (``job_for``),
say what ``--resume`` must find unchanged (``digest``) and what the manifest records
(``summary``). Nothing else in the run asks which kind it has.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from packer.config import ConvertConfig, DetectionConfig, MaskConfig
from packer.records import ShardTask
from packer.sources.discover import Discovery
from packer.sources.source_stamps import source_stamp
from packer.spec.errors import InputError
from packer.targets.detection import DetectionJob, Matched, annotations_digest, match_targets
from packer.targets.segmentation import mask_job, match_masks


class Targets:
    """No targets: the images (or texts) are the samples. The base of the kinds that carry some."""

    def attach(self, found: Discovery, classes: Optional[Sequence[str]], add_classes: bool) -> Discovery:
        """``found`` with the images that cannot carry their targets skipped (with the reason), numbered again."""
        return found

    def job_for(self, task: ShardTask) -> dict[str, Any]:
        """The part of ``task``'s ``ShardJob`` that is its targets' (keyword arguments of ``ShardWork.job``)."""
        return {}

    def digest(self) -> str:
        """What ``--resume`` must find unchanged of the targets ("" without)."""
        return ""

    def summary(self) -> Optional[dict]:
        """What the manifest records of the targets (the annotations' counts), or None."""
        return None


class Boxes(Targets):
    """Detection boxes (and polygons) from ``--annotations``, carried through the geometry."""

    def __init__(self, config: DetectionConfig) -> None:
        self.config = config
        self.matched: Optional[Matched] = None

    def attach(self, found: Discovery, classes: Optional[Sequence[str]], add_classes: bool) -> Discovery:
        """Pair every image with its annotations (``packer.targets.detection.match_targets``); ``classes``
        orders the categories (``add_classes``: append those it lacks)."""
        _images_only(found, "--annotations pairs boxes")
        self.matched = match_targets(found, self.config, classes, add_classes)
        return self.matched.found

    def job_for(self, task: ShardTask) -> dict[str, Any]:
        matched = self._matched()
        targets = {it.index: matched.targets.get(it.index) for it in task.items}
        return {"detection": DetectionJob(targets, self.config.min_visibility, self.config.coords)}

    def digest(self) -> str:
        return annotations_digest(self._matched(), self.config)

    def summary(self) -> Optional[dict]:
        return self._matched().summary

    def _matched(self) -> Matched:
        if self.matched is None:
            raise RuntimeError("the boxes are asked for before attach paired them with the images")
        return self.matched


class Masks(Targets):
    """Segmentation masks from ``--masks`` (a folder, or files beside the images), carried through the geometry."""

    def __init__(self, config: MaskConfig) -> None:
        self.config = config
        self.files: Optional[dict[int, str]] = None

    def attach(self, found: Discovery, classes: Optional[Sequence[str]], add_classes: bool) -> Discovery:
        """Pair every image with its mask file (``packer.targets.segmentation.match_masks``)."""
        _images_only(found, "--masks pairs masks")
        found, self.files = match_masks(found, self.config)
        return found

    def job_for(self, task: ShardTask) -> dict[str, Any]:
        return {"segmentation": mask_job(self._files(), self.config, task.items)}

    def digest(self) -> str:
        """The mask files' stamps, as the images' are compared."""
        files = self._files()
        return "".join(f"\0{i}\0{files[i]}\0{source_stamp(files[i])}" for i in sorted(files))

    def _files(self) -> dict[int, str]:
        if self.files is None:
            raise RuntimeError("the masks are asked for before attach paired them with the images")
        return self.files


def _images_only(found: Discovery, what: str) -> None:
    """InputError where the samples found are not images alone: targets pair with image files."""
    if found.fields != ("image",):
        raise InputError(
            f"{what} with images, but the samples of {found.root} have the fields {', '.join(found.fields)}; "
            "pass --fields image"
        )


def targets_for(config: ConvertConfig) -> Targets:
    """The targets ``config`` asks for: boxes, masks or none (it refuses both at once)."""
    if config.detection is not None:
        return Boxes(config.detection)
    if config.masks is not None:
        return Masks(config.masks)
    return Targets()
