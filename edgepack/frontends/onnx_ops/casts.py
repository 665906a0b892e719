"""Casts: Cast/CastLike with float8 and float4 through code tables (TVM's conversions get zeros,
subnormals, NaN, infinities and saturation wrong), sub-byte integer casts, and BitCast.
"""

from __future__ import annotations

import itertools

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const, _dtype
from edgepack.frontends.onnx_ops.registry import register
from edgepack.frontends.onnx_ops.subbyte import _SUBBYTE_BITS, SUBBYTE_CONTAINERS, _mark, _true_dtype

_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_FP_SIGN_BIT = {"float4_e2m1fn": 0x8}  # float8 formats: 0x80
_SMALL_FLOATS = (*_FLOAT8, "float4_e2m1fn")  # converted through code tables


def _float8_tables(name: str, saturate: bool):
    """(decode table [256] float32, encode boundaries, encode codes, overflow bound, overflow strict,
    nan code, overflow code) for one float8 format, derived from ml_dtypes (round to nearest even)."""
    import ml_dtypes

    f8 = getattr(ml_dtypes, name)
    sign = _FP_SIGN_BIT.get(name, 0x80)
    codes = _np.arange(2 * sign, dtype=_np.uint8)
    decoded = codes.view(f8).astype(_np.float32)
    finite_pos = [(float(v), int(c)) for c, v in zip(codes, decoded) if c < sign and _np.isfinite(v)]
    finite_pos.sort()
    values = _np.array([v for v, _ in finite_pos], dtype=_np.float64)
    enc_codes = _np.array([c for _, c in finite_pos], dtype=_np.int32)
    bounds = []
    for lo, hi in itertools.pairwise(values):
        mid = _np.float32((lo + hi) / 2)
        rounds_up = float(_np.float32(mid).astype(f8).astype(_np.float32)) == float(hi)
        # bucketize counts the boundaries strictly below |x|: a tie that rounds up needs the
        # boundary just below the midpoint
        bounds.append(_np.nextafter(mid, _np.float32(-_np.inf)) if rounds_up else mid)
    top = values[-1]
    step = top - values[-2]
    over = _np.float32(top + step / 2)  # halfway to the next (unrepresentable) step
    strict = float(_np.float32(over).astype(f8).astype(_np.float32)) == float(top)  # the tie stays finite
    nan_code = {"float4_e2m1fn": 0x8}.get(name, 0x80 if name.endswith("fnuz") else 0x7F)  # float4: -0
    if saturate or name == "float4_e2m1fn":
        over_code = int(enc_codes[-1])
    else:
        over_code = 0x7C if name == "float8_e5m2" else nan_code
    return decoded, _np.array(bounds, dtype=_np.float32), enc_codes, over, strict, nan_code, over_code


def _float8_decode(bb, x, to: str):
    src = _true_dtype(x)
    decoded = _float8_tables(src, True)[0]
    raw = x if _dtype(x) == "uint8" else relax.op.memory.view(x, dtype="uint8")  # float4: its container
    bits = relax.op.astype(raw, "int32")
    out = relax.op.take(relax.const(decoded, "float32"), bits, axis=0)
    return out if to == "float32" else relax.op.astype(out, to)


def _float8_encode(bb, x, to: str, saturate: bool):
    _, bounds, enc_codes, over, strict, nan_code, over_code = _float8_tables(to, saturate)
    xf = bb.normalize(x if _dtype(x) == "float32" else relax.op.astype(x, "float32"))
    a = bb.normalize(relax.op.abs(xf))
    idx = relax.op.bucketize(a, relax.const(bounds, "float32"), out_int32=True, right=False)
    code = bb.normalize(relax.op.take(relax.const(enc_codes, "int32"), idx, axis=0))
    too_big = relax.op.greater(a, _const(over, "float32")) if strict else \
        relax.op.greater_equal(a, _const(over, "float32"))
    code = relax.op.where(too_big, _const(over_code, "int32"), code)
    negative = relax.op.less(relax.op.memory.view(xf, dtype="int32"), _const(0, "int32"))  # -0.0 too
    if to.endswith("fnuz"):  # no negative zero in these formats
        negative = relax.op.logical_and(negative, relax.op.not_equal(code, _const(0, "int32")))
    sign = _FP_SIGN_BIT.get(to, 0x80)
    signed = relax.op.where(negative, relax.op.bitwise_or(code, _const(sign, "int32")), code)
    if to.endswith("fnuz"):
        signed = relax.op.where(relax.op.equal(code, _const(0x80, "int32")), code, signed)
    signed = relax.op.where(relax.op.isnan(xf), _const(nan_code, "int32"), signed)
    as_bytes = bb.normalize(relax.op.astype(signed, "uint8"))
    if to in SUBBYTE_CONTAINERS:
        return _mark(bb, as_bytes, to)
    return relax.op.memory.view(as_bytes, dtype=to)


def _int_wrap(bb, x, to: str):
    """Cast to a sub-byte integer type: truncate, keep the low bits (ml_dtypes' wrap-around)."""
    bits = _SUBBYTE_BITS[to]
    v = relax.op.astype(relax.op.trunc(x) if _dtype(x).startswith("float") else x, "int32")
    wrapped = relax.op.floor_mod(v, _const(1 << bits, "int32"))
    if to.startswith("int"):
        half = 1 << (bits - 1)
        wrapped = relax.op.floor_mod(v + _const(half, "int32"), _const(1 << bits, "int32")) - _const(half, "int32")
    return _mark(bb, relax.op.astype(wrapped, SUBBYTE_CONTAINERS[to]), to)


def _cast(bb, x, to: str, attr: dict, params, fallback):
    src = _true_dtype(x) if isinstance(getattr(x, "ty", None), relax.TensorType) else None
    if src in _SMALL_FLOATS and to in ("float32", "float16", "float64"):
        return _float8_decode(bb, x, to)
    if to in _SMALL_FLOATS and src in ("float32", "float16"):
        return _float8_encode(bb, x, to, bool(attr.get("saturate", 1)))
    if to in _SUBBYTE_BITS and src is not None:
        return _int_wrap(bb, x, to)
    if src in _SUBBYTE_BITS:  # the container holds the value: a plain cast of the container
        return relax.op.astype(x, to)
    return fallback()


@register("Cast")
class Cast(OnnxOpConverter):
    """TVM's Cast, except float8 <-> float: TVM's conversions get zeros, subnormals, NaN, infinities
    and saturation wrong, so those go through 256-entry tables (decode) and bucketize (encode)."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        from onnx import helper

        to = str(helper.tensor_dtype_to_np_dtype(int(attr["to"]))) if isinstance(attr["to"], int) else attr["to"]
        return _cast(bb, inputs[0], to, attr, params, lambda: _tvm.Cast.get_converter(13)(bb, inputs, attr, params))


@register("CastLike")
class CastLike(OnnxOpConverter):
    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        target = inputs[1]
        to = _true_dtype(target) if isinstance(getattr(target, "ty", None), relax.TensorType) else None
        if to is None:
            return _tvm.CastLike.get_converter(15)(bb, inputs, attr, params)
        return _cast(bb, inputs[0], to, attr, params,
                     lambda: _tvm.CastLike.get_converter(15)(bb, inputs, attr, params))


@register("BitCast")
class BitCast(OnnxOpConverter):
    """Reinterpret the bytes (same element size): a view, no copy."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        from onnx import helper

        x = inputs[0]
        to = str(helper.tensor_dtype_to_np_dtype(int(attr["to"])))
        if _np.dtype(to).itemsize != _np.dtype(_dtype(x)).itemsize:
            raise ValueError(f"BitCast between element sizes ({_dtype(x)} -> {to}) is not supported.")
        if to == "bool":  # bytes 0/1 only: a view is exact, but TVM's bool views are not byte-wise
            return relax.op.not_equal(relax.op.memory.view(x, dtype="uint8"), _const(0, "uint8"))
        if _dtype(x) == "bool":
            return relax.op.memory.view(bb.normalize(relax.op.astype(x, "uint8")), dtype=to)
        return relax.op.memory.view(x, dtype=to)
