"""How much of a compiled program is constants: the weights, as the pipeline left them (widened, packed,
folded), measured on the Relax program the code generator gets. ``inspect BUILD`` and the compile summary
show the device library as these bytes and the rest (kernels, the program, its tables), so a library many
times its model says why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LARGEST = 3  # constants named one by one


@dataclass(frozen=True)
class ConstantSizes:
    bytes: int  # all constant tensors of the program, each counted once
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

    found: dict[int, tuple[str, tuple[int, ...], int]] = {}

    def visit(expr) -> None:
        if isinstance(expr, tvm.ir.GenericConst):
            value = expr.value
            if hasattr(value, "shape") and hasattr(value, "dtype"):
                shape = tuple(int(d) for d in value.shape)
                dtype = str(value.dtype)
                found[hash(expr)] = (dtype, shape, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    ordered = sorted(found.values(), key=lambda c: -c[2])
    return ConstantSizes(sum(c[2] for c in ordered), len(ordered), tuple(ordered[:LARGEST]))


def measuring(pipeline, sink: dict[str, ConstantSizes]):
    """``pipeline`` (a Relax module pass) followed by a look at the constants of what it made, stored in
    ``sink["constants"]``; the module is not changed."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="edgepack.MeasureConstants")
    def measure(mod, _ctx):
        sink["constants"] = constant_sizes(mod)
        return mod

    return tvm.transform.Sequential([pipeline, measure])
