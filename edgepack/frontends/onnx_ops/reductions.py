"""Reductions: ReduceMax/ReduceMin (bool inputs, empty axes) and Det (cofactor expansion)."""

from __future__ import annotations

import numpy as _np
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const_value, _dtype, _rank, _shape
from edgepack.frontends.onnx_ops.registry import register


class _ReduceExtreme(OnnxOpConverter):
    """TVM's ReduceMax/ReduceMin, plus bool inputs and reductions over empty axes."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        """Axes from the attribute (opsets 1-17) or the second input (18 on); TVM's own converter is
        only called for the form of opset 18, so the attribute is read here: handed to it, the axes of
        an opset-17 ``ReduceMax(axes=[1])`` were dropped and the reduction ran over every axis."""
        x = inputs[0]
        tvm_conv = getattr(_tvm, cls.op_type).get_converter(18)
        if not isinstance(getattr(x, "ty", None), relax.TensorType) or x.ty.shape is None:
            if attr.get("axes") is not None:
                return _reduce(cls.op_type)(x, [int(a) for a in attr["axes"]], bool(attr.get("keepdims", 1)))
            return tvm_conv(bb, inputs, attr, params)
        shape = list(x.ty.shape)  # extents: symbolic ones (--dim) stay expressions
        axes = attr.get("axes")
        if axes is None and len(inputs) > 1 and inputs[1] is not None:
            axes = _const_value(inputs[1])
        if (axes is None or len(axes) == 0) and attr.get("noop_with_empty_axes", 0):
            return x
        axes = list(range(len(shape))) if axes is None or len(axes) == 0 else [int(a) % len(shape) for a in axes]
        keep = attr.get("keepdims", 1)
        if any(isinstance(shape[a], tirx.IntImm) and int(shape[a]) == 0 for a in axes) \
                and all(isinstance(d, tirx.IntImm) for d in shape):
            shape = _shape(x)
            out_shape = [1 if a in axes else d for a, d in enumerate(shape)] if keep else \
                [d for a, d in enumerate(shape) if a not in axes]
            dt = _dtype(x)
            big = _np.inf if dt.startswith("float") else _np.iinfo(dt).max
            fill = -big if cls.op_type == "ReduceMax" else big
            return relax.const(_np.full(out_shape, fill, dtype=dt), dt)
        if _dtype(x) == "bool":
            as_int = bb.normalize(relax.op.astype(x, "int8"))
            out = bb.normalize(_reduce(cls.op_type)(as_int, axes, bool(keep)))
            return relax.op.astype(out, "bool")
        return _reduce(cls.op_type)(x, axes, bool(keep))


def _reduce(op_type: str):
    return relax.op.max if op_type == "ReduceMax" else relax.op.min


for _op in ("ReduceMax", "ReduceMin"):
    register(_op)(type(_op, (_ReduceExtreme,), {"op_type": _op}))


@register("Det")
class Det(OnnxOpConverter):
    """Determinant of [..., n, n] by cofactor expansion (n <= 4: what graphs contain in practice)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        n = _shape(x)[-1]
        if n > 4:
            raise ValueError(f"Det of {n}x{n} matrices is not supported (at most 4x4).")
        rank = _rank(x)

        def entry(i, j):
            return bb.normalize(relax.op.squeeze(relax.op.strided_slice(x, [rank - 2, rank - 1], [i, j], [i + 1, j + 1]),
                                                 [rank - 2, rank - 1]))

        cells = [[entry(i, j) for j in range(n)] for i in range(n)]

        def det(rows, cols):
            if len(rows) == 1:
                return cells[rows[0]][cols[0]]
            total = None
            for k, c in enumerate(cols):
                term = cells[rows[0]][c] * det(rows[1:], cols[:k] + cols[k + 1:])
                total = term if total is None else (total - term if k % 2 else total + term)
            return bb.normalize(total)

        return det(list(range(n)), list(range(n)))
