"""Activations TVM lacks or computes inaccurately: Celu, Softplus, Tanh, Mish, Swish."""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const, _dtype
from edgepack.frontends.onnx_ops.registry import register


def _log1p(e, dt: str):
    """log(1 + e) for e >= 0, accurate for small e (float32 1 + e drops e's low digits)."""
    series = e * (_const(1, dt) - e * (_const(0.5, dt) - e / _const(3, dt)))
    return relax.op.where(relax.op.less(e, _const(0.01, dt)), series, relax.op.log(_const(1, dt) + e))


@register("Celu")
class Celu(OnnxOpConverter):
    """celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); TVM has no converter."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        alpha = _const(attr.get("alpha", 1.0), dt)
        zero = _const(0, dt)
        neg = alpha * (relax.op.exp(x / alpha) - _const(1, dt))
        return relax.op.maximum(x, zero) + relax.op.minimum(zero, neg)


def _softplus(x, dt: str):
    return relax.op.maximum(x, _const(0, dt)) + _log1p(relax.op.exp(-relax.op.abs(x)), dt)


def _tanh(x, dt: str):
    # TVM's tanh is ~1e-3 relative off for |x| < 1e-4: the series there (error < 1e-9 below 0.01)
    series = x * (_const(1, dt) - x * x / _const(3, dt))
    return relax.op.where(relax.op.less(relax.op.abs(x), _const(0.01, dt)), series, relax.op.tanh(x))


@register("Softplus")
class Softplus(OnnxOpConverter):
    """max(x, 0) + log1p(exp(-|x|)): TVM's log(1 + ...) drops the low digits of small results."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _softplus(inputs[0], _dtype(inputs[0]))


@register("Tanh")
class Tanh(OnnxOpConverter):
    @classmethod
    def _impl_v6(cls, bb, inputs, attr, params):
        dt = _dtype(inputs[0])
        return _tanh(inputs[0], dt) if dt.startswith("float") else relax.op.tanh(inputs[0])


@register("Mish")
class Mish(OnnxOpConverter):
    """x * tanh(softplus(x)), accurate for large negative x too (TVM's version is off by ~1e-3
    relative there). ONNX Runtime's folding usually inlines Mish into Softplus + Tanh + Mul."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        return x * _tanh(bb.normalize(_softplus(x, dt)), dt)


@register("Swish")
class Swish(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        return x * relax.op.sigmoid(x * _const(attr.get("alpha", 1.0), _dtype(x)))
