"""Floating-point values WGSL cannot write as literals, written as bit patterns.

TVM's WGSL code generator prints an infinite constant as ``inff`` (and NaN as ``nanf``), identifiers WGSL
does not have: a model that compares with or clamps to an infinity (``Min(x, inf)``, an attention mask's
``-inf``) fails when wgpu compiles its shader. WGSL has no literal for them at all (a constant expression
that evaluates to one is an error too), so each becomes the reinterpretation of its bit pattern, a
``bitcast<f32>`` of an unsigned integer, which is an ordinary value to WGSL.
"""

from __future__ import annotations

import functools
import math
import struct

TIR_PIPELINE = "edgepack-wgsl"


def _bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _as_bits(imm):
    """``imm`` (a float constant) as a reinterpretation of its float32 bit pattern where WGSL cannot write
    it: infinities and NaN (float16 ones through float32)."""
    from tvm import tirx

    value, dtype = float(imm.value), imm.ty.dtype
    if math.isfinite(value) or dtype.bits not in (16, 32):
        return imm
    word = tirx.call_intrin("float32", "tirx.reinterpret", tirx.const(_bits(value), "uint32"))
    return word if dtype.bits == 32 else tirx.Cast(str(dtype), word)


def wgsl_float_constants():
    """The TIR pass: every non-finite float constant of a kernel as its bit pattern."""
    import tvm_ffi
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.WgslFloatConstants")
    def float_constants(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.FloatImm, _as_bits)]))

    return float_constants


def _pipeline():
    import tvm
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower, finalize_host, finalize_device = default_s_tir_pipeline()  # TVM's "default" for webgpu
    return lower, finalize_host, lambda: tvm.transform.Sequential([finalize_device(), wgsl_float_constants()])


@functools.cache
def tir_pipeline() -> str:
    """The name of the WGSL builds' TIR pipeline (TVM's default, then ``wgsl_float_constants`` on the
    device kernels), registered with TVM once per process."""
    from tvm import tirx

    tirx.register_tir_pipeline(TIR_PIPELINE, _pipeline)
    return TIR_PIPELINE
