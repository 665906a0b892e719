"""8-bit tensors held in 32 bits, for WGSL, which has no 8-bit integer type.

An 8-bit model compiles to kernels that pass 8-bit tensors between them (a convolution's requantized
output, the next one's input) and read 8-bit constants (its weights); TVM's WGSL code generator declares
those buffers ``array<i8>`` / ``array<u8>``, which wgpu refuses. In a Vulkan build every 8-bit tensor
inside the model is an int32 tensor holding the same values instead: 8-bit constants are widened, and a
cast to 8 bits becomes a cast to int32 where its operand is known to lie in the 8-bit range (a float:
casting one out of range is undefined anyway; a ``minimum``/``maximum``/``clip`` to bounds inside the
range, the saturation every requantization ends with). Operators between (pooling, reshapes,
concatenations) follow their operands' type. Four times the bytes of those tensors on the GPU, and the
same values.

What cannot be held so is refused by name: an 8-bit model input or output (the caller's buffer is 8-bit),
a cast to 8 bits that may wrap around.
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.relax_exprs import bound_value, const_value, dtype_of, op_name
from edgepack.errors import CompileError

EIGHT_BITS = ("int8", "uint8")
WRAPPING_CAST = "which WGSL (no 8-bit integers) can only hold in 32 bits"  # in the refusal's message


def _in_range(expr, dtype: str, builder) -> bool:
    """Whether the values of ``expr`` (a Relax expression, through the builder's bindings) all fit
    ``dtype``: a float (an out-of-range cast is undefined), or saturated (a ``clip``, or a ``minimum``
    and a ``maximum`` of each other) to constant bounds inside its range."""
    info = np.iinfo(dtype)
    expr = bound_value(expr, builder)
    if dtype_of(expr) in ("float16", "float32", "float64"):
        return True
    name, saturating = op_name(expr), ("relax.maximum", "relax.minimum")
    if name == "relax.clip":
        bounds = [const_value(a) for a in expr.args[1:3]]
    elif name in saturating:
        inner = bound_value(expr.args[0], builder)
        if op_name(inner) not in saturating or op_name(inner) == name:  # both bounds, one of each kind
            return False
        bounds = [const_value(expr.args[1]), const_value(inner.args[1])]
    else:
        return False
    if any(b is None or b.size != 1 for b in bounds):
        return False
    low, high = sorted(float(b.reshape(-1)[0]) for b in bounds)
    return info.min <= low and high <= info.max


def hold_8_bits_in_32(model: str = "the model"):
    """The Relax module pass (see the module docstring); raises CompileError for what it cannot hold."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Widen(relax.PyExprMutator):
        def visit_generic_const_(self, const):
            value = const_value(const)
            if value is not None and str(value.dtype) in EIGHT_BITS:
                return relax.const(value.astype(np.int32), "int32")
            return const

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if op_name(call) != "relax.astype" or str(call.attrs.dtype) not in EIGHT_BITS:
                return call
            source, target = call.args[0], str(call.attrs.dtype)
            if dtype_of(source) not in EIGHT_BITS and not _in_range(source, target, self.builder_):
                raise CompileError(
                    f"{model} casts a {dtype_of(source)} tensor to {target} on the GPU, {WRAPPING_CAST}, "
                    "and these values may not fit 8 bits.",
                    "Compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4).")
            return source if dtype_of(source) == "int32" else relax.op.astype(source, "int32")

    @tvm.transform.module_pass(opt_level=0, name="EdgepackHold8BitsIn32")
    def _pass(mod, _ctx):
        widen = _Widen(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                widen.builder_.update_func(gvar, widen.visit_expr(func))
        return widen.builder_.get()

    return _pass


def _read_other_than_as_words(func) -> list:
    """The variables of ``func`` some call reads other than through ``memory.view`` (compiled-in
    pre-processing reads a uint8 frame as 32-bit words that way, ``processing/frames.py``)."""
    from tvm import relax

    found = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and op_name(expr) != "relax.memory.view":
            found.extend(a for a in expr.args if isinstance(a, relax.Var))
        elif isinstance(expr, relax.Tuple):
            found.extend(f for f in expr.fields if isinstance(f, relax.Var))

    relax.analysis.post_order_visit(func.body, visit)
    return found


def refuse_8_bit_boundary(mod, model: str = "the model") -> None:
    """A CompileError where a Relax function of ``mod`` takes an 8-bit tensor it reads other than as
    32-bit words, or gives one."""
    from tvm import relax

    for _gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        inputs = func.params[:int(func.attrs["num_input"])] if func.attrs and "num_input" in func.attrs else func.params
        read_otherwise = _read_other_than_as_words(func)
        eight = [f"input {p.name} ({dtype_of(p)})" for p in inputs
                 if dtype_of(p) in EIGHT_BITS and any(p.same_as(v) for v in read_otherwise)]
        ret = func.body.body if hasattr(func.body, "body") else None
        outputs = list(ret.fields) if isinstance(ret, relax.Tuple) else [ret] if ret is not None else []
        eight += [f"an output ({dtype_of(o)})" for o in outputs if dtype_of(o) in EIGHT_BITS]
        if eight:
            raise CompileError(
                f"{model} takes or gives 8-bit tensors ({', '.join(eight)}); WGSL has no 8-bit integers, so a "
                "Vulkan build cannot share them with the caller.",
                "Compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4), or use an export of the "
                "model with float inputs and outputs (quantized inside, as QDQ ONNX models are).")

