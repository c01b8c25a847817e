"""The class map: which class name each label index stands for, its digest, and class map files.

Two outputs agree on their labels exactly when their class maps are equal, so every output records
its map (``classes``) and a digest of it (``class_map_sha256``), and a later conversion can take its
map from a file or from an existing output (``--classes``, ``packer.ops.splits.read_class_map``)
instead of from its own folders. A leaf module: the manifest imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

from packer.spec.errors import InputError

log = logging.getLogger(__name__)

MAX_SHOWN = 10  # class names quoted in one message


def class_map_digest(classes: Optional[Sequence[str]]) -> Optional[str]:
    """SHA-256 of the class map (its names, in index order, as a compact JSON list); None when unlabelled."""
    if classes is None:
        return None
    text = json.dumps(list(classes), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_class_file(path: str | os.PathLike) -> list[str]:
    """The class names in a text file, one per line in index order (blank lines ignored; a YOLO
    ``classes.txt`` is one); InputError for a missing or unreadable file, a name given twice, or none."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--classes {path}: no such file or packer output")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"--classes {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InputError(f"--classes {path} cannot be read: {e.strerror or e}") from None
    names: list[str] = []
    where: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        if name in where:
            raise InputError(f"--classes {path}:{lineno}: class {name!r} is listed twice (first on line {where[name]})")
        where[name] = lineno
        names.append(name)
    if not names:
        raise InputError(f"--classes {path} names no class (one class name per line)")
    return names


def extend_class_map(given: Sequence[str], found: Iterable[str], add: bool, where: str) -> list[str]:
    """``given`` with the ``found`` class names that it lacks appended (sorted) when ``add``; InputError naming
    them otherwise (``where``: the source they were found in)."""
    known = set(given)
    new = sorted(set(found) - known)
    if new and not add:
        raise InputError(
            f"{where} has {len(new)} class(es) that the class map of --classes lacks: {quoted(new)}; "
            f"pass --add-classes to append them at the end (from index {len(given)}), or fix the "
            "class map"
        )
    if new:
        log.warning("appending %d class(es) to the class map from index %d: %s", len(new), len(given), quoted(new))
    return [*given, *new]


def quoted(names: Sequence[str]) -> str:
    """Up to ``MAX_SHOWN`` names, quoted and comma-separated, with a count of the rest."""
    shown = ", ".join(repr(n) for n in names[:MAX_SHOWN])
    return shown + (f" and {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else "")


def differences(a: Sequence[str], b: Sequence[str]) -> str:
    """How class map ``b`` differs from ``a``, in words (for refusals that must say what to fix)."""
    only_a = [n for n in a if n not in set(b)]
    only_b = [n for n in b if n not in set(a)]
    parts = []
    if only_a:
        parts.append(f"only the first has {quoted(only_a)}")
    if only_b:
        parts.append(f"only the second has {quoted(only_b)}")
    if not parts:
        moved = [f"{n!r} is {i} and {b.index(n)}" for i, n in enumerate(a) if b.index(n) != i]
        parts.append("the same names at other indices: " + ", ".join(moved[:MAX_SHOWN]))
    return "; ".join(parts)
