"""The ``com.microsoft`` quantized operators that ONNX Runtime's quantization tools write (QOperator format
and dynamic quantization): QLinearAdd/Mul/Sigmoid/LeakyRelu/Concat/GlobalAveragePool/AveragePool, QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul and DynamicQuantizeLSTM.

Each is imported as what it computes on real numbers between a ``dequantize`` of its 8-bit inputs and a
``quantize`` of its output, the form of a QDQ model: the CPU pipeline then runs convolutions and matrix
products on exact int32 sums (``backends/integer.py``) and the rest elementwise. ONNX Runtime's own
kernels compute the same real-valued function with their own float roundings, so results agree within
one quantization step (the tolerance ``validate`` applies to 8-bit outputs).
"""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const_value, _dtype, _opt, _rank, _shape
from edgepack.frontends.onnx_ops.quantization import dynamic_quantize, integer_matmul_to_float
from edgepack.frontends.onnx_ops.recurrent import LSTM
from edgepack.frontends.onnx_ops.registry import register


def _zero(z, dtype: str):
    return z if z is not None else relax.const(_np.zeros((), dtype), dtype)


def _scalar(e):
    """A per-tensor scale or zero point ([] or [1]) as a scalar, the form quantize/dequantize take."""
    return relax.op.reshape(e, []) if _rank(e) else e


def _dq(bb, x, scale, zero, axis: int = -1):
    """Real values of the 8-bit (or int32) ``x``: (x - zero) * scale (``axis``: of a per-channel scale)."""
    zero = _zero(zero, _dtype(x))
    if _rank(scale) == 0 or (_rank(scale) == 1 and int(scale.ty.shape[0]) == 1):
        scale, zero, axis = _scalar(scale), _scalar(zero), -1
    return bb.normalize(relax.op.dequantize(x, scale, zero, axis=axis, out_dtype="float32"))


def _q(x, scale, zero, dtype: str):
    return relax.op.quantize(x, _scalar(scale), _scalar(_zero(zero, dtype)), axis=-1, out_dtype=dtype)


def _out_dtype(zero, like) -> str:
    return _dtype(zero) if zero is not None else _dtype(like)


def _binary(bb, inputs, op):
    """(A, A_scale, A_zero, B, B_scale, B_zero, C_scale, C_zero) through ``op`` on real values."""
    a, a_s, a_z, b, b_s, b_z, c_s = inputs[0], inputs[1], _opt(inputs, 2), inputs[3], inputs[4], _opt(inputs, 5), inputs[6]
    c_z = _opt(inputs, 7)
    return _q(op(_dq(bb, a, a_s, a_z), _dq(bb, b, b_s, b_z)), c_s, c_z, _out_dtype(c_z, a))


@register("QLinearAdd")
class QLinearAdd(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _binary(bb, inputs, relax.op.add)


@register("QLinearMul")
class QLinearMul(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _binary(bb, inputs, relax.op.multiply)


def _unary(bb, inputs, fn):
    """(X, X_scale, X_zero, Y_scale, Y_zero) through ``fn`` on real values."""
    x, x_s, x_z, y_s = inputs[0], inputs[1], _opt(inputs, 2), inputs[3]
    y_z = _opt(inputs, 4)
    return _q(fn(_dq(bb, x, x_s, x_z)), y_s, y_z, _out_dtype(y_z, x))


@register("QLinearSigmoid")
class QLinearSigmoid(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _unary(bb, inputs, relax.op.sigmoid)


@register("QLinearLeakyRelu")
class QLinearLeakyRelu(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        alpha = float(attr.get("alpha", 0.01))
        return _unary(bb, inputs, lambda x: relax.op.nn.leakyrelu(x, alpha))


@register("QLinearGlobalAveragePool")
class QLinearGlobalAveragePool(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        channels_last = int(attr.get("channels_last", 0))
        rank = _rank(inputs[0])
        axes = list(range(1, rank - 1)) if channels_last else list(range(2, rank))
        return _unary(bb, inputs, lambda x: relax.op.mean(x, axis=axes, keepdims=True))


@register("QLinearAveragePool")
class QLinearAveragePool(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if int(attr.get("channels_last", 0)):
            raise NotImplementedError("QLinearAveragePool with channels_last=1")
        pool = {k: v for k, v in attr.items() if k != "channels_last"}
        return _unary(bb, inputs, lambda x: _tvm.AveragePool.get_converter(19)(bb, [x], pool, params))


@register("QLinearConcat")
class QLinearConcat(OnnxOpConverter):
    """(Y_scale, Y_zero, then X, X_scale, X_zero for each input)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        y_s, y_z = inputs[0], _opt(inputs, 1)
        parts = [_dq(bb, inputs[i], inputs[i + 1], _opt(inputs, i + 2)) for i in range(2, len(inputs), 3)]
        axis = int(attr.get("axis", 0))
        return _q(relax.op.concat(parts, axis=axis), y_s, y_z, _out_dtype(y_z, inputs[2]))


@register("QGemm")
class QGemm(OnnxOpConverter):
    """(A, A_scale, A_zero, B, B_scale, B_zero, C, Y_scale, Y_zero): alpha * A' B' + C, C an int32 bias at
    scale alpha * A_scale * B_scale; float output where Y_scale is absent."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        a, a_s, a_z, b, b_s, b_z = inputs[0], inputs[1], _opt(inputs, 2), inputs[3], inputs[4], _opt(inputs, 5)
        c, y_s, y_z = _opt(inputs, 6), _opt(inputs, 7), _opt(inputs, 8)
        alpha = float(attr.get("alpha", 1.0))
        trans_b = int(attr.get("transB", 0))
        real_a = _dq(bb, a, a_s, a_z)
        real_b = _dq(bb, b, b_s, b_z, axis=0 if trans_b else 1)
        gemm = {"alpha": alpha, "beta": 1.0, "transA": int(attr.get("transA", 0)), "transB": trans_b}
        operands = [real_a, real_b]
        if c is not None:
            bias_scale = bb.normalize(relax.op.multiply(relax.op.multiply(a_s, b_s), relax.const(_np.float32(alpha))))
            operands.append(_dq(bb, c, bias_scale, None, axis=0))
        y = bb.normalize(_tvm.Gemm.get_converter(13)(bb, operands, gemm, params))
        return y if y_s is None else _q(y, y_s, y_z, _out_dtype(y_z, a))


@register("MatMulIntegerToFloat")
class MatMulIntegerToFloat(OnnxOpConverter):
    """(A, B, A_scale, B_scale, A_zero, B_zero, bias): float (A - A_zero)(B - B_zero) x A_scale B_scale + bias,
    the product summed in int32."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        a, b, a_s, b_s = inputs[:4]
        return integer_matmul_to_float(a, _opt(inputs, 4), b, _opt(inputs, 5), a_s * b_s, _opt(inputs, 6))


@register("DynamicQuantizeMatMul")
class DynamicQuantizeMatMul(OnnxOpConverter):
    """(A float, B 8-bit, B_scale, B_zero, bias): A quantized to uint8 by its own range at run time
    (ONNX's DynamicQuantizeLinear), then as MatMulIntegerToFloat."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        a, b, b_s = inputs[:3]
        a_q, a_s, a_z = dynamic_quantize(bb, a)
        return integer_matmul_to_float(a_q, a_z, b, _opt(inputs, 3), a_s * b_s, _opt(inputs, 4))


@register("DynamicQuantizeLSTM")
class DynamicQuantizeLSTM(LSTM):
    """An LSTM with 8-bit weights (W [dirs, input, 4H], R [dirs, H, 4H], scales and zero points per
    direction or per gate column): as ONNX Runtime runs it, each product's float operand is quantized to
    uint8 by its own range (the whole sequence for X W, each step's H for H R), summed in int32 and scaled
    back; the gates in float."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._impl_v7(bb, inputs, attr, params)

    @classmethod
    def direction_weights(cls, bb, inputs, d):
        def part(weights, scale, zero):
            def pick(e):
                value = _const_value(e)  # constant weights sliced here (kept 8-bit: ``backends/integer.py``)
                if value is not None:
                    return relax.const(value[d])
                return bb.normalize(relax.op.squeeze(relax.op.strided_slice(e, [0], [d], [d + 1]), [0]))

            return pick(weights), pick(scale), pick(zero) if zero is not None else None

        return (part(inputs[1], inputs[8], _opt(inputs, 9)), part(inputs[2], inputs[10], _opt(inputs, 11)))

    @classmethod
    def times(cls, bb, a, weights):
        w, w_s, w_z = weights
        a_q, a_s, a_z = dynamic_quantize(bb, a)
        return bb.normalize(integer_matmul_to_float(a_q, a_z, w, w_z, a_s * w_s))

    @classmethod
    def hidden_size(cls, w) -> int:
        return _shape(w)[2] // cls.gates
