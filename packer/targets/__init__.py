"""The targets a conversion carries beside its images (none, boxes, masks), chosen once per run."""

from packer.targets.attached import Boxes, Masks, Targets, targets_for

__all__ = ["Targets", "Boxes", "Masks", "targets_for"]
