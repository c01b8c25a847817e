"""Reading a Pascal VOC annotations folder into ``Annotations`` (see ``packer.targets.annotations``)."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from packer.records import Skipped
from packer.targets.annotation_records import Annotations, ImageBoxes, box_problem, finite_number, mark_problem


def read_voc(path: Path) -> Annotations:
    """A Pascal VOC ``Annotations`` folder: one ``REL/NAME.xml`` per image ``REL/NAME.*`` with its ``size``
    and ``object``s (``name``, ``bndbox`` of 1-based inclusive pixel indices, ``difficult``). Categories
    are the names found, sorted. A file or object that cannot be used marks its image (skipped)."""
    problems: list[Skipped] = []
    raw: dict[str, dict] = {}
    for folder, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            if not name.lower().endswith(".xml"):
                continue
            file = Path(folder) / name
            key = file.relative_to(path).with_suffix("").as_posix()
            where = f"{path.name}/{file.relative_to(path).as_posix()}"
            try:
                root = ElementTree.parse(file).getroot()
            except (ElementTree.ParseError, OSError, RecursionError) as e:
                problem = f"bad annotation: {where} is not readable XML ({e})"
                problems.append(Skipped(where, problem))
                raw[key] = {"objects": [], "size": None, "where": where, "problem": problem}
                continue
            size, problem = None, None
            w, h = root.findtext("size/width"), root.findtext("size/height")
            try:
                if w and h and w.strip() and h.strip():
                    fw, fh = float(w), float(h)
                    if not (fw.is_integer() and fh.is_integer() and fw > 0 and fh > 0):
                        raise ValueError
                    size = (int(fw), int(fh))
            except ValueError:
                problem = f"bad annotation: size {w!r} x {h!r} is not a whole positive width and height ({where})"
                problems.append(Skipped(where, problem))
            objects = []
            for n, obj in enumerate(root.iter("object")):
                label = obj.findtext("name")
                try:
                    box = tuple(
                        finite_number(float(obj.findtext(f"bndbox/{k}") or "x"))
                        for k in ("xmin", "ymin", "xmax", "ymax")
                    )
                    # VOC counts pixels from 1, both ends included: pixel edges are xmin - 1 .. xmax
                    x0, y0, x1, y1 = box[0] - 1, box[1] - 1, box[2], box[3]
                    bad = None if label and label.strip() else "an object needs a name"
                    bad = bad or box_problem(x0, y0, x1, y1)
                    if bad:
                        raise ValueError(bad)
                except ValueError as e:
                    reason = f"bad annotation: {e or 'bndbox needs numeric xmin, ymin, xmax, ymax'}"
                    problem = mark_problem(problems, problem, f"{where}#object[{n}]", reason)
                    continue
                difficult = int((obj.findtext("difficult") or "0").strip() == "1")
                objects.append((label.strip(), (x0, y0, x1, y1), difficult))
            raw[key] = {"objects": objects, "size": size, "where": where, "problem": problem}
    names = sorted({o[0] for r in raw.values() for o in r["objects"]})
    index = {n: i for i, n in enumerate(names)}
    records = {
        key: ImageBoxes(
            tuple(o[1] for o in r["objects"]),
            tuple(index[o[0]] for o in r["objects"]),
            r["where"],
            r["size"],
            difficult=tuple(o[2] for o in r["objects"]),
            problem=r["problem"],
        )
        for key, r in raw.items()
    }
    return Annotations("voc", names, list(names), records, problems)
