"""``ShardJob``, everything a worker needs to write one shard (plain values, no open object), and
``ShardWork``, what every shard of one run shares: the one place a ``ShardJob`` is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from packer.config import ConvertConfig, PreprocessConfig
from packer.records import ShardTask
from packer.sources.containers import ContainerJob
from packer.sources.repack_shard import RepackJob
from packer.spec.sample_layout import SampleLayout
from packer.spec.text import TextConfig
from packer.targets.detection import DetectionJob
from packer.targets.segmentation import SegmentationJob


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to write one shard.

    ``number`` is the shard's position in the plan; ``poisoned`` maps item indices to a reason
    for items known to crash or hang the decoder, which are skipped without being opened.
    ``strict`` makes the first bad file an error instead of a skip.
    """

    number: int
    task: ShardTask
    format: str
    layout: SampleLayout
    preprocess: PreprocessConfig
    directory: str
    strict: bool = False
    poisoned: dict[int, str] = field(default_factory=dict)
    text: TextConfig = field(default_factory=TextConfig)
    detection: Optional[DetectionJob] = None
    """Detection outputs: each item's annotations and the crop rule (``packer.targets.detection``)."""
    segmentation: Optional[SegmentationJob] = None
    """Segmentation outputs: each item's mask file (``packer.targets.segmentation``)."""
    container: Optional[ContainerJob] = None
    """Sources that are containers (``packer.sources.containers``): where the items' images are inside them."""
    repack: Optional[RepackJob] = None
    """Repacking a packer output: where its samples are (``packer.repack``); the items are dataset
    indices into it, each with the path of its source shard's first file, whose stamp --resume compares."""
    record: bool = False
    """Write the finished shard's record (``packer.output.files.record_shard``) in ``directory`` here, and
    return the result with its per-sample values left in it (``ShardResult.kept_in``): the parent then
    never holds a shard's keys, labels and digests, nor the text of its record."""
    plan_fingerprint: str = ""
    """With ``record``: the fingerprint of the run's plan, written into the record
    (``packer.output.files.PLAN_OF_RECORD``)."""
    looks: bool = False
    """Hash each stored image (``packer.pixels.looks``) into the result's ``looks``."""


@dataclass(frozen=True)
class ShardWork:
    """What every shard of one run shares: its format and layout, preprocessing, the folder the
    shards are written into, strictness and text options. ``job`` makes each shard's ``ShardJob``:
    the one place one is built."""

    format: str
    layout: SampleLayout
    directory: str
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    strict: bool = False
    text: TextConfig = field(default_factory=TextConfig)
    looks: bool = False

    @classmethod
    def of(cls, config: ConvertConfig, layout: SampleLayout, directory: str, strict: bool = False) -> ShardWork:
        """The shared part of a conversion's shards, from its options."""
        looks = config.image_hashes and layout.has_image
        return cls(config.format, layout, directory, config.preprocess, strict, config.text, looks)

    def job(self, number: int, task: ShardTask, **own: Any) -> ShardJob:
        """Shard ``number`` of the run, writing ``task``; ``own``: what is its own (its items' detection
        targets, masks, container places or repacked shards; ``record``)."""
        return ShardJob(
            number,
            task,
            self.format,
            self.layout,
            self.preprocess,
            self.directory,
            self.strict,
            text=self.text,
            looks=self.looks,
            **own,
        )
