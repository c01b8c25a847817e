"""The human-readable report written beside the manifest: what was packed and what was left out."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from packer.spec.manifest import Manifest

REPORT_NAME = "report.txt"


def reason_kind(reason: str) -> str:
    """The category of a skip reason: the text before its first colon."""
    return reason.split(":", 1)[0]


def shown(path: str) -> str:
    """A path as printed on one line: escaped when it holds newlines or other control characters."""
    return path if path.isprintable() else repr(path)[1:-1]


def source_counts(m: Manifest) -> str:
    """How a ``--codec source`` output stored its images: kept as the source files' bytes, re-encoded."""
    kept = sum(stop - start for s in m.shards for start, stop in (s.image_sources or {}).get("kept", []))
    jpeg = sum((s.image_sources or {}).get("jpeg", 0) for s in m.shards)
    png = sum((s.image_sources or {}).get("png", 0) for s in m.shards)
    quality = m.fields["image"].get("quality")
    return f"the source files' bytes ({kept:,} kept; re-encoded: {jpeg:,} as JPEG quality {quality}, {png:,} as PNG)"


def render_report(m: Manifest) -> str:
    """Plain-text report of an output: counts, skipped files by reason, duplicates, empty classes."""
    if m.tokens is not None:
        t = m.tokens
        lines = [
            f"packer {m.packer_version}: {m.samples} blocks of {t.block} tokens ({t.packing}) in {len(m.shards)} "
            f"{m.format} shard(s) from {m.source.get('files', '?')} corpus file(s)",
            f"{t.documents} documents, {t.tokens} tokens, {t.stored} stored, {t.padding} padding positions "
            f"({100 * t.padding_share(m.samples):.2f}%), {t.dropped} tokens not stored",
        ]
    else:
        lines = _sample_lines(m)
    if m.skipped:
        kinds = Counter(reason_kind(s["reason"]) for s in m.skipped)
        lines += [
            "",
            f"skipped {len(m.skipped)} file(s) or document(s):" if m.tokens else f"skipped {len(m.skipped)} file(s):",
        ]
        for kind, count in kinds.most_common():
            lines.append(f"  {count} x {kind}")
        lines.append("")
        lines += [f"  {shown(s['path'])}: {s['reason']}" for s in m.skipped]
    if m.duplicates:
        lines += [
            "",
            f"{sum(len(g) for g in m.duplicates)} file(s) in {len(m.duplicates)} group(s) "
            "have identical bytes (all were packed):",
        ]
        lines += ["  " + "  ==  ".join(shown(k) for k in group) for group in m.duplicates]
    near = (m.near_duplicates or {}).get("groups") or []
    if near:
        lines += [
            "",
            f"{sum(len(g) for g in near)} image(s) in {len(near)} group(s) are near-duplicates (perceptual hashes "
            f"within {m.near_duplicates['distance']} bits; all were packed):",  # type: ignore[index]
        ]
        lines += ["  " + "  ~  ".join(shown(k) for k in group) for group in near]
    ignored = m.source.get("ignored") or {}
    if ignored:
        parts = ", ".join(f"{ext} x{n}" for ext, n in ignored.items())
        lines += ["", f"ignored {sum(ignored.values())} file(s) that are not images: {parts}"]
    return "\n".join(lines) + "\n"


def _sample_lines(m: Manifest) -> list[str]:
    """The report's first lines for an output of samples: counts, how images are stored, classes."""
    lines = [
        f"packer {m.packer_version}: {m.samples} samples in {len(m.shards)} {m.format} shard(s) "
        f"from {m.source.get('files', '?')} {'image file(s)' if m.sample_fields == ('image',) else 'source samples'}",
    ]
    if m.has_image and m.fields["image"].get("codec") == "source":
        lines.append(f"images stored as {source_counts(m)}")
    if m.classes is not None and m.class_counts is not None:
        lines.append("")
        lines.append("samples per class:")
        lines += [f"  {name}: {count}" for name, count in zip(m.classes, m.class_counts)]
        empty = [name for name, count in zip(m.classes, m.class_counts) if count == 0]
        if empty:
            lines.append(f"WARNING: {len(empty)} class(es) have no samples: {', '.join(empty)}")
    return lines


def write_report(path: Path, manifest: Manifest) -> None:
    """Write ``render_report(manifest)`` to ``path``."""
    path.write_text(render_report(manifest), encoding="utf-8")
