"""Step 1 of the int64 pass: fold integer and boolean arithmetic on constants and static shapes with
numpy (at most 4096 elements), replace ``If`` nodes whose condition becomes a constant (or whose arms
are the same) by the arm taken, and drop unused bindings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgepack.backends.int64.rebuild import Rebuild
from edgepack.backends.relax_exprs import as_ints, attr, const, const_value, dtype_of, live_vars, op_name, static_shape

_FOLD_MAX_ELEMENTS = 4096



class Simplify(Rebuild):
    @dataclass
    class Result:
        module: Any
        func: Any

    def run(self, func):
        from tvm import relax

        mod, current = self.bb.get(), func
        for _ in range(4):  # folding can make more conditions constant and more bindings unused
            self.bb, self.vmap, self.in_dataflow = relax.BlockBuilder(mod), {}, False
            self.live = live_vars(current)
            mod, new = self.run_function(current)
            done = same(new, current)
            current = new
            if done:
                break
        return Simplify.Result(mod, current)

    def binding(self, binding):
        from tvm import relax

        var = binding.var
        if var not in self.live:
            return
        if isinstance(binding, relax.MatchCast):
            self.vmap[var] = self.bb.match_cast(self.map(binding.value), binding.ty, name_hint=var.name)
            return
        value = binding.value
        if isinstance(value, relax.If):
            cond = self.map(value.cond)
            known = const_value(cond)
            if known is not None and np.asarray(known).size == 1:
                taken = value.true_branch if bool(np.asarray(known).reshape(-1)[0]) else value.false_branch
                self.vmap[var] = self.inline_arm(taken)
                return
            if same(value.true_branch, value.false_branch):
                self.vmap[var] = self.inline_arm(value.true_branch)
                return
            new_if = relax.If(cond, self.arm(value.true_branch), self.arm(value.false_branch))
            self.vmap[var] = self.emit(new_if, like=var)
            return
        mapped = self.map(value)
        if isinstance(mapped, relax.Var) or const_value(mapped) is not None and not isinstance(mapped, relax.Call):
            self.alias(var, mapped)  # an alias or a constant: no binding needed
            return
        if isinstance(mapped, relax.Call):
            mapped = self.bb.normalize(mapped)
        folded = fold(mapped) if isinstance(mapped, relax.Call) else None
        if folded is not None:
            self.vmap[var] = folded
            return
        if isinstance(mapped, relax.TupleGetItem) and isinstance(mapped.tuple_value, relax.Tuple):
            self.alias(var, mapped.tuple_value.fields[mapped.index])
            return
        self.vmap[var] = self.emit(mapped, like=var)


def same(a, b) -> bool:
    import tvm_ffi

    try:
        return bool(tvm_ffi.structural_equal(a, b))
    except Exception:  # noqa: BLE001
        return False


# --- numpy evaluation of integer operators on constants ---

COMPARISONS = {"relax.less": np.less, "relax.greater": np.greater, "relax.less_equal": np.less_equal,
        "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal}
_ARITH = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
          "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.logical_and": np.logical_and,
          "relax.logical_or": np.logical_or, "relax.bitwise_and": np.bitwise_and,
          "relax.bitwise_or": np.bitwise_or, "relax.left_shift": np.left_shift,
          "relax.right_shift": np.right_shift}


def fold(call):
    """The value of an integer/boolean operator applied to constants, as a Relax constant, else None."""
    from tvm import relax

    name = op_name(call)
    if name == "relax.shape_of":
        shape = static_shape(call.args[0])
        return relax.ShapeExpr(list(shape)) if shape is not None else None
    if name == "relax.tensor_to_shape":
        value = const_value(call.args[0])
        return relax.ShapeExpr([int(v) for v in value.reshape(-1)]) if value is not None else None
    out_dtype = dtype_of(call)
    if out_dtype is None or not (out_dtype.startswith(("int", "uint")) or out_dtype == "bool"):
        return None
    shape = static_shape(call)
    if shape is None or math.prod(shape) > _FOLD_MAX_ELEMENTS:
        return None
    args = []
    for a in call.args:
        if isinstance(a, relax.Tuple):
            vals = [const_value(f) for f in a.fields]
            if any(v is None for v in vals):
                return None
            args.append(vals)
            continue
        v = const_value(a)
        if v is None:
            return None
        args.append(v)
    try:
        value = np_eval(name, call, args)
    except Exception:  # noqa: BLE001  anything unexpected: leave the operator to TVM
        return None
    if value is None:
        return None
    value = np.asarray(value)
    if tuple(value.shape) != shape:
        return None
    return const(value.astype(out_dtype), out_dtype)


def np_eval(name: str, call, args):
    if name == "relax.shape_to_tensor":
        return args[0].astype(np.int64)
    if name in COMPARISONS:
        return COMPARISONS[name](args[0], args[1])
    if name in _ARITH:
        return _ARITH[name](args[0], args[1])
    if name == "relax.floor_divide":
        return np.floor_divide(args[0], args[1]) if np.all(args[1] != 0) else None
    if name == "relax.floor_mod":
        return np.mod(args[0], args[1]) if np.all(args[1] != 0) else None
    if name == "relax.logical_not":
        return np.logical_not(args[0])
    if name == "relax.negative":
        return np.negative(args[0])
    if name == "relax.abs":
        return np.abs(args[0])
    if name == "relax.where":
        return np.where(args[0], args[1], args[2])
    if name == "relax.astype":
        return args[0].astype(str(attr(call, "dtype")))
    if name == "relax.take":
        data, idx = args
        axis = int(attr(call, "axis", 0) or 0)
        mode = str(attr(call, "mode", "fast"))
        n = data.shape[axis]
        idx = idx.astype(np.int64)
        if mode == "wrap":
            idx = np.mod(idx, n)
        elif mode == "clip":
            idx = np.clip(idx, 0, n - 1)
        elif np.any(idx < 0) or np.any(idx >= n):
            return None
        return np.take(data, idx, axis=axis)
    if name == "relax.squeeze":
        axis = as_ints(attr(call, "axis"))
        return np.squeeze(args[0], axis=tuple(axis) if axis else None)
    if name == "relax.expand_dims":
        out = args[0]
        for a in sorted(a % (out.ndim + len(as_ints(attr(call, "axis")))) for a in as_ints(attr(call, "axis"))):
            out = np.expand_dims(out, a)
        return out
    if name == "relax.reshape":
        return np.reshape(args[0], tuple(int(v) for v in args[1]))
    if name == "relax.broadcast_to":
        return np.broadcast_to(args[0], tuple(int(v) for v in args[1]))
    if name == "relax.permute_dims":
        axes = as_ints(attr(call, "axes"))
        return np.transpose(args[0], axes)
    if name == "relax.concat":
        return np.concatenate(args[0], axis=int(attr(call, "axis", 0) or 0))
    if name == "relax.stack":
        return np.stack(args[0], axis=int(attr(call, "axis", 0) or 0))
    if name == "relax.strided_slice":
        data = args[0]
        axes, begin, end = (list(np.asarray(a).reshape(-1)) for a in args[1:4])
        strides = list(np.asarray(args[4]).reshape(-1)) if len(args) > 4 else [1] * len(axes)
        index = [slice(None)] * data.ndim
        for ax, b, e, s in zip(axes, begin, end, strides):
            index[int(ax)] = slice(int(b), int(e), int(s))
        return data[tuple(index)]
    if name in ("relax.sum", "relax.prod", "relax.max", "relax.min"):
        axis = as_ints(attr(call, "axis"))
        keep = bool(attr(call, "keepdims", False))
        f = {"relax.sum": np.sum, "relax.prod": np.prod, "relax.max": np.max, "relax.min": np.min}[name]
        return f(args[0], axis=tuple(axis) if axis is not None else None, keepdims=keep)
    return None
