"""Math functions of GPU kernels called by the names their languages have.

TVM lowers the math intrinsics it has no OpenCL or WGSL rule for (``asinh``, ``acosh``, ``atanh``, ``asin``,
``acos``, ``atan``, ``tan``) to C's float functions, ``asinhf`` ... Neither OpenCL C nor WGSL has those names:
OpenCL's math functions are overloaded (``asinh`` of a float is a float), and so are WGSL's builtins. PoCL
refused the kernel (``use of undeclared identifier 'asinhf'``), wgpu the shader (``atanhf``). The pass, the
last of the GPU builds' device lowering, calls each by its overloaded name.
"""

from __future__ import annotations

#: C99's float functions (``<name>f``) whose overloaded ``<name>`` both OpenCL C and WGSL have
OVERLOADED = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "atan2", "tan", "sinh", "cosh", "tanh")


def _overloaded(call):
    from tvm.ir.expr import StringImm

    if call.op.name != "tirx.call_pure_extern" or not call.args or not isinstance(call.args[0], StringImm):
        return call
    name = call.args[0].value
    if not (name.endswith("f") and name[:-1] in OVERLOADED):
        return call
    from tvm import tirx

    return tirx.call_pure_extern(call.ty.dtype, name[:-1], *call.args[1:])


def overloaded_math():
    """The TIR pass: every call of ``<name>f`` in ``OVERLOADED`` made a call of ``<name>``."""
    import tvm_ffi
    from tvm import tirx
    from tvm.ir.expr import Call

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.OverloadedMath")
    def _pass(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, [(Call, _overloaded)]))

    return _pass
