"""packer.spec.field_kinds: each kind of variable-length field, as one object, gives its manifest entry,
its name rule, its tar member, its verify check and its value, checked against explicit values."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from packer.spec.entries import TextField
from packer.spec.field_kinds import KINDS, TEXT_KINDS, fits, kind_of


def test_every_kind_is_registered_under_its_manifest_name():
    assert TEXT_KINDS == ("text", "tokens", "json", "detection", "mask", "geometry")
    assert all(kind_of(name).name == name for name in TEXT_KINDS)
    with pytest.raises(KeyError):
        kind_of("token_blocks")


def test_manifest_entries_are_the_documented_ones_and_read_back():
    text = TextField("text", "text", encoding="latin-1", allow_missing=True)
    assert text.to_dict() == {
        "kind": "text",
        "dtype": "str",
        "encoding": "utf-8",
        "newlines": "LF",
        "shape": [],
        "length_unit": "bytes",
        "source_encoding": "latin-1",
        "missing": "stored empty",
    }
    tokens = TextField("text", "tokens", {"name": "bpe", "pad_id": 3})
    assert tokens.to_dict() == {
        "kind": "tokens",
        "dtype": "int32",
        "shape": [None],
        "length_unit": "tokens",
        "tokenizer": {"name": "bpe", "pad_id": 3},
        "source_encoding": "utf-8",
        "missing": "skipped",
    }
    mask = TextField("mask", "mask", info={"ignore_index": 255, "source": "masks"})
    assert mask.to_dict()["values"] == "class indices (palette indices kept)" and mask.to_dict()["ignore_index"] == 255
    for field in (text, tokens, mask, TextField("target", "detection"), TextField("geometry", "geometry")):
        assert TextField.from_dict(field.name, field.to_dict()) == field
    assert [kind_of(k).itemsize for k in TEXT_KINDS] == [1, 4, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("kind", "name", "ok"),
    [
        ("text", "text", True),
        ("tokens", "text", True),
        ("json", "json", True),
        ("json", "text", False),  # json has a name of its own
        ("text", "json", False),  # and that name holds json only
        ("detection", "target", True),
        ("detection", "mask", False),
        ("mask", "mask", True),
        ("geometry", "geometry", True),
        ("text", "geometry", False),
    ],
)
def test_a_field_name_fits_its_kind(kind, name, ok):
    assert fits(kind, name) is ok


def test_tar_members_round_trip_as_the_other_formats_store_them():
    ids = np.array([5, 0, 70000], dtype="<i4").tobytes()
    parts = kind_of("tokens").tar_member(ids)
    member = b"".join(parts)
    assert np.load(io.BytesIO(member)).tolist() == [5, 0, 70000]  # an .npy member webdataset decodes
    assert kind_of("tokens").from_tar({"tokens.npy": member}, "tokens.npy") == ids
    assert kind_of("json").tar_member(b"") is None  # missing: no member
    assert kind_of("json").from_tar({}, "data.json") == b""
    with pytest.raises(KeyError):
        kind_of("geometry").from_tar({}, "geometry.json")  # never missing
    out = io.BytesIO()
    np.save(out, np.zeros(2, dtype="<i8"))  # an .npy of int64: not what packer stores
    bad = out.getvalue()
    with pytest.raises(ValueError, match="not 1-D int32 token ids"):
        kind_of("tokens").from_tar({"tokens.npy": bad}, "tokens.npy")
    assert {k: kind_of(k).member for k in TEXT_KINDS} == {
        "text": "txt",
        "tokens": "tokens.npy",
        "json": "data.json",
        "detection": "target.json",
        "mask": "mask.png",
        "geometry": "geometry.json",
    }


def _png(mode: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.array([[0, 1], [2, 255]], dtype=np.uint8)).convert(mode).save(out, "PNG")
    return out.getvalue()


def test_verify_checks_each_kind_by_what_it_holds():
    def problem(kind: str, name: str, data: bytes) -> str:
        return TextField(name, kind).kind_of.problem(TextField(name, kind), data)

    assert problem("text", "text", "héllo".encode()) == ""
    assert problem("text", "text", b"\xff").startswith("text does not decode as UTF-8 text")
    assert problem("tokens", "text", b"\0" * 6) == "text: 6 bytes is not a whole number of int32 token ids"
    assert problem("json", "json", b"") == ""  # stored empty: missing
    assert problem("json", "json", b"{").startswith("json does not decode as JSON")
    assert problem("geometry", "geometry", b"").startswith("geometry does not decode as JSON")
    box = json.dumps({"boxes": [[0, 0, 2, 2]], "labels": [1]}).encode()
    assert problem("detection", "target", box) == ""
    flipped = json.dumps({"boxes": [[3, 0, 2, 2]], "labels": [1]}).encode()
    assert problem("detection", "target", flipped) == "target: the boxes are not XYXY boxes, one per label"
    assert problem("mask", "mask", _png("L")) == ""
    assert "not a grayscale PNG of class indices" in problem("mask", "mask", _png("RGB"))
    assert problem("mask", "mask", b"png?").startswith("mask does not decode as a PNG")


def test_values_a_reader_gets():
    assert kind_of("text").read("naïve".encode()) == "naïve"
    ids = kind_of("tokens").read(np.array([1, 2], dtype="<i4").tobytes())
    assert ids.dtype == np.int64 and ids.tolist() == [1, 2]
    assert kind_of("json").read(b"") is None and kind_of("json").read(b'{"a": [1]}') == {"a": [1]}
    mask = kind_of("mask").read(_png("L"))
    assert mask.dtype == np.int64 and mask.tolist() == [[0, 1], [2, 255]]
    target = kind_of("detection").read(
        json.dumps({"boxes": [[1, 2, 3, 4]], "labels": [7], "iscrowd": [0], "geometry": {"size": [4, 5]}}).encode()
    )
    assert target["boxes"].dtype == np.float32 and target["boxes"].tolist() == [[1, 2, 3, 4]]
    assert target["labels"].dtype == np.int64 and target["labels"].tolist() == [7]
    assert target["iscrowd"].dtype == np.int64 and target["geometry"] == {"size": [4, 5]}
    empty = kind_of("detection").read(json.dumps({"boxes": [], "labels": []}).encode())
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)


def test_the_kinds_say_what_they_are_for():
    assert [k for k, kind in KINDS.items() if kind.target] == ["detection", "mask"]
    assert [k for k, kind in KINDS.items() if kind.readable] == ["text", "tokens", "json"]
    assert [k for k, kind in KINDS.items() if kind.class_indices] == ["mask"]
    assert [k for k, kind in KINDS.items() if kind.made_by_converter] == ["geometry"]
