"""Operators whose result is fixed at compile time (the window functions and MelWeightMatrix, computed
by the ONNX reference; EyeLike), and OneHot.
"""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import (
    _const,
    _const_value,
    _dtype,
    _rank,
    _reference_constant,
    _require_consts,
    _shape,
)
from edgepack.frontends.onnx_ops.registry import register


class _ConstantOp(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        values = _require_consts(cls.op_type, [i for i in inputs if i is not None])
        out = _reference_constant(cls.op_type, attr, values)
        return relax.const(out, str(out.dtype))


for _op in ("HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"):
    register(_op)(type(_op, (_ConstantOp,), {"op_type": _op}))


@register("EyeLike")
class EyeLike(OnnxOpConverter):
    """Only the input's shape matters: the identity is a constant (TVM mixes up the dtype attribute)."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        from onnx import helper

        x = inputs[0]
        dt = str(helper.tensor_dtype_to_np_dtype(int(attr["dtype"]))) if "dtype" in attr else _dtype(x)
        rows, cols = (_shape(x) * 2)[:2] if _rank(x) == 1 else _shape(x)
        return relax.const(_np.eye(rows, cols, k=int(attr.get("k", 0)), dtype=dt), dt)


@register("OneHot")
class OneHot(OnnxOpConverter):
    """Constant depth; indices and (off, on) values may be run-time tensors; negative indices wrap."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        indices, depth_e, values = inputs
        depth = _const_value(depth_e)
        if depth is None:
            return _tvm.OneHot.get_converter(11)(bb, inputs, attr, params)
        depth = int(depth.reshape(-1)[0])
        rank = _rank(indices)
        axis = attr.get("axis", -1)
        axis = axis + rank + 1 if axis < 0 else axis
        idt = _dtype(indices)
        idx = indices if idt in ("int32", "int64") else relax.op.astype(indices, "int64")
        idt = _dtype(bb.normalize(idx))
        idx = relax.op.where(relax.op.less(idx, _const(0, idt)), idx + _const(depth, idt), idx)
        idx = relax.op.expand_dims(idx, axis)
        shape = [1] * (rank + 1)
        shape[axis] = depth
        positions = relax.const(_np.arange(depth, dtype=idt).reshape(shape), idt)
        hit = relax.op.equal(idx, positions)
        off = relax.op.take(values, relax.const(0, "int64"), axis=0)
        on = relax.op.take(values, relax.const(1, "int64"), axis=0)
        return relax.op.where(hit, on, off)
