"""One compiled pass from stored uint8 pixels to normalized float32: ``x * scale + bias`` per channel.

A normalized image is written into its slot of a batch once, each byte read once and each float
written once, in whichever pair of layouts meets: the source HWC (pixels side by side, as OpenCV's
resize and the stored images have them) or planar (as torch's resize writes it), the slot NCHW or
channels-last. numpy's way is a cast, a multiply and an add, three passes over the slot, plus a
regrouping of the channels when the layouts differ; numba compiles each loop below to one pass.

Each value is ``float32(x) * scale[c]`` rounded to float32, then ``+ bias[c]`` rounded to float32,
as numpy computes it: numba's default (no ``fastmath``) keeps both roundings (no fused multiply-add),
so every host, layout, worker count and rank gives the same float32 values as numpy's passes.

The loops take flat (or, ``pixels_to_pixels``, 2-D) C-contiguous arrays, which LLVM vectorizes (the
rows of 2-D views defeat it). Asked to ``stream`` (a batch's slot, which nobody reads before the
batch is handed on), where the slot allows it (its address a multiple of 64 bytes, as a batch
tensor's slots are, and each plane, or the whole image, a multiple of 16 floats or pixels, as
224 x 224 ones are), the floats are written 16 at a time with non-temporal stores (the intrinsics
``_stream16``, ``_stream16_channel``, ``_stream48``, ``_stream48_planes``): a slot of a 38 MB batch is not
in the cache anyway, and an ordinary store first reads each line it writes from memory, so
streaming them past the cache halves the bytes moved (docs/BENCHMARKS.md, C21). The values are the
same: the same two roundings, in LLVM vector instructions instead of the loop's. A fence ends each
such loop, so that the stores are visible before the batch is handed on. Each loop returns whether
it streamed.
They are compiled on first use and cached on disk (``cache=True``: next to this file, or in the
user's cache folder where that is not writable), so a DataLoader worker loads them, not compiles;
where numba finds nowhere to cache (a read-only install and home), each process compiles them.
This module imports numba: ``readers.datasets.tensors`` imports it for a reader of uint8 images that
normalizes on the CPU, when the reader is made, or at the first normalize otherwise.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from readers.compiled import jit

_F32, _I8, _I32 = ir.FloatType(), ir.IntType(8), ir.IntType(32)
_FLOATS, _BYTES, _INTS = ir.VectorType(_F32, 16), ir.VectorType(_I8, 16), ir.VectorType(_I32, 16)
STREAM = 16
"""Floats a streamed store writes: 64 bytes, one cache line."""
BLOCK = 1024
"""Pixels of an HWC crop that ``pixels_to_planes`` streams into one plane before the next: the three
planes are written one after another, 1,024 pixels at a time (3 KB of the crop, which stays in the
first-level cache for the three reads). Streamed stores into three planes at once, 16 floats to each
in turn, ran at half the speed of one plane at a time on an AVX2 host, whose 32-byte stores fill a
line in two (AMD EPYC Zen 3; C21 of docs/BENCHMARKS.md)."""


def _at(context, builder, array_type, array, index):
    """LLVM pointer to ``array[index]`` of a C-contiguous numba array (``_checked`` when typed)."""
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [index])


def _checked(name: str, **arrays) -> None:
    """Refuse, when numba types a call, any array the intrinsic ``name`` would misread: they index
    from the data pointer, so each must be C-contiguous, of the dtype named (``src``: uint8, the
    others float32)."""
    for what, array in arrays.items():
        dtype = types.uint8 if what == "src" else types.float32
        if not (isinstance(array, types.Array) and array.layout == "C" and array.dtype == dtype):
            raise TypingError(f"{name} takes C-contiguous {dtype} arrays for {what}, not {array}")


def _load(builder, pointer, vector, align: int):
    """Load a ``vector`` (an LLVM vector type) from ``pointer``, aligned to ``align`` bytes."""
    return builder.load(builder.bitcast(pointer, vector.as_pointer()), align=align)


def _streamed(builder, values, pointer) -> None:
    """Store 16 floats at ``pointer`` (64-byte aligned) past the cache (``!nontemporal``)."""
    store = builder.store(values, builder.bitcast(pointer, _FLOATS.as_pointer()), align=64)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(_I32, 1)]))


def _normalized(builder, pixels, scale, bias):
    """float32(pixels) * scale + bias over 16 lanes: a multiply and an add, each rounded (no fusing)."""
    floats = builder.uitofp(builder.zext(pixels, _INTS), _FLOATS)
    return builder.fadd(builder.fmul(floats, scale), bias)


@intrinsic
def _stream16(typingctx, src, i, dst, j, scale, bias, k):
    """``dst[j:j+16] = float32(src[i:i+16]) * scale[k:k+16] + bias[k:k+16]``, streamed."""
    _checked("_stream16", src=src, dst=dst, scale=scale, bias=bias)

    def codegen(context, builder, signature, args):
        s, i_, d, j_, sc, bi, k_ = args
        a = signature.args
        pixels = _load(builder, _at(context, builder, a[0], s, i_), _BYTES, 1)
        factors = (_load(builder, _at(context, builder, a[n], f, k_), _FLOATS, 4) for n, f in ((4, sc), (5, bi)))
        _streamed(builder, _normalized(builder, pixels, *factors), _at(context, builder, a[2], d, j_))
        return context.get_dummy_value()

    return types.void(src, i, dst, j, scale, bias, k), codegen


@intrinsic(prefer_literal=True)
def _stream16_channel(typingctx, src, i, dst, j, scale, bias, channel):
    """Channel ``channel`` (a constant 0, 1 or 2) of 16 RGB pixels side by side, ``src[3i:3i+48]``,
    to ``dst[j:j+16]``, ``float32(x) * scale[16c:][:16] + bias[16c:][:16]``, streamed."""
    # prefer_literal: numba types the call with the constant first; the shuffle's lanes are fixed
    if not isinstance(channel, types.IntegerLiteral) or not 0 <= channel.literal_value < 3:
        raise TypingError(f"_stream16_channel takes the channel as a constant 0, 1 or 2, not {channel}")
    _checked("_stream16_channel", src=src, dst=dst, scale=scale, bias=bias)
    c = channel.literal_value

    def codegen(context, builder, signature, args):
        s, i_, d, j_, sc, bi, _ = args
        a = signature.args
        at = _at(context, builder, a[0], s, builder.mul(i_, ir.Constant(i_.type, 3)))
        pixels = _load(builder, at, ir.VectorType(_I8, 48), 1)
        lane = builder.shuffle_vector(pixels, pixels, ir.Constant(_INTS, [3 * n + c for n in range(16)]))
        first = ir.Constant(i_.type, 16 * c)
        factors = (_load(builder, _at(context, builder, a[n], f, first), _FLOATS, 4) for n, f in ((4, sc), (5, bi)))
        _streamed(builder, _normalized(builder, lane, *factors), _at(context, builder, a[2], d, j_))
        return context.get_dummy_value()

    return types.void(src, i, dst, j, scale, bias, channel), codegen


def _store48(context, builder, pixels, dst_type, dst, j, factors) -> None:
    """48 floats of 16 RGB pixels side by side (``pixels``: 48 bytes) to ``dst[j:j+48]``, each
    ``float32(x) * scale + bias`` with the factors tiled over 16 pixels, streamed."""
    (scale_type, scale), (bias_type, bias) = factors
    for m in range(3):
        lane = builder.shuffle_vector(pixels, pixels, ir.Constant(_INTS, list(range(16 * m, 16 * m + 16))))
        first = ir.Constant(j.type, 16 * m)
        scales = _load(builder, _at(context, builder, scale_type, scale, first), _FLOATS, 4)
        biases = _load(builder, _at(context, builder, bias_type, bias, first), _FLOATS, 4)
        out = _at(context, builder, dst_type, dst, builder.add(j, first))
        _streamed(builder, _normalized(builder, lane, scales, biases), out)


@intrinsic
def _stream48(typingctx, src, i, dst, j, scale, bias):
    """16 RGB pixels side by side from ``src[i:i+48]`` to ``dst[j:j+48]`` (``_store48``)."""
    _checked("_stream48", src=src, dst=dst, scale=scale, bias=bias)

    def codegen(context, builder, signature, args):
        s, i_, d, j_, sc, bi = args
        a = signature.args
        pixels = _load(builder, _at(context, builder, a[0], s, i_), ir.VectorType(_I8, 48), 1)
        _store48(context, builder, pixels, a[2], d, j_, ((a[4], sc), (a[5], bi)))
        return context.get_dummy_value()

    return types.void(src, i, dst, j, scale, bias), codegen


@intrinsic
def _stream48_planes(typingctx, src, i, plane, dst, j, scale, bias):
    """16 RGB pixels from three planes ``plane`` bytes apart (``src[i:i+16]``, ``src[plane + i:][:16]``,
    ``src[2 * plane + i:][:16]``) to ``dst[j:j+48]``, side by side (``_store48``)."""
    _checked("_stream48_planes", src=src, dst=dst, scale=scale, bias=bias)

    def codegen(context, builder, signature, args):
        s, i_, p_, d, j_, sc, bi = args
        a = signature.args
        r, g, b = (
            _load(
                builder,
                _at(context, builder, a[0], s, builder.add(builder.mul(p_, ir.Constant(p_.type, c)), i_)),
                _BYTES,
                1,
            )
            for c in range(3)
        )
        rg = builder.shuffle_vector(r, g, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        bb = builder.shuffle_vector(b, b, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        # output byte n: pixel n // 3 of channel n % 3 (rg holds r then g, bb starts with b: index 32 on)
        order = ir.Constant(ir.VectorType(_I32, 48), [16 * (n % 3) + n // 3 for n in range(48)])
        _store48(context, builder, builder.shuffle_vector(rg, bb, order), a[3], d, j_, ((a[5], sc), (a[6], bi)))
        return context.get_dummy_value()

    return types.void(src, i, plane, dst, j, scale, bias), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def _fence(typingctx):
    """The streamed stores before it made visible to every core before any store after it (the
    message that hands the batch on): x86's ``sfence``, which non-temporal stores need (the fence
    LLVM emits for ``seq_cst`` may be a locked instruction), or a full fence elsewhere."""

    def codegen(context, builder, signature, args):
        if _X86:
            sfence = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence"
            )
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _address(typingctx, array):
    """The address of an array's first element, as an integer."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, context.get_value_type(types.intp))

    return types.intp(array), codegen


@jit
def _streams(dst: np.ndarray, part: int) -> bool:
    """Whether ``dst`` takes streamed stores of 16 floats written ``part`` floats at a time (a plane,
    or the whole image): each part then starts on a 64-byte boundary."""
    return part > 0 and part % STREAM == 0 and _address(dst) % 64 == 0


@jit
def pixels_to_pixels(
    src: np.ndarray, dst: np.ndarray, channels: int, scale_row: np.ndarray, bias_row: np.ndarray, stream: bool
) -> bool:
    """``src`` uint8 HWC rows, (H, W * C), into ``dst`` float32 rows of that shape; the factors tiled
    along one row. With ``stream``, where ``dst`` is on a cache line and holds a multiple of 16
    pixels (and the row at least 16), 16 pixels a step with streamed stores; True when so written.
    Otherwise row by row (LLVM vectorizes a row's loop, not one flat loop in steps of a row), three
    rows a third of the image apart at a time: three streams of stores in flight, which write a slot
    that is not in the cache faster than one stream, waiting on the memory, does (docs/BENCHMARKS.md,
    C21's run of 2026-12-06); the NCHW loops write three planes so already."""
    flat_in, flat_out = src.reshape(src.size), dst.reshape(dst.size)
    period = STREAM * channels  # 16 pixels: the factors' pattern starts again, on a cache line
    if stream and scale_row.shape[0] >= period and flat_out.size % period == 0 and _streams(flat_out, period):
        for base in range(0, flat_out.size, period):
            if channels == 3:
                _stream48(flat_in, base, flat_out, base, scale_row, bias_row)
            else:
                for k in range(0, period, STREAM):
                    _stream16(flat_in, base + k, flat_out, base + k, scale_row, bias_row, k)
        _fence()
        return True
    third = src.shape[0] // 3
    for y in range(third):
        s0, s1, s2 = src[y], src[y + third], src[y + 2 * third]
        d0, d1, d2 = dst[y], dst[y + third], dst[y + 2 * third]
        for k in range(s0.shape[0]):
            d0[k] = np.float32(s0[k]) * scale_row[k] + bias_row[k]
            d1[k] = np.float32(s1[k]) * scale_row[k] + bias_row[k]
            d2[k] = np.float32(s2[k]) * scale_row[k] + bias_row[k]
    for y in range(3 * third, src.shape[0]):
        s, d = src[y], dst[y]
        for k in range(s.shape[0]):
            d[k] = np.float32(s[k]) * scale_row[k] + bias_row[k]
    return False


@jit
def pixels_to_planes(
    src: np.ndarray, dst: np.ndarray, channels: int, scale16: np.ndarray, bias16: np.ndarray, stream: bool
) -> bool:
    """``src`` flat uint8 HWC into ``dst`` flat float32 CHW (``channels`` planes); ``scale16``,
    ``bias16``: each channel's factor 16 times over, as the streamed stores take them (with
    ``stream``, of 1 or 3 channels, where each plane starts on a cache line); True when so written."""
    pixels = src.shape[0] // channels
    if stream and channels == 1 and _streams(dst, pixels):
        for i in range(0, pixels, STREAM):
            _stream16(src, i, dst, i, scale16, bias16, 0)
        _fence()
        return True
    if stream and channels == 3 and _streams(dst, pixels):
        for start in range(0, pixels, BLOCK):  # one plane at a time: one stream of streamed stores
            end = min(start + BLOCK, pixels)
            for i in range(start, end, STREAM):
                _stream16_channel(src, i, dst, i, scale16, bias16, 0)
            for i in range(start, end, STREAM):
                _stream16_channel(src, i, dst, pixels + i, scale16, bias16, 1)
            for i in range(start, end, STREAM):
                _stream16_channel(src, i, dst, 2 * pixels + i, scale16, bias16, 2)
        _fence()
        return True
    if channels == 3:  # the common case, written out so that LLVM sees a stride of 3
        s0, s1, s2 = scale16[0], scale16[STREAM], scale16[2 * STREAM]
        b0, b1, b2 = bias16[0], bias16[STREAM], bias16[2 * STREAM]
        for i in range(pixels):
            dst[i] = np.float32(src[3 * i]) * s0 + b0
            dst[pixels + i] = np.float32(src[3 * i + 1]) * s1 + b1
            dst[2 * pixels + i] = np.float32(src[3 * i + 2]) * s2 + b2
        return False
    for c in range(channels):
        sc, bi, base = scale16[STREAM * c], bias16[STREAM * c], c * pixels
        for i in range(pixels):
            dst[base + i] = np.float32(src[channels * i + c]) * sc + bi
    return False


@jit
def planes_to_planes(
    src: np.ndarray, dst: np.ndarray, channels: int, scale16: np.ndarray, bias16: np.ndarray, stream: bool
) -> bool:
    """``src`` flat uint8 CHW into ``dst`` flat float32 CHW; the rest as ``pixels_to_planes``'s (any
    channel count streams)."""
    pixels = src.shape[0] // channels
    if stream and _streams(dst, pixels):
        for c in range(channels):
            for i in range(c * pixels, (c + 1) * pixels, STREAM):
                _stream16(src, i, dst, i, scale16, bias16, STREAM * c)
        _fence()
        return True
    for c in range(channels):
        sc, bi, base = scale16[STREAM * c], bias16[STREAM * c], c * pixels
        for i in range(pixels):
            dst[base + i] = np.float32(src[base + i]) * sc + bi
    return False


@jit
def planes_to_pixels(
    src: np.ndarray, dst: np.ndarray, channels: int, scale_row: np.ndarray, bias_row: np.ndarray, stream: bool
) -> bool:
    """``src`` flat uint8 CHW into ``dst`` flat float32 HWC; the factors tiled over at least 16 pixels
    (as ``pixels_to_pixels`` takes them), for the streamed stores (with ``stream``, of RGB, where
    ``dst`` starts on a cache line and holds a multiple of 16 pixels); True when so written."""
    pixels = src.shape[0] // channels
    if stream and channels == 3 and scale_row.shape[0] >= 48 and _streams(dst, 48) and pixels % STREAM == 0:
        for i in range(0, pixels, STREAM):
            _stream48_planes(src, i, pixels, dst, 3 * i, scale_row, bias_row)
        _fence()
        return True
    if channels == 3:  # written out: LLVM then stores the three channels of a pixel side by side
        s0, s1, s2, b0, b1, b2 = scale_row[0], scale_row[1], scale_row[2], bias_row[0], bias_row[1], bias_row[2]
        for i in range(pixels):
            dst[3 * i] = np.float32(src[i]) * s0 + b0
            dst[3 * i + 1] = np.float32(src[pixels + i]) * s1 + b1
            dst[3 * i + 2] = np.float32(src[2 * pixels + i]) * s2 + b2
        return False
    for c in range(channels):
        sc, bi, base = scale_row[c], bias_row[c], c * pixels
        for i in range(pixels):
            dst[channels * i + c] = np.float32(src[base + i]) * sc + bi
    return False


__all__ = ["pixels_to_pixels", "pixels_to_planes", "planes_to_planes", "planes_to_pixels"]
