"""What a reader tells about the output it reads, from its manifest alone (no shard is opened): class
names and counts, detection categories, a segmentation output's ignore index, statistics, the
tokenizer's pad id, the text field lengths are measured on. Readers give these names to users
(``ds.classes``, ``ds.class_to_idx``, ...) through ``ReaderBase``; they are computed here."""

from __future__ import annotations

from typing import Any, Optional

from packer.spec.entries import TextField
from packer.spec.field_kinds import Geometry, Json, Tokens
from packer.spec.manifest import Manifest


class OutputInfo:
    """The facts of one output's ``manifest`` (opened at ``root``, named in error messages)."""

    def __init__(self, manifest: Manifest, root: Any) -> None:
        self.manifest, self.root = manifest, root
        self.text_fields = manifest.text_fields
        self.has_target = any(f.kind_of.target for f in self.text_fields)
        """True for outputs whose samples are ``(image, target)``: detection boxes, or a segmentation mask."""
        self.geometry = any(isinstance(f.kind_of, Geometry) for f in self.text_fields)
        """True when each image's geometry is stored (beside a paired json): the last text field, given in
        ``return_meta``'s dict as ``"geometry"``, never in the sample tuple."""

    @property
    def classes(self) -> Optional[list[str]]:
        """Class names by index, or None for unlabelled data."""
        return self.manifest.classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ``ImageFolder.class_to_idx``, from the manifest.

        ``{}`` for unlabelled data (``classes`` is None and every label is -1): still a dict, so code
        that looks names up or iterates it needs no special case."""
        return {name: index for index, name in enumerate(self.manifest.classes or [])}

    @property
    def class_counts(self) -> Optional[list[int]]:
        """Samples per class, from the manifest (no shard is opened); None for unlabelled data."""
        return self.manifest.class_counts

    @property
    def class_map_sha256(self) -> Optional[str]:
        """The digest of the class map (names in index order), the same for outputs whose labels agree;
        None for unlabelled data."""
        return self.manifest.class_map_sha256

    @property
    def categories(self) -> Optional[list[str]]:
        """A detection output's category names, which ``target["labels"]`` index; None for other outputs."""
        return list(self.manifest.annotations["categories"]) if self.manifest.annotations else None

    @property
    def ignore_index(self) -> Optional[int]:
        """A segmentation output's ignore index (the value of padding in the masks); None for other outputs."""
        mask = next((f for f in self.text_fields if f.kind_of.class_indices), None)
        return int((mask.info or {}).get("ignore_index", 255)) if mask is not None else None

    @property
    def stats(self) -> Optional[dict]:
        """The manifest's dataset statistics (pixel mean/std, original sizes); None for older outputs."""
        return self.manifest.stats

    @property
    def pad_id(self) -> int:
        """Padding id of the token-id field's tokenizer (0 without one): what pad_collate should pad with."""
        tokens = next((f for f in self.text_fields if isinstance(f.kind_of, Tokens)), None)
        return int((tokens.tokenizer or {}).get("pad_id") or 0) if tokens else 0

    def length_field(self, field: Optional[str] = None) -> TextField:
        """The text field ``field`` names; by default the first text or token-id field (else json)."""
        fields = {f.name: f for f in self.text_fields if f.kind_of.readable}
        if not fields:
            raise ValueError(f"{self.root} has no text fields, so its samples have no length")
        if field is None:
            return next((f for f in fields.values() if not isinstance(f.kind_of, Json)), next(iter(fields.values())))
        if field not in fields:
            raise ValueError(f"{self.root} has no field {field!r}; its text fields are {', '.join(fields)}")
        return fields[field]


class FromInfo:
    """A reader attribute read from its ``info`` (an ``OutputInfo``): ``classes = FromInfo()`` in a
    reader class gives ``ds.classes`` as ``ds.info.classes``, documented there."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = getattr(OutputInfo, name).__doc__

    def __get__(self, reader: Any, owner: Optional[type] = None) -> Any:
        return self if reader is None else getattr(reader.info, self.name)


__all__ = ["OutputInfo", "FromInfo"]
