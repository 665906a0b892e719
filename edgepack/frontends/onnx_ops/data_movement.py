"""Gathers, scatters, slices and masks: ReverseSequence, CenterCropPad, TensorScatter and Trilu."""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _attr_str, _const, _dtype, _opt, _require_consts, _shape
from edgepack.frontends.onnx_ops.registry import register


@register("ReverseSequence")
class ReverseSequence(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, lens = inputs
        shape = _shape(x)
        t_axis, b_axis = attr.get("time_axis", 0), attr.get("batch_axis", 1)
        ldt = _dtype(lens)
        tshape = [1] * len(shape)
        tshape[t_axis] = shape[t_axis]
        bshape = [1] * len(shape)
        bshape[b_axis] = shape[b_axis]
        t = relax.const(_np.arange(shape[t_axis], dtype=ldt).reshape(tshape), ldt)
        n = relax.op.reshape(lens, bshape)
        idx = relax.op.where(relax.op.less(t, n), n - _const(1, ldt) - t, t)
        idx = relax.op.broadcast_to(idx, shape)
        return relax.op.gather_elements(x, idx, axis=t_axis)


@register("CenterCropPad")
class CenterCropPad(OnnxOpConverter):
    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        (target,) = _require_consts("CenterCropPad", [inputs[1]])
        shape = _shape(x)
        rank = len(shape)
        axes = [a + rank if a < 0 else a for a in attr.get("axes", range(rank))]
        for a, size in zip(axes, [int(v) for v in target]):
            dim = shape[a]
            if size < dim:
                start = (dim - size) // 2
                x = relax.op.strided_slice(x, [a], [start], [start + size])
            elif size > dim:
                before = (size - dim) // 2
                pads = [0, 0] * rank
                pads[2 * a], pads[2 * a + 1] = before, size - dim - before
                x = relax.op.nn.pad(x, pads)
            x = bb.normalize(x)
            shape[a] = size
        return x


@register("TensorScatter")
class TensorScatter(OnnxOpConverter):
    """TensorScatter (opset 24, KV-cache writes): each output position along ``axis`` takes the
    update row it receives (linear or circular write from write_indices[batch]) or keeps the cache."""

    @classmethod
    def _impl_v24(cls, bb, inputs, attr, params):
        past, update, where = inputs[0], inputs[1], _opt(inputs, 2)
        shape = _shape(past)
        rank = len(shape)
        axis = attr.get("axis", -2) % rank
        max_len, seq = shape[axis], _shape(update)[axis]
        pos_shape = [1] * rank
        pos_shape[axis] = max_len
        pos = relax.const(_np.arange(max_len, dtype="int64").reshape(pos_shape), "int64")
        if where is not None:
            start = relax.op.reshape(relax.op.astype(where, "int64"), [shape[0]] + [1] * (rank - 1))
            offset = pos - start
        else:
            offset = pos
        if _attr_str(attr, "mode", "linear") == "circular":
            offset = relax.op.floor_mod(offset, _const(max_len, "int64"))
        offset = bb.normalize(offset)
        inside = relax.op.logical_and(relax.op.greater_equal(offset, _const(0, "int64")),
                                      relax.op.less(offset, _const(seq, "int64")))
        idx_shape = list(shape)
        idx = relax.op.broadcast_to(relax.op.clip(offset, 0, seq - 1), idx_shape)
        picked = relax.op.gather_elements(update, idx, axis=axis)
        return relax.op.where(relax.op.broadcast_to(inside, idx_shape), picked, past)


@register("Trilu")
class Trilu(OnnxOpConverter):
    """Mask by (column - row) against k, which may be a run-time scalar (empty tensors included)."""

    @classmethod
    def _impl_v14(cls, bb, inputs, attr, params):
        x, k = inputs[0], _opt(inputs, 1)
        rows, cols = _shape(x)[-2:]
        diff = (_np.arange(cols)[None, :] - _np.arange(rows)[:, None]).astype("int64")
        kk = relax.op.astype(k, "int64") if k is not None else _const(0, "int64")
        diff_c = relax.const(diff, "int64")
        keep = relax.op.greater_equal(diff_c, kk) if attr.get("upper", 1) else relax.op.less_equal(diff_c, kk)
        return relax.op.where(keep, x, relax.op.zeros_like(x))
