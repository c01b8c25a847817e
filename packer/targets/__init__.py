"""The targets a conversion carries beside its images (none, boxes, masks), chosen once per run."""

from packer.targets.attached import Boxes, Masks, NoTargets, Targets, targets_for

__all__ = ["Targets", "NoTargets", "Boxes", "Masks", "targets_for"]
