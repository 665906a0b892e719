"""Element-wise operators: Dropout (inference), Clip, the variadic Sum/Mean/Min/Max folded pairwise,
Pow with mixed types, CumProd and IsInf.
"""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const, _const_value, _constant_of, _dtype, _rank, _shape
from edgepack.frontends.onnx_ops.registry import register


@register("Dropout")
class Dropout(OnnxOpConverter):
    """Inference: the data unchanged and an all-true bool mask (TVM's mask is float32)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        if attr["tvm_custom"]["num_outputs"] < 2:
            return x
        return relax.Tuple([x, relax.op.ones(x.ty.shape, "bool")])


@register("Clip")
class Clip(OnnxOpConverter):
    """Clip with constant bounds as Relax ``maximum``/``minimum`` against scalars.

    TVM's converter emits TE calls, which Relax passes cannot see through: ``ConvertLayout`` then
    wraps every ReLU6 in a pair of transposes. NaN bounds mean "unbounded", as in ONNX Runtime.
    Bounds computed at run time keep TVM's converter.
    """

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._clip(bb, inputs[0], attr.get("min"), attr.get("max"))

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        given = (list(inputs) + [None, None])[1:3]
        bounds = [None if x is None else _constant_of(x) for x in given]
        if any(x is not None and b is None for x, b in zip(given, bounds)):
            return _tvm.Clip.get_converter(13)(bb, inputs, attr, params)
        return cls._clip(bb, inputs[0], *bounds)

    @staticmethod
    def _clip(bb, x, lo, hi):
        dtype = _dtype(x)
        result = x
        for bound, op in ((lo, relax.op.maximum), (hi, relax.op.minimum)):
            if bound is None or _np.isnan(float(bound)):
                continue
            result = bb.normalize(op(result, relax.const(_np.asarray(bound).astype(dtype), dtype)))
        return result


class _PairwiseVariadic(OnnxOpConverter):
    """Sum/Mean/Min/Max folded pairwise with broadcasting binary ops.

    TVM's converter broadcasts every input to the common shape, stacks them into a new tensor and
    reduces over it: extra copies of the data, and a residual ``Sum`` cannot fuse into the
    convolution before it (in resnet50-light those kernels took about 7% of the model's time).
    Constant inputs keep TVM's converter (it folds them).
    """

    tvm_converter: type
    binary = staticmethod(relax.op.add)

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if all(_constant_of(x) is not None for x in inputs):
            return cls.tvm_converter.get_converter(13)(bb, inputs, attr, params)
        result = inputs[0]
        for rhs in inputs[1:]:
            result = bb.normalize(cls.binary(result, rhs))
        if cls.tvm_converter is _tvm.Mean and len(inputs) > 1:
            result = relax.op.divide(result, relax.const(len(inputs), _dtype(result)))
        return result


@register("Sum")
class Sum(_PairwiseVariadic):
    tvm_converter = _tvm.Sum


@register("Mean")
class Mean(_PairwiseVariadic):
    tvm_converter = _tvm.Mean


@register("Min")
class Min(_PairwiseVariadic):
    tvm_converter = _tvm.Min
    binary = staticmethod(relax.op.minimum)


@register("Max")
class Max(_PairwiseVariadic):
    tvm_converter = _tvm.Max
    binary = staticmethod(relax.op.maximum)


@register("Pow")
class Pow(OnnxOpConverter):
    """ONNX Pow allows an exponent of another type than the base (the result has the base's type);
    integer bases are computed in float64 and rounded back."""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        base, exp = inputs[0], inputs[1]
        bdt, edt = _dtype(base), _dtype(exp)
        if bdt == edt and bdt.startswith("float"):
            return _tvm.Pow.get_converter(7)(bb, inputs, attr, params)
        if bdt.startswith("float"):
            return relax.op.power(base, relax.op.astype(exp, bdt))
        result = relax.op.power(relax.op.astype(base, "float64"), relax.op.astype(exp, "float64"))
        return relax.op.astype(relax.op.round(result), bdt)


@register("CumProd")
class CumProd(OnnxOpConverter):
    """CumProd (opset 26) with a constant axis, ``exclusive`` and ``reverse``."""

    @classmethod
    def _impl_v26(cls, bb, inputs, attr, params):
        x = inputs[0]
        axis_value = _const_value(inputs[1])
        if axis_value is None:
            raise ValueError("CumProd needs a constant axis.")
        rank = _rank(x)
        axis = int(axis_value.reshape(-1)[0])
        axis = axis + rank if axis < 0 else axis
        dt = _dtype(x)
        if attr.get("reverse", 0):
            x = bb.normalize(relax.op.flip(x, axis))
        if attr.get("exclusive", 0):  # shift by one along the axis, filling with the identity 1
            n = _shape(x)[axis]
            pads = [0, 0] * rank
            pads[2 * axis] = 1
            ones = relax.op.nn.pad(x, pads, pad_value=1.0)
            x = relax.op.strided_slice(ones, axes=[axis], begin=[0], end=[n])
        out = relax.op.cumprod(x, axis=axis, dtype=dt)
        return relax.op.flip(out, axis) if attr.get("reverse", 0) else out


@register("IsInf")
class IsInf(OnnxOpConverter):
    """Honours detect_negative / detect_positive (TVM's converter flags both signs always)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        inf = relax.op.isinf(x)
        pos, neg = attr.get("detect_positive", 1), attr.get("detect_negative", 1)
        if pos and neg:
            return inf
        if not pos and not neg:
            return relax.op.zeros(x.ty.shape, "bool")
        side = relax.op.greater(x, _const(0, dt)) if pos else relax.op.less(x, _const(0, dt))
        return relax.op.logical_and(inf, side)
