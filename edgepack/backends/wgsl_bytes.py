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

8-bit weights (constants of ``PACKED_MIN_ELEMENTS`` or more) are stored as they are in the model, four to an
int32 word, and a kernel unpacks them at run time (``wgsl_words.unpack_constant``; constant folding leaves
it). Widened at compile time they made an 8-bit model's library 3-4 times its file (MobileNetV2 int8
3.67x -> 0.99x, visual wake words 2.95x -> 1.18x). The cost is one elementwise kernel per weight and
inference, reading a quarter of what it writes; on lavapipe MobileNetV2 int8's latency did not change
measurably (3.09-3.26 s against 3.24-3.29 s, medians of 15, two rounds each).

The model's 8-bit inputs and outputs stay 8-bit for the caller: they are read and written as 32-bit
words of the caller's buffer (``wgsl_words.py``). A cast to 8 bits that may wrap around is refused by name.
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.relax_exprs import bound_value, const_value, dtype_of, op_name
from edgepack.backends.wgsl_words import (
    EIGHT_BITS,
    boundary_devices,
    is_public,
    unpack_constant,
    with_words_at_the_boundary,
)
from edgepack.errors import CompileError

PACKED_MIN_ELEMENTS = 64  # smaller 8-bit constants (zero points, lookup tables) are widened at compile time
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
    """The Relax module pass (see the module docstring); raises CompileError for what it cannot hold.
    8-bit inputs and outputs must be whole words (``wgsl_words.refuse_unaligned_8_bit_boundary``)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Widen(relax.PyExprMutator):
        # ``unpacked``: {8-bit parameter: its int32 values} of the function being visited (``_widened``)

        def visit_var_(self, var):
            found = [v for p, v in self.unpacked.items() if p.same_as(var)]
            return found[0] if found else super().visit_var_(var)

        def visit_generic_const_(self, const):
            value = const_value(const)
            if value is not None and str(value.dtype) in EIGHT_BITS:
                if value.size >= PACKED_MIN_ELEMENTS:  # weights: stored as words, unpacked on the GPU
                    return unpack_constant(self.builder_, value)
                return relax.const(value.astype(np.int32), "int32")
            return const

        def visit_call_(self, call):
            if op_name(call) == "relax.memory.view" and any(p.same_as(call.args[0]) for p in self.unpacked):
                return call  # pre-processing's own word reads of the caller's buffer
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

    def _widened(widen, func):
        """``func`` with 8-bit tensors in int32, its 8-bit inputs unpacked from words first and its 8-bit
        outputs packed into words last."""
        if not is_public(func):  # called from the model itself, with its widened tensors
            return widen.visit_expr(func)
        return with_words_at_the_boundary(widen, func, EIGHT_BITS, widen.devices)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackHold8BitsIn32")
    def _pass(mod, _ctx):
        devices = boundary_devices(mod, EIGHT_BITS)  # before the mutator: its builder takes the module's devices
        widen = _Widen(mod)
        widen.unpacked, widen.devices = {}, devices
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                widen.builder_.update_func(gvar, _widened(widen, func))
        return widen.builder_.get()

    return _pass
