"""JPEG decoding at reduced scale (packer.pixels.jpeg) and how decode uses it."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from packer.config import PreprocessConfig
from packer.pixels import jpeg
from packer.pixels.preprocess import decode
from packer.spec.errors import DecodeError


def _jpeg(size=(505, 379), orientation=None, mode="RGB", quality=95, stripes=False, **save) -> bytes:
    """A JPEG of gradients, photograph-like, or with sharp ``stripes`` (a resize box misplaced by a
    fraction of a pixel shows at every edge), in ``size`` as stored (not a multiple of 8 / M:
    partial last blocks), with an EXIF orientation."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    stripes = ((x // 13 + y // 17) % 2) * 120 if stripes else (np.sin(x / 9.0) + np.cos(y / 11.0)) * 30 + 60
    rgb = np.stack([x * 120 // w + stripes, y * 120 // h + stripes, (x + y) * 120 // (w + h) + stripes], axis=-1)
    img = Image.fromarray(rgb.astype(np.uint8))
    if mode != "RGB":
        img = img.convert(mode)
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        save["exif"] = exif.tobytes()
    buf = io.BytesIO()
    img.save(buf, save.pop("format", "JPEG"), quality=quality, **save)
    return buf.getvalue()


@pytest.fixture
def scales(monkeypatch) -> list:
    """The M of every decode_scaled call (None: it declined and Pillow decoded)."""
    seen: list = []
    real = jpeg.decode_scaled

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        seen.append(None if result is None else result.eighths)
        return result

    monkeypatch.setattr(jpeg, "decode_scaled", spy)
    return seen


def _diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape
    return np.abs(a.astype(int) - b.astype(int))


def test_eighths_is_the_smallest_scale_that_keeps_the_target():
    assert jpeg.eighths_for((500, 375), (299, 224)) == 5  # 312.5 x 234.4 >= 299 x 224; 4/8 gives 188 rows
    assert jpeg.eighths_for((2000, 1500), (299, 224)) == 2
    assert jpeg.eighths_for((1600, 1200), (200, 150)) == 1
    assert jpeg.eighths_for((224, 224), (224, 224)) == 8
    assert jpeg.eighths_for((100, 80), (224, 224)) == 8  # enlarging: never more than full size
    assert jpeg.eighths_for((800, 600), (100, 150)) == 2  # the tighter side decides


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("resize", ["shorter-crop", "stretch", "pad"])
def test_scaled_decode_is_close_to_a_full_decode(resize, orientation, scales):
    data = _jpeg(orientation=orientation)
    full = decode(data, PreprocessConfig(size=(160, 120), resize=resize, reduced_decode=False))
    scaled = decode(data, PreprocessConfig(size=(160, 120), resize=resize))
    # 505 x 379 needs 160 x 120 (3/8); turned upright it needs 214 x 160 cropped or stretched (4/8), 91 x 120 padded
    assert scales == [8, 3 if orientation < 5 else 2 if resize == "pad" else 4]  # 8: the full decode
    assert scaled.original_size == full.original_size == ((379, 505) if orientation >= 5 else (505, 379))
    diff = _diff(scaled.pixels, full.pixels)
    assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 4


_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@pytest.mark.parametrize("orientation", range(2, 9))
@pytest.mark.parametrize("resize", ["shorter-crop", "stretch"])
def test_every_orientation_resizes_the_same_source_pixels(orientation, resize, scales):
    """An image stored turned gives the upright image turned: the resize box sits on the same pixels
    whichever side the partial last block ends up on (505 * 3 / 8 = 189.375: 0.6 of a pixel). (Not
    for pad, whose letterbox is placed by rounding down, so a flip moves it by a pixel.)"""
    cfg = PreprocessConfig(size=(140, 140), resize=resize)
    upright = decode(_jpeg(stripes=True), cfg).pixels
    turned = decode(_jpeg(orientation=orientation, stripes=True), cfg)
    assert turned.original_size == ((379, 505) if orientation >= 5 else (505, 379))
    expected = np.asarray(Image.fromarray(upright).transpose(_UPRIGHT[orientation]))
    assert scales == [3, 3]  # both decoded scaled: 379 * 3 / 8 = 142.1 >= 140
    assert _diff(turned.pixels, expected).max() <= 2  # rounding only; a box 0.6 pixel off: 30+ at the edges


def test_the_partial_last_block_is_placed_by_the_orientation():
    data = _jpeg(orientation=3)  # turned 180 degrees: the partial column and row come first
    scaled = jpeg.decode_scaled(data, (505, 379), (150, 113), gray=False, orientation=3)
    assert scaled is not None and scaled.eighths == 3
    assert scaled.image.size == (190, 143)  # ceil(505 * 3 / 8), ceil(379 * 3 / 8)
    assert scaled.area == pytest.approx((190 - 189.375, 143 - 142.125, 190, 143))
    scaled = jpeg.decode_scaled(data, (505, 379), (150, 113), gray=False, orientation=6)  # turned 90 degrees
    assert scaled is not None and scaled.image.size == (143, 190)
    assert scaled.area == pytest.approx((143 - 142.125, 0, 143, 189.375))


def test_no_scaling_when_it_would_not_pay_or_the_file_is_damaged():
    data = _jpeg()
    scaled = jpeg.decode_scaled(data, (505, 379), (400, 300), gray=False)  # M = 7: slower than in full
    assert scaled is not None and scaled.eighths == 8 and scaled.image.size == (505, 379)
    assert jpeg.decode_scaled(data[: len(data) // 2], (505, 379), (150, 113), gray=False) is None
    assert jpeg.decode_scaled(data[: len(data) // 2], (505, 379), None, gray=False) is None


def test_a_truncated_large_jpeg_is_still_explained():
    data = _jpeg(size=(1200, 900))
    with pytest.raises(DecodeError, match="corrupt or truncated"):
        decode(data[: len(data) // 2], PreprocessConfig(size=(100, 100)), "cut.jpg")


@pytest.mark.parametrize("source,target", [("L", "RGB"), ("L", "L"), ("RGB", "L")])
def test_gray_and_colour_sources(source, target, scales):
    data = _jpeg(mode=source, orientation=6)
    full = decode(data, PreprocessConfig(size=(160, 120), mode=target, reduced_decode=False))
    scaled = decode(data, PreprocessConfig(size=(160, 120), mode=target))
    assert scales == [8, 4]
    assert scaled.pixels.shape == full.pixels.shape == (120, 160, 3 if target == "RGB" else 1)
    assert _diff(scaled.pixels, full.pixels).mean() < 1.0


def _resized_from(monkeypatch) -> list:
    """The sizes of the images Pillow resizes from."""
    sizes: list = []
    real = Image.Image.resize

    def spy(self, size, *args, **kwargs):
        sizes.append(self.size)
        return real(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", spy)
    return sizes


def test_jpegs_libjpeg_turbo_does_not_take_fall_back_to_pillows_draft(monkeypatch, scales):
    """CMYK, and a file with bytes libjpeg-turbo calls corrupt but can skip (Pillow decodes it):
    Pillow still scales them while decoding, by 1/4 (its choices: 1/2, 1/4, 1/8), where libjpeg-turbo's
    would have been 3/8."""
    sizes = _resized_from(monkeypatch)
    good = _jpeg(size=(1010, 758))
    extraneous = good[:20] + b"\x00\x00\x00" + good[20:]  # between the JFIF header and the next marker
    cmyk = _jpeg(size=(1010, 758), mode="CMYK")
    for data in (extraneous, cmyk):
        full = decode(data, PreprocessConfig(size=(160, 120), reduced_decode=False)).pixels
        reduced = decode(data, PreprocessConfig(size=(160, 120))).pixels
        assert _diff(reduced, full).mean() < 1.5
    assert scales == [None]  # libjpeg-turbo refused the first (asked once: scaled); the CMYK file never asks it
    assert sizes == [(1010, 758), (253, 190)] * 2


def test_mpo_progressive_and_odd_orientations_are_scaled(scales):
    rgb = np.asarray(Image.open(io.BytesIO(_jpeg())))
    second = Image.fromarray(rgb[::-1].copy())
    datas = [
        _jpeg(format="MPO", save_all=True, append_images=[second]),
        _jpeg(progressive=True),
        _jpeg(orientation=0),
        _jpeg(orientation=9),
    ]
    assert Image.open(io.BytesIO(datas[0])).format == "MPO"
    full = decode(datas[1], PreprocessConfig(size=(160, 120), reduced_decode=False)).pixels
    for data in datas:
        scaled = decode(data, PreprocessConfig(size=(160, 120)))
        assert scaled.original_size == (505, 379)  # 0 and 9 are not orientations: the image stays as stored
        assert _diff(scaled.pixels, full).mean() < 1.0
    assert scales == [8] + [3] * 4


def _via_pillow(monkeypatch, data: bytes, cfg: PreprocessConfig):
    """decode(data) with every file through Image.open and Pillow's own decoder."""
    with monkeypatch.context() as m:
        m.setattr(jpeg, "plain_header", lambda data: None)
        m.setattr(jpeg, "decode_scaled", lambda *args, **kwargs: None)
        return decode(data, cfg, histogram=True)


_NOT_SCALED = [PreprocessConfig(), PreprocessConfig(reduced_decode=False), PreprocessConfig(size=None, resize="none")]


@pytest.mark.parametrize(
    "save,cfg",
    [
        *(({"size": (350, 350)}, cfg) for cfg in _NOT_SCALED),  # to 224: 5.12/8 of the size, M = 6
        *(({"size": (256, 300), "subsampling": 0}, cfg) for cfg in _NOT_SCALED),  # M = 7
        *(({"size": (300, 260), "orientation": 6}, cfg) for cfg in _NOT_SCALED),
        ({"size": (230, 240), "progressive": True}, PreprocessConfig()),  # M = 8
        ({"size": (32, 32), "mode": "L"}, PreprocessConfig(size=(32, 32))),  # a CIFAR-sized source at its size
        ({"size": (7, 40)}, PreprocessConfig(size=(5, 30), resize="stretch")),  # M = 6
    ],
)
def test_jpegs_not_worth_scaling_are_decoded_in_full_by_libjpeg_turbo(monkeypatch, save, cfg, scales):
    """Decoding at 6/8 or 7/8 is slower than in full, and a full decode (--full-decode, no resize, a
    target as large as the image) is the same libjpeg-turbo call Pillow makes: all decoded in full
    (M = 8) without Image.open, with the pixels, histogram and size Pillow's own decoding gives."""
    data = _jpeg(**save)
    via_pillow = _via_pillow(monkeypatch, data, cfg)
    monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("Image.open was called for a plain JPEG"))
    plain = decode(data, cfg, histogram=True)
    assert np.array_equal(plain.pixels, via_pillow.pixels) and plain.histogram == via_pillow.histogram
    assert plain.original_size == via_pillow.original_size
    assert scales == [8]


def test_tiny_images_are_not_scaled():
    assert jpeg.decode_scaled(_jpeg(size=(7, 40)), (7, 40), (1, 5), gray=False) is None  # Pillow's draft scales it


def test_a_full_decode_is_the_whole_image():
    scaled = jpeg.decode_scaled(_jpeg(size=(7, 40)), (7, 40), (7, 40), gray=False)
    assert scaled is not None and scaled.eighths == 8 and scaled.image.size == (7, 40) and scaled.area is None
    scaled = jpeg.decode_scaled(_jpeg(), (505, 379), None, gray=False, orientation=6)
    assert scaled is not None and scaled.eighths == 8 and scaled.image.size == (379, 505) and scaled.area is None


def test_the_manifest_records_how_jpegs_were_scaled(tmp_path):
    from packer import ConvertConfig, convert
    from packer.spec.manifest import read_manifest

    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "one.jpg").write_bytes(_jpeg())
    for reduced, out in ((True, "scaled"), (False, "full")):
        cfg = ConvertConfig("npy", PreprocessConfig(size=(160, 120), reduced_decode=reduced))
        convert(tmp_path / "src", tmp_path / out, cfg, workers=1)
        pre = read_manifest(tmp_path / out).preprocess
        assert pre.get("jpeg_scaling") == (jpeg.SCALING if reduced else None)
        assert PreprocessConfig.from_dict(pre) == cfg.preprocess


def _with_app1(data: bytes, payload: bytes) -> bytes:
    """``data`` with an APP1 segment holding ``payload`` right after the start-of-image marker."""
    return data[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


@pytest.mark.parametrize("save", [{}, {"subsampling": 0}, {"progressive": True}, {"mode": "L"}, {"size": (379, 505)}])
def test_plain_jpegs_skip_pillows_parser_with_the_same_result(monkeypatch, save, scales):
    data = _jpeg(**save)
    assert jpeg.plain_header(data) is not None
    cfg = PreprocessConfig(size=(160, 120))
    with monkeypatch.context() as m:
        m.setattr(jpeg, "plain_header", lambda data: None)  # every file through Image.open, as before
        via_pillow = decode(data, cfg, histogram=True)

    def no_open(*args, **kwargs):
        raise AssertionError("Image.open was called for a plain JPEG")

    monkeypatch.setattr(Image, "open", no_open)
    plain = decode(data, cfg, histogram=True)
    assert np.array_equal(plain.pixels, via_pillow.pixels)
    assert plain.histogram == via_pillow.histogram and plain.original_size == via_pillow.original_size
    assert len(scales) == 2 and scales[0] == scales[1] in (3, 4)  # scaled alike both ways (3/8, 4/8 portrait)


_XMP = (
    b'http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
    b'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
    b'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
)


def test_xmp_and_unusual_app1_segments_are_left_to_pillow():
    exif6 = _jpeg(orientation=6)
    exif_block = exif6[exif6.index(jpeg.EXIF) :]
    exif_block = exif_block[: int.from_bytes(exif6[exif6.index(jpeg.EXIF) - 2 : exif6.index(jpeg.EXIF)], "big") - 2]
    for data in (
        _with_app1(_jpeg(), _XMP),
        _with_app1(exif6, _XMP),
        _with_app1(exif6, exif_block),
        _with_app1(_jpeg(), b"something else"),
    ):
        assert jpeg.plain_header(data) is None
    for data in (_with_app1(_jpeg(), _XMP), _with_app1(exif6, _XMP)):
        assert decode(data, PreprocessConfig(size=(160, 120))).original_size == (379, 505)  # turned upright


def _both_ways(monkeypatch, data: bytes, cfg: PreprocessConfig):
    """decode(data) through Image.open as before plain headers, then without Image.open."""
    with monkeypatch.context() as m:
        m.setattr(jpeg, "plain_header", lambda data: None)
        via_pillow = decode(data, cfg, histogram=True)
    with monkeypatch.context() as m:
        m.setattr(Image, "open", lambda *a, **k: pytest.fail("Image.open was called for a JPEG with only EXIF"))
        plain = decode(data, cfg, histogram=True)
    return via_pillow, plain


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientations_are_read_without_opening_the_file(monkeypatch, orientation, scales):
    data = _jpeg(orientation=orientation, stripes=True)
    header = jpeg.plain_header(data)
    assert header is not None and header.exif is not None and header.exif.startswith(jpeg.EXIF)
    via_pillow, plain = _both_ways(monkeypatch, data, PreprocessConfig(size=(160, 120)))
    assert np.array_equal(plain.pixels, via_pillow.pixels) and plain.histogram == via_pillow.histogram
    assert plain.original_size == via_pillow.original_size == ((379, 505) if orientation > 4 else (505, 379))
    assert len(scales) == 2 and scales[0] == scales[1]


@pytest.mark.parametrize(
    "block", [b"Exif\x00\x00garbage", b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12", jpeg.EXIF]
)
def test_a_broken_exif_block_reads_as_pillow_reads_it(monkeypatch, block):
    data = _with_app1(_jpeg(), block)
    assert jpeg.plain_header(data).exif == block
    cfg = PreprocessConfig(size=(160, 120))
    plain = decode(data, cfg, histogram=True)  # through Image.open where Pillow's EXIF parser fails
    monkeypatch.setattr(jpeg, "plain_header", lambda data: None)
    via_pillow = decode(data, cfg, histogram=True)
    assert np.array_equal(plain.pixels, via_pillow.pixels) and plain.original_size == via_pillow.original_size


def _exif(*entries: tuple[int, int, int, bytes]) -> bytes:
    """An EXIF APP1 payload (little-endian TIFF) with IFD entries (tag, type, count, 4 value bytes)."""
    ifd = b"".join(struct.pack("<HHL", tag, kind, count) + value for tag, kind, count, value in entries)
    return jpeg.EXIF + b"II*\x00" + struct.pack("<LH", 8, len(entries)) + ifd + b"\x00" * 4


@pytest.mark.parametrize(
    "kind,count,value",
    [(7, 1, b"\x05\x00\x00\x00"), (1, 1, b"\x05\x00\x00\x00"), (2, 2, b"5\x00\x00\x00"), (3, 1, b"\x48\x00\x00\x00")],
)
def test_an_odd_exif_resolution_lets_pillow_decide(monkeypatch, kind, count, value):
    # Opening a JPEG without JFIF density, Pillow reads its dpi from EXIF and refuses some odd
    # values (a one-byte XResolution): the file goes to Image.open, whatever it makes of it.
    block = _exif(
        (0x011A, kind, count, value), (0x0112, 3, 1, struct.pack("<HH", 6, 0)), (0x0128, 3, 1, struct.pack("<HH", 2, 0))
    )
    data = _with_app1(_jpeg(), block)
    opened = []
    real = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real(*a, **k))
    cfg = PreprocessConfig(size=(160, 120))
    try:
        got = decode(data, cfg).original_size
    except DecodeError:
        got = "refused"
    assert opened
    monkeypatch.setattr(jpeg, "plain_header", lambda data: None)
    try:
        want = decode(data, cfg).original_size
    except DecodeError:
        want = "refused"
    assert got == want


def test_a_rational_exif_resolution_keeps_the_fast_path(monkeypatch):
    block = _exif((0x0112, 3, 1, struct.pack("<HH", 6, 0)), (0x0128, 3, 1, struct.pack("<HH", 2, 0)))
    via_pillow, plain = _both_ways(monkeypatch, _with_app1(_jpeg(), block), PreprocessConfig(size=(160, 120)))
    assert plain.original_size == via_pillow.original_size == (379, 505)


def test_a_tem_marker_before_the_scan_is_left_to_pillow():
    data = _jpeg()
    data = data[:2] + b"\xff\x01" + data[2:]  # libjpeg skips it; Pillow refuses the file
    assert jpeg.plain_header(data) is None
    with pytest.raises(DecodeError):
        decode(data, PreprocessConfig(size=(160, 120)))


def test_plain_header_declines_what_it_cannot_vouch_for():
    good = _jpeg()
    assert jpeg.plain_header(good) == (505, 379, False, None)
    assert jpeg.plain_header(_jpeg(mode="L")) == (505, 379, True, None)
    assert jpeg.plain_header(_jpeg(mode="CMYK")) is None
    assert jpeg.plain_header(_jpeg(format="PNG")) is None
    assert jpeg.plain_header(good[:40]) is None  # cut inside the headers
    assert jpeg.plain_header(good[:2] + b"\x00" + good[3:]) is None  # a segment that is not a marker
    with pytest.raises(DecodeError, match="corrupt or truncated"):
        decode(good[:40], PreprocessConfig(size=(160, 120)))  # Pillow explains it, as before
    sof = good.index(b"\xff\xc0")
    frame = good[sof : sof + 2 + ((good[sof + 2] << 8) | good[sof + 3])]
    assert jpeg.plain_header(good[: sof + 4] + b"\x0c" + good[sof + 5 :]) is None  # 12-bit samples
    assert jpeg.plain_header(good[: sof + 5] + b"\x00\x00" + good[sof + 7 :]) is None  # height in a DNL marker
    assert jpeg.plain_header(good[:sof] + frame + good[sof:]) is None  # two frame headers
    assert jpeg.plain_header(good[:sof] + good[sof + len(frame) :]) is None  # none
    progressive = _jpeg(size=(33, 20), progressive=True, restart_marker_blocks=1, optimize=True)
    assert jpeg.plain_header(progressive) == (33, 20, False, None)  # SOF2


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("size", [(505, 379), (379, 505), (233, 171)])
def test_a_scaled_image_holds_exactly_libjpegs_pixels(mode, size):
    data = _jpeg(size=size, mode=mode)
    scaled = jpeg.decode_scaled(data, size, (size[0] * 5 // 8, size[1] * 5 // 8), mode == "L")
    assert scaled is not None and scaled.eighths == 5
    want = simplejpeg.decode_jpeg(
        data, "GRAY" if mode == "L" else "RGB", min_width=scaled.image.width, min_height=scaled.image.height
    )
    got = np.asarray(scaled.image)
    assert scaled.image.mode == mode and np.array_equal(got[:, :, None] if mode == "L" else got, want)


def test_decoded_pixels_are_used_without_a_copy():
    """Also an alarm: a Pillow that stops keeping RGB as 4 bytes a pixel fails here (decoding still
    works, with a copy: see the next test)."""
    pixels = simplejpeg.decode_jpeg(_jpeg(size=(40, 24)), "RGBX")
    assert jpeg._maps_rgbx()  # this Pillow keeps RGB as 4 bytes a pixel: the mapping is used, not the copy
    image = jpeg.as_image(pixels)
    assert image.mode == "RGB" and image.size == (40, 24)
    assert np.array_equal(np.asarray(image), pixels[:, :, :3])
    pixels[0, 0, :3] = (1, 2, 3)  # the image is a view of libjpeg-turbo's output
    assert image.getpixel((0, 0)) == (1, 2, 3)
    gray = simplejpeg.decode_jpeg(_jpeg(size=(40, 24), mode="L"), "GRAY")
    assert np.array_equal(np.asarray(jpeg.as_image(gray)), gray[:, :, 0])


@pytest.mark.parametrize("why", ["probe", "refused"])
def test_without_the_mapping_the_pixels_are_copied(monkeypatch, why):
    """A Pillow whose RGB images are laid out otherwise (the probe's bytes differ) or whose private
    mapping call is gone: as_image copies, decode gives the same pixels."""
    jpeg._maps_rgbx.cache_clear()
    if why == "probe":
        monkeypatch.setattr(jpeg, "_mapped_rgb", lambda pixels, size: Image.new("RGB", size))
    else:

        def refused(*args):
            raise AttributeError("map_buffer")

        monkeypatch.setattr(Image.core, "map_buffer", refused)
    assert not jpeg._maps_rgbx()
    pixels = simplejpeg.decode_jpeg(_jpeg(size=(40, 24)), "RGBX")
    image = jpeg.as_image(pixels)
    pixels[0, 0, :3] = (1, 2, 3)
    assert image.mode == "RGB" and image.getpixel((0, 0)) != (1, 2, 3)
    cfg = PreprocessConfig(size=(160, 120))
    data = _jpeg()
    fallback = decode(data, cfg).pixels
    monkeypatch.undo()
    jpeg._maps_rgbx.cache_clear()
    assert jpeg._maps_rgbx() and np.array_equal(fallback, decode(data, cfg).pixels)


def test_decodes_into_the_scratch_buffer_do_not_mix(monkeypatch):
    """decode reuses one buffer per thread: image after image, and in threads at once, each result
    is what a decode into fresh memory gives."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(jpeg, "_SCRATCH", type(jpeg._SCRATCH)())
    cases = [
        (_jpeg(size=size, orientation=o, mode=m), cfg)
        for size, o, m in [
            ((505, 379), None, "RGB"),
            ((379, 505), 6, "RGB"),
            ((233, 171), None, "L"),
            ((64, 48), 3, "RGB"),
        ]
        for cfg in (
            PreprocessConfig(size=(160, 120)),
            PreprocessConfig(size=None, resize="none"),
            PreprocessConfig(size=(64, 48)),
        )
    ]
    real = jpeg.decode_scaled
    monkeypatch.setattr(jpeg, "decode_scaled", lambda *a: real(*a[:5], scratch=False))
    want = [decode(d, c).pixels for d, c in cases]
    monkeypatch.setattr(jpeg, "decode_scaled", real)
    assert [decode(d, c).pixels.tobytes() for d, c in cases] == [w.tobytes() for w in want]
    assert len(jpeg._SCRATCH.buffer) > 0  # the buffer was used
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            got = list(pool.map(lambda case: decode(*case).pixels.tobytes(), cases * 4))
            assert got == [w.tobytes() for w in want] * 4


def test_large_images_get_a_buffer_of_their_own(monkeypatch):
    monkeypatch.setattr(jpeg, "_SCRATCH", type(jpeg._SCRATCH)())
    monkeypatch.setattr(jpeg, "SCRATCH_MAX_BYTES", 100 * 100 * 4)
    data = _jpeg(size=(505, 379))
    decode(data, PreprocessConfig(size=(160, 120)))  # 316 x 237 at M = 5: over the limit
    assert len(jpeg._SCRATCH.buffer) == 0
    small = decode(_jpeg(size=(80, 60)), PreprocessConfig(size=(80, 60))).pixels  # in full
    assert len(jpeg._SCRATCH.buffer) == 80 * 60 * 4
    assert np.array_equal(small, np.asarray(Image.open(io.BytesIO(_jpeg(size=(80, 60))))))
