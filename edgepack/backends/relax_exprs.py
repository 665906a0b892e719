"""Small helpers on Relax expressions for the backends' Relax passes (Vulkan's int64 narrowing, the CPU's
Winograd rewrite): dtypes and static shapes, constants as numpy, operator names and attributes, and
walking a function's bindings (If arms included) and what is live."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Function attribute the ONNX importer may set: {Relax variable name: ONNX node name}
#: (``frontends/onnx_ops/static_if.py`` sets it under the same name).
NAMES_ATTR = "edgepack.onnx_names"



def tensor_type(expr):
    from tvm import relax

    ty = getattr(expr, "ty", None)
    return ty if isinstance(ty, relax.TensorType) else None


def dtype_of(expr) -> str | None:
    ty = tensor_type(expr)
    return str(ty.dtype) if ty is not None else None


def is_i64(expr) -> bool:
    return dtype_of(expr) == "int64"


def static_shape(expr) -> tuple[int, ...] | None:
    from tvm import tirx

    ty = tensor_type(expr)
    if ty is None or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return tuple(int(v.value) for v in values)


def known_shape(expr) -> tuple | None:
    """A tensor's extents where its rank and each extent are known at compile time or by name (a ``--dim``
    variable, a data-dependent count a ``match_cast`` named): ints and TIR expressions. None otherwise."""
    from tvm import tirx

    ty = tensor_type(expr)
    values = getattr(getattr(ty, "shape", None), "values", None)
    if values is None:
        return None
    return tuple(int(v.value) if isinstance(v, tirx.IntImm) else v for v in values)


def shape_of(expr) -> tuple[int | str, ...] | None:
    """A tensor's shape with its symbolic extents (``--dim``) as their text: what two shapes are compared by
    where equal symbolic extents are as good as equal numbers (``(W - 5) // 8 + 1`` both times). None where
    the rank is unknown."""
    from tvm import tirx

    ty = tensor_type(expr)
    values = getattr(ty.shape, "values", None) if ty is not None and ty.shape is not None else None
    if values is None:
        return None
    return tuple(int(v.value) if isinstance(v, tirx.IntImm) else str(v) for v in values)


def const_value(expr):
    """numpy value of a constant tensor, static shape (int64 vector) or integer PrimValue, else None."""
    import tvm
    from tvm import relax, tirx

    if isinstance(expr, tvm.ir.GenericConst):
        value = expr.value
        return value.numpy() if hasattr(value, "numpy") else None  # a GenericConst may hold a dtype
    if isinstance(expr, relax.ShapeExpr):
        if all(isinstance(v, tirx.IntImm) for v in expr.values):
            return np.array([int(v.value) for v in expr.values], dtype=np.int64)
        return None
    if isinstance(expr, tirx.IntImm):
        return np.array(int(expr.value), dtype=np.int64)
    return None


def const(array, dtype: str | None = None):
    from tvm import relax

    array = np.asarray(array)
    dtype = dtype or str(array.dtype)
    return relax.const(array.astype(dtype), dtype)


def bound_constant(expr, bindings: dict) -> np.ndarray | None:
    """The value of ``expr`` when it is a constant: directly, through variables (``bindings``: variable ->
    the value bound to it), a transpose (a weight ``ConvertLayout`` reordered) or a cast."""
    from tvm import relax

    seen = 0
    while isinstance(expr, relax.Var) and expr in bindings and seen < 8:
        expr, seen = bindings[expr], seen + 1
    if op_name(expr) == "relax.permute_dims":
        inner = bound_constant(expr.args[0], bindings)
        axes = attr(expr, "axes")
        return None if inner is None else np.transpose(inner, [int(a) for a in axes] if axes is not None else None)
    if op_name(expr) == "relax.astype":  # e.g. a TFLite model's float16 weights, widened
        inner = bound_constant(expr.args[0], bindings)
        return None if inner is None else inner.astype(str(attr(expr, "dtype")))
    return const_value(expr)


def bound_value(expr, builder):
    """What ``expr`` is bound to, through variables a ``relax.BlockBuilder`` (a mutator's ``builder_``)
    has emitted; ``expr`` itself where it is no such variable."""
    from tvm import relax

    while isinstance(expr, relax.Var):
        value = builder.lookup_binding(expr)
        if value is None:
            break
        expr = value
    return expr


def op_name(call) -> str:
    op = getattr(call, "op", None)
    return str(getattr(op, "name", "")) if op is not None else ""


def attr(call, name: str, default=None):
    attrs = getattr(call, "attrs", None)
    if attrs is None:
        return default
    try:
        return getattr(attrs, name)
    except AttributeError:
        return default


def as_int(value) -> int:
    return int(value.value) if hasattr(value, "value") else int(value)


def as_ints(values) -> list[int] | None:
    if values is None:
        return None
    return [int(v.value) if hasattr(v, "value") else int(v) for v in values]


def is_cpu_target(target) -> bool:
    return "cpu" in [str(k) for k in target.keys]


def vdevice_of(expr):
    """The virtual device of a Relax value (a tuple: that of its first tensor), or None."""
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TupleType):
        return next((t.vdevice for t in ty.fields if isinstance(t, relax.TensorType)), None)
    return getattr(ty, "vdevice", None)


def on_cpu(expr) -> bool:
    """Whether a Relax value lives on a CPU virtual device (a tuple: each of its tensors)."""
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TupleType):
        tensors = [t for t in ty.fields if isinstance(t, relax.TensorType)]
        return bool(tensors) and all(t.vdevice is not None and is_cpu_target(t.vdevice.target) for t in tensors)
    vdevice = vdevice_of(expr)
    return vdevice is not None and is_cpu_target(vdevice.target)


def names_of(func) -> dict[str, str]:
    attrs = func.attrs
    if attrs is None or NAMES_ATTR not in attrs:
        return {}
    return {str(k): str(v) for k, v in attrs[NAMES_ATTR].items()}


def iter_bindings(seq) -> Iterable:
    """Every binding of a SeqExpr, with those inside If arms, in program order."""
    from tvm import relax

    for block in seq.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.If):  # the arms first: the If reads their results
                yield from iter_bindings(value.true_branch)
                yield from iter_bindings(value.false_branch)
            yield binding


def free_vars(expr, out: set) -> None:
    """Relax variables an expression reads (not descending into If arms: they are SeqExprs)."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        out.add(expr)
    elif isinstance(expr, relax.Call):
        for a in expr.args:
            free_vars(a, out)
    elif isinstance(expr, relax.Tuple):
        for f in expr.fields:
            free_vars(f, out)
    elif isinstance(expr, relax.TupleGetItem):
        free_vars(expr.tuple_value, out)
    elif isinstance(expr, relax.If):
        free_vars(expr.cond, out)
        for arm in (expr.true_branch, expr.false_branch):
            free_vars(arm, out)
    elif isinstance(expr, relax.SeqExpr):
        for b in iter_bindings(expr):
            free_vars(b.value, out)
        free_vars(expr.body, out)


def _binds_symbols(ty) -> bool:
    """Whether a type names a symbolic (non-constant) shape value."""
    from tvm import relax, tirx

    shape = ty if isinstance(ty, relax.ShapeType) else getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    return values is not None and any(not isinstance(v, tirx.IntImm) for v in values)


def live_vars(func) -> set:
    """Variables whose value reaches the function's result (everything, for an impure function)."""
    from tvm import relax

    bindings = list(iter_bindings(func.body))
    if not func.is_pure:
        return {b.var for b in bindings}
    live: set = set()
    free_vars(func.body.body, live)
    # a match_cast that binds symbolic shape variables defines them for every later use (the binding of a
    # --dim step: ``R.match_cast(R.shape([W // 32]), R.Shape([W_32]))``), though nothing reads its variable
    live.update(b.var for b in bindings if isinstance(b, relax.MatchCast) and _binds_symbols(b.ty))
    # arms' results are read by their If
    changed = True
    while changed:
        changed = False
        for b in reversed(bindings):
            if b.var not in live:
                continue
            reads: set = set()
            value = b.value
            if isinstance(value, relax.If):
                free_vars(value.cond, reads)
                for arm in (value.true_branch, value.false_branch):
                    free_vars(arm.body, reads)
            else:
                free_vars(value, reads)
            if isinstance(b, relax.MatchCast):
                free_vars(b.value, reads)
            for v in reads:
                if v not in live:
                    live.add(v)
                    changed = True
    return live


def call_rewrite_pass(name: str, rewrite):
    """A Relax module pass named ``name`` that offers every call of every Relax function, its arguments
    rewritten first, to ``rewrite(call, builder)``: the call's replacement (bindings it needs emitted
    through ``builder``), or None to keep it."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            replacement = rewrite(call, self.builder_)
            return call if replacement is None else replacement

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod, _ctx):
        rewriter = _Rewriter(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return _pass


def has_tensor(expr) -> bool:
    """Whether a Relax value is a tensor or a tuple holding one."""
    from tvm import relax

    if isinstance(expr, relax.Tuple):
        return any(has_tensor(f) for f in expr.fields)
    return isinstance(getattr(expr, "ty", None), relax.TensorType)
