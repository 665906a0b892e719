"""ai.onnx.preview.training optimizers (update rules are element-wise math): Adagrad, Momentum, Adam."""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _attr_str, _const, _dtype
from edgepack.frontends.onnx_ops.registry import register


class _Optimizer(OnnxOpConverter):
    """Inputs: R (learning rate), T (step), then ``groups`` lists of tensors (X..., G..., ...)."""

    groups = 3

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        r, t = inputs[0], inputs[1]
        n = (len(inputs) - 2) // cls.groups
        lists = [inputs[2 + g * n: 2 + (g + 1) * n] for g in range(cls.groups)]
        results = [cls.update(bb, r, t, *items, attr) for items in zip(*lists)]
        flat = [res[k] for k in range(len(results[0])) for res in results]
        return relax.Tuple(flat)


def _f(value, dt):
    return _const(float(value), dt)


@register("Adagrad")
class Adagrad(_Optimizer):
    groups = 3

    @classmethod
    def update(cls, bb, r, t, x, g, h, attr):
        dt = _dtype(x)
        rr = relax.op.astype(r, dt) / (_f(1, dt) + relax.op.astype(t, dt) * _f(attr.get("decay_factor", 0.0), dt))
        g_reg = _f(attr.get("norm_coefficient", 0.0), dt) * x + g
        h_new = bb.normalize(h + g_reg * g_reg)
        x_new = x - rr * g_reg / (relax.op.sqrt(h_new) + _f(attr.get("epsilon", 0.0), dt))
        return bb.normalize(x_new), h_new


@register("Momentum")
class Momentum(_Optimizer):
    groups = 3

    @classmethod
    def update(cls, bb, r, t, x, g, v, attr):
        dt = _dtype(x)
        alpha, beta = _f(attr["alpha"], dt), _f(attr["beta"], dt)
        g_reg = _f(attr.get("norm_coefficient", 0.0), dt) * x + g
        beta_t = relax.op.where(relax.op.greater(t, _const(0, _dtype(t))), beta, _f(1, dt))
        v_new = bb.normalize(alpha * v + beta_t * g_reg)
        rr = relax.op.astype(r, dt)
        if _attr_str(attr, "mode", "standard") == "nesterov":
            x_new = x - rr * (g_reg + alpha * v_new)
        else:
            x_new = x - rr * v_new
        return bb.normalize(x_new), v_new


@register("Adam")
class Adam(_Optimizer):
    groups = 4

    @classmethod
    def update(cls, bb, r, t, x, g, v, h, attr):
        dt = _dtype(x)
        alpha, beta = _f(attr.get("alpha", 0.9), dt), _f(attr.get("beta", 0.999), dt)
        g_reg = _f(attr.get("norm_coefficient", 0.0), dt) * x + g
        v_new = bb.normalize(alpha * v + (_f(1, dt) - alpha) * g_reg)
        h_new = bb.normalize(beta * h + (_f(1, dt) - beta) * g_reg * g_reg)
        tf = relax.op.astype(t, dt)
        rr = relax.op.astype(r, dt)
        adjusted = rr * relax.op.sqrt(_f(1, dt) - relax.op.power(beta, tf)) / (_f(1, dt) - relax.op.power(alpha, tf))
        rr = relax.op.where(relax.op.greater(t, _const(0, _dtype(t))), adjusted, rr)
        x_new = x - rr * (v_new / (relax.op.sqrt(h_new) + _f(attr.get("epsilon", 0.0), dt)))
        x_final = (_f(1, dt) - _f(attr.get("norm_coefficient_post", 0.0), dt)) * x_new
        return bb.normalize(x_final), v_new, h_new
