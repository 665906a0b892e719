"""Weights the model stores in float16 stay float16 in a CPU build: the kernels widen them as they read.

A TFLite model with float16 weights (MediaPipe's) widens each to float32 before its convolution
(``DEQUANTIZE``). Folded at compile time, that widening doubled the library (face_landmark: a 1.24 MB model,
a 2.6 MB library). Here a float32 convolution or matrix product whose constant weights are all float16
values (widening them back gives the same numbers) takes the float16 constant instead, with a float32
result: TOPI's kernels then cast each weight to float32 where they multiply it, and the weight-layout
rewrite that packs the weights for the schedule (``pipeline.weight_prepack_passes``) packs float16.

The result is the same to the bit: every float16 value is a float32 value, and the sums are float32 as
before. Where the target can widen in hardware (x86's F16C, every AArch64, ARMv7 with VFPv4), that is one
instruction per vector of weights; elsewhere LLVM would call a library routine per weight, so those
targets keep float32 weights (``widens_in_hardware``).
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.cpu.conv_rewrite import conv2d_rewrite_pass
from edgepack.backends.relax_exprs import dtype_of

#: Smaller weights are not worth a cast in the kernel (a bias-sized matrix, a 3x3 depthwise filter of 8 channels).
MIN_ELEMENTS = 256


def stored_in_half(weight: np.ndarray) -> np.ndarray | None:
    """``weight`` as float16 when that loses nothing (every value, NaN and infinities included, widens back
    to itself) and it is large enough to matter; None otherwise."""
    if weight.dtype != np.float32 or weight.size < MIN_ELEMENTS:
        return None
    with np.errstate(over="ignore"):
        half = weight.astype(np.float16)
    same = half.astype(np.float32)
    if not np.array_equal(same.view(np.uint32), weight.view(np.uint32)):
        return None
    return half


def widens_in_hardware(target) -> bool:
    """Whether LLVM widens float16 to float32 with an instruction on ``target`` (a CPU target): every
    AArch64; ARMv7 with the half-precision conversions (VFPv4's ``fp16``); x86 with F16C."""
    from tvm.target import codegen

    triple = str(target.attrs.get("mtriple", "") or "")
    if triple.startswith(("aarch64", "arm64")):
        return True
    features = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    return bool(features & {"f16c", "fp16", "fullfp16"})


def half_weights():
    """Relax module passes: float16-valued constant weights of float32 convolutions and matrix products
    passed as float16 (``stored_in_half``), the result float32."""

    def conv(call, weight: np.ndarray, bb):
        from tvm import relax

        half = stored_in_half(weight)
        if half is None or not _float32(call):
            return None
        a = call.attrs
        return (relax.op.nn.conv2d(call.args[0], relax.const(half), a.strides, a.padding, a.dilation, a.groups,
                                   a.data_layout, a.kernel_layout, a.out_layout, "float32"),
                "with float16 weights widened in the kernel")

    def matmul(call, weight: np.ndarray, bb):
        from tvm import relax

        half = stored_in_half(weight)
        if half is None or not _float32(call):
            return None
        return (relax.op.matmul(call.args[0], relax.const(half), "float32"),
                "with float16 weights widened in the kernel")

    return [conv2d_rewrite_pass("EdgepackHalfConvWeights", conv),
            conv2d_rewrite_pass("EdgepackHalfMatmulWeights", matmul, op="relax.matmul", noun="matrix product")]


def _float32(call) -> bool:
    return dtype_of(call) == "float32" and dtype_of(call.args[0]) == "float32"
