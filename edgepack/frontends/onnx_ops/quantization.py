"""Quantized operators: integer matmul/conv with int32 accumulation like the reference
(QLinearMatMul, ConvInteger, QLinearConv), and QuantizeLinear/DequantizeLinear for float8/float4,
sub-byte integers and blocked scales on top of TVM's converters.
"""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.casts import _SMALL_FLOATS, _float8_decode, _float8_encode
from edgepack.frontends.onnx_ops.common import _const_value, _dtype, _opt, _rank, _shape
from edgepack.frontends.onnx_ops.registry import register
from edgepack.frontends.onnx_ops.subbyte import _SUBBYTE_BITS, SUBBYTE_CONTAINERS, _mark, _true_dtype

# --- integer (quantized) matmul / conv: int32 accumulation like the reference -------------------


def _minus_zero_point(x, zp, axis_shape=None):
    """int32(x) - zp. A constant zero point is folded here (none subtracted where it is 0), so that the
    CPU's 8-bit kernels (``backends/cpu/dot_product.py``) find ``int32(x) - constant`` and constant weights."""
    constant = _const_value(x)
    if constant is not None and (zp is None or _const_value(zp) is not None):  # weights: folded here, and
        # ``backends/integer.py`` keeps them as the 8-bit constants they fit in
        z = _const_value(zp).astype(_np.int32) if zp is not None else _np.int32(0)
        if axis_shape is not None:
            z = z.reshape(axis_shape)
        return relax.const(constant.astype(_np.int32) - z, "int32")
    x32 = relax.op.astype(x, "int32")
    if zp is None:
        return x32
    value = _const_value(zp)
    if value is not None:
        if not value.any():
            return x32
        value = value.astype("int32")
        if value.size == 1:
            return x32 - relax.const(value.reshape(()), "int32")
        return x32 - relax.const(value.reshape(axis_shape) if axis_shape is not None else value, "int32")
    z = relax.op.astype(zp, "int32")
    if axis_shape is not None:
        z = relax.op.reshape(z, axis_shape)
    return x32 - z


def _requantize(bb, acc, factor, y_zp, out_dtype: str):
    """round(acc * factor) + zero point, saturated: in float32 and in that order, as ONNX Runtime's kernels
    compute it (in float64, or with the zero point added before rounding, a value next to a rounding tie
    went the other way, and MobileNetV2 in QOperator form drifted 3 quantization steps from ONNX Runtime
    at its logits)."""
    rounded = relax.op.round(relax.op.astype(acc, "float32") * relax.op.astype(factor, "float32"))
    if y_zp is not None:
        rounded = rounded + relax.op.astype(y_zp, "float32")
    info = _np.iinfo(out_dtype)
    # saturated by a minimum and a maximum, which have layout rules (a clip kept the CPU's channels-last
    # form from passing through: a transpose on each side of every quantized convolution)
    saturated = relax.op.maximum(relax.op.minimum(rounded, relax.const(float(info.max), "float32")),
                                 relax.const(float(info.min), "float32"))
    return relax.op.astype(saturated, out_dtype)


def dynamic_quantize(bb, x):
    """ONNX's DynamicQuantizeLinear as ONNX Runtime computes it: the range [min(x, 0), max(x, 0)] over 255
    steps (a scale of 1 where the range is empty: TVM's converter divided by 0 there), the zero point
    rounded half to even, ``round(x / scale) + zero point`` saturated. Returns (uint8, scale, zero point)."""
    zero = relax.const(_np.float32(0), "float32")
    lo = relax.op.minimum(relax.op.min(x), zero)
    hi = relax.op.maximum(relax.op.max(x), zero)
    scale = bb.normalize(relax.op.where(relax.op.equal(hi, lo), relax.const(_np.float32(1), "float32"),
                                        relax.op.divide(hi - lo, relax.const(_np.float32(255), "float32"))))
    zp = bb.normalize(relax.op.round(relax.op.clip(relax.op.negative(relax.op.divide(lo, scale)), 0, 255)))
    q = relax.op.clip(relax.op.round(relax.op.divide(x, scale)) + zp, 0, 255)
    return bb.normalize(relax.op.astype(q, "uint8")), scale, bb.normalize(relax.op.astype(zp, "uint8"))


@register("DynamicQuantizeLinear")
class DynamicQuantizeLinear(OnnxOpConverter):
    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return relax.Tuple(list(dynamic_quantize(bb, inputs[0])))


def integer_matmul(a, a_zp, b, b_zp):
    """The int32 sum of (a - a_zp)(b - b_zp) (MatMulInteger); ``b``'s zero point per column where it is 1-D."""
    b_axis = [_shape(b_zp)[0]] if b_zp is not None and _rank(b_zp) == 1 and _shape(b_zp)[0] > 1 else None
    return relax.op.matmul(_minus_zero_point(a, a_zp), _minus_zero_point(b, b_zp, b_axis), out_dtype="int32")


def integer_matmul_to_float(a, a_zp, b, b_zp, scale, bias=None):
    """float(:func:`integer_matmul`) * scale (+ bias): how ONNX Runtime's dynamically quantized products
    (MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLSTM) compute."""
    y = relax.op.astype(integer_matmul(a, a_zp, b, b_zp), "float32") * scale
    return y if bias is None else y + bias


@register("MatMulInteger")
class MatMulInteger(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, b, a_zp, b_zp = (list(inputs) + [None] * 4)[:4]
        return integer_matmul(a, a_zp, b, b_zp)


@register("QLinearMatMul")
class QLinearMatMul(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (inputs + [None] * 8)[:8]
        acc = integer_matmul(a, a_zp, b, b_zp)
        factor = a_s * b_s / y_s
        out_dtype = _dtype(y_zp) if y_zp is not None else _dtype(a)
        return _requantize(bb, acc, factor, y_zp, out_dtype)


@register("ConvInteger")
class ConvInteger(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w, x_zp, w_zp = (list(inputs) + [None] * 4)[:4]
        wz = None
        if w_zp is not None and _rank(w_zp) == 1 and _shape(w_zp)[0] > 1:
            wz = [_shape(w_zp)[0]] + [1] * (_rank(w) - 1)
        xi = bb.normalize(_minus_zero_point(x, x_zp))
        wi = bb.normalize(_minus_zero_point(w, w_zp, wz))
        return _tvm.Conv.get_converter(11)(bb, [xi, wi, None], attr, params)


@register("QLinearConv")
class QLinearConv(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
        bias = _opt(inputs, 8)
        wz = [_shape(w_zp)[0]] + [1] * (_rank(w) - 1) if w_zp is not None and _rank(w_zp) == 1 and _shape(w_zp)[0] > 1 else None
        xi = bb.normalize(_minus_zero_point(x, x_zp))
        wi = bb.normalize(_minus_zero_point(w, w_zp, wz))
        acc = bb.normalize(_tvm.Conv.get_converter(11)(bb, [xi, wi, None], attr, params))
        if bias is not None:
            acc = acc + relax.op.reshape(bb.normalize(relax.op.astype(bias, "int32")), [1, -1] + [1] * (_rank(x) - 2))
        ws = w_s if _rank(w_s) == 0 or _shape(w_s) == [1] else relax.op.reshape(w_s, [1, -1] + [1] * (_rank(x) - 2))
        out_dtype = _dtype(y_zp) if y_zp is not None else _dtype(x)
        return _requantize(bb, acc, x_s * ws / y_s, y_zp, out_dtype)


# --- quantize / dequantize: float8 formats and blocked scales on top of TVM's converters ---------


def _q_param(bb, p, x_rank: int, axis: int, block: int):
    """Scale or zero point broadcastable against x: per-tensor, per-axis (1-D) or blocked."""
    if p is None:
        return None
    rank = _rank(p)
    if block and rank == x_rank:
        return bb.normalize(relax.op.repeat(p, block, axis=axis))
    if rank == 1 and x_rank > 1 and _shape(p)[0] > 1:
        shape = [1] * x_rank
        shape[axis] = _shape(p)[0]
        return relax.op.reshape(p, shape)
    return p


def _to_float32(bb, x):
    if _true_dtype(x) in _SMALL_FLOATS:
        return bb.normalize(_float8_decode(bb, x, "float32"))
    return bb.normalize(relax.op.astype(x, "float32")) if _dtype(x) != "float32" else x


@register("DequantizeLinear")
class DequantizeLinear(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, scale, zp = inputs[0], inputs[1], _opt(inputs, 2)
        block = int(attr.get("block_size", 0))
        if _true_dtype(x) not in _SMALL_FLOATS and _true_dtype(x) not in _SUBBYTE_BITS and not block:
            return _tvm.DequantizeLinear.get_converter(21)(bb, inputs, attr, params)
        axis = attr.get("axis", 1) % max(_rank(x), 1)
        xf = _to_float32(bb, x)
        if zp is not None:
            xf = xf - _q_param(bb, _to_float32(bb, zp), _rank(x), axis, block)
        out = xf * _q_param(bb, _to_float32(bb, scale), _rank(x), axis, block)
        out_dt = _dtype(scale)
        return relax.op.astype(out, out_dt) if out_dt != "float32" else out


@register("QuantizeLinear")
class QuantizeLinear(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, scale, zp = inputs[0], inputs[1], _opt(inputs, 2)
        block = int(attr.get("block_size", 0))
        from onnx import helper

        out_dt = _true_dtype(zp) if zp is not None else (
            str(helper.tensor_dtype_to_np_dtype(int(attr["output_dtype"]))) if attr.get("output_dtype") else "uint8")
        if out_dt not in _SMALL_FLOATS and out_dt not in _SUBBYTE_BITS and not block:
            return _tvm.QuantizeLinear.get_converter(10)(bb, inputs, attr, params)
        axis = attr.get("axis", 1) % max(_rank(x), 1)
        y = _to_float32(bb, x) / _q_param(bb, _to_float32(bb, scale), _rank(x), axis, block)
        if out_dt in _SMALL_FLOATS:
            if zp is not None:
                y = y + _q_param(bb, _to_float32(bb, zp), _rank(x), axis, block)
            return _float8_encode(bb, bb.normalize(y), out_dt, bool(attr.get("saturate", 1)))
        y = relax.op.round(y)
        if zp is not None:
            y = y + _q_param(bb, _to_float32(bb, zp), _rank(x), axis, block)
        if out_dt in _SUBBYTE_BITS:
            bits = _SUBBYTE_BITS[out_dt]
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if out_dt.startswith("int") else (0, (1 << bits) - 1)
            return _mark(bb, relax.op.astype(relax.op.clip(y, lo, hi), SUBBYTE_CONTAINERS[out_dt]), out_dt)
        info = _np.iinfo(out_dt)
        return relax.op.astype(relax.op.clip(y, int(info.min), int(info.max)), out_dt)
