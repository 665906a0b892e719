"""Output channels padded to whole SIMD vectors: a convolution with 36 output channels computes 40 and
keeps 36.

The register tile (``schedules/tiling.py``) vectorizes the output channels of a channels-last
convolution; a count the SIMD width does not divide gets vectors of an odd width (36 channels: 12 lanes
of AVX-512's 16, 28: 14) or of a narrower power of two (1000: 8 lanes), and LLVM splits those into
partial vectors. Computing a few more channels with zero weights and dropping them in the kernel's
store is faster (Zen 4, AVX-512, one thread, pointwise convolutions with their crop: 32 -> 36 channels
at 32x32 0.036 ms, padded to 40 0.032; 24 -> 28 at 64x64 0.086 ms, padded to 32 0.081; 512 -> 1000 at
13x13, SqueezeNet's classifier, 1.97 ms, padded to 1008 1.71; without a crop, 56 against 64 channels
0.0175 / 0.0169 ms, 88 against 96 0.041 / 0.039). The weights are constants: padded here, once.

A matrix product by a constant matrix is padded the same way along its columns: PP-OCRv2's classifier,
40 x 96 by 96 x 6625 (6625 = 5^3 x 53: vectors of 5 lanes), ran 1.18 ms, padded to 6640 columns
0.56 ms (Zen 4, 1 thread, in the model).
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.cpu.conv_rewrite import conv2d_rewrite_pass
from edgepack.backends.relax_exprs import dtype_of, shape_of

MAX_EXTRA = 1 / 6  # at most this share of extra channels


def padded_channels(channels: int, lanes: int) -> int:
    """How many output channels to compute for ``channels`` with ``lanes`` SIMD lanes: the next multiple
    of the lanes, else of half of them, that costs at most MAX_EXTRA more channels; ``channels`` where
    it is a multiple already, or too few to pad."""
    if lanes < 4 or channels < lanes:
        return channels
    for step in (lanes, lanes // 2):
        padded = -(-channels // step) * step
        if padded == channels:
            return channels
        if padded - channels <= channels * MAX_EXTRA:
            return padded
    return channels


def pad_output_channels(lanes: int):
    """A Relax module pass: each channels-last (NHWC, OHWI), ungrouped float32 convolution with constant
    weights gets ``padded_channels`` output channels (zero weights) and a slice back to its own."""

    def rewrite(call, weight: np.ndarray, bb):
        from tvm import relax

        if not _suits(call):
            return None
        channels = int(weight.shape[0])
        padded = padded_channels(channels, lanes)
        if padded == channels:
            return None
        grown = np.concatenate([weight, np.zeros((padded - channels, *weight.shape[1:]), weight.dtype)])
        a = call.attrs
        wide = bb.emit(relax.op.nn.conv2d(call.args[0], relax.const(grown), a.strides, a.padding, a.dilation,
                                          a.groups, a.data_layout, a.kernel_layout, a.out_layout, a.out_dtype))
        return (relax.op.strided_slice(wide, axes=[3], begin=[0], end=[channels]),
                "with output channels padded to whole SIMD vectors")

    return conv2d_rewrite_pass("EdgepackPadOutputChannels", rewrite)


def pad_matmul_columns(lanes: int):
    """A Relax module pass: each float32 matrix product by a constant 2-D matrix whose columns the SIMD
    width does not divide gets ``padded_channels`` columns (zeros) and a slice back to its own."""

    def rewrite(call, weight: np.ndarray, bb):
        from tvm import relax

        shape = shape_of(call)  # a symbolic row count (``--dim``) is padded as well
        if weight.ndim != 2 or weight.dtype != np.float32 or dtype_of(call) != "float32" or shape is None:
            return None
        columns = int(weight.shape[1])
        padded = padded_channels(columns, lanes)
        if padded == columns:
            return None
        grown = np.concatenate([weight, np.zeros((weight.shape[0], padded - columns), weight.dtype)], axis=1)
        wide = bb.emit(relax.op.matmul(call.args[0], relax.const(grown), call.attrs.out_dtype))
        return (relax.op.strided_slice(wide, axes=[len(shape) - 1], begin=[0], end=[columns]),
                "with columns padded to whole SIMD vectors")

    return conv2d_rewrite_pass("EdgepackPadMatmulColumns", rewrite, op="relax.matmul", noun="matrix product")


def _suits(call) -> bool:
    attrs = call.attrs
    return (str(attrs.data_layout) == "NHWC" and str(attrs.kernel_layout) == "OHWI"
            and str(attrs.out_layout) == "NHWC" and int(attrs.groups) == 1
            and dtype_of(call) == "float32" and shape_of(call) is not None)
