"""Step 3 of the int64 pass: every int64 tensor replaced by its 32-bit form.

Constants are converted, ``astype`` and creation operators given int32, ArgMax/ArgMin computed by an
int32 reduction that keeps TOPI's pattern, other operators re-emitted on the 32-bit operands (their type
follows). An int64 model input is read as (low, high) int32 words through a ``memory.view`` of its
buffer and saturated on the GPU; an int64 model output is written as (low, sign) words and viewed as
int64 again. On the way, ``If`` conditions are handed to the VM as int32 and ``isfinite``/``isinf``
compare ``|x|`` with the largest finite value (WGSL has no bool storage and no ``inff``).
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.int64.facts import FLOATS, INT32_MAX, INT32_MIN, SAT_BOUND
from edgepack.backends.int64.rebuild import Rebuild
from edgepack.backends.relax_exprs import (
    as_int,
    attr,
    const,
    const_value,
    dtype_of,
    free_vars,
    is_i64,
    iter_bindings,
    known_shape,
    on_cpu,
    op_name,
    static_shape,
)


class Rewriter(Rebuild):
    """Re-emit a function whose int64 tensors were all proven narrowable (``prove.Prover``), with int32
    in their place; ``live`` are the bindings that reach the result."""

    def __init__(self, mod, func, live: set):
        super().__init__(mod)
        self.func = func
        self.live = live

    def run(self):
        """(the module with the kernels added, the rewritten function)"""
        return self.run_function(self.func, prologue=self.prologue, epilogue=self.epilogue)

    def prologue(self) -> None:
        """int64 parameters read as (low, high) int32 words and saturated to +-SAT_BOUND."""
        for p in self.func.params:
            if not is_i64(p) or p not in self.used_params():
                continue
            shape = known_shape(p)
            if shape is None:
                continue
            self.vmap[p] = self.saturated(p, shape)

    def saturated(self, value, shape):
        """The int64 tensor ``value`` (an input; a result of the CPU) as int32, saturated to +-SAT_BOUND: its
        (low, high) int32 words read through a ``memory.view``."""
        from tvm import relax

        R = relax.op
        name = value.name if isinstance(value, relax.Var) else "value"
        words = self.bb.emit(R.memory.view(value, relax.ShapeExpr([*shape, 2]), "int32"), name_hint=f"{name}_words")
        axis = len(shape)
        lo = self.bb.emit(R.take(words, const(0, "int32"), axis=axis), name_hint=f"{name}_lo")
        hi = self.bb.emit(R.take(words, const(1, "int32"), axis=axis), name_hint=f"{name}_hi")
        fits = R.equal(hi, R.right_shift(lo, const(31, "int32")))
        big = R.where(R.less(hi, const(0, "int32")), const(-SAT_BOUND, "int32"), const(SAT_BOUND, "int32"))
        value = R.minimum(R.maximum(R.where(fits, lo, big), const(-SAT_BOUND, "int32")), const(SAT_BOUND, "int32"))
        return self.bb.emit(value, name_hint=f"{name}_i32")

    def used_params(self) -> set:
        used: set = set()
        for b in iter_bindings(self.func.body):
            if b.var in self.live and not on_cpu(b.var):
                free_vars(b.value if not hasattr(b.value, "true_branch") else b.value.cond, used)
        free_vars(self.func.body.body, used)
        return used

    def epilogue(self, result):
        """int64 outputs: the exact int32 values written as (low, sign) words, viewed as int64."""
        from tvm import relax

        R = relax.op

        def widen(expr, ty):
            if isinstance(ty, relax.TupleType):
                fields = expr.fields if isinstance(expr, relax.Tuple) else [
                    self.bb.normalize(relax.TupleGetItem(expr, i)) for i in range(len(ty.fields))]
                new = [widen(f, t) for f, t in zip(fields, ty.fields)]
                if isinstance(expr, relax.Tuple) or not all(n.same_as(f) for n, f in zip(new, fields)):
                    return relax.Tuple(new)
                return expr
            if str(getattr(ty, "dtype", "")) != "int64" or dtype_of(expr) == "int64":
                return expr
            shape = static_shape(expr)
            sign = R.right_shift(expr, const(31, "int32"))
            words = self.bb.emit(R.stack(relax.Tuple([expr, sign]), axis=len(shape)), name_hint="out_words")
            return self.bb.emit(R.memory.view(words, relax.ShapeExpr(list(shape)), "int64"), name_hint="out_i64")

        return widen(result, self.func.body.body.ty)

    def unnarrowed(self, expr):
        """``expr`` with its variables mapped, but the int64 inputs as they are (not their 32-bit forms)."""
        from tvm import relax

        if isinstance(expr, relax.Var) and expr in self.func.params:
            return expr
        if isinstance(expr, relax.Call):
            return relax.Call(expr.op, [self.unnarrowed(a) for a in expr.args], expr.attrs,
                              list(expr.ty_args) if expr.ty_args else None)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.unnarrowed(f) for f in expr.fields])
        return self.map(expr)

    def narrowed(self, expr):
        """The 32-bit form of an int64 operand (variables via vmap; constants converted)."""
        from tvm import relax

        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.narrowed(f) for f in expr.fields])
        if not is_i64(expr):
            return self.map(expr)
        if isinstance(expr, relax.Var):
            return self.vmap.get(expr, expr)
        value = const_value(expr)
        if value is not None and not isinstance(expr, relax.ShapeExpr):
            return const(value.astype(np.int32), "int32")
        return self.map(expr)

    def binding(self, binding) -> None:
        from tvm import relax, tirx

        R = relax.op
        var, value = binding.var, binding.value
        if var not in self.live:
            return
        if isinstance(binding, relax.MatchCast):
            self.vmap[var] = self.bb.match_cast(self.map(value), binding.ty, name_hint=var.name)
            return
        if on_cpu(var):  # computed in int64 on the device's CPU (placement.py): its inputs unnarrowed
            self.vmap[var] = self.emit(self.unnarrowed(value), like=var)
            return
        if isinstance(value, relax.Call) and op_name(value) == "relax.to_vdevice" and is_i64(var):
            # an int64 result of the CPU, copied to the GPU: read like an int64 input
            copy = self.emit(self.map(value), like=var)
            shape = known_shape(var)
            self.vmap[var] = self.saturated(copy, shape) if shape is not None else copy
            return
        if isinstance(value, relax.If):
            cond = self.narrowed(value.cond)
            if dtype_of(cond) == "bool" and isinstance(cond, relax.Var):
                # the VM reads the condition from the GPU; WGSL cannot store bool tensors (TVM declares
                # them array<i8>, which WGSL does not have): hand it an int32 (fused with its producer)
                cond = self.bb.emit(R.astype(cond, "int32"), name_hint=f"{cond.name}_i32")
            new_if = relax.If(cond, self.arm(value.true_branch), self.arm(value.false_branch))
            self.vmap[var] = self.emit(new_if, like=var)
            return
        if isinstance(value, relax.Var):
            self.alias(var, self.narrowed(value) if is_i64(value) else self.map(value))
            return
        if isinstance(value, relax.Tuple):
            self.vmap[var] = self.emit(relax.Tuple([self.narrowed(f) for f in value.fields]), like=var)
            return
        if not isinstance(value, relax.Call):
            self.vmap[var] = self.emit(self.map(value), like=var)
            return
        name = op_name(value)
        touches = name in ("relax.isfinite", "relax.isinf") or is_i64(var) or any(is_i64(a) for a in value.args) or any(
            isinstance(a, relax.Tuple) and any(is_i64(f) for f in a.fields) for a in value.args) or (
            isinstance(getattr(var, "ty", None), relax.TupleType)
            and any(str(getattr(t, "dtype", "")) == "int64" for t in var.ty.fields))
        if not touches:
            self.vmap[var] = self.emit(self.map(value), like=var)
            return
        args = list(value.args)
        new = None
        if name in ("relax.isfinite", "relax.isinf") and dtype_of(args[0]) in ("float16", "float32", "float64"):
            # TVM's WGSL writes infinity as `inff`, which WGSL does not have (TVM's Cast from float to
            # an integer guards with isfinite): compare |x| with the largest finite value instead
            # (NaN compares false either way)
            dt = dtype_of(args[0])
            biggest = const(np.finfo(np.dtype(dt)).max, dt)
            magnitude = R.abs(self.map(args[0]))
            new = R.less_equal(magnitude, biggest) if name == "relax.isfinite" else R.greater(magnitude, biggest)
        elif name in ("relax.argmax", "relax.argmin"):
            data = self.map(args[0])
            shape = static_shape(args[0])
            axis = as_int(attr(value, "axis")) % len(shape)
            iota = const(np.arange(shape[axis], dtype=np.int32), "int32")
            new = self.bb.call_te(arg_reduce_i32, data, iota, axis, bool(attr(value, "keepdims", False)),
                                  name == "relax.argmax", primfunc_name_hint=name.split(".")[-1])
        elif name == "relax.topk":
            new = R.topk(self.map(args[0]), int(attr(value, "k")), int(attr(value, "axis")),
                         str(attr(value, "ret_type")), bool(attr(value, "largest")), "int32")
        elif name == "relax.argsort":
            new = R.argsort(self.map(args[0]), int(attr(value, "axis")), bool(attr(value, "descending")), "int32")
        elif name == "relax.astype" and is_i64(var):
            src = self.map(args[0])
            if dtype_of(args[0]) == "int64":
                new = self.narrowed(args[0])
            elif dtype_of(args[0]) in FLOATS and dtype_of(args[0]) != "float16":  # saturate: clamp, then cast
                dt = dtype_of(args[0])
                clipped = R.minimum(R.maximum(src, const(-SAT_BOUND, dt)), const(SAT_BOUND, dt))
                new = R.astype(clipped, "int32")
            else:
                new = R.astype(src, "int32")
        elif name == "relax.arange" and is_i64(var):
            new = R.arange(args[0], args[1], args[2], "int32")
        elif name in ("relax.full", "relax.zeros", "relax.ones") and is_i64(var):
            if name == "relax.full":
                new = R.full(args[0], self.narrowed(args[1]), "int32")
            else:
                new = (R.zeros if name == "relax.zeros" else R.ones)(args[0], "int32")
        elif name in ("relax.full_like", "relax.zeros_like", "relax.ones_like") and is_i64(var):
            base = self.narrowed(args[0])
            if name == "relax.full_like":
                new = R.full_like(base, self.narrowed(args[1]), "int32")
            else:
                new = (R.zeros_like if name == "relax.zeros_like" else R.ones_like)(base, "int32")
        elif name == "relax.clip" and is_i64(var):
            lo, hi = (int(const_value(a)) for a in args[1:3])
            new = R.clip(self.narrowed(args[0]), tirx.IntImm("int32", max(lo, INT32_MIN + 1)),
                         tirx.IntImm("int32", min(hi, INT32_MAX)))
        elif name == "relax.gather_nd" and is_i64(args[1]):
            # Relax's gather_nd takes int64 indices only; its legalisation (TOPI's, indices transposed) any
            new = self.bb.call_te(gather_nd_any_indices, self.narrowed(args[0]), self.narrowed(args[1]),
                                  int(value.attrs.batch_dims), primfunc_name_hint="gather_nd")
        if new is None and name == "relax.memory.view":  # reinterprets the buffer: keep the int64 operand
            new = self.map(value)
        if new is None:
            new_args = [self.narrowed(a) for a in args]
            new = relax.Call(value.op, new_args, value.attrs, list(value.ty_args) if value.ty_args else None)
        self.vmap[var] = self.emit(new, like=var)


def gather_nd_any_indices(data, indices, batch_dims: int):
    """ONNX GatherND (indices last-axis tuples) with indices of any integer type: TOPI's, which takes them
    first-axis, as Relax's legalisation gives it."""
    from tvm import topi

    ndim = len(indices.shape)
    return topi.gather_nd(data, topi.transpose(indices, [ndim - 1, *range(ndim - 1)]), batch_dims)


def arg_reduce_i32(data, iota, axis: int, keepdims: bool, is_max: bool):
    """ArgMax/ArgMin along ``axis`` with int32 indices: TOPI's reduction (first index among equal
    values, the same comparisons, so the GPU schedule rules recognise the pattern), reading the
    candidate index from ``iota`` (0..n-1 as int32). Relax gives every kernel int64 loop indices: a
    cast of the loop index would be moved onto the accumulator by the simplifier (Cast(int64, acc) < k),
    which neither matches the pattern nor avoids int64."""
    from tvm import te, tirx

    shape = list(data.shape)
    ndim = len(shape)
    axis = int(axis) % ndim

    def fcombine(x, y):  # TOPI's MakeArgmaxReducer / MakeArgminReducer
        better = x[1] > y[1] if is_max else x[1] < y[1]
        keep = tirx.Or(better, tirx.And(x[1] == y[1], x[0] < y[0]))
        return tirx.Select(keep, x[0], y[0]), tirx.Select(better, x[1], y[1])

    def fidentity(t0, t1):
        return tirx.const(-1, t0), (tirx.min_value(t1) if is_max else tirx.max_value(t1))

    reducer = te.comm_reducer(fcombine, fidentity, name="argmax" if is_max else "argmin")
    k = te.reduce_axis((0, shape[axis]), name="k")
    out_shape = [(1 if a == axis else s) for a, s in enumerate(shape) if a != axis or keepdims]

    def compute(*i):
        it = iter(i)
        full = []
        for a in range(ndim):
            if a == axis:
                full.append(k)
                if keepdims:
                    next(it)
            else:
                full.append(next(it))
        return reducer((iota[k], data[tuple(full)]), axis=k)

    idx, _val = te.compute(out_shape, compute, name="arg_red_temp")
    # TOPI's shape: the reduction into a temporary pair, then a copy of the index (the GPU schedule
    # rules keep the pair in registers)
    return te.compute(out_shape, lambda *i: idx(*i), name="arg_red")
