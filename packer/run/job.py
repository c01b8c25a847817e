"""One conversion as asked for: a frozen record built once from the options, validated in one place.

``ConvertJob.validate`` is where packer says which options cannot go together; the CLI turns its
``ConfigError`` into a usage message (exit 2), and ``packer.convert`` calls it before any work, so
that a refusal comes before a long walk of the source, not after it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer.config import ConvertConfig
from packer.records import ShardTask
from packer.run.executor import DEFAULT_TIMEOUT, Executor, ProgressFn
from packer.sources.containers import container_kind
from packer.sources.discover import Discovery
from packer.spec.errors import ConfigError


@dataclass(frozen=True)
class Selection:
    """Which samples a conversion takes and how they are labelled: a ``--labels`` file instead of class
    folders, ``--classes`` (the class map, or the categories' order with boxes), ``--add-classes``."""

    labels_file: Optional[str | os.PathLike] = None
    classes: Optional[Sequence[str]] = None
    add_classes: bool = False


@dataclass(frozen=True)
class ConvertJob:
    """Everything one conversion was asked to do (see ``packer.convert`` for each option).

    ``splits``: the source is cut into split outputs (``--split``, or split folders), each converted
    as a job of its own; ``nodes``: the number of machines of a static split (``--num-nodes``), or
    None; ``ray``: the shards run on a Ray cluster.
    """

    source: Path
    output: Path
    config: ConvertConfig
    selection: Selection = Selection()
    workers: Optional[int] = None
    overwrite: bool = False
    strict: bool = False
    resume: bool = False
    timeout: float = DEFAULT_TIMEOUT
    executor: Optional[Executor] = None
    progress: Optional[ProgressFn] = None
    on_plan: Optional[Callable[[Discovery, list[ShardTask]], None]] = None
    discovery: Optional[Discovery] = None
    splits: bool = False
    nodes: Optional[int] = None
    ray: bool = False
    drop_against: tuple[Path, ...] = ()
    """With ``--drop-duplicates``: outputs (earlier splits) whose images' near-duplicates are left out too."""

    def validate(self) -> ConvertJob:
        """This job, once its options go together; ConfigError naming the two that do not and what to do."""
        config, chosen = self.config, self.selection
        targets = "--annotations" if config.detection is not None else "--masks" if config.masks is not None else None
        if chosen.add_classes and chosen.classes is None:
            raise ConfigError("--add-classes extends the class map of --classes; give --classes too")
        if config.masks is not None and (chosen.labels_file is not None or chosen.classes is not None):
            raise ConfigError(
                "--labels and --classes label images by class; with --masks the labels are the masks' "
                "indices: leave them out"
            )
        if config.detection is not None and chosen.labels_file is not None:
            raise ConfigError(
                "--labels labels images by class; with --annotations the labels are the boxes' categories: "
                "leave it out (--classes orders the categories)"
            )
        if targets is not None and self._container_source():
            raise ConfigError(
                f"{self.source} is a container of images: --annotations and --masks pair boxes and masks with "
                "image files; convert the images of a folder"
            )
        if targets is not None and self.splits:
            raise ConfigError(
                f"{targets} with splits: convert each split on its own with its annotations or masks, or pass "
                "--no-splits"
            )
        if self.nodes is not None:
            if targets is not None:
                raise ConfigError(
                    f"{targets} with --num-nodes is not supported yet: convert on one machine or with --executor ray"
                )
            if self.splits:
                raise ConfigError(
                    "--num-nodes converts one output; convert each split on its own, with the same --classes"
                )
            if self.ray:
                raise ConfigError(
                    "--num-nodes splits a conversion for schedulers without Ray; with --executor ray, "
                    "Ray spreads the shards over the cluster by itself"
                )
            if self.resume:
                raise ConfigError(
                    "--resume is implied with --num-nodes: a node run again redoes only its unfinished shards"
                )
            if config.drop_duplicates:
                raise ConfigError(
                    "--drop-duplicates with --num-nodes: a node sees only its own shards' images; convert on one "
                    "machine or with --executor ray"
                )
        return self

    def _container_source(self) -> bool:
        """Whether the samples come from a container (Parquet, a saved dataset, a tar of samples)."""
        if self.discovery is not None:
            return self.discovery.places is not None
        return container_kind(self.source) is not None
