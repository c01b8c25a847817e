"""Where a conversion's samples come from, chosen once (``sample_source``): a caller's discovery
(``Given``, a split's), a folder walked or a container read (``Walked``, the walk possibly watched
by the early start), or what an interrupted run saved in its staging folder (``Saved``, walked again
when a folder of the tree changed). Each gives the samples with the checks every conversion makes
before any work, and says which discovery the run saves for ``--resume``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from packer.output.files import check_output, staging_dir
from packer.sources.containers import container_kind, discover_container
from packer.sources.discover import Discovery, discover
from packer.sources.saved_discovery import can_save
from packer.sources.saved_discovery import load as load_discovery
from packer.sources.walk import WalkWatcher, is_packer_folder
from packer.spec.errors import DecodeError, InputError
from packer.spec.source_kinds import IMAGE_EXTENSIONS, TEXT_EXTENSIONS
from packer.spec.text import TextConfig


class SampleSource:
    """Where the samples of one conversion come from."""

    def find(self) -> Discovery:
        """The samples, checked (see ``checked``); raises a PackerError for what the user must fix."""
        raise NotImplementedError

    def to_save(self, found: Discovery) -> Optional[Discovery]:
        """The discovery the run saves in its staging folder for ``--resume`` (None: nothing to save)."""
        return None


@dataclass
class Given(SampleSource):
    """A discovery the caller made (a split of a set of outputs): only checked."""

    discovery: Discovery
    source: Path
    output: Path
    overwrite: bool
    strict: bool
    text: TextConfig

    def find(self) -> Discovery:
        check_output(self.output, self.overwrite, self.source)
        return checked(self.discovery, self.strict, self.text)


@dataclass
class Walked(SampleSource):
    """A folder walked (``on_walk`` watches the walk: the early start) or a container read."""

    source: Path
    output: Path
    labels_file: Optional[str | os.PathLike]
    overwrite: bool
    strict: bool
    text: TextConfig
    classes: Optional[Sequence[str]]
    add_classes: bool
    processes: int
    on_walk: Optional[WalkWatcher] = None

    def find(self) -> Discovery:
        return discover_checked(
            self.source,
            self.output,
            self.labels_file,
            self.overwrite,
            self.strict,
            self.text,
            self.classes,
            self.add_classes,
            self.processes,
            on_walk=self.on_walk,
        )

    def to_save(self, found: Discovery) -> Optional[Discovery]:
        return found if can_save(found) else None


@dataclass
class Saved(SampleSource):
    """What the interrupted run saved (``options``: the discovery options it was saved with), taken
    while no folder of the tree changed; otherwise the tree is walked again (``walk``). ``lock``
    takes the output's lock first: the saved discovery is read under it."""

    walk: Walked
    options: dict
    lock: Callable[[], None]
    walked_again: bool = False

    def find(self) -> Discovery:
        self.lock()
        found = reused_discovery(
            self.walk.source, self.walk.output, self.walk.overwrite, self.walk.strict, self.walk.text, self.options
        )
        if found is not None:
            return found
        self.walked_again = True
        return self.walk.find()

    def to_save(self, found: Discovery) -> Optional[Discovery]:
        return self.walk.to_save(found) if self.walked_again else None


def sample_source(
    walk: Walked, discovery: Optional[Discovery], resuming: bool, options: dict, lock: Callable[[], None]
) -> SampleSource:
    """The one source of a conversion's samples: ``discovery`` when the caller gives it, what an
    interrupted run saved when ``resuming`` one (its staging folder is there), else ``walk``."""
    if discovery is not None:
        return Given(discovery, walk.source, walk.output, walk.overwrite, walk.strict, walk.text)
    if resuming:
        return Saved(walk, options, lock)
    return walk


def reused_discovery(
    source: Path, output: Path, overwrite: bool, strict: bool, text: TextConfig, options: dict
) -> Optional[Discovery]:
    """What the interrupted run in ``output``'s staging folder found in ``source``, if no folder of the
    tree changed since (``packer.sources.saved_discovery``), after the checks ``discover_checked``
    makes; None where it must be walked again."""
    check_output(output, overwrite, source)
    refuse_packer_output(source)
    if not source.is_dir() or container_kind(source) is not None:
        return None
    found = load_discovery(staging_dir(output), source, options)
    return checked(found, strict, text) if found is not None else None


def discover_checked(
    source: str | os.PathLike,
    output: Path,
    labels_file: Optional[str | os.PathLike],
    overwrite: bool,
    strict: bool,
    text: TextConfig = TextConfig(),
    classes: Optional[Sequence[str]] = None,
    add_classes: bool = False,
    processes: int = 1,
    on_walk: Optional[WalkWatcher] = None,
) -> Discovery:
    """The checks every conversion makes before any work: the output may be written, the source
    has samples, and with ``strict`` discovery skipped none; then what discovery found (``text``
    says which fields make a sample, ``classes`` the class map, see ``packer.convert``;
    ``processes`` and ``on_walk`` may walk a folder source, see ``discover``)."""
    check_output(output, overwrite, Path(source))
    refuse_packer_output(Path(source))
    kind = container_kind(Path(source))
    if kind is not None:
        if labels_file is not None or (text.fields and tuple(text.fields) != ("image",)):
            raise InputError(
                f"{source} is a {kind} source: its images are labelled by their own column or member; "
                "--labels and --fields do not apply"
            )
        found, places = discover_container(Path(source), kind, classes, add_classes)
        found.places = places
        return checked(found, strict, text)
    if Path(source).is_file():
        raise InputError(
            f"{source} is a file: give a folder of images, a .parquet file or a .tar of WebDataset samples"
        )
    found = discover(source, labels_file, text.fields, text.allow_missing, classes, add_classes, processes, on_walk)
    if not found.items and labels_file is not None and found.skipped:
        raise InputError(
            f"none of the {len(found.skipped)} samples under {source} is listed in {labels_file}; "
            "its paths must be relative to the source folder, e.g. 'cat/001.jpg'"
        )
    return checked(found, strict, text)


def refuse_packer_output(source: Path) -> None:
    """InputError for a packer output (or a folder of split outputs) given as the source folder: walked
    for files, its report.txt would become a text sample and its shards litter. ``packer.repack``
    converts an output into another format from its own shards."""
    if not is_packer_folder(source):
        return
    if (source / "manifest.json").is_file():
        raise InputError(
            f"{source} is a packer output, not a folder of source files: repack it with packer convert "
            f"{source} -f FORMAT -o OUTPUT (from Python: packer.repack)"
        )
    raise InputError(
        f"{source} holds split outputs (splits.json), not source files: repack each split on its own "
        f"(packer convert {source / 'train'} -f FORMAT -o OUTPUT, ...)"
    )


def checked(found: Discovery, strict: bool, text: TextConfig = TextConfig()) -> Discovery:
    """``found`` once it passes the checks on what was found: it has samples, the fields the text
    options need, and with ``strict`` nothing skipped."""
    source = found.root
    if not found.items:
        if found.skipped:
            raise InputError(
                f"no usable samples in {source}: all {len(found.skipped)} were skipped; first: "
                f"{found.skipped[0].path}: {found.skipped[0].reason}"
            )
        looked = ", ".join(sorted(IMAGE_EXTENSIONS | TEXT_EXTENSIONS))
        raise InputError(f"no images or texts found in {source} (looked for {looked})")
    if (text.tokenizer is not None or text.max_length is not None) and "text" not in found.fields:
        raise InputError(
            f"--tokenizer tokenizes text, but the samples in {source} have no text field "
            f"(fields: {', '.join(found.fields)}); pass --fields with text, or leave --tokenizer out"
        )
    if strict and found.skipped:
        first = found.skipped[0]
        raise DecodeError(first.path, first.reason)
    return found
