"""Float constants of GPU kernels written exactly: as bit patterns where a literal would not be.

TVM's OpenCL and WGSL code generators print a float constant with seven significant digits
(``1.149804e-01f``); a float32 needs nine to come back as itself. The constant the kernel computes with is
then a neighbour of the model's: QDQ MobileNetV2's output scale 0.11498045 became 0.1149805, a residual
add's requantization fell on the other side of a rounding tie, and the logits missed ONNX Runtime by two
steps on PoCL and lavapipe while the CPU build was exact. And the WGSL generator prints an infinity as
``inff`` (NaN as ``nanf``), identifiers WGSL does not have (a model that clamps to an infinity or an
attention mask's ``-inf`` failed to compile; WGSL has no literal for them at all).

So each float constant whose printed form would not be its value becomes the reinterpretation of its
bit pattern (``as_float``-style in OpenCL, ``bitcast<f32>`` of an unsigned integer in WGSL), which the
shader compiler folds back into the same constant. So does the one int32 WGSL cannot write: its smallest,
-2147483648, which WGSL reads as the negation of ``2147483648i``, out of range (an int8 max-pool starts
from it: the shader failed to compile on lavapipe).
"""

from __future__ import annotations

import functools
import math
import struct

import numpy as np

from edgepack.backends.gpu_math import overloaded_math
from edgepack.backends.separate_products import separate_products
from edgepack.backends.uniform_barriers import uniform_barriers

TIR_PIPELINE = "edgepack-gpu"


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _printed_exactly(value: float) -> bool:
    """Whether the code generators' ``%.6e`` form of the float32 ``value`` reads back as it."""
    return math.isfinite(value) and np.float32(f"{value:.6e}") == np.float32(value)


def _as_bits(imm):
    """``imm`` (a float constant) as a reinterpretation of its float32 bit pattern where its literal would
    not be exact (float16 ones through float32)."""
    from tvm import tirx

    value, dtype = float(imm.value), imm.ty.dtype
    if dtype.bits not in (16, 32) or _printed_exactly(float(np.float32(value))):
        return imm
    word = tirx.call_intrin("float32", "tirx.reinterpret", tirx.const(_bits(value), "uint32"))
    return word if dtype.bits == 32 else tirx.Cast(str(dtype), word)


INT32_MIN = -(1 << 31)


def _int_as_bits(imm):
    """The int32 constant -2147483648 as the reinterpretation of its bit pattern; any other as it is."""
    from tvm import tirx

    if imm.value != INT32_MIN or str(imm.ty.dtype) != "int32":
        return imm
    return tirx.call_intrin("int32", "tirx.reinterpret", tirx.const(1 << 31, "uint32"))


def exact_float_constants():
    """The TIR pass: every float constant of a kernel that its literal would not give (and the smallest
    int32) as its bit pattern."""
    import tvm_ffi
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.ExactFloatConstants")
    def float_constants(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.FloatImm, _as_bits),
                                                                 (tirx.IntImm, _int_as_bits)]))

    return float_constants


def _pipeline(products: str):
    import tvm
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower, finalize_host, finalize_device = default_s_tir_pipeline()  # TVM's "default" for GPU targets
    return lower, finalize_host, lambda: tvm.transform.Sequential(
        [separate_products(products), finalize_device(), exact_float_constants(), overloaded_math(), uniform_barriers()])


@functools.cache
def tir_pipeline(products: str = "statement") -> str:
    """The name of the GPU builds' TIR pipeline (TVM's default, ``separate_products`` of the given form
    before its device lowering, ``exact_float_constants`` and ``uniform_barriers`` after), registered with
    TVM once per process."""
    from tvm import tirx

    name = TIR_PIPELINE if products == "statement" else f"{TIR_PIPELINE}-{products}"
    tirx.register_tir_pipeline(name, lambda: _pipeline(products))
    return name
