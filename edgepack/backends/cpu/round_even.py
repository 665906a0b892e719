"""Rounding to nearest even as LLVM's ``roundeven``, a pass of the CPU builds' TIR pipeline (``stack.py``).

TVM writes ``round`` (an 8-bit model's requantization rounds every output value half to even, as ONNX
Runtime and LiteRT do) as ``nearbyint``, which LLVM does not vectorize on x86: each lane became a
library call. In QDQ MobileNetV2's first depthwise kernel (112x112x32 values) that was 0.51 ms of its
0.51 ms; as ``roundeven`` (one ``vrndscaleps`` per vector on x86, ``frintn`` on aarch64), 0.14 ms.
Both round half to even under the default rounding mode, the only one a kernel runs in.
"""

from __future__ import annotations


def _as_roundeven(call):
    import tvm
    from tvm import tirx

    if not call.op.same_as(tvm.ir.Op.get("tirx.nearbyint")):
        return call
    return tirx.call_llvm_pure_intrin(str(call.ty.dtype), "llvm.roundeven", *call.args)


def round_even():
    """The TIR pass: every ``nearbyint`` as ``llvm.roundeven``."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.RoundEven")
    def round_even_pass(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.ir.Call, _as_roundeven)]))

    return round_even_pass
