"""8-bit convolutions on the CPU's dot-product instructions: AVX-512 VNNI and AVX-VNNI (``vpdpbusd``) on x86
and ``sdot`` on aarch64 CPUs with the dot-product extension (Cortex-A76 and later: rpi5, recent phones),
``smmla`` on those with the 8-bit matrix multiply (+i8mm, Armv9 cores: 2 pixels x 2 channels x 8 input
channels per instruction, ``[KH, KW, C/8, O, 8]`` weights; sdot where a strided window or an odd row rules
it out), and on widening multiplies where there is none: AVX2's ``vpmaddwd`` on 16-bit pairs, NEON's (Cortex-A72: rpi4;
armv7: rpi3; ``schedules/dot_product.py``'s PMADDWD, SMULL and VMULL, the last two taking no weight of -128).

``backends/integer.py`` turns an 8-bit convolution into an exact int32 one, ``conv2d(int32(x_q) - z, w_q)``. As
such it multiplies 32-bit integers, 16 per AVX-512 instruction. A dot-product instruction multiplies
four 8-bit pairs and adds them into each 32-bit lane: 64 multiply-adds per VNNI instruction, 16 per
``sdot``. This pass rewrites each such channels-last convolution (ungrouped, constant 8-bit weights,
``L`` output channels per vector dividing its channels) into a kernel that reads the 8-bit input itself:

    u[n, y, x, c] = x_q[...] + shift   (padding: z + shift)  the instruction's operand type: unsigned for
                                                             VNNI (int8 input: +128), signed for sdot
    acc[n, y, x, o] = sum_{kh, kw, c} u[...] * w_q[o, kh, kw, c]           in L-lane blocks of 4 channels
    conv = acc - (z + shift) * sum_{kh, kw, c} w_q[o, kh, kw, c]           one constant per channel

which equals ``sum (x_q - z) * w_q`` exactly (the padding contributes nothing). ``z`` is a constant, or
the zero point a DynamicQuantizeLinear computed at run time (``quantize_dynamic``'s ConvInteger): the
padding and the per-channel term then read it. The weights are packed
at compile time as ``[KH, KW, C/4, O, 4]``: for each tap and 4 input channels, the L x 4 bytes one
instruction reads are contiguous. The input's channels are padded to a multiple of 4 with copies of its
last channel (their weights are zero). ``schedules/dot_product.py`` tiles the kernel and maps its inner
L x 4 block onto the instruction (``tensorize``); the bias, requantization and activation after it are
fused into each tile's store.

Measured (Zen 4, AVX-512 VNNI, one thread, in cache): ResNet-8's 3x3 convolutions 290-400 GOP/s, from
~92 as int32 multiply-adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from edgepack.backends.cpu.conv_rewrite import conv2d_rewrite_pass
from edgepack.backends.cpu.schedules.dot_product import DOT_PRODUCT_ATTR, DotProduct, dot_product_of
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.integer import narrow_integers
from edgepack.backends.relax_exprs import as_ints, bound_value, const_value, dtype_of, op_name, static_shape

OUT_ELEMWISE_FUSABLE = 4  # TVM's OpPatternKind kOutEWiseFusable


def window_of(attrs) -> dict:
    """A convolution's window (strides, padding, dilation) as the TE kernels here take it."""
    return {"strides": as_ints(attrs.strides), "padding": as_ints(attrs.padding), "dilation": as_ints(attrs.dilation)}


def output_size(h: int, w: int, kernel: tuple[int, int], *, strides, padding, dilation) -> tuple[int, int]:
    """Output rows and columns of a convolution window over ``h`` x ``w``."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilation
    top, left, bottom, right = padding
    return (h + top + bottom - dh * (kh - 1) - 1) // sh + 1, (w + left + right - dw * (kw - 1) - 1) // sw + 1


def packed_weights(weights_ohwi: np.ndarray, dot: DotProduct) -> np.ndarray:
    """OHWI int8 weights as ``[KH, KW, C/D, O, D]`` (``D = dot.depth`` input channels per instruction: 4,
    or 8 for a matrix instruction), the input channels padded to a multiple of D with zeros; for an
    instruction that reads them by pairs of channels (``DotProduct.pairs``) as ``[KH, KW, C/4, O/L, 2, L, 2]``."""
    o, kh, kw, c = weights_ohwi.shape
    depth = dot.depth
    cp = -(-c // depth) * depth
    grown = np.zeros((o, kh, kw, cp), np.int8)
    grown[..., :c] = weights_ohwi
    packed = grown.reshape(o, kh, kw, cp // depth, depth).transpose(1, 2, 3, 0, 4)
    if dot.pairs:
        packed = packed.reshape(kh, kw, cp // 4, o // dot.lanes, dot.lanes, 2, 2).transpose(0, 1, 2, 3, 5, 4, 6)
    return np.ascontiguousarray(packed)


def dot_convolution(data, weights, *, strides, padding, dilation, pad_value, shift: int, dot: DotProduct):
    """The TE kernel: NHWC 8-bit ``data`` (``shift`` added, as ``dot.data_dtype``; padded with
    ``pad_value``: a number, or the zero point as an int32 tensor of one element, ``shift`` then added)
    convolved with ``weights`` packed by ``packed_weights``, summed in int32."""
    from tvm import te

    n, h, w, c = (int(v) for v in data.shape)
    kh_, kw_, blocks = (int(v) for v in weights.shape[:3])
    o = int(weights.shape[3]) * (dot.lanes if dot.pairs else 1)
    (sh, sw), (dh, dw) = strides, dilation
    oh, ow = output_size(h, w, (kh_, kw_), strides=strides, padding=padding, dilation=dilation)

    if not any(padding) and c % dot.depth == 0 and not shift and data.dtype == dot.data_dtype:
        padded = data  # already the operand: read in place
    else:
        padded = _padded(data, padding, blocks, pad_value, shift, dot)
    ry = te.reduce_axis((0, kh_), "ry")
    rx = te.reduce_axis((0, kw_), "rx")
    rb = te.reduce_axis((0, blocks), "rb")
    rc = te.reduce_axis((0, dot.depth), "rc")

    def weight(k):
        if dot.pairs:
            return weights[ry, rx, rb, k // dot.lanes, rc // 2, k % dot.lanes, rc % 2]
        return weights[ry, rx, rb, k, rc]

    return te.compute(
        (n, oh, ow, o),
        lambda b, y, x, k: te.sum(
            padded[b, y * sh + ry * dh, x * sw + rx * dw, rb * dot.depth + rc].astype("int32") * weight(k).astype("int32"),
            axis=[ry, rx, rb, rc]),
        name="dot_conv", attrs={DOT_PRODUCT_ATTR: dot.name})


def integer_input(expr, builder, *, runtime_zero: bool = False):
    """``(x_q, z)`` where ``expr`` is ``int32(x_q) - z`` or ``int32(x_q)`` of an 8-bit ``x_q`` (through
    the builder's bindings), else None. A transpose on top (the model's NCHW input made NHWC) is moved
    onto the 8-bit tensor, emitted through ``builder``: a quarter of the bytes to move.

    ``z`` is a constant, or with ``runtime_zero`` a ``RuntimeZero``: a zero point computed at run time
    (ONNX's DynamicQuantizeLinear before a ConvInteger), the int32 of a scalar of ``x_q``'s own type."""
    from tvm import relax

    zero, axes = 0, None
    value = bound_value(expr, builder)
    if op_name(value) == "relax.permute_dims" and value.attrs.axes is not None:
        axes, value = [int(v) for v in value.attrs.axes], bound_value(value.args[0], builder)
    if op_name(value) == "relax.subtract":
        z = const_value(value.args[1])
        if z is None and runtime_zero:
            zero = _runtime_zero(value.args[1], builder)
            if zero is None:
                return None
        elif z is None or z.size != 1:
            return None
        else:
            zero = int(z.reshape(-1)[0])
        value = bound_value(value.args[0], builder)
    if op_name(value) != "relax.astype":
        return None
    source = value.args[0]
    if dtype_of(source) not in ("int8", "uint8") or dtype_of(value) != "int32" or static_shape(source) is None:
        return None
    if isinstance(zero, RuntimeZero) and zero.dtype != dtype_of(source):
        return None
    if axes is not None:
        source = builder.emit(relax.op.permute_dims(source, axes))
    return source, zero


@dataclass(frozen=True)
class RuntimeZero:
    """A zero point known at run time: ``value`` (a Relax int32 scalar) widened from ``dtype``, so within
    that type's range."""

    value: object
    dtype: str


def _runtime_zero(expr, builder) -> RuntimeZero | None:
    """``expr`` as a RuntimeZero where it is the int32 of one 8-bit value, else None."""
    value = bound_value(expr, builder)
    shape = static_shape(value)
    if op_name(value) != "relax.astype" or dtype_of(value) != "int32" or shape is None or prod(shape) != 1 \
            or dtype_of(value.args[0]) not in ("int8", "uint8"):
        return None
    return RuntimeZero(expr, dtype_of(value.args[0]))


def dot_product_convolutions(cpu: CpuInfo):
    """A Relax module pass: every exact 8-bit convolution (``backends/integer.py``) in channels-last form on the
    dot-product instruction of ``cpu`` (none: the pass changes nothing)."""
    dot = dot_product_of(cpu)

    def rewrite(call, weight: np.ndarray, bb):
        weight = as_int8(weight)
        a = call.attrs
        if dot is None or str(a.data_layout) != "NHWC" or str(a.kernel_layout) != "OHWI" \
                or str(a.out_layout) not in ("", "NHWC") or int(a.groups) != 1 or dtype_of(call) != "int32" \
                or static_shape(call) is None:
            return None
        found = integer_input(call.args[0], bb, runtime_zero=True)
        made = None if found is None else _dot_call(bb, *found, weight, window_of(a), dot)
        return None if made is None else (made[0], _noun(made[1]))

    return conv2d_rewrite_pass("EdgepackDotProductConvolutions", rewrite)


def dot_product_matmuls(cpu: CpuInfo):
    """A Relax module pass: every exact 8-bit matrix product (``backends/integer.py``: MatMulInteger, QGemm,
    a QDQ MatMul or Gemm, ``quantize_dynamic``'s products) of an 8-bit operand and constant int8 weights
    ``[K, N]`` as a 1x1 convolution on the dot-product instruction of ``cpu``: the rows are pixels."""
    from tvm import relax

    dot = dot_product_of(cpu)
    window = {"strides": [1, 1], "padding": [0, 0, 0, 0], "dilation": [1, 1]}

    def rewrite(call, weight: np.ndarray, bb):
        weight = as_int8(weight)
        if dot is None or dtype_of(call) != "int32" or weight.ndim != 2 or static_shape(call) is None:
            return None
        found = integer_input(call.args[0], bb, runtime_zero=True)
        shape = None if found is None else static_shape(found[0])
        if shape is None or len(shape) < 2 or shape[-1] != weight.shape[0]:
            return None
        data, zero = found
        rows = bb.emit(relax.op.reshape(data, [1, 1, prod(shape[:-1]), shape[-1]]))
        ohwi = np.ascontiguousarray(weight.T.reshape(weight.shape[1], 1, 1, weight.shape[0]))
        made = _dot_call(bb, rows, zero, ohwi, window, dot)
        if made is None:
            return None
        return relax.op.reshape(bb.emit(made[0]), [*shape[:-1], weight.shape[1]]), _noun(made[1])

    return conv2d_rewrite_pass("EdgepackDotProductMatmuls", rewrite, op="relax.matmul", noun="matrix product")


def _noun(dot: DotProduct) -> str:
    """How the compile summary says which instruction a product runs on."""
    return f"on {dot.name.split('_')[1]} dot products"


def _dot_call(bb, data, zero, weight: np.ndarray, window: dict, dot: DotProduct):
    """(the int32 convolution of ``data`` less ``zero`` (a constant or a ``RuntimeZero``) with OHWI int8
    ``weight``, the instruction it runs on: ``dot`` or its fallback), or None where it cannot take it."""
    from tvm import relax

    dot = _taken(dot, static_shape(data), weight.shape[1:3], window)
    if weight.dtype != np.int8 or int(weight.min()) < dot.weight_min:
        return None
    out_channels = int(weight.shape[0])
    channels = -(-out_channels // dot.lanes) * dot.lanes  # a few more at 4x the speed: 24 as 32
    shift = {("uint8", "uint8"): 0, ("int8", "uint8"): 128, ("int8", "int8"): 0, ("uint8", "int8"): -128,
             ("int8", "int16"): 0, ("uint8", "int16"): 0}[(dtype_of(data), dot.data_dtype)]
    info = np.iinfo(dot.data_dtype)
    # a run-time zero point of the input's type, shifted as the input is, stays in the operand's range
    if not isinstance(zero, RuntimeZero) and not info.min <= zero + shift <= info.max:
        return None
    if channels != out_channels:  # computed in whole vectors, the rest cropped (``channels.py``)
        weight = np.concatenate([weight, np.zeros((channels - weight.shape[0], *weight.shape[1:]), np.int8)])
    packed = packed_weights(weight, dot)
    weight_sums = weight.astype(np.int64).sum(axis=(1, 2, 3))
    settings = {**window, "shift": shift, "dot": dot}
    if isinstance(zero, RuntimeZero):
        acc = fusable_call(bb, lambda x, w, z: dot_convolution(x, w, pad_value=z, **settings),
                           [data, relax.const(packed), zero.value], "dot_conv2d", weight_sums,
                           times=relax.op.add(zero.value, relax.const(shift, "int32")))
    else:
        acc = fusable_call(bb, lambda x, w: dot_convolution(x, w, pad_value=zero + shift, **settings),
                           [data, relax.const(packed)], "dot_conv2d", (zero + shift) * weight_sums)
    if channels != out_channels:
        acc = relax.op.strided_slice(bb.emit(acc), axes=[3], begin=[0], end=[out_channels])
    return acc, dot


def _taken(dot: DotProduct, shape, kernel, window: dict) -> DotProduct:
    """The instruction a convolution of an NHWC input of ``shape`` with a ``kernel`` (KH, KW) window runs
    on: ``dot``, or its fallback where ``dot`` computes several pixels of a row at a time (``smmla``: 2)
    and the window is strided (those pixels' inputs are not one stride apart) or the rows hold an odd
    number of them."""
    if dot.pixels == 1 or dot.fallback is None:
        return dot
    _, h, w, _ = shape
    width = output_size(h, w, kernel, **window)[1]
    return dot if window["strides"][1] == 1 and width % dot.pixels == 0 else dot.fallback


def as_int8(weight: np.ndarray) -> np.ndarray:
    """Integer weights widened on import (ONNX's QLinearConv: int32) back in int8 where they fit."""
    narrow = narrow_integers(weight)
    return narrow if narrow is not None and narrow.dtype == np.int8 else weight


def fusable_call(bb, te_func, args, name: str, compensation: np.ndarray, times=None):
    """``te_func`` on ``args`` as a kernel FuseOps treats as a convolution (what follows elementwise, the
    requantization, joins it), less ``compensation`` per output channel where that is not all zeros
    (``times`` that, a Relax int32 scalar known at run time, where given)."""
    from tvm import relax

    call_tir = bb.call_te(te_func, *args, primfunc_name_hint=name)
    gvar = call_tir.args[0]
    bb.update_func(gvar, bb.get()[gvar].with_attr("op_pattern", OUT_ELEMWISE_FUSABLE))
    if not compensation.any():  # the call itself: an alias binding would keep FuseOps from fusing it
        return call_tir
    per_channel = relax.const(compensation.astype(np.int32))
    if times is not None:
        per_channel = relax.op.multiply(bb.emit(relax.op.reshape(times, [1])), per_channel)
    return relax.op.subtract(bb.emit(call_tir), per_channel)


def _padded(data, padding, blocks: int, pad_value, shift: int, dot: DotProduct):
    """``data`` + ``shift`` as the instruction's operand type, padded with ``pad_value`` (a number, or an
    int32 tensor of one element that ``shift`` is added to) and to ``blocks`` groups of ``dot.depth``
    channels (copies of the last one: their weights are zero)."""
    from tvm import te, tirx

    n, h, w, c = (int(v) for v in data.shape)
    top, left, bottom, right = padding

    def shifted(value):
        return (value.astype("int32") + shift).astype(dot.data_dtype) if shift else value.astype(dot.data_dtype)

    if isinstance(pad_value, te.Tensor):
        pad = shifted(pad_value[(0,) * len(pad_value.shape)])
    else:
        pad = tirx.const(pad_value, dot.data_dtype)
    return te.compute(
        (n, h + top + bottom, w + left + right, blocks * dot.depth),
        lambda b, y, x, ch: tirx.if_then_else(
            tirx.all(y >= top, y < h + top, x >= left, x < w + left),
            shifted(data[b, tirx.max(tirx.min(y - top, h - 1), 0), tirx.max(tirx.min(x - left, w - 1), 0),
                         tirx.min(ch, c - 1)]),
            pad),
        name="dot_pad")
