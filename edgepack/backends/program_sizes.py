"""What a compiled program holds, measured on the Relax program of each backend's pipeline:

- its constants: the weights as the pipeline left them (widened, packed, folded). ``inspect BUILD`` and the
  compile summary show the device library as these bytes and the rest (kernels, the program, its tables),
  so a library many times its model says why;
- the memory it allocates for a run: the storage memory planning gave its intermediate tensors, and its
  outputs, both at the largest size a ``--dim`` range allows (planning reads the same upper bounds).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgepack.backends.relax_exprs import dtype_of

LARGEST = 3  # constants named one by one


@dataclass(frozen=True)
class ConstantSizes:
    bytes: int  # all constant tensors of the program, each value counted once
    count: int
    largest: tuple[tuple[str, tuple[int, ...], int], ...]  # (dtype, shape, bytes), largest first

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "count": self.count,
                "largest": [{"dtype": d, "shape": list(s), "bytes": b} for d, s, b in self.largest]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConstantSizes:
        return cls(int(data["bytes"]), int(data["count"]),
                   tuple((x["dtype"], tuple(x["shape"]), int(x["bytes"])) for x in data.get("largest", ())))


def constant_sizes(mod) -> ConstantSizes:
    """The constant tensors of the Relax functions in ``mod``."""
    import tvm
    from tvm import relax

    found: dict[tuple, tuple[str, tuple[int, ...], int]] = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            value = expr.value
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                shape = tuple(int(d) for d in value.shape)
                dtype = str(value.dtype)
                # by content: the importer and the passes make equal constants (an LSTM's weights, once per
                # step) that the executable stores once
                key = (dtype, shape, hashlib.sha1(value.numpy().tobytes()).hexdigest())
                found[key] = (dtype, shape, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    ordered = sorted(found.values(), key=lambda c: -c[2])
    return ConstantSizes(sum(c[2] for c in ordered), len(ordered), tuple(ordered[:LARGEST]))


def _extent(values, analyzer) -> int | None:
    """The product of ``values`` (TIR integers, symbolic ones at their bound upper limits), else None."""
    size = 1
    for v in values:
        v = analyzer.simplify(v)
        if not hasattr(v, "value"):
            return None
        size *= int(v.value)
    return size


def _calls(func) -> list:
    from tvm import relax

    calls: list = []
    relax.analysis.post_order_visit(func, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    return calls


def run_memory_bytes(mod) -> int:
    """Bytes a run of ``mod``'s Relax functions allocates, right after memory planning: every planned
    storage and every tensor allocated on its own (outputs), symbolic sizes at their upper bounds."""
    import tvm
    from tvm import relax
    from tvm.sym import Analyzer

    total = 0
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        bounds = {str(k): int(v) for k, v in (func.attrs.get("tir_var_upper_bound", {}) if func.attrs else {}).items()}
        analyzer = Analyzer()
        for var in relax.analysis.defined_symbolic_vars(func):
            if var.name in bounds:
                analyzer.bind(var, tvm.tirx.IntImm("int64", bounds[var.name]))  # shape variables are int64
        for call in _calls(func):
            name = getattr(call.op, "name", "")
            if name == "relax.memory.alloc_storage" and isinstance(call.args[0], relax.ShapeExpr):
                total += _extent(call.args[0].values, analyzer) or 0
            elif name == "relax.builtin.alloc_tensor" and isinstance(call.args[0], relax.ShapeExpr):
                elements, dtype = _extent(call.args[0].values, analyzer), dtype_of(call)
                total += elements * np.dtype(dtype).itemsize if elements is not None and dtype else 0
    return total


def measuring(pipeline, sink: dict):
    """``pipeline`` (a list of Relax passes) with looks at what it makes, the module unchanged: the memory
    a run allocates right after memory planning (``sink["run_memory"]``), the constants at the end
    (``sink["constants"]``)."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="edgepack.MeasureMemory")
    def memory(mod, _ctx):
        sink["run_memory"] = run_memory_bytes(mod)
        return mod

    @tvm.transform.module_pass(opt_level=0, name="edgepack.MeasureConstants")
    def constants(mod, _ctx):
        sink["constants"] = constant_sizes(mod)
        return mod

    passes: list = []
    for p in pipeline:
        passes.append(p)
        if p.info.name == "StaticPlanBlockMemory":
            passes.append(memory)
    return [*passes, constants]
