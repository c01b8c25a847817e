"""packer.spec.source_kinds: the extensions of each field kind of a sample's source files, and how
the walk (``packer.sources.walk``) applies them, whatever the case of a file's extension."""

from __future__ import annotations

import pytest

from packer.sources.walk import field_kind, is_image_name
from packer.spec.source_kinds import FIELD_KINDS, IMAGE_EXTENSIONS, JSON_EXTENSIONS, TEXT_EXTENSIONS

BY_KIND = {"image": IMAGE_EXTENSIONS, "text": TEXT_EXTENSIONS, "json": JSON_EXTENSIONS}


def test_the_fields_are_stored_image_then_text_then_json():
    assert FIELD_KINDS == ("image", "text", "json")
    assert set(BY_KIND) == set(FIELD_KINDS)


def test_the_image_extensions_are_torchvisions_and_gif():
    torchvision = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}
    assert IMAGE_EXTENSIONS == torchvision | {".gif"}
    assert TEXT_EXTENSIONS == {".txt"} and JSON_EXTENSIONS == {".json"}


def test_no_extension_belongs_to_two_kinds():
    sets = list(BY_KIND.values())
    assert sum(len(s) for s in sets) == len(set().union(*sets))


def test_extensions_are_written_lower_case_with_their_dot():
    for ext in set().union(*BY_KIND.values()):
        assert ext == ext.lower() and ext.startswith(".") and ext.count(".") == 1


@pytest.mark.parametrize("kind", FIELD_KINDS)
def test_the_walk_gives_each_extension_its_kind_in_any_case(kind):
    for ext in BY_KIND[kind]:
        for name in (f"a{ext}", f"a{ext.upper()}", f"a.b{ext[:2]}{ext[2:].upper()}"):
            assert field_kind(name) == kind, name
            assert is_image_name(name) == (kind == "image"), name


@pytest.mark.parametrize("name", ["notes.md", "photo.jpg.bak", "jpg", "archive.tar", "labels.csv", "README"])
def test_other_files_fill_no_field(name):
    assert field_kind(name) is None and not is_image_name(name)
