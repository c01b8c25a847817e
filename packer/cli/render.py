"""What the commands print about a conversion and an output: summaries, the info description, sizes."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

import click

from packer.ops.convert import ConvertResult
from packer.ops.nodes import NodeResult
from packer.ops.splits import SplitsResult, describe_leaks, describe_missing
from packer.output.report import REPORT_NAME, reason_kind, shown, source_counts
from packer.records import Skipped
from packer.spec.class_map import class_map_digest, differences, quoted
from packer.spec.errors import PackerError
from packer.spec.manifest import Manifest, read_manifest
from packer.spec.splits_record import SplitsRecord, splits_problems

SHOW_SKIPPED = 10  # skipped paths printed per reason; the manifest lists them all


def node_summary(result: NodeResult) -> None:
    """Print what one node of a ``--num-nodes`` split wrote, and the ``packer merge`` to run when all are done."""
    kept = result.shards - result.written
    output = shown_as(result.output)
    where = result.stage if output == str(result.output) else output  # a bucket: its parts, until the merge
    click.echo(
        f"packer: node {result.node.rank} of {result.node.nodes} wrote {result.written} shard(s)"
        f"{f' (and kept {kept} from an earlier run)' if kept else ''}, {result.samples} samples in all, "
        f"into {where} in {result.seconds:.1f} s; {result.total_shards} shard(s) in the plan"
    )
    if result.skipped:
        click.echo(f"skipped {len(result.skipped)} file(s) (listed in the report that packer merge writes)", err=True)
    click.echo(f"when every node is done: packer merge {output}")


def splits_summary(result: SplitsResult) -> None:
    """Print each split's summary, then the set: its splits, the shared class map, the classes splits lack."""
    record = result.record
    for name, split in result.results.items():
        if split is None:
            click.echo(f"packer: kept split {name} ({record.splits[name]['samples']} samples), finished and unchanged")
        else:
            summary(split)
    how = "random split" if record.origin.get("kind") == "random" else "split folders found"
    counts = ", ".join(f"{name} {entry['samples']}" for name, entry in record.splits.items())
    classes = (
        f"one class map of {len(record.classes)} classes (sha256 {record.class_map_sha256[:12]})"
        if record.classes is not None and record.class_map_sha256
        else "unlabelled"
    )
    if record.unlabelled:
        classes += f" ({', '.join(record.unlabelled)}: unlabelled, no class folders)"
    click.echo(f"packer: {how}: {counts} samples into {shown_as(result.output)}, {classes}, in {result.seconds:.1f} s")
    for line in describe_missing(record):
        click.echo(f"  {line} (their indices are kept)")
    for line in describe_leaks(result, shown=shown_as(result.output)):
        click.echo(f"warning: {line}", err=True)


_SHOWN: dict[str, str] = {}
"""Local folders shown as the place their output goes (a bucket: ``packer.cli.remote_output``)."""


def shown_as(path: Any) -> str:
    """``path`` as the user knows it: under a folder being uploaded, the URL it is uploaded to."""
    text = str(path)
    for local, url in _SHOWN.items():
        if text == local or text.startswith(local + os.sep):
            return url + text[len(local) :].replace(os.sep, "/")
    return text


@contextlib.contextmanager
def showing(local: Path, url: str) -> Iterator[None]:
    """Within the block, what is printed of ``local`` names ``url`` instead."""
    _SHOWN[str(local)] = url.rstrip("/")
    try:
        yield
    finally:
        _SHOWN.pop(str(local), None)


def summary(result: ConvertResult) -> None:
    """Print a finished conversion (or merge): what was written, and on stderr what was skipped or odd."""
    m = result.manifest
    rate = result.processed / result.seconds if result.seconds else 0.0
    click.echo(
        f"packer: wrote {m.samples} samples in {len(m.shards)} {m.format} shard(s), "
        f"{human(result.bytes)}, to {shown_as(result.output)} in {result.seconds:.1f} s"
        + (f" ({rate:.0f} {'images' if m.sample_fields == ('image',) else 'samples'}/s)" if result.processed else "")
    )
    report = result.output / REPORT_NAME
    skipped_summary(result.skipped, report)
    if m.classes and m.class_counts:
        empty = [name for name, count in zip(m.classes, m.class_counts) if count == 0]
        if empty:
            click.echo(f"warning: {len(empty)} class(es) have no samples: {', '.join(empty)}", err=True)
    if m.duplicates:
        click.echo(
            f"note: {sum(len(g) for g in m.duplicates)} files in {len(m.duplicates)} group(s) have identical "
            f"bytes (all packed; listed in {shown_as(report)})",
            err=True,
        )
    near = (m.near_duplicates or {}).get("groups") or []
    if near:
        click.echo(
            f"note: {sum(len(g) for g in near)} images in {len(near)} group(s) are near-duplicates "
            f"(all packed; listed in {shown_as(report)})",
            err=True,
        )
    if result.ignored:
        parts = ", ".join(f"{ext} x{n}" for ext, n in result.ignored.items())
        click.echo(f"ignored {sum(result.ignored.values())} file(s) that are not images ({parts})", err=True)


def skipped_summary(skipped: list[Skipped], report: Path, what: str = "file(s)") -> None:
    """Print on stderr how many ``skipped`` there are, by reason, with a few paths of each."""
    if not skipped:
        return
    reasons = Counter(reason_kind(s.reason) for s in skipped)
    click.echo(f"skipped {len(skipped)} {what}, all listed in {shown_as(report)}:", err=True)
    for kind, count in reasons.most_common():
        click.echo(f"  {count} x {kind}", err=True)
        for s in [s for s in skipped if reason_kind(s.reason) == kind][:SHOW_SKIPPED]:
            click.echo(f"      {shown(s.path)}: {s.reason}", err=True)


def append_summary(result, source) -> None:
    """Print a finished append (``packer.ops.append.AppendResult``): what was added, and what was reported."""
    m, output = result.manifest, shown_as(result.output)
    if not result.added and result.processed:
        click.echo(
            f"packer: nothing appended: none of the {result.processed} new file(s) of {source} could be packed; "
            f"{output} is unchanged"
        )
    elif not result.added:
        click.echo(f"packer: nothing to append: every sample of {source} is in {output} already")
    else:
        new = [h for h in m.history if h.get("action") == "append"][-1]
        click.echo(
            f"packer: appended {result.added} samples in {len(new['shards'])} new shard(s) to {output} "
            f"in {result.seconds:.1f} s; it now holds {m.samples} samples in {len(m.shards)} shard(s)"
        )
    if result.changed:
        click.echo(
            f"warning: {len(result.changed)} file(s) that {output} holds were modified after it was "
            f"written and are not packed again: {', '.join(result.changed[:SHOW_SKIPPED])}",
            err=True,
        )
    if result.removed:
        click.echo(
            f"warning: {len(result.removed)} sample(s) of {output} are no longer in {source} (still in "
            f"the output): {', '.join(result.removed[:SHOW_SKIPPED])}",
            err=True,
        )
    if result.skipped:
        where = f", all listed in {output}/{REPORT_NAME}" if result.added else ""
        click.echo(f"skipped {len(result.skipped)} new file(s){where}:", err=True)
        for s in result.skipped[:SHOW_SKIPPED]:
            click.echo(f"      {shown(s.path)}: {s.reason}", err=True)


def human(n: float) -> str:
    """A byte count in decimal units: ``512 B``, ``1.5 KB`` ... ``TB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n} B"


def describe(output: Path, m: Manifest) -> str:
    """The text ``packer info`` prints for the output at ``output`` with manifest ``m``."""
    if m.tokens is not None:
        return describe_tokens(output, m)
    pre = m.preprocess
    norm = pre.get("normalize")
    size = "x".join(map(str, pre["size"])) if pre.get("size") else "original"
    total = sum(f.bytes for s in m.shards for f in s.files)
    lines = [
        f"{output}: packer {m.format} output (format version {m.format_version}, packer {m.packer_version})",
        f"  samples   {m.samples} in {len(m.shards)} shard(s), {human(total)}",
        f"  classes   {len(m.classes)} (map sha256 {m.class_map_sha256[:12]}): {_classes(m)}"
        if m.classes is not None and m.class_map_sha256
        else "  classes   none (unlabelled)",
        f"  fields    {', '.join(m.sample_fields)}",
    ]
    if m.has_image:
        img = m.fields["image"]
        lines += [
            f"  image     {img['dtype']} {'x'.join(map(str, img['shape'])) if img['shape'] else 'variable size'} "
            f"(HWC), {pre['mode']}, {_codec(img, m)}",
            f"  resize    {_resize_line(pre, size)}",
            f"  normalize {_normalize(norm)}{' (applied by readers)' if img['dtype'] == 'uint8' else ' (stored)'}",
        ]
    for f in m.text_fields:
        lines += [f"  {line}" for line in f.kind_of.describe(f, m.annotations)]
    lines.append(f"  skipped   {len(m.skipped)} file(s){_kinds(m)}")
    lines += _stats(m.stats)
    if m.duplicates:
        lines.append(f"  identical {sum(len(g) for g in m.duplicates)} files in {len(m.duplicates)} group(s)")
    if m.near_duplicates is not None:
        near = m.near_duplicates.get("groups") or []
        lines.append(
            f"  similar   {sum(len(g) for g in near)} images in {len(near)} group(s) of near-duplicates "
            f"(hashes within {m.near_duplicates.get('distance')} bits)"
        )
    lines += [f"  history   {_event(h)}" for h in m.history]
    return "\n".join(lines)


def describe_tokens(output: Path, m: Manifest) -> str:
    """The text ``packer info`` prints for a token output."""
    s = m.tokens
    assert s is not None
    total = sum(f.bytes for shard in m.shards for f in shard.files)
    tok = s.tokenizer
    lines = [
        f"{output}: packer {m.format} token output (format version {m.format_version}, packer {m.packer_version})",
        f"  blocks    {m.samples:,} of {s.block} inputs ({s.block + 1} ids stored) in {len(m.shards)} shard(s), "
        f"{human(total)}, {s.packing} packing",
        f"  corpus    {s.documents:,} documents, {s.tokens:,} tokens, {s.stored:,} stored as {s.dtype} "
        f"({total / max(s.tokens, 1):.3f} bytes a token), padding {100 * s.padding_share(m.samples):.2f}%, "
        f"{s.dropped} dropped",
        f"  tokenizer {tok.get('file')} (sha256 {str(tok.get('sha256'))[:12]}), vocabulary {s.vocab_size:,}, "
        f"end-of-text id {s.eos}" + (f", beginning id {s.bos}" if s.bos is not None else ""),
        "  order     " + ("as read" if s.shuffle_seed is None else f"documents shuffled with seed {s.shuffle_seed}"),
        f"  skipped   {len(m.skipped)} document(s) or file(s){_kinds(m)}",
    ]
    lines += [f"  history   {_event(h)}" for h in m.history]
    return "\n".join(lines)


def _event(entry: dict) -> str:
    """One ``history`` entry of a manifest in words."""
    action = entry.get("action")
    if action == "append":
        added = f", classes added: {', '.join(entry['classes_added'])}" if entry.get("classes_added") else ""
        return (
            f"{entry.get('at', '?')}: appended {entry.get('samples')} samples in {len(entry.get('shards', []))} "
            f"shard(s) (packer {entry.get('packer_version')}{added})"
        )
    if action == "repack":
        was = entry.get("from", {})
        return (
            f"repacked from {was.get('format')} version {was.get('format_version')} ({was.get('codec')} images), "
            f"{entry.get('samples')} samples (packer {entry.get('packer_version')})"
        )
    if action == "combine":
        parts = ", ".join(f"{i.get('name')} ({i.get('samples')})" for i in entry.get("inputs", []))
        return f"combined from {parts} (packer {entry.get('packer_version')})"
    return str(entry)


def _stats(stats: Optional[dict]) -> list[str]:
    """The manifest's ``stats`` in a few lines (none for outputs of packers before they existed)."""
    if not stats:
        return []
    lines = []
    px = stats.get("pixels")
    if px:
        scale = "of pixel/255" if px["scale"] == "0..1" else "of the stored values"
        counted = f"; {px['counted']}: the std a little low" if px.get("counted") else ""
        lines.append(
            f"  pixels    mean {_floats(px['mean'])}, std {_floats(px['std'])} "
            f"({scale}, {px['count']:,} per channel{counted})"
        )
    sizes = stats.get("original_sizes")
    if sizes:
        bins = sizes["bins"]
        labels = [f"{a}-{b - 1}" for a, b in zip(bins, bins[1:])] + [f"{bins[-1]}+"]
        for name, side in (("widths", sizes["width"]), ("heights", sizes["height"])):
            if side["min"] is None:
                continue
            shown = ", ".join(f"{label}: {n}" for label, n in zip(labels, side["counts"]) if n)
            median = f", median {side['median']}" if side.get("median") is not None else ""  # unknown when combined
            lines.append(f"  {name:<9} {side['min']}..{side['max']}{median} (original; {shown})")
    return lines


def _normalize(norm: Optional[dict]) -> str:
    if not norm:
        return "none (0..1)"
    if norm.get("auto"):
        return f"mean {_floats(norm['mean'])} std {_floats(norm['std'])} (computed: --normalize auto)"
    return f"mean {norm['mean']} std {norm['std']}"


def _floats(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _codec(image: dict, m: Manifest) -> str:
    codec = image.get("codec", "raw")
    if codec == "source":
        return "stored as " + source_counts(m)
    return {"raw": "raw pixels", "png": "stored as PNG"}.get(codec, f"stored as JPEG quality {image.get('quality')}")


def _kinds(m: Manifest) -> str:
    kinds = Counter(reason_kind(s["reason"]) for s in m.skipped)
    return f" ({', '.join(f'{n} x {k}' for k, n in kinds.most_common())})" if kinds else ""


def describe_splits(output: Path, record: SplitsRecord) -> str:
    """The text ``packer info`` prints for a folder of splits: the set, then each split in brief."""
    how = (
        "a seeded stratified split ("
        + ", ".join(f"{k}={v:g}" for k, v in record.origin["fractions"].items())
        + f", seed {record.origin['seed']})"
        if record.origin.get("kind") == "random"
        else "split folders"
    )
    lines = [f"{output}: packer splits ({how}){'' if record.complete else ', UNFINISHED (run again with --resume)'}"]
    if record.classes is not None and record.class_map_sha256:
        shown = ", ".join(record.classes[:20]) + (" ..." if len(record.classes) > 20 else "")
        every = "every split" + (f" but {', '.join(record.unlabelled)} (unlabelled)" if record.unlabelled else "")
        lines.append(
            f"  classes   {len(record.classes)} (map sha256 {record.class_map_sha256[:12]}), one map for "
            f"{every}: {shown}"
        )
    else:
        lines.append("  classes   none (unlabelled)")
    for name, entry in record.splits.items():
        target = output / name
        try:
            m = read_manifest(target)
            line = f"{m.samples} samples, {m.format}, {human(sum(f.bytes for s in m.shards for f in s.files))}"
        except PackerError as e:
            line = f"not readable: {e}"
        absent = record.missing.get(name)
        lines.append(
            f"  {name:<9} {line}" + (f"; no sample of {len(absent)} class(es): {quoted(absent)}" if absent else "")
        )
    lines += [f"  problem   {p}" for p in splits_problems(output, record)]
    return "\n".join(lines)


def compare_class_maps(maps: list[tuple[str, Optional[list[str]]]]) -> str:
    """Whether the outputs ``(path, classes)`` share one class map; if not, which differ and how."""
    first_path, first = maps[0]
    differ = [(path, classes) for path, classes in maps[1:] if classes != first]
    if not differ:
        digest = class_map_digest(first)
        return (
            "class maps: all unlabelled"
            if first is None
            else f"class maps: all {len(maps)} equal (sha256 {digest[:12] if digest else '?'}): labels agree"
        )
    lines = [f"class maps DIFFER: a label means another class in these outputs than in {first_path}"]
    for path, classes in differ:
        if first is None or classes is None:
            lines.append(f"  {path}: {'unlabelled' if classes is None else 'labelled'}, the first is not")
        else:
            lines.append(f"  {path}: {differences(first, classes)}")
    lines.append(f"  convert them again with one map: packer convert ... --classes {first_path}")
    return "\n".join(lines)


def _classes(m: Manifest, most: int = 20) -> str:
    counts = m.class_counts or [None] * len(m.classes or [])
    shown = [f"{name} ({n})" if n is not None else name for name, n in zip(m.classes or [], counts)]
    return ", ".join(shown[:most]) + (" ..." if len(shown) > most else "")


def _resize_line(pre: dict, size: str) -> str:
    """How the images were resized and cropped, for ``packer info``."""
    if not pre.get("size"):
        line = "none (each image keeps its size)"
    elif pre["resize"] == "shorter":
        line = f"shorter side to {pre['size'][0]}, aspect kept, {pre['interpolation']}"
    elif pre["resize"] == "max":
        line = f"longer side at most {pre['size'][0]}, aspect kept, never enlarged, {pre['interpolation']}"
    else:
        line = f"{pre['resize']} to {size}, {pre['interpolation']}"
        if pre["resize"] == "shorter-crop":
            line += f", {pre.get('geometry', 'fractional')} geometry"
    if pre.get("crop"):
        line += f", then the centre {pre['crop'][0]}x{pre['crop'][1]}"
    return line
