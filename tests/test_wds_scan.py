"""The wds shard scan walks the tar's headers itself (packer.spec.tario.iter_shard_samples): the same
samples as tarfile for every tar packer writes and for other plain ustar tars, and a clear refusal,
naming the shard and the byte, of a damaged, cut or hostile tar (issue 26)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import make_tree, pair_tree

import packer.formats.wds as wds
import packer.spec.tario as tario
from packer import ConvertConfig, PreprocessConfig, convert
from packer.cli import cli
from packer.config import ImageCodec, ShardSize
from packer.output.verify import Problem, verify
from packer.spec.errors import ManifestError
from packer.spec.manifest import read_manifest
from packer.spec.sample_layout import SampleLayout
from packer.spec.tario import iter_shard_samples, iter_tar_samples, packer_header
from packer.spec.text import TextConfig

SMALL = PreprocessConfig(size=(16, 12))
KINDS = ["raw", "raw-sizes", "jpeg", "png", "source", "paired", "text", "tokens"]


def _tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate("a cat dog number".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """A wds output of every kind packer writes, in shards of 3 samples."""
    base = tmp_path_factory.mktemp("wds")
    images = base / "images"
    make_tree(images, {"ant": 4, "bee": 3})
    make_tree(images / "cat", {"jpegs": 2}, ext="jpg")  # a class of JPEG files (in a subfolder), for source
    texts = base / "texts"
    for i in range(7):
        (texts / ("a" if i < 4 else "b") / f"{i}.txt").parent.mkdir(parents=True, exist_ok=True)
        (texts / ("a" if i < 4 else "b") / f"{i}.txt").write_text(f"a cat number {i}" * (i + 1), encoding="utf-8")
    shards = ShardSize(samples=3)
    configs = {
        "raw": (images, ConvertConfig("wds", SMALL, shards)),
        "raw-sizes": (images, ConvertConfig("wds", PreprocessConfig(size=None, resize="none"), shards)),
        "jpeg": (images, ConvertConfig("wds", SMALL, shards, codec=ImageCodec("jpeg"))),
        "png": (images, ConvertConfig("wds", SMALL, shards, codec=ImageCodec("png"))),
        "source": (
            images,
            ConvertConfig("wds", PreprocessConfig(size=None, resize="none"), shards, codec=ImageCodec("source")),
        ),
        "paired": (
            pair_tree(base / "pairs", per_class=4),
            ConvertConfig("wds", SMALL, shards, text=TextConfig(allow_missing=True)),
        ),
        "text": (texts, ConvertConfig("wds", shard_size=shards)),
        "tokens": (
            texts,
            ConvertConfig("wds", shard_size=shards, text=TextConfig(tokenizer=str(_tokenizer(base / "tok.json")))),
        ),
    }
    for kind, (src, config) in configs.items():
        convert(src, base / "out" / kind, config, workers=1)
    return {kind: base / "out" / kind for kind in configs}


def tars(out: Path) -> list[Path]:
    return [out / s.file(".tar") for s in read_manifest(out).shards]


def header_offsets(tar: Path) -> list[int]:
    """The byte offset of every member's header, from tarfile."""
    with tarfile.open(tar) as t:
        return [m.offset for m in t.getmembers()]


# --------------------------------------------------------------------------- the same samples as tarfile


@pytest.mark.parametrize("kind", KINDS)
def test_the_walk_yields_what_tarfile_yields_for_every_kind_of_wds_output(outputs, kind, monkeypatch):
    def parsed(block, name, pos):
        raise AssertionError(f"the header at byte {pos} is not byte for byte one packer_header makes")

    monkeypatch.setattr(tario, "_parse_header", parsed)  # every header packer writes is matched whole
    for tar in tars(outputs[kind]):
        expected = list(iter_tar_samples(tar))
        assert expected and list(iter_shard_samples(tar)) == expected
        members = [ext for fields in expected for ext in fields if ext != "__key__"]
        assert len(members) == len(header_offsets(tar))  # every member is in a sample
    assert verify(outputs[kind]) == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_scan_of_every_kind_of_wds_output_is_the_tarfile_based_scan(outputs, kind, monkeypatch):
    out = outputs[kind]
    manifest = read_manifest(out)
    layout = SampleLayout.from_manifest(manifest)

    def records(start: int = 0) -> list[tuple]:
        return [
            (
                s.local,
                s.key,
                s.label,
                None if s.image is None else (s.image.dtype.str, s.image.shape, s.image.tobytes()),
                s.crc32,
                s.encoded,
                s.fields,
                s.shape,
            )
            for shard in manifest.shards
            for s in wds.scan_shard(out, shard, layout, start)
        ]

    walked, walked_from_2 = records(), records(2)
    with monkeypatch.context() as m:
        m.setattr(wds, "iter_shard_samples", lambda tar, offset=0: iter_tar_samples(tar, offset=offset))
        assert walked == records() and walked_from_2 == records(2)
    assert len(walked) == manifest.samples and [r[0] for r in walked_from_2] == [
        n for shard in manifest.shards for n in range(2, shard.samples)
    ]
    keys, crcs = wds.scan_index(out, manifest.shards[0], layout)
    older = type(manifest.shards[0])(
        manifest.shards[0].name,
        manifest.shards[0].samples,
        [f for f in manifest.shards[0].files if not f.path.endswith(".idx")],
    )
    assert wds.scan_index(out, older, layout)[0] == keys and wds.scan_index(out, older, layout)[
        1
    ].tolist() == crcs.tolist() == [r[4] for r in walked[:3]]  # without the DALI index, from the tar's headers


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("window", [512, 1536, 1 << 22])
def test_the_scan_of_an_intact_shard_by_its_index_is_the_walk(outputs, kind, window, monkeypatch):
    """verify reads a shard whose files match the manifest by its NAME.idx, never walking its headers:
    the same samples as the walk, for every kind of output and reads of any size; without the index
    (before format version 7), the walk."""
    out = outputs[kind]
    manifest = read_manifest(out)
    layout = SampleLayout.from_manifest(manifest)

    def records(scan, shards) -> list[tuple]:
        return [
            (
                s.local,
                s.key,
                s.label,
                None if s.image is None else (s.image.dtype.str, s.image.shape, s.image.tobytes()),
                s.crc32,
                s.encoded,
                s.fields,
                s.shape,
            )
            for shard in shards
            for s in scan(out, shard, layout)
        ]

    walked = records(wds.scan_shard, manifest.shards)
    monkeypatch.setattr(wds, "_WINDOW", window)
    with monkeypatch.context() as m:
        m.setattr(wds, "iter_shard_samples", lambda *a, **k: pytest.fail("walked"))
        assert records(wds.scan_intact_shard, manifest.shards) == walked
    older = [type(s)(s.name, s.samples, [f for f in s.files if not f.path.endswith(".idx")]) for s in manifest.shards]
    assert records(wds.scan_intact_shard, older) == walked


def test_verify_reads_intact_wds_shards_by_their_index_and_damaged_ones_by_their_headers(
    outputs, tmp_path, monkeypatch
):
    import packer.formats.wds as wds_module
    from packer.output.verify import verify

    marks = tmp_path / "walked"  # the shards are checked in forked processes: they leave a file
    real = wds_module.iter_shard_samples

    def walk(*args, **kwargs):
        with marks.open("a") as f:
            f.write("walked\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(wds_module, "iter_shard_samples", walk)
    assert verify(outputs["raw"]) == [] and not marks.exists()
    copy = tmp_path / "raw"
    shutil.copytree(outputs["raw"], copy)
    tar = tars(copy)[1]
    data = bytearray(tar.read_bytes())
    data[header_offsets(tar)[5] + 512] ^= 0xFF  # the second sample's image (members: cls, json, npy)
    tar.write_bytes(bytes(data))
    problems = verify(copy)
    assert marks.read_text() == "walked\n" and any("SHA-256" in p.message for p in problems)
    assert any(p.sample == 1 for p in problems), problems  # found by the walk


@pytest.mark.parametrize("window", [512, 700, 1024, 1536, 5000])
def test_reads_of_any_size_give_the_same_samples(outputs, window, monkeypatch):
    """Members cut by the end of a read, members larger than a read (read alone), headers across two."""
    monkeypatch.setattr(tario, "_WINDOW", window)
    for kind in ("raw", "raw-sizes", "paired"):
        for tar in tars(outputs[kind]):
            assert list(iter_shard_samples(tar)) == list(iter_tar_samples(tar))


def test_a_walk_from_any_sample_header_yields_the_rest(outputs):
    tar = tars(outputs["paired"])[0]
    whole = list(iter_tar_samples(tar))
    offsets = header_offsets(tar)
    per_sample = [sum(1 for ext in f if ext != "__key__") for f in whole]
    at = 0
    for n, count in enumerate(per_sample):
        assert list(iter_shard_samples(tar, offset=offsets[at])) == whole[n:]
        at += count


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], fmt: int = tarfile.USTAR_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as t:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            t.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def _file(name: str, **fields) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for k, v in fields.items():
        setattr(info, k, v)
    return info


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_plain_tars_packer_did_not_write_read_as_tarfile_reads_them(tmp_path, fmt):
    """Other times, modes and owners (another Python's tarfile, an older packer), GNU and POSIX magic,
    a long name that ustar splits into prefix and name, a UTF-8 name, an empty member."""
    long_dir = "d" * 90 if fmt == tarfile.USTAR_FORMAT else "d"  # GNU and pax write long names as members
    members = [
        (_file("000000000.cls", mtime=1_700_000_000, mode=0o644, uname="me", gname="us", uid=1000), b"3"),
        (_file("000000000.json"), b'{"key": "a/0.png"}'),
        (_file(f"{long_dir}/000000001.npy"), bytes(range(256)) * 3),
        (_file(f"{long_dir}/000000001.cls"), b"1"),
        (_file("clåss/ü.txt"), "tëxt".encode()),
        (_file("000000002.cls"), b""),
    ]
    if fmt == tarfile.PAX_FORMAT:
        members = [(i, d) for i, d in members if i.name.isascii()]  # a UTF-8 name gets a pax header
    tar = _tar(tmp_path / "plain.tar", members, fmt)
    expected = list(iter_tar_samples(tar))
    keys = ["000000000", f"{long_dir}/000000001"] + (["clåss/ü"] if fmt != tarfile.PAX_FORMAT else []) + ["000000002"]
    assert [f["__key__"] for f in expected] == keys
    assert list(iter_shard_samples(tar)) == expected


def test_a_header_summed_over_signed_bytes_is_accepted_as_tarfile_accepts_it(tmp_path):
    header = bytearray(packer_header("ü.txt".encode(), 2))
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + header[156:]) + 256
    header[148:156] = b"%06o\0 " % signed
    tar = tmp_path / "signed.tar"
    tar.write_bytes(bytes(header) + b"ok".ljust(512, b"\0") + bytes(10240 - 1024))
    assert list(iter_tar_samples(tar)) == list(iter_shard_samples(tar)) == [{"__key__": "ü", "txt": b"ok"}]


def test_an_empty_shard_has_no_samples(tmp_path):
    tar = _tar(tmp_path / "empty.tar", [])
    assert list(iter_shard_samples(tar)) == list(iter_tar_samples(tar)) == []


# --------------------------------------------------------------------------- damaged, cut and hostile tars


def refusal(tar: Path) -> str:
    """The message a walk of ``tar`` stops with (after the samples before the break)."""
    with pytest.raises(ManifestError) as e:
        for _ in iter_shard_samples(tar):
            pass
    return str(e.value)


def damaged(tmp_path: Path, tar: Path, at: int, value: bytes) -> Path:
    copy = tmp_path / tar.name
    data = bytearray(tar.read_bytes())
    data[at : at + len(value)] = value
    copy.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("field,at", [("name", 3), ("size", 130), ("checksum", 150), ("owner", 270)])
def test_a_damaged_header_is_named_with_its_byte_not_taken_for_the_end(outputs, tmp_path, field, at):
    tar = tars(outputs["raw"])[1]
    fourth = header_offsets(tar)[4]  # sample 1's second member
    data = tar.read_bytes()
    copy = damaged(tmp_path, tar, fourth + at, bytes([data[fourth + at] ^ 0x01]))
    assert refusal(copy) == (
        f"{copy}: the tar header at byte {fourth} is damaged (its checksum does not match); the shard is damaged"
    )
    assert len(list(iter_tar_samples(copy))) == 2  # tarfile: the end of the tar, after a sample cut short


def test_a_size_running_past_the_end_is_refused_before_it_is_read(outputs, tmp_path):
    tar = tars(outputs["raw"])[0]
    second = header_offsets(tar)[1]
    name = tarfile.TarInfo.frombuf(tar.read_bytes()[second : second + 512], "utf-8", "surrogateescape").name
    copy = damaged(tmp_path, tar, second, packer_header(name.encode(), 8**11 - 1))
    left = copy.stat().st_size - second - 512
    assert refusal(copy) == (
        f"{copy}: member {name!r} (header at byte {second}) claims {8**11 - 1} bytes, more than "
        f"the {left} left in the shard's {copy.stat().st_size} bytes; the shard is damaged"
    )


@pytest.mark.parametrize("where", ["data", "header", "boundary", "padding"])
def test_a_cut_tar_is_named_with_where_it_ends(outputs, tmp_path, where):
    """Cut inside sample 1's image, inside its first header, just before it, or inside its label's
    padding: the samples before the cut, sample 1 with the members read whole, then the refusal."""
    tar = tars(outputs["raw"])[0]
    offsets = header_offsets(tar)  # sample 1: cls, json, npy at offsets 3, 4, 5
    cut = {
        "data": offsets[5] + 512 + 300,
        "header": offsets[3] + 100,
        "boundary": offsets[3],
        "padding": offsets[3] + 700,
    }[where]
    copy = tmp_path / tar.name
    copy.write_bytes(tar.read_bytes()[:cut])
    whole = list(iter_tar_samples(tar))
    samples = []
    with pytest.raises(ManifestError) as e:
        for fields in iter_shard_samples(copy):
            samples.append(fields)
    if where == "data":
        assert samples == [whole[0], {k: whole[1][k] for k in ("__key__", "cls", "json")}]
        size = len(whole[1]["npy"])
        assert str(e.value) == (
            f"{copy}: member '000000001.npy' (header at byte {offsets[5]}) claims {size} bytes, "
            f"more than the 300 left in the shard's {cut} bytes; the shard is damaged"
        )
    else:
        assert samples == whole[:1] + ([{k: whole[1][k] for k in ("__key__", "cls")}] if where == "padding" else [])
        how = "inside a header" if where == "header" else "without its end marker"
        assert str(e.value) == f"{copy}: the tar ends at byte {cut} {how}; the shard is cut short"


def test_a_scan_reports_the_break_that_cut_a_sample_short_not_its_missing_member(outputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(outputs["raw"], out)
    manifest = read_manifest(out)
    tar = out / manifest.shards[0].file(".tar")
    offsets = header_offsets(tar)
    data = bytearray(tar.read_bytes())
    data[offsets[4] + 2] ^= 0x04  # sample 1's json header: its cls member is read, then the walk breaks
    tar.write_bytes(bytes(data))
    scan = wds.scan_shard(out, manifest.shards[0], SampleLayout.from_manifest(manifest))
    assert next(scan).key == "ant/img_000.png"
    with pytest.raises(ManifestError, match=f"^{tar}: the tar header at byte {offsets[4]} is damaged"):
        next(scan)


HOSTILE = {
    "pax": (
        [(_file("000000000.cls", pax_headers={"comment": "x"}), b"1")],
        tarfile.PAX_FORMAT,
        "the tar header at byte 0 is a pax extended header ('././@PaxHeader'), which packer never writes",
    ),
    "gnu-long-name": (
        [(_file("n" * 120 + ".cls"), b"1")],
        tarfile.GNU_FORMAT,
        "the tar header at byte 0 is a GNU long name ('././@LongLink'), which packer never writes",
    ),
    "directory": (
        [(_file("000000000", type=tarfile.DIRTYPE), b"")],
        tarfile.USTAR_FORMAT,
        "the tar header at byte 0 is a directory ('000000000/'), which packer never writes",
    ),
    "symlink": (
        [(_file("000000000.cls", type=tarfile.SYMTYPE, linkname="/etc/passwd"), b"")],
        tarfile.USTAR_FORMAT,
        "the tar header at byte 0 is a symbolic link ('000000000.cls'), which packer never writes",
    ),
    "hard-link": (
        [(_file("000000000.cls", type=tarfile.LNKTYPE, linkname="x"), b"")],
        tarfile.USTAR_FORMAT,
        "the tar header at byte 0 is a hard link ('000000000.cls'), which packer never writes",
    ),
    "absolute": (
        [(_file("/tmp/000000000.cls"), b"1")],
        tarfile.USTAR_FORMAT,
        "member '/tmp/000000000.cls' (header at byte 0) has an unsafe path; refusing to read it",
    ),
    "parent": (
        [(_file("../000000000.cls"), b"1")],
        tarfile.USTAR_FORMAT,
        "member '../000000000.cls' (header at byte 0) has an unsafe path; refusing to read it",
    ),
    "dot-dot": (
        [(_file(".."), b"1")],
        tarfile.USTAR_FORMAT,
        "member '..' (header at byte 0) has an unsafe path; refusing to read it",
    ),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_members_packer_never_writes_are_refused_by_name(tmp_path, case):
    members, fmt, message = HOSTILE[case]
    good = [(_file("000000009.cls"), b"9")]
    tar = _tar(tmp_path / "hostile.tar", good + members, fmt)
    at = 1024
    message = message.replace("byte 0", f"byte {at}")
    assert tarfile.open(tar).getmembers()[1].offset == at
    assert refusal(tar).startswith(f"{tar}: {message}")


@pytest.mark.parametrize("name", [b"../000000000.cls", b"/000000000.cls", b"a/../000000000.cls", b".."])
def test_an_unsafe_name_in_a_header_exactly_like_packers_is_refused(tmp_path, name):
    tar = tmp_path / "unsafe.tar"
    tar.write_bytes(
        packer_header(b"000000009.cls", 1)
        + b"9".ljust(512, b"\0")
        + packer_header(name, 1)
        + b"1".ljust(512, b"\0")
        + bytes(10240 - 2048)
    )
    assert [m.name for m in tarfile.open(tar).getmembers()] == ["000000009.cls", name.decode()]
    assert refusal(tar) == (
        f"{tar}: member {name.decode()!r} (header at byte 1024) has an unsafe path; refusing to read it"
    )


def _with_checksum(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


@pytest.mark.parametrize(
    "size_field", [b"0000000009\0\0", b"\x80" + bytes(8) + b"\x00\x10\x00", b"12 34\0\0\0\0\0\0\0"]
)
def test_a_size_that_is_not_an_octal_number_is_refused(tmp_path, size_field):
    """A digit 9, GNU's base-256 (packer never writes sizes of 8 GiB), a space inside: with a valid checksum."""
    header = bytearray(packer_header(b"000000000.npy", 0))
    header[124:136] = size_field
    tar = tmp_path / "odd.tar"
    tar.write_bytes(_with_checksum(header) + bytes(10240 - 512))
    assert refusal(tar) == (
        f"{tar}: the tar header at byte 0 is damaged (its size is not an octal number); the shard is damaged"
    )


# --------------------------------------------------------------------------- through verify and the CLI


def test_verify_names_the_shard_sample_and_byte_of_a_damaged_header(outputs, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(outputs["jpeg"], copy)
    shard = read_manifest(copy).shards[1]
    tar = copy / shard.file(".tar")
    at = header_offsets(tar)[6]  # sample 2's first member
    data = bytearray(tar.read_bytes())
    data[at + 5] ^= 0x02  # a digit of the member's key
    tar.write_bytes(bytes(data))
    reason = f"{tar}: the tar header at byte {at} is damaged (its checksum does not match); the shard is damaged"
    assert verify(copy) == [  # samples 0 and 1 are read and checked, then the break
        Problem(shard.name, f"{tar.name} has changed: its SHA-256 does not match the manifest"),
        Problem(shard.name, f"unreadable from sample 2 on: ManifestError: {reason}", 2),
        Problem("manifest", "class_counts [4, 3, 2] do not match the stored labels ([4, 2, 2])"),  # one bee unread
    ]
    result = CliRunner().invoke(cli, ["verify", str(copy), "-q"])
    assert (
        result.exit_code == 1
        and f"{shard.name} sample 2: unreadable from sample 2 on: ManifestError: {reason}" in result.output
        and "Traceback" not in result.output
    )


def test_verify_reports_a_hostile_member_in_a_shard_as_a_problem(outputs, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(outputs["raw"], copy)
    shard = read_manifest(copy).shards[0]
    tar = copy / shard.file(".tar")
    offsets = header_offsets(tar)
    data = tar.read_bytes()
    link = tarfile.TarInfo("000000001.cls")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    link = link.tobuf(tarfile.USTAR_FORMAT)
    tar.write_bytes(data[: offsets[3]] + link + data[offsets[3] + 512 :])  # sample 1's first member, in place
    assert verify(copy)[1:] == [
        Problem(
            shard.name,
            f"unreadable from sample 1 on: ManifestError: {tar}: the tar header at byte {offsets[3]} "
            "is a symbolic link ('000000001.cls'), which packer never writes; refusing to read the shard",
            1,
        ),
        Problem("manifest", "class_counts [4, 3, 2] do not match the stored labels ([2, 3, 2])"),  # two ants unread
    ]


def test_raw_images_are_the_arrays_tarfile_members_hold(outputs):
    """The raw images come back as arrays equal to the ones tarfile's members hold."""
    tar = tars(outputs["raw"])[0]
    layout = SampleLayout.from_manifest(read_manifest(outputs["raw"]))
    shard = read_manifest(outputs["raw"]).shards[0]
    images = [s.image for s in wds.scan_shard(outputs["raw"], shard, layout)]
    expected = [np.load(io.BytesIO(f["npy"])) for f in iter_tar_samples(tar)]
    assert all(np.array_equal(a, b) and a.shape == (12, 16, 3) for a, b in zip(images, expected, strict=True))
