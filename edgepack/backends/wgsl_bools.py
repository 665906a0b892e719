"""Boolean tensors held in int32 (0 or 1), for WGSL, which has no bool (nor any 8-bit type) in buffers.

TVM stores a bool tensor as one byte per element; a kernel that writes or reads one (a comparison whose
mask another kernel reads, an ``IsInf`` output, a logical op on bool inputs) gets a WGSL storage buffer of
an 8-bit type, which wgpu refuses when it compiles the shader, at run time. In a Vulkan build every bool
tensor inside the model is an int32 tensor of 0 and 1 instead: what makes a bool (a comparison, a logical
op, a cast to bool) is followed by a cast to int32, and what reads one as a bool (``where``'s condition, a
logical op, a cast) gets a cast back to bool right before it. Fusion folds each cast into the kernel beside
it, so a mask fused into its consumer costs nothing, and one that is not crosses kernels as int32 words.
Operators that only move values (reshapes, slices, concatenations) follow their operands' type: they move
the int32 values. bool constants are int32 constants.

The model's bool inputs and outputs stay one byte per element for the caller: they are read and written
as 32-bit words of the caller's buffer as 8-bit ones are (``wgsl_words.py``), so one of a byte count that
is not a multiple of 4 is refused at compile time by name. ``unwidened_buffers`` finds any kernel that
still declares a bool or 8-bit buffer (e.g. a bool tensor an opaque operator reads), which the backend
refuses by name at compile time rather than let wgpu refuse its shader at run time.
"""

from __future__ import annotations

from edgepack.backends.relax_exprs import const_value, dtype_of, op_name
from edgepack.backends.wgsl_words import BYTES, boundary_devices, is_public, with_words_at_the_boundary

ELEMWISE = 0  # TVM's OpPatternKind kElemWise: ``isnan_bits`` fuses as ``isnan`` would

# Operators whose result takes its dtype from their (data) operands and that only move or pick values:
# they move the int32 0/1 of a widened bool as they would its bytes.
_FOLLOWING = frozenset(f"relax.{n}" for n in (
    "reshape", "permute_dims", "expand_dims", "squeeze", "flatten", "concat", "split", "strided_slice",
    "dynamic_strided_slice", "take", "broadcast_to", "tile", "flip", "repeat", "gather_elements", "gather_nd",
    "scatter_elements", "scatter_nd", "layout_transform", "to_vdevice",
))


def _isnan_bits(x):
    """The TE compute of ``isnan`` as int32 0/1 from the bits of each (float32, or float16 widened exactly)
    value: an exponent of all ones and a nonzero fraction. WGSL lets a compiler assume no NaN, and lavapipe
    folds TVM's ``x != x`` to false."""
    from tvm import te, tirx

    def value(*index):
        v = x(*index) if x.dtype == "float32" else tirx.Cast("float32", x(*index))
        bits = tirx.bitwise_and(tirx.reinterpret("int32", v), 0x7FFFFFFF)
        return tirx.Cast("int32", bits > 0x7F800000)
    return te.compute(x.shape, value, name="isnan_bits")


def _as_bool(expr):
    """A bool tensor's int32 0/1 read as the bool again, right before what reads it as one."""
    from tvm import relax

    return relax.op.astype(expr, "bool")


def hold_bools_in_32():
    """The Relax module pass (see the module docstring). Bool inputs and outputs must be whole words
    (``wgsl_words.refuse_unaligned_8_bit_boundary`` refuses the others first)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Widen(relax.PyExprMutator):
        # ``unpacked``: {bool parameter: its int32 values} of the public function being visited

        def visit_var_(self, var):
            found = [v for p, v in self.unpacked.items() if p.same_as(var)]
            return found[0] if found else super().visit_var_(var)

        def visit_generic_const_(self, const):
            value = const_value(const)
            if value is not None and str(value.dtype) == "bool":
                return relax.const(value.astype("int32"), "int32")
            return const

        def visit_call_(self, call):
            if op_name(call) == "relax.isnan" and dtype_of(call.args[0]) in ("float16", "float32"):
                source = self.visit_expr(call.args[0])
                return self.builder_.call_te(_isnan_bits, source, primfunc_name_hint="isnan_bits",
                                             primfunc_attrs={"op_pattern": ELEMWISE})
            if op_name(call) in _FOLLOWING:  # the int32 values moved as the bytes were
                return super().visit_call_(call)
            visited = [self.visit_expr(a) for a in call.args]
            if op_name(call) == "relax.astype" and dtype_of(call.args[0]) == "bool":  # its 0 and 1 as they are
                new_call = relax.op.astype(visited[0], str(call.attrs.dtype))
            else:
                args = []
                for arg, new in zip(call.args, visited):
                    if isinstance(arg, relax.Tuple):  # e.g. a tuple of bool operands of an opaque operator
                        new = relax.Tuple([_as_bool(n) if dtype_of(a) == "bool" and dtype_of(n) == "int32" else n
                                           for a, n in zip(arg.fields, new.fields)])
                    elif dtype_of(arg) == "bool" and dtype_of(new) == "int32":
                        new = _as_bool(new)  # read as a bool: cast back right before its reader
                    args.append(new)
                if op_name(call) == "relax.logical_xor":  # TVM writes it as ``^``, which WGSL has not for bools
                    new_call = relax.op.not_equal(*args)
                else:
                    new_call = relax.Call(call.op, args, call.attrs, list(call.ty_args) if call.ty_args else None)
            if dtype_of(call) == "bool":
                return relax.op.astype(new_call, "int32")
            return new_call

    def _widened(widen, func):
        """``func`` with bool tensors in int32; a public one with its bool inputs unpacked from words first
        and its bool outputs packed into words last, another one with its bool result cast back to bool."""
        bb = widen.builder_
        if not is_public(func):  # called from the model, with bool operands it reads as they are
            func = widen.visit_expr(func)
            if dtype_of(func.body.body) != "int32" or str(getattr(func.ret_ty, "dtype", "")) != "bool":
                return func
            bb.begin_scope(list(func.params))
            seq = bb.normalize(relax.SeqExpr(func.body.blocks, _as_bool(func.body.body)))
            bb.end_scope()
            return relax.Function(list(func.params), seq, None, func.is_pure, func.attrs)
        return with_words_at_the_boundary(widen, func, ("bool",), widen.devices)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackHoldBoolsIn32")
    def _pass(mod, _ctx):
        devices = boundary_devices(mod, ("bool",))  # before the mutator: its builder takes the module's devices
        widen = _Widen(mod)
        widen.unpacked, widen.devices = {}, devices
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                widen.builder_.update_func(gvar, _widened(widen, func))
        return widen.builder_.get()

    return _pass


def unwidened_buffers(kernels: dict) -> dict[str, list[str]]:
    """{kernel: the 1-byte types of its buffers} for the kernels (``gpu._collect_kernels``' records, with
    their buffers' element types) that declare a bool, 8-bit or 16-bit integer storage buffer, which WGSL
    cannot."""
    found = {}
    for name, info in kernels.items():
        odd = sorted({t for t in info.get("buffer_types", ()) if t in (*BYTES, "int16", "uint16")})
        if odd:
            found[name] = odd
    return found
