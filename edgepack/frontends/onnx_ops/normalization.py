"""Normalisation layers: LayerNormalization (all three outputs), RMSNormalization,
BatchNormalization (training mode), LpNormalization and GroupNormalization (opsets 18 and 21).
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const, _dtype, _rank, _shape
from edgepack.frontends.onnx_ops.registry import register


def _axes_from(axis: int, rank: int) -> list[int]:
    axis = axis + rank if axis < 0 else axis
    return list(range(axis, rank))


@register("LayerNormalization")
class LayerNormalization(OnnxOpConverter):
    """All three outputs (Y, Mean, InvStdDev); TVM returns placeholders for the last two."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        if attr["tvm_custom"]["num_outputs"] == 1:  # the usual inference graph: TVM's fused layer_norm
            return _tvm.LayerNormalization.get_converter(17)(bb, inputs, attr, params)
        x, scale, bias = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
        rank = _rank(x)
        axes = _axes_from(attr.get("axis", -1), rank)
        eps = attr.get("epsilon", 1e-5)
        in_dt = _dtype(x)
        stash = "float32" if attr.get("stash_type", 1) == 1 else in_dt
        xs = relax.op.astype(x, stash) if stash != in_dt else x
        mean = relax.op.mean(xs, axes, keepdims=True)
        centered = xs - mean
        var = relax.op.mean(centered * centered, axes, keepdims=True)
        inv_std = relax.op.rsqrt(var + _const(eps, stash))
        normed = centered * inv_std
        if stash != in_dt:
            normed = relax.op.astype(normed, in_dt)
        y = normed * scale
        if bias is not None:
            y = y + bias
        return relax.Tuple([y, mean, inv_std])


@register("RMSNormalization")
class RMSNormalization(OnnxOpConverter):
    """Written out with reductions: TVM's rms_norm fails to compile when the axes start at 0."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        x, scale = inputs[0], inputs[1]
        rank = _rank(x)
        axes = _axes_from(attr.get("axis", -1), rank)
        in_dt = _dtype(x)
        stash = "float32" if attr.get("stash_type", 1) == 1 else in_dt
        xs = relax.op.astype(x, stash) if stash != in_dt else x
        ms = relax.op.mean(xs * xs, axes, keepdims=True)
        normed = xs * relax.op.rsqrt(ms + _const(attr.get("epsilon", 1e-5), stash))
        if stash != in_dt:
            normed = relax.op.astype(normed, in_dt)
        return normed * scale


@register("BatchNormalization")
class BatchNormalization(OnnxOpConverter):
    """Inference mode is TVM's; training mode (batch statistics + updated running mean/var) is ours."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._impl_v15(bb, inputs, attr, params)

    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        if not attr.get("training_mode", 0):
            return _tvm.BatchNormalization.get_converter(15)(bb, inputs, attr, params)
        x, scale, bias, mean_in, var_in = inputs[:5]
        rank = _rank(x)
        axes = [0] + list(range(2, rank))
        dt = _dtype(x)
        eps, momentum = attr.get("epsilon", 1e-5), attr.get("momentum", 0.9)
        mean = relax.op.mean(x, axes, keepdims=True)
        centered = x - mean
        var = relax.op.mean(centered * centered, axes, keepdims=True)
        bshape = [1, -1] + [1] * (rank - 2)
        y = centered * relax.op.rsqrt(var + _const(eps, dt)) * relax.op.reshape(scale, bshape) \
            + relax.op.reshape(bias, bshape)
        m = _const(momentum, _dtype(mean_in))
        one_m = _const(1 - momentum, _dtype(mean_in))
        run_mean = mean_in * m + relax.op.astype(relax.op.squeeze(mean, axes), _dtype(mean_in)) * one_m
        run_var = var_in * m + relax.op.astype(relax.op.squeeze(var, axes), _dtype(var_in)) * one_m
        return relax.Tuple([y, run_mean, run_var])


@register("LpNormalization")
class LpNormalization(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        axis = attr.get("axis", -1)
        p = attr.get("p", 2)
        if p == 1:
            norm = relax.op.sum(relax.op.abs(x), [axis], keepdims=True)
        else:
            norm = relax.op.sqrt(relax.op.sum(x * x, [axis], keepdims=True))
        # an all-zero slice normalises to zeros (ONNX Runtime / the reference), not NaN
        zero = _const(0, _dtype(x))
        norm = relax.op.where(relax.op.equal(norm, zero), _const(1, _dtype(x)), norm)
        return x / norm


@register("GroupNormalization")
class GroupNormalization(OnnxOpConverter):
    """Opset 18 (per-group scale/bias) and 21 (per-channel), statistics in float32."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr, per_channel=False)

    @classmethod
    def _impl_v21(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr, per_channel=True)

    @classmethod
    def _convert(cls, bb, inputs, attr, per_channel: bool):
        x, scale, bias = inputs[:3]
        shape = _shape(x)
        groups = int(attr["num_groups"])
        n, c = shape[0], shape[1]
        dt = _dtype(x)
        stash = "float32" if attr.get("stash_type", 1) == 1 else dt
        xs = relax.op.astype(x, stash) if stash != dt else x
        grouped = relax.op.reshape(xs, [n, groups, -1])
        mean = relax.op.mean(grouped, [2], keepdims=True)
        centered = grouped - mean
        var = relax.op.mean(centered * centered, [2], keepdims=True)
        normed = relax.op.reshape(centered * relax.op.rsqrt(var + _const(attr.get("epsilon", 1e-5), stash)), shape)
        if stash != dt:
            normed = relax.op.astype(normed, dt)
        if not per_channel:  # one value per group -> one per channel
            scale = relax.op.repeat(scale, c // groups, axis=0)
            bias = relax.op.repeat(bias, c // groups, axis=0)
        bshape = [1, c] + [1] * (len(shape) - 2)
        return normed * relax.op.reshape(scale, bshape) + relax.op.reshape(bias, bshape)
