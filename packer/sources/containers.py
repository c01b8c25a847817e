"""Sources that are not folders of image files: Parquet files and Hugging Face datasets saved to
disk (read through pyarrow), and WebDataset tar shards.

Each becomes a ``Discovery`` like a folder's: one item per image, keyed, labelled and sorted by
key, so the preprocessing, reports, resume and guarantees are a folder's. An item's ``path`` is
the container file (its stamp is what ``--resume`` compares); the worker gets the bytes of its
shard's images from a ``ContainerJob`` instead of opening files.

- **Parquet** (a ``.parquet`` file, or a folder of them and nothing else) and **a Hugging Face
  dataset saved with ``save_to_disk``** (a folder with ``state.json`` and ``*.arrow`` files): the
  image column is a binary column, or a struct of ``bytes`` and ``path`` (the ``datasets`` Image
  feature): the first column named ``image``, ``img``, ``jpg`` or ``png``, else the first such
  column. The label column is ``label``, ``labels``, ``class``, ``target`` or ``cls``: integers
  named by the ``datasets`` ClassLabel feature recorded with the data (``dataset_info.json``, or
  the Parquet schema's ``huggingface`` metadata), else ``"0"``, ``"1"``, ...; or strings, the class
  names (sorted). A sample's key is the image's recorded ``path`` when every row has a distinct one,
  else ``FILE/ROW`` (the file's stem and the row number, 8 digits).
- **WebDataset tar shards** (a ``.tar`` file, or a folder of them and nothing else): the samples
  are the ``KEY.EXT`` members sharing a key; the image is the member with an image extension
  (``jpg``, ``png``, ...), the label ``KEY.cls`` (an integer) or the ``label`` of ``KEY.json``; the
  key is ``SHARD/KEY``.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Optional, Sequence

from packer.pixels.read import read_source
from packer.records import UNLABELLED, Skipped, SourceItem
from packer.sources.discover import Discovery
from packer.spec.class_map import extend_class_map
from packer.spec.errors import DecodeError, InputError
from packer.spec.source_kinds import IMAGE_EXTENSIONS

IMAGE_COLUMNS = ("image", "img", "jpg", "png")
LABEL_COLUMNS = ("label", "labels", "class", "target", "cls")


@dataclass(frozen=True)
class ContainerJob:
    """Where the images of one shard's items are: for each item (in the shard's order), ``(file,
    row)`` of an Arrow or Parquet file (``kind`` ``arrow``/``parquet``, the image in ``column``), or
    ``(tar file, data offset, size)`` (``kind`` ``tar``)."""

    kind: str
    column: str
    places: tuple[tuple, ...]


def container_kind(source: Path) -> Optional[str]:
    """``parquet``, ``arrow`` (a saved Hugging Face dataset) or ``tar`` when ``source`` is such a
    container (or a folder holding nothing but such files), None for a folder of files."""
    if source.is_file():
        return {".parquet": "parquet", ".tar": "tar"}.get(source.suffix.lower())
    if not source.is_dir():
        return None
    if (source / "state.json").is_file() and any(source.glob("*.arrow")):
        return "arrow"
    files = [p for p in source.iterdir() if p.is_file() and not p.name.startswith(".")]
    suffixes = {p.suffix.lower() for p in files}
    if files and suffixes <= {".parquet", ".json", ".md"} and ".parquet" in suffixes:
        return "parquet"
    if (
        files
        and suffixes <= {".tar", ".json", ".idx", ".md"}
        and ".tar" in suffixes
        and not (source / "manifest.json").is_file()
    ):
        return "tar"
    return None


def discover_container(
    source: Path, kind: str, classes: Optional[Sequence[str]] = None, add_classes: bool = False
) -> tuple[Discovery, dict[int, tuple]]:
    """The samples of the container ``source`` and, per item index, where its image is (see the module)."""
    if kind == "tar":
        raw = _tar_samples(source)
    else:
        raw = _arrow_samples(source, kind)
    return _discovery(source, raw, classes, add_classes)


def _files(source: Path, suffix: str) -> list[Path]:
    return [source] if source.is_file() else sorted(p for p in source.iterdir() if p.suffix.lower() == suffix)


# -- Arrow and Parquet ------------------------------------------------------------------------------------------------


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise InputError(
            "reading Parquet files and saved Hugging Face datasets needs pyarrow: pip install "
            "'packer-datasets[parquet]'"
        ) from None
    import pyarrow as pa

    return pa


def _arrow_table(path: str, kind: str, columns: Optional[list[str]] = None):
    """The table of one Arrow stream file (memory-mapped: nothing copied) or the ``columns`` of a
    Parquet file (all when None)."""
    pa = _pyarrow()
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=columns)
    # Not closed here: the table's buffers are views of the mapping (closed when they are collected).
    return pa.ipc.open_stream(pa.memory_map(path)).read_all()


def _schema(path: str, kind: str):
    """The schema of one Arrow or Parquet file, read without its data (Parquet)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_schema(path)
    return _arrow_table(path, kind).schema


def _features(source: Path, kind: str, schema) -> dict:
    """The ``datasets`` features recorded with the data, if any: ``{column: feature}``."""
    try:
        if kind == "arrow":
            info = json.loads((source / "dataset_info.json").read_text(encoding="utf-8"))
            return info.get("features") or {}
        meta = (schema.metadata or {}).get(b"huggingface")
        return (json.loads(meta).get("info", {}).get("features") or {}) if meta else {}
    except (OSError, ValueError, AttributeError):
        return {}


def _arrow_samples(source: Path, kind: str) -> dict:
    """``{"rows": [(key, file, row, label value)], "names": ClassLabel names or None, ...}``."""
    pa = _pyarrow()
    rows, names, image_column, label_kind = [], None, None, None
    paths: list[Optional[str]] = []
    for path in _files(source, ".arrow" if kind == "arrow" else ".parquet"):
        try:
            schema = _schema(str(path), kind)
            column = _image_column(schema, pa)
            if column is None:
                raise InputError(
                    f"{path} has no image column (binary, or a struct with bytes: {schema.names}); "
                    f"name it one of {', '.join(IMAGE_COLUMNS)}"
                )
            if image_column not in (None, column):
                raise InputError(f"{path} keeps its images in {column!r}, the files before it in {image_column!r}")
            image_column = column
            label = next((c for c in LABEL_COLUMNS if c in schema.names), None)
            field = schema.field(column)
            has_path = pa.types.is_struct(field.type) and field.type.get_field_index("path") >= 0
            # Parquet: the label and the images' paths alone, not the images' bytes.
            wanted = [c for c in (label, f"{column}.path" if has_path else None) if c]
            table = _arrow_table(str(path), kind, wanted if kind == "parquet" else None)
        except (pa.ArrowInvalid, OSError) as e:
            raise InputError(f"{path} cannot be read as {'Arrow' if kind == 'arrow' else 'Parquet'}: {e}") from None
        features = _features(source, kind, schema)
        if label is not None:
            feature = features.get(label) or {}
            if feature.get("_type") == "ClassLabel" or "names" in feature:
                names = list(feature.get("names") or [])
            kind_here = _label_kind(path, label, schema.field(label).type)
            if label_kind is not None and kind_here != label_kind:
                raise InputError(
                    f"{source}: the {label!r} column holds class indices in some files and class names "
                    f"in others ({path.name}); give every file one kind of label"
                )
            label_kind = kind_here
        labels = table.column(label).to_pylist() if label is not None else [None] * table.num_rows
        if label is not None and pa.types.is_floating(schema.field(label).type):
            labels = [_whole(v, path, label) for v in labels]
        if has_path:
            found = table.column(column) if kind == "arrow" else table.column(len(wanted) - 1)
            paths += (found.combine_chunks().field("path") if kind == "arrow" else found).to_pylist()
        else:
            paths += [None] * table.num_rows
        rows += [(f"{path.stem}/{r:08d}", str(path.resolve()), r, labels[r]) for r in range(table.num_rows)]
    if paths and all(paths) and len(set(paths)) == len(paths):  # the images' own paths make the better keys
        if all(os.path.isabs(p) for p in paths):  # no absolute paths in an output: relative to their common folder
            common = os.path.commonpath([os.path.dirname(p) for p in paths])
            paths = [os.path.relpath(p, common) for p in paths]
        rows = [(PurePosixPath(p).as_posix(), f, r, lab) for p, (_, f, r, lab) in zip(paths, rows)]
    return {"rows": rows, "names": names, "column": image_column, "label_kind": label_kind, "kind": kind}


def _image_column(schema, pa) -> Optional[str]:
    usable = [
        f.name
        for f in schema
        if pa.types.is_binary(f.type)
        or pa.types.is_large_binary(f.type)
        or (pa.types.is_struct(f.type) and f.type.get_field_index("bytes") >= 0)
    ]
    return next((c for c in IMAGE_COLUMNS if c in usable), usable[0] if usable else None)


def _label_kind(path: Path, column: str, kind) -> str:
    """``int`` (class indices) or ``str`` (class names) for a label column of Arrow type ``kind``;
    floats count as indices (pandas writes integers with a missing value as floats). Anything else is
    refused: its values are not one class per sample."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "int"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    raise InputError(
        f"{path}: its label column {column!r} is of type {kind}, neither class indices (integers) nor "
        "class names (strings); multi-label and other labels are not supported: convert without that "
        "column, or give --labels"
    )


def _whole(value, path: Path, column: str) -> Optional[int]:
    """A float label as the class index it stands for (None stays missing); a fraction is refused."""
    if value is None or value != value:  # NaN: a missing label
        return None
    if float(value).is_integer():
        return int(value)
    raise InputError(f"{path}: its label column {column!r} holds {value}, not a class index")


# -- WebDataset tar shards --------------------------------------------------------------------------------------------


def _tar_samples(source: Path) -> dict:
    """The samples of tar shards: ``{"rows": [(key, tar, offset, size, label value)], ...}``."""
    rows, skipped = [], []
    label_kind = None
    for path in _files(source, ".tar"):
        groups: dict[str, dict[str, tuple[int, int]]] = {}
        try:
            with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
                last = None
                for member in tar:
                    if not member.isfile():
                        continue
                    base, _, ext = PurePosixPath(member.name).name.partition(".")
                    key = str(PurePosixPath(member.name).parent / base) if "/" in member.name else base
                    members = groups.setdefault(key, {})
                    if (key != last and members) or ext.lower() in members:
                        # A reader of the tar takes them as two samples; grouped by key, one would overwrite the other.
                        raise InputError(f"{path}: the key {key!r} comes twice ({member.name}); keys must be unique")
                    members[ext.lower()] = (member.offset_data, member.size)
                    last = key
                labels = {}
                for key, members in groups.items():
                    for ext in ("cls", "json"):
                        if ext in members:
                            offset, size = members[ext]
                            f.seek(offset)
                            labels[key] = (ext, f.read(min(size, 1 << 16)))
                            break
        except (tarfile.TarError, OSError) as e:
            raise InputError(f"{path} is not a readable tar file ({e})") from None
        for key, members in groups.items():
            image = next((e for e in members if f".{e}" in IMAGE_EXTENSIONS), None)
            where = f"{path.stem}/{key}"
            if image is None:
                skipped.append(Skipped(where, f"no image member (found {', '.join(sorted(members))})"))
                continue
            value = None
            if key in labels:
                ext, data = labels[key]
                try:
                    value = int(data.decode("ascii").strip()) if ext == "cls" else json.loads(data).get("label")
                except (ValueError, UnicodeDecodeError, AttributeError):
                    skipped.append(Skipped(where, f"its .{ext} member holds no label"))
                    continue
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, str))):
                    skipped.append(
                        Skipped(
                            where,
                            f"its .{ext} label {json.dumps(value)[:40]} is neither a class index nor a class name",
                        )
                    )
                    continue
                kind_here = None if value is None else "int" if isinstance(value, int) else "str"
                if kind_here is not None and label_kind is not None and kind_here != label_kind:
                    raise InputError(
                        f"{source}: some samples are labelled by class index and others by class name "
                        f"(first other: {where}); label them all one way"
                    )
                label_kind = kind_here or label_kind
            offset, size = members[image]
            rows.append((where, str(path.resolve()), offset, size, value))
    return {"rows": rows, "names": None, "column": "", "label_kind": label_kind, "kind": "tar", "skipped": skipped}


# -- both -------------------------------------------------------------------------------------------------------------


def _discovery(
    source: Path, raw: dict, classes: Optional[Sequence[str]], add_classes: bool
) -> tuple[Discovery, dict[int, tuple]]:
    """The Discovery of a container's samples, sorted by key, labelled by name; and their places."""
    rows = sorted(raw["rows"], key=lambda r: r[0])
    keys = [r[0] for r in rows]
    if len(set(keys)) != len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})[:3]
        raise InputError(f"{source} holds several samples with the key {', '.join(twice)}; keys must be unique")
    values = [r[-1] for r in rows]
    labelled = [v is not None for v in values]
    skipped = list(raw.get("skipped", []))
    if any(labelled) and not all(labelled):
        missing = keys[labelled.index(False)]
        raise InputError(
            f"{source}: {labelled.count(False)} samples have no label (first: {missing}) and the "
            "others have one: label all of them, or none"
        )
    names: Optional[list[str]] = None
    if any(labelled):
        if raw["label_kind"] == "str":
            names = sorted(set(values))
        elif raw["names"]:
            names = list(raw["names"])
        else:
            names = [str(i) for i in range(max(values) + 1)]
        if raw["label_kind"] != "str":
            bad = [k for k, v in zip(keys, values) if not 0 <= v < len(names)]
            if bad:
                raise InputError(f"{source}: {len(bad)} labels are outside its {len(names)} classes (first: {bad[0]})")
            values = [names[v] for v in values]
        if classes is not None:
            names = extend_class_map(classes, names, add_classes, str(source))
    elif classes is not None:
        raise InputError(f"--classes gives a class map, but the samples of {source} have no labels")
    index = {n: i for i, n in enumerate(names or [])}
    items, places = [], {}
    for n, (row, value) in enumerate(zip(rows, values)):
        label = index[value] if names is not None else UNLABELLED
        items.append(SourceItem(n, row[1], row[0], label))
        places[n] = (raw["kind"], raw["column"], tuple(row[1:-1]))
    return Discovery(source, items, names, skipped, {}, ("image",)), places


def job_for(places: dict[int, tuple], items: Sequence[SourceItem]) -> Optional[ContainerJob]:
    """The ``ContainerJob`` of one shard's ``items`` (None when they are files)."""
    if not items or items[0].index not in places:
        return None
    kind, column, _ = places[items[0].index]
    return ContainerJob(kind, column, tuple(places[it.index][2] for it in items))


def container_bytes(
    job: ContainerJob, max_bytes: int, on_file: Optional[Callable[[Path], None]] = None
) -> Iterator[bytes | DecodeError]:
    """The image bytes of each item of ``job``, in order (a DecodeError for one that cannot be used).
    ``on_file`` is called with each file outside the container that a row names, before it is read."""
    if job.kind == "tar":
        handles: dict[str, object] = {}
        try:
            for path, offset, size in job.places:
                where = f"{path} at {offset}"
                if size == 0:
                    yield DecodeError(where, "empty file: 0 bytes")
                    continue
                if size > max_bytes:
                    yield DecodeError(where, f"file too large: {size:,} bytes")
                    continue
                f = handles.get(path) or handles.setdefault(path, open(path, "rb"))
                f.seek(offset)  # type: ignore[attr-defined]
                data = f.read(size)  # type: ignore[attr-defined]
                yield data if len(data) == size else DecodeError(where, "cut short: the tar file changed")
        finally:
            for f in handles.values():
                f.close()  # type: ignore[attr-defined]
        return
    reader = _Rows(job.kind, job.column)
    for path, row in job.places:
        value = reader.value(path, row)
        data = value.get("bytes") if isinstance(value, dict) else value
        where = f"{os.path.basename(path)} row {row}"
        if not data and isinstance(value, dict) and value.get("path"):
            # The datasets Image feature keeps a local file's path instead of its bytes until embedded.
            external = Path(value["path"]) if os.path.isabs(value["path"]) else Path(path).parent / value["path"]
            if on_file is not None:
                on_file(external)
            try:
                data = read_source(external, max_bytes)
            except DecodeError as e:
                yield DecodeError(where, f"{e.reason} (its image is the file {external})")
                continue
        if not data:
            yield DecodeError(where, "empty file: 0 bytes (no image bytes in the row)")
        elif len(data) > max_bytes:
            yield DecodeError(where, f"file too large: {len(data):,} bytes")
        else:
            yield bytes(data)


class _Rows:
    """One image cell after another from Arrow or Parquet files: an Arrow file memory-mapped whole, a
    Parquet file read one row group at a time (the group holding the row asked for, kept while
    rows come from it), so a shard reads only the parts of a large file that hold its images."""

    def __init__(self, kind: str, column: str) -> None:
        self.kind, self.column = kind, column
        self.path: Optional[str] = None
        self.cells = None
        self.start = self.stop = 0
        self.parquet = None
        self.starts: list[int] = []

    def value(self, path: str, row: int):
        """The Python value of the image cell at ``row`` of ``path``."""
        if path != self.path:
            self.path, self.cells, self.start, self.stop = path, None, 0, 0
            if self.kind == "parquet":
                import pyarrow.parquet as pq

                self.parquet = pq.ParquetFile(path)
                sizes = [self.parquet.metadata.row_group(i).num_rows for i in range(self.parquet.num_row_groups)]
                self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
            else:
                self.cells, self.stop = _arrow_table(path, self.kind).column(self.column), 1 << 62
        if not self.start <= row < self.stop:
            group = max(i for i, s in enumerate(self.starts[:-1]) if s <= row)
            self.cells = self.parquet.read_row_group(group, columns=[self.column]).column(0)  # type: ignore[union-attr]
            self.start, self.stop = self.starts[group], self.starts[group + 1]
        return self.cells[row - self.start].as_py()  # type: ignore[index]


__all__ = ["ContainerJob", "container_kind", "discover_container", "job_for", "container_bytes"]
