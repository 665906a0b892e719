"""Pooling with indices: MaxPool's optional Indices output, and MaxUnpool."""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const, _dtype, _opt, _rank, _require_consts, _shape
from edgepack.frontends.onnx_ops.registry import register


@register("MaxPool")
class MaxPool(OnnxOpConverter):
    """TVM's MaxPool, plus the optional Indices output (2-D): the window positions are unrolled
    into strided slices, so values and argmax come from one reduction over the kernel axis."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if attr["tvm_custom"]["num_outputs"] < 2 or _rank(inputs[0]) != 4:
            return _tvm.MaxPool.get_converter(22)(bb, inputs, attr, params)
        x = inputs[0]
        n, c, h, w = _shape(x)
        kh, kw = attr["kernel_shape"]
        sh, sw = attr.get("strides", (1, 1))
        dh, dw = attr.get("dilations", (1, 1))
        pt, pl, pb, pr = attr.get("pads", (0, 0, 0, 0))
        rounding = _np.ceil if attr.get("ceil_mode", 0) else _np.floor
        oh = int(rounding((h + pt + pb - ((kh - 1) * dh + 1)) / sh)) + 1
        ow = int(rounding((w + pl + pr - ((kw - 1) * dw + 1)) / sw)) + 1
        # pad enough for every window (ceil_mode may reach past the given end pads)
        eb = max(pb, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
        er = max(pr, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pl)
        dt = _dtype(x)
        low = float(_np.finfo(dt).min) if dt.startswith("float") else int(_np.iinfo(dt).min)
        xp = relax.op.nn.pad(x, [0, 0, 0, 0, pt, eb, pl, er], pad_value=low)
        windows, positions = [], []
        rows, cols = _np.arange(oh)[:, None], _np.arange(ow)[None, :]
        column_major = attr.get("storage_order", 0) == 1
        for i in range(kh):
            for j in range(kw):
                windows.append(relax.op.strided_slice(
                    xp, axes=[2, 3], begin=[i * dh, j * dw],
                    end=[i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1], strides=[sh, sw]))
                hh, ww = rows * sh + i * dh - pt, cols * sw + j * dw - pl
                positions.append((ww * h + hh) if column_major else (hh * w + ww))
        stacked = bb.normalize(relax.op.stack(windows, axis=0))
        values = relax.op.max(stacked, axis=0)
        arg = bb.normalize(relax.op.argmax(stacked, axis=0))
        index = relax.op.zeros((n, c, oh, ow), "int64")
        for k, pos in enumerate(positions):
            hit = relax.op.equal(arg, relax.const(_np.array(k, dtype=str(arg.ty.dtype)), str(arg.ty.dtype)))
            index = relax.op.where(hit, relax.const(pos.astype("int64").reshape(1, 1, oh, ow), "int64"), index)
        base = (_np.arange(n * c, dtype="int64") * h * w).reshape(n, c, 1, 1)
        return relax.Tuple([values, index + relax.const(base, "int64")])


@register("MaxUnpool")
class MaxUnpool(OnnxOpConverter):
    """Scatter the values to their (flat) indices in a zero tensor of the output shape."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        x, idx, out_shape_e = inputs[0], inputs[1], _opt(inputs, 2)
        shape = _shape(x)
        spatial = len(shape) - 2
        kernel = list(attr["kernel_shape"])
        strides = list(attr.get("strides", [1] * spatial))
        pads = list(attr.get("pads", [0] * 2 * spatial))
        inferred = shape[:2] + [(shape[2 + i] - 1) * strides[i] - pads[i] - pads[spatial + i] + kernel[i]
                                for i in range(spatial)]
        out_shape = inferred
        if out_shape_e is not None:
            out_shape = [int(v) for v in _require_consts("MaxUnpool", [out_shape_e])[0]]
        if out_shape != inferred:  # the indices address the inferred shape: re-address them
            idt = _dtype(idx)
            rest, coords = idx, []
            for d in reversed(inferred):
                coords.append(relax.op.floor_mod(rest, _const(d, idt)))
                rest = relax.op.floor_divide(rest, _const(d, idt))
            coords.reverse()
            idx = coords[0]
            for c, d in zip(coords[1:], out_shape[1:]):
                idx = idx * _const(d, idt) + c
            idx = bb.normalize(idx)
        dt = _dtype(x)
        total = int(_np.prod(out_shape))
        flat = relax.op.scatter_elements(relax.op.zeros((total,), dt), relax.op.reshape(idx, [-1]),
                                         relax.op.reshape(x, [-1]), axis=0)
        return relax.op.reshape(flat, out_shape)
