"""Reading a YOLO labels folder (and its class names) into ``Annotations`` (see ``packer.targets.annotations``)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from packer.records import Skipped
from packer.spec.errors import InputError
from packer.targets.annotation_records import Annotations, ImageBoxes, box_problem, finite_number, mark_problem

YOLO_CLASS = re.compile(r"[0-9]+")


def read_yolo(path: Path) -> Annotations:
    """A YOLO labels folder: ``REL/NAME.txt`` per image ``REL/NAME.*``, a row ``class cx cy w h`` per box
    (fractions of the image), class names from ``classes.txt`` or the ``names`` of a ``data.yaml`` in
    the folder or the one above. An image's label file with a row that cannot be used marks the image
    (``ImageBoxes.problem``): it is skipped, never stored with an object missing."""
    names = _yolo_names(path)
    problems: list[Skipped] = []
    records: dict[str, ImageBoxes] = {}
    highest = -1
    for folder, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            if not name.lower().endswith(".txt") or name.lower() == "classes.txt":
                continue
            file = Path(folder) / name
            rel = file.relative_to(path).with_suffix("").as_posix()
            where = f"{path.name}/{rel}.txt"
            try:
                text = file.read_text(encoding="utf-8-sig")
            except (OSError, UnicodeDecodeError) as e:
                problem = f"bad annotation: cannot read {where} ({e})"
                problems.append(Skipped(where, problem))
                records[rel] = ImageBoxes((), (), where, normalized=True, problem=problem)
                continue
            boxes, labels, problem = [], [], None
            for lineno, line in enumerate(text.splitlines(), start=1):
                parts = line.split()
                if not parts:
                    continue
                try:
                    if len(parts) != 5:
                        raise ValueError(
                            f"expected 'class cx cy w h', got {len(parts)} values"
                            + (" (a segment: packer reads boxes)" if len(parts) > 5 else "")
                        )
                    if not YOLO_CLASS.fullmatch(parts[0]):
                        raise ValueError(f"class {parts[0]!r} is not a class number")
                    cls = int(parts[0])
                    cx, cy, w, h = (finite_number(float(v)) for v in parts[1:])
                    if names is not None and cls >= len(names):
                        raise ValueError(f"class {cls} is not in the class names ({len(names)} of them)")
                    box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
                    bad = box_problem(*box) or (
                        None
                        if all(-1e-6 <= v <= 1 + 1e-6 for v in (cx, cy, w, h))
                        else "values must be fractions of the image, 0..1"
                    )
                    if bad:
                        raise ValueError(bad)
                except ValueError as e:
                    problem = mark_problem(problems, problem, f"{where}:{lineno}", f"bad annotation: {e}")
                    continue
                highest = max(highest, cls)
                boxes.append(box)
                labels.append(cls)
            records[rel] = ImageBoxes(tuple(boxes), tuple(labels), where, normalized=True, problem=problem)
    categories = names if names is not None else [str(i) for i in range(highest + 1)]
    return Annotations("yolo", categories, list(range(len(categories))), records, problems, background=True)


def _yolo_names(path: Path) -> Optional[list[str]]:
    """The class names of a YOLO labels folder, or None when it has none (classes are then numbered)."""
    for folder in (path, path.parent):
        classes = folder / "classes.txt"
        if classes.is_file():
            from packer.spec.class_map import read_class_file

            return read_class_file(classes)
        for yaml_name in ("data.yaml", "dataset.yaml"):
            if (folder / yaml_name).is_file():
                return _yaml_names(folder / yaml_name)
    return None


def _yaml_names(path: Path) -> list[str]:
    import yaml  # PyYAML: Ultralytics' data.yaml is YAML, never parsed by hand

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
        names = data["names"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError) as e:
        raise InputError(f"{path}: cannot read its class names ('names: [...]'): {e}") from None
    if isinstance(names, dict):
        numbered = {int(k) if isinstance(k, str) and YOLO_CLASS.fullmatch(k) else k: v for k, v in names.items()}
        if sorted(numbered, key=str) != sorted(range(len(numbered)), key=str):
            raise InputError(f"{path}: 'names' must number the classes 0..{len(names) - 1}")
        names = [numbered[i] for i in range(len(numbered))]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise InputError(
            f"{path}: 'names' must be a list of class names as text (quote names such as yes, no, "
            "1.0 that YAML reads as other values)"
        )
    if len(set(names)) != len(names):
        raise InputError(f"{path}: two classes share a name in 'names'")
    return list(names)
