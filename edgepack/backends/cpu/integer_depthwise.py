"""8-bit depthwise convolutions that read their 8-bit input.

``backends/integer.py`` leaves a depthwise convolution as ``conv2d(int32(x_q) - z, w_q, groups=C)``: the cast and
the subtraction fuse into the kernel before it, which then writes its output as int32, four times the
bytes of the 8-bit tensor, and the depthwise kernel reads them back (QDQ MobileNetV2's first one:
112x112x32, 1.6 MB, 0.50 ms at one thread). This pass gives each such convolution (channels-last,
constant weights, one output channel per input channel) a kernel that reads ``x_q`` itself:

    acc[n, y, x, c] = sum_{kh, kw} int32(x_q padded with z)[...] * w_q[kh, kw, c] - z * sum_{kh, kw} w_q[kh, kw, c]

exact, as the int32 form. ``z`` is a constant, or the zero point a DynamicQuantizeLinear computed at run
time (``quantize_dynamic``'s ConvInteger: the padding and the per-channel term read it). The register tile of ``schedules/conv.py`` schedules it (a window, two
operands), with the widening of the 8-bit input inside its loads; the requantization after it fuses
into its store. (QDQ MobileNetV2's first one: 0.11 ms reading 8 bits, with ``round_even.py``.)

Ungrouped convolutions stay as they are where the CPU has no dot-product instruction: reading 8 bits,
each input value is widened again by every tile of output channels that reads it, and QDQ MobileNetV2
built for AVX2 ran 14.3 ms against 9.9 with them reading int32 (Zen 4 running Haswell's code, 1 thread).
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.cpu.conv_rewrite import conv2d_rewrite_pass
from edgepack.backends.cpu.dot_product import (
    RuntimeZero,
    as_int8,
    fusable_call,
    integer_input,
    output_size,
    window_of,
)
from edgepack.backends.relax_exprs import dtype_of, static_shape


def depthwise_of_8_bits(data, weights, *, strides, padding, dilation, zero):
    """The TE kernel: NHWC 8-bit ``data`` (padded with ``zero``: a number, or the zero point computed at run
    time as an int32 tensor of one element) and ``[KH, KW, C]`` int8 ``weights``, summed in int32."""
    from tvm import te, tirx

    n, h, w, c = (int(v) for v in data.shape)
    kh_, kw_, _c = (int(v) for v in weights.shape)
    (sh, sw), (dh, dw) = strides, dilation
    top, left, bottom, right = padding
    oh, ow = output_size(h, w, (kh_, kw_), strides=strides, padding=padding, dilation=dilation)
    if isinstance(zero, te.Tensor):  # the int32 of a value of the input's type
        pad = zero[(0,) * len(zero.shape)].astype(data.dtype)
    else:
        pad = tirx.const(zero, data.dtype)
    padded = te.compute(
        (n, h + top + bottom, w + left + right, c),
        lambda b, y, x, ch: tirx.if_then_else(
            tirx.all(y >= top, y < h + top, x >= left, x < w + left), data[b, y - top, x - left, ch], pad),
        name="pad")
    ry = te.reduce_axis((0, kh_), "ry")
    rx = te.reduce_axis((0, kw_), "rx")
    return te.compute(
        (n, oh, ow, c),
        lambda b, y, x, ch: te.sum(
            padded[b, y * sh + ry * dh, x * sw + rx * dw, ch].astype("int32") * weights[ry, rx, ch].astype("int32"),
            axis=[ry, rx]),
        name="depthwise_conv2d")


def depthwise_of_8_bit_inputs():
    """A Relax module pass: every exact 8-bit depthwise convolution (``backends/integer.py``) in channels-last form
    reads its 8-bit input (see the module docstring)."""

    def rewrite(call, weight: np.ndarray, bb):
        from tvm import relax

        weight = as_int8(weight)

        a = call.attrs
        channels = int(weight.shape[0])
        if str(a.data_layout) != "NHWC" or str(a.kernel_layout) != "OHWI" or str(a.out_layout) not in ("", "NHWC") \
                or dtype_of(call) != "int32" or weight.dtype != np.int8 or weight.shape[3] != 1 \
                or int(a.groups) != channels or static_shape(call) is None:
            return None
        found = integer_input(call.args[0], bb, runtime_zero=True)
        if found is None or static_shape(found[0])[3] != channels:
            return None
        data, zero = found
        taps = np.ascontiguousarray(weight[..., 0].transpose(1, 2, 0))  # [KH, KW, C]
        sums = taps.astype(np.int64).sum(axis=(0, 1))
        window = window_of(a)
        if isinstance(zero, RuntimeZero):  # quantize_dynamic's: padded with it, its share subtracted
            return (fusable_call(bb, lambda x, w, z: depthwise_of_8_bits(x, w, zero=z, **window),
                                 [data, relax.const(taps), zero.value], "depthwise_conv2d_8bit", sums,
                                 times=zero.value), "reading 8-bit input")
        info = np.iinfo(dtype_of(data))
        if not info.min <= zero <= info.max:
            return None
        return (fusable_call(bb, lambda x, w: depthwise_of_8_bits(x, w, zero=zero, **window),
                             [data, relax.const(taps)], "depthwise_conv2d_8bit", zero * sums), "reading 8-bit input")

    return conv2d_rewrite_pass("EdgepackDepthwiseOf8BitInputs", rewrite)
