"""Step 2 of the int64 pass: a fact about every int64 tensor (``facts.Fact``), found forward through
the program, and the refusals (by ONNX node name) of those that really need 64 bits.

Sources of exact intervals are constants, casts from narrower types, ArgMax/ArgMin/TopK/ArgSort
indices, Range and Full; interval arithmetic carries them through add, subtract, multiply, min/max,
clip, floor_divide, floor_mod, sum, cumsum, where and value-preserving operators. int64 model inputs and
casts from float are *saturated*; only consumers whose result cannot change through the saturation
(comparisons with values strictly inside the agreement, clip to bounds inside it, indices whose valid
range it covers) may read them.
"""

from __future__ import annotations

import math

import numpy as np

from edgepack.backends.int64.facts import (
    DTYPE_RANGE,
    FLOATS,
    INT32_MAX,
    SATURATED,
    Fact,
    exact,
    fits,
    join,
)
from edgepack.backends.int64.fold import COMPARISONS
from edgepack.backends.relax_exprs import (
    as_int,
    as_ints,
    attr,
    const_value,
    dtype_of,
    is_i64,
    iter_bindings,
    known_shape,
    live_vars,
    on_cpu,
    op_name,
    static_shape,
)

#: operators whose int64 result is a selection of the int64 values of their first argument
_SELECT = {"relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.permute_dims", "relax.broadcast_to",
           "relax.strided_slice", "relax.flip", "relax.tile", "relax.repeat", "relax.flatten", "relax.take",
           "relax.gather_elements", "relax.gather_nd", "relax.concat", "relax.stack", "relax.split",
           "relax.max", "relax.min", "relax.dynamic_strided_slice", "relax.sort"}
#: operators that read int64 operands and keep the values' meaning in 32 bits
_CMP_OPS = set(COMPARISONS)
#: index operands: (operator, argument position) -> how the valid range is found
_INDEX_ARGS = {("relax.take", 1), ("relax.gather_elements", 1), ("relax.gather_nd", 1),
               ("relax.scatter_elements", 1), ("relax.scatter_nd", 1), ("relax.one_hot", 0)}
_INDEX_NAMES = {n for n, _ in _INDEX_ARGS}


class Prover:
    """The facts of one (simplified) Relax function's int64 tensors; ``run()`` returns the problems."""

    def __init__(self, func, names: dict[str, str]):
        self.func = func
        self.names = names
        self.facts: dict = {}  # var -> Fact | str (why it cannot be narrowed) | list (tuple fields)
        self.problems: list[str] = []
        self.reported: set = set()  # refused variables: their consumers are not reported again
        self.refused: dict[str, str] = {}  # {their names: why}, in program order
        self.live: set = set()

    # --- naming ---
    def label(self, var, what: str = "tensor") -> str:
        onnx = self.names.get(var.name)
        return f"{what} {var.name}" + (f" (ONNX node {onnx!r})" if onnx else "")

    def refuse(self, var, message: str) -> None:
        self.reported.add(var)
        self.refused.setdefault(var.name, f"64-bit integers: {message}")
        text = f"{self.label(var)}: {message}"
        if text not in self.problems:
            self.problems.append(text)

    # --- analysis ---
    def run(self) -> list[str]:
        """Analyse every binding; the tensors that cannot be narrowed, by name and reason."""
        func = self.func
        self.live = live_vars(func)
        for p in func.params:
            if is_i64(p):
                self.facts[p] = SATURATED if known_shape(p) is not None else "an int64 input of unknown rank"
        for binding in iter_bindings(func.body):
            if not on_cpu(binding.var):  # computed in int64 on the device's CPU (placement.py)
                self.analyse(binding)
        self.need_exact_output(func.body.body)
        return self.problems

    def fact(self, expr):
        """Fact of an int64 operand (variables, constants); str when it cannot be narrowed."""
        from tvm import relax

        if isinstance(expr, relax.Var):
            return self.facts.get(expr, "it comes from an operation without a 32-bit rule")
        value = const_value(expr)
        if value is not None:
            if value.size == 0:
                return Fact(0, 0)
            return exact(value.min(), value.max()) if fits(value.min(), value.max()) else \
                f"constant {int(value.max()) if value.max() > INT32_MAX else int(value.min())} does not fit in 32 bits"
        return "it is not a tensor edgepack can narrow"

    def need_exact(self, expr, why: str) -> None:
        from tvm import relax

        if not is_i64(expr):
            return
        f = self.fact(expr)
        if isinstance(f, str):
            if isinstance(expr, relax.Var):
                if expr not in self.reported:
                    self.refuse(expr, f"{why}: {f}")
            else:
                self.problems.append(f"an int64 constant output: {f}")
        elif not f.exact:
            self.refuse(expr, f"{why}: they follow an int64 input or a cast from float, and 32 bits hold them "
                              f"only within [{f.agree[0]}, {f.agree[1]}]")

    def tuple_facts(self, expr, n: int) -> list:
        from tvm import relax

        if isinstance(expr, relax.Tuple):
            return [self.fact(f) if is_i64(f) else None for f in expr.fields]
        found = self.facts.get(expr)
        if isinstance(found, list):
            return found
        ty = getattr(expr, "ty", None)
        return [("it is a field of a tuple without a 32-bit rule" if str(getattr(t, "dtype", "")) == "int64" else None)
                for t in (ty.fields if isinstance(ty, relax.TupleType) else [None] * n)]

    def need_exact_output(self, expr) -> None:
        from tvm import relax

        why = "the model returns it as int64, and its values cannot be bounded to 32 bits"
        if on_cpu(expr):
            return
        if isinstance(expr, relax.Tuple):
            for f in expr.fields:
                self.need_exact_output(f)
        elif isinstance(getattr(expr, "ty", None), relax.TupleType):
            facts = self.facts.get(expr) if isinstance(expr, relax.Var) else None
            for i, t in enumerate(expr.ty.fields):
                if str(getattr(t, "dtype", "")) != "int64":
                    continue
                f = facts[i] if isinstance(facts, list) and i < len(facts) else None
                if f is None:  # no fact for an int64 field (TopK's indices): nothing bounds it
                    f = "it is a field of a tuple without a 32-bit rule"
                if isinstance(f, str):
                    self.refuse(expr, f"{why}: {f}")
                elif not f.exact:
                    self.refuse(expr, why)
        else:
            self.need_exact(expr, why)

    def analyse(self, binding) -> None:
        from tvm import relax

        var, value = binding.var, binding.value
        live = var in self.live
        if isinstance(value, relax.If):
            if is_i64(var):
                arms = [self.fact(arm.body) for arm in (value.true_branch, value.false_branch)]
                bad = next((a for a in arms if isinstance(a, str)), None)
                self.facts[var] = bad if bad is not None else join(arms)
            elif isinstance(getattr(var, "ty", None), relax.TupleType):
                arms = [self.tuple_facts(arm.body, len(var.ty.fields)) for arm in (value.true_branch, value.false_branch)]
                fields = []
                for pair in zip(*arms):
                    if all(f is None for f in pair):
                        fields.append(None)
                    else:
                        bad = next((f for f in pair if not isinstance(f, Fact)), None)
                        fields.append((bad or "it is a field of a tuple without a 32-bit rule")
                                      if bad is not None or None in pair else join(list(pair)))
                self.facts[var] = fields
            return
        if isinstance(value, relax.Var) or isinstance(binding, relax.MatchCast):
            if var in self.live and value in self.facts:
                self.facts[var] = self.facts[value]
            return
        if isinstance(value, relax.Tuple):
            self.facts[var] = [self.fact(f) if is_i64(f) else None for f in value.fields]
            return
        if isinstance(value, relax.TupleGetItem):
            inner = self.facts.get(value.tuple_value)
            if isinstance(inner, list) and value.index < len(inner):
                self.facts[var] = inner[value.index]
            elif is_i64(var):
                self.facts[var] = "it is a field of a tuple without a 32-bit rule"
            return
        if not isinstance(value, relax.Call):
            if is_i64(var):
                self.facts[var] = "it is not a tensor edgepack can narrow"
            return
        result = self.transfer(var, value, live)
        if result is not None:
            self.facts[var] = result

    def transfer(self, var, call, live: bool):
        """The fact of ``var = call`` (or None when it has no int64 result), checking on the way that
        ``call`` accepts the 32-bit forms of its int64 operands (refusing by name when not)."""
        from tvm import relax

        name = op_name(call)
        args = list(call.args)
        i64_args = [(i, a) for i, a in enumerate(args) if is_i64(a)]
        tuple_i64 = [f for a in args if isinstance(a, relax.Tuple) for f in a.fields if is_i64(f)]
        out_i64 = is_i64(var) or (isinstance(getattr(var, "ty", None), relax.TupleType)
                                   and any(str(getattr(t, "dtype", "")) == "int64" for t in var.ty.fields))
        if not i64_args and not tuple_i64 and not out_i64:
            return None
        if name == "relax.to_vdevice" and is_i64(var):  # computed on the CPU: like an int64 input
            return SATURATED if known_shape(var) is not None else "an int64 tensor of unknown rank from the CPU"
        facts = {i: self.fact(a) for i, a in i64_args}
        tuple_facts = [self.fact(f) for f in tuple_i64]

        bad = next((f for f in list(facts.values()) + tuple_facts if isinstance(f, str)), None)
        bad_vars = [a for i, a in i64_args if isinstance(facts[i], str)] + [
            a for a, f in zip(tuple_i64, tuple_facts) if isinstance(f, str)]
        upstream = bool(bad_vars) and all(isinstance(a, relax.Var) and a in self.reported for a in bad_vars)

        def fail(why: str):
            if upstream and bad is not None:  # the operand's own refusal says it all
                self.reported.add(var)
            elif live:
                self.refuse(var, why)
            return why

        # --- consumers whose result is not int64 ---
        if not out_i64:
            if bad is not None:
                return fail(f"{name} reads an int64 operand that cannot be narrowed: {bad}")
            return self.check_consumer(var, call, name, facts, live)

        # --- producers of int64 results ---
        if name in ("relax.argmax", "relax.argmin"):
            shape = static_shape(args[0])
            axis = attr(call, "axis")
            if shape is None or axis is None or not shape:
                return fail(f"{name} over a dynamic shape or all axes")
            return exact(0, max(shape[as_int(axis) % len(shape)] - 1, 0))
        if name in ("relax.topk", "relax.argsort"):
            shape = static_shape(args[0])
            if shape is None:
                return fail(f"{name} over a dynamic shape")
            n = shape[int(attr(call, "axis", -1)) % len(shape)]
            idx = exact(0, max(n - 1, 0))
            if name == "relax.topk" and str(attr(call, "ret_type", "both")) == "both":
                return [facts[0] if is_i64(args[0]) else None, idx]  # the values: the input's
            return idx
        if name == "relax.astype":
            src = dtype_of(args[0])
            if src == "int64":
                return facts[0]
            if src in DTYPE_RANGE:
                return exact(*DTYPE_RANGE[src])
            if src == "float16":  # |x| <= 65504: always exact
                return Fact(-65504, 65504)
            if src in FLOATS:
                return SATURATED
            return fail(f"a cast from {src} to int64 has no 32-bit rule")
        if name == "relax.arange":
            vals = [const_value(a) for a in args]
            if any(v is None for v in vals):
                return fail("Range with run-time bounds")
            start, end, step = (int(np.asarray(v)) for v in vals)
            count = max(0, math.ceil((end - start) / step)) if step else 0
            last = start + (count - 1) * step if count else start
            return exact(min(start, last), max(start, last))
        if name in ("relax.full", "relax.full_like"):
            fill = const_value(args[1])
            return exact(int(np.min(fill)), int(np.max(fill))) if fill is not None else fail("Full with a run-time value")
        if name in ("relax.zeros", "relax.ones", "relax.zeros_like", "relax.ones_like"):
            return Fact(0, 1)
        if name == "relax.shape_to_tensor":
            return fail("a run-time shape as an int64 tensor")
        if bad is not None:
            return fail(f"{name} of an operand that cannot be narrowed: {bad}")
        if name == "relax.memory.view":
            return fail("a view of a buffer as int64")

        # value-preserving / selecting operators: the facts of the selected operand(s)
        if name in _SELECT:
            if name in ("relax.concat", "relax.stack"):
                return join([f for f in tuple_facts]) if tuple_facts else fail(f"{name} without int64 operands")
            if 0 not in facts:
                return fail(f"{name} producing int64 from other types")
            if name in _INDEX_NAMES and 1 in facts:
                self.check_index(var, call, name, facts[1], live)
            if name == "relax.split":
                n = len(var.ty.fields)
                return [facts[0]] * n
            return facts[0]
        if name == "relax.where":
            return join([facts[i] for i in (1, 2) if i in facts]) if (1 in facts or 2 in facts) else \
                fail("where producing int64 from other types")
        if name in ("relax.scatter_elements", "relax.scatter_nd"):  # data and updates are the values
            values = [facts[i] for i in (0, 2) if i in facts]
            if len(values) != 2:
                return fail(f"{name} producing int64 from other types")
            self.check_index(var, call, name, facts[1], live) if 1 in facts else None
            return join(values)
        if name == "relax.clip":
            lo, hi = (const_value(a) for a in args[1:3])
            if lo is None or hi is None:
                return fail("clip with run-time bounds")
            lo, hi = int(lo), int(hi)
            f = facts[0]
            if f.exact or f.covers(lo, hi):  # beyond the agreement the clip gives the bound either way
                return exact(max(f.lo, lo), min(f.hi, hi))
            return fail("clip of a saturated value to bounds beyond the values it agrees on")
        if name in ("relax.add", "relax.subtract"):
            a, b = self.operand(call, 0), self.operand(call, 1)
            if isinstance(a, str) or isinstance(b, str):
                return fail(f"{name}: {a if isinstance(a, str) else b}")
            sign = 1 if name == "relax.add" else -1
            lo = a.lo + (b.lo if sign > 0 else -b.hi)
            hi = a.hi + (b.hi if sign > 0 else -b.lo)
            if not fits(lo, hi):
                return fail(f"{name} may overflow 32 bits (values up to [{lo}, {hi}])")
            if a.exact and b.exact:
                return Fact(lo, hi)
            if not a.exact and not b.exact:
                return fail(f"{name} of two values that only agree with their int64 originals within a range")
            if a.exact and sign < 0:  # c - saturated: reverses the direction of the saturation
                return fail(f"{name} of a saturated value from an exact one")
            sat, ex = (a, b) if not a.exact else (b, a)
            shift_lo, shift_hi = (ex.hi, ex.lo) if sign > 0 else (-ex.lo, -ex.hi)
            return Fact(lo, hi, (sat.agree[0] + shift_lo, sat.agree[1] + shift_hi))
        if name == "relax.negative":
            f = facts[0]
            return Fact(-f.hi, -f.lo, None if f.exact else (-f.agree[1], -f.agree[0]))
        exact_ops = ("relax.multiply", "relax.abs", "relax.maximum", "relax.minimum", "relax.floor_divide",
                     "relax.floor_mod", "relax.sum", "relax.cumsum", "relax.prod", "relax.sign", "relax.square")
        if name in exact_ops:
            ops = [self.operand(call, i) for i in range(len(args)) if is_i64(args[i]) or const_value(args[i]) is not None]
            if any(isinstance(o, str) for o in ops):
                return fail(f"{name}: {next(o for o in ops if isinstance(o, str))}")
            if any(not o.exact for o in ops):
                return fail(f"{name} of a value that only agrees with its int64 original within a range")
            return self.exact_arith(var, call, name, ops, fail)
        return fail(f"{name} on int64 tensors has no 32-bit rule")

    def operand(self, call, i):
        a = call.args[i]
        if is_i64(a):
            return self.fact(a)
        value = const_value(a)
        if value is not None:
            return exact(np.min(value), np.max(value))
        return f"operand {i} is {dtype_of(a)}"

    def exact_arith(self, var, call, name, ops, fail):
        shape = static_shape(call.args[0])
        if name == "relax.multiply":
            a, b = ops
            corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
            r = exact(min(corners), max(corners))
        elif name == "relax.abs":
            a = ops[0]
            r = exact(0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi)), max(abs(a.lo), abs(a.hi)))
        elif name == "relax.sign":
            r = Fact(-1, 1)
        elif name == "relax.square":
            a = ops[0]
            r = exact(0, max(a.lo * a.lo, a.hi * a.hi))
        elif name in ("relax.maximum", "relax.minimum"):
            a, b = ops
            f = max if name == "relax.maximum" else min
            r = Fact(f(a.lo, b.lo), f(a.hi, b.hi))
        elif name == "relax.floor_divide":
            a, b = ops
            if b.lo <= 0 <= b.hi:
                return fail("floor_divide by a value that may be 0")
            corners = [a.lo // b.lo, a.lo // b.hi, a.hi // b.lo, a.hi // b.hi]
            r = exact(min(corners), max(corners))
        elif name == "relax.floor_mod":
            a, b = ops
            if b.lo <= 0 <= b.hi:
                return fail("floor_mod by a value that may be 0")
            m = max(abs(b.lo), abs(b.hi))
            r = Fact(-(m - 1) if b.lo < 0 else 0, (m - 1) if b.hi > 0 else 0)
        elif name in ("relax.sum", "relax.cumsum", "relax.prod"):
            a = ops[0]
            if shape is None:
                return fail(f"{name} over a dynamic shape")
            axis = attr(call, "axis")
            axes = as_ints(axis) if name != "relax.cumsum" else ([int(axis)] if axis is not None else None)
            n = math.prod(shape) if axes is None else math.prod(shape[x % len(shape)] for x in axes)
            if name == "relax.prod":
                m = max(abs(a.lo), abs(a.hi)) ** n if n else 1
                r = exact(-m if a.lo < 0 else (0 if a.lo == 0 else a.lo ** n), m)
            else:
                r = exact(min(a.lo * n, a.lo), max(a.hi * n, a.hi))
        else:  # pragma: no cover
            return fail(f"{name} has no 32-bit rule")
        if isinstance(r, str):
            return fail(f"{name}: {r}")
        return r

    def check_consumer(self, var, call, name, facts, live):
        """``call`` reads int64 operands and produces no int64: the 32-bit operands must give the
        same result. Returns None (no int64 result) or the reason it cannot."""
        def fail(why):
            if live:
                self.refuse(var, why)

        if name in _CMP_OPS:
            a, b = self.operand(call, 0), self.operand(call, 1)
            if isinstance(a, str) or isinstance(b, str):
                return fail(f"{name}: {a if isinstance(a, str) else b}")
            if a.exact and b.exact:
                return None
            if not a.exact and not b.exact:
                return fail(f"{name} of two saturated values")
            sat, ex = (a, b) if not a.exact else (b, a)
            if not sat.covers(ex.lo, ex.hi, strict=True):
                return fail(f"{name} compares a value known only within {sat.agree} with values in [{ex.lo}, {ex.hi}]")
            return None
        if name == "relax.astype":
            f = facts.get(0)
            target = str(attr(call, "dtype"))
            if target == "bool":
                if f.exact or f.covers(0, 0, strict=True):
                    return None
                return fail("a cast to bool of a saturated value")
            if f.exact:
                return None
            return fail(f"a cast to {target} of a value that only agrees with its int64 original within {f.agree}")
        if (name, 1) in _INDEX_ARGS or (name, 0) in _INDEX_ARGS:
            pos = 1 if (name, 1) in _INDEX_ARGS else 0
            extra = [i for i in facts if i != pos]
            if extra:
                return fail(f"{name} with int64 data (only its indices have a 32-bit rule)")
            self.check_index(var, call, name, facts[pos], live)
            return None
        if name in ("relax.memory.view",):
            return None
        return fail(f"{name} reads int64 operands and has no 32-bit rule")

    def check_index(self, var, call, name, f, live) -> None:
        if f.exact:
            return
        data = call.args[0]
        shape = static_shape(data)
        if name == "relax.take":
            if shape is None:
                self.refuse(var, "take with saturated indices over a dynamic shape") if live else None
                return
            axis = attr(call, "axis")
            n = math.prod(shape) if axis is None else shape[int(axis) % len(shape)]
            mode = str(attr(call, "mode", "fast"))
            if mode == "wrap":
                ok = False
            else:  # fast: out-of-range is undefined (the ONNX model errs too); clip: clamps the same way
                ok = f.covers(0, n - 1)
        elif name == "relax.one_hot":
            depth = int(attr(call, "depth", 0))
            ok = f.covers(-1, depth)
        else:
            n = max(shape) if shape else None
            ok = n is not None and f.covers(-n, n - 1)
        if not ok and live:
            self.refuse(var, f"{name} with indices that agree with their int64 values only within {f.agree}")
