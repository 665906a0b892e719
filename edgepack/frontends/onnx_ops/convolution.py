"""Convolutions TVM lacks or gets wrong: ConvTranspose with ``output_shape``, CausalConvWithState,
Col2Im (as a matrix) and DeformConv (bilinear sampling, then a grouped matmul).
"""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import (
    _attr_str,
    _const,
    _dtype,
    _opt,
    _rank,
    _reference_constant,
    _require_consts,
    _shape,
)
from edgepack.frontends.onnx_ops.registry import register


@register("ConvTranspose")
class ConvTranspose(OnnxOpConverter):
    """TVM's converter, plus the ``output_shape`` attribute (pads derived per the ONNX spec)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "output_shape" in attr:
            x, w = inputs[0], inputs[1]
            spatial = _rank(x) - 2
            in_sizes = _shape(x)[2:]
            kernel = list(attr.get("kernel_shape", _shape(w)[2:]))
            strides = list(attr.get("strides", [1] * spatial))
            dil = list(attr.get("dilations", [1] * spatial))
            out_pad = list(attr.get("output_padding", [0] * spatial))
            target = list(attr.pop("output_shape"))[-spatial:]
            auto_pad = attr.pop("auto_pad", b"NOTSET")
            auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
            begin, end = [], []
            for i in range(spatial):
                total = strides[i] * (in_sizes[i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - target[i]
                if total < 0:  # the target is larger than the full output: extra output padding
                    out_pad[i] += -total
                    total = 0
                lo = total - total // 2 if auto_pad == "SAME_LOWER" else total // 2
                begin.append(lo)
                end.append(total - lo)
            attr["pads"] = begin + end
            attr["output_padding"] = out_pad
        return _tvm.ConvTranspose.get_converter(1)(bb, inputs, attr, params)


@register("CausalConvWithState")
class CausalConvWithState(OnnxOpConverter):
    """Depthwise causal Conv1d over [past_state | input] with optional SiLU; returns the output and
    the last k-1 input positions as the next state (opset 26)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, w, bias, past = inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3)
        batch, channels, length = _shape(x)
        k = _shape(w)[2]
        dt = _dtype(x)
        if k > 1:
            pad = past if past is not None else relax.op.zeros((batch, channels, k - 1), dt)
            padded = bb.normalize(relax.op.concat([pad, x], axis=2))
        else:
            padded = x
        out = relax.op.nn.conv1d(padded, w, groups=channels)
        if bias is not None:
            out = out + relax.op.reshape(bias, [1, channels, 1])
        act = _attr_str(attr, "activation", "none")
        if act in ("silu", "swish"):
            of = relax.op.astype(out, "float32") if dt != "float32" else out
            of = of * relax.op.sigmoid(of)
            out = relax.op.astype(of, dt) if dt != "float32" else of
        if k > 1:
            state = relax.op.strided_slice(padded, [2], [length], [length + k - 1])
        else:
            state = relax.op.zeros((batch, channels, 0), dt)
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([out, state])
        return out


@register("Col2Im")
class Col2Im(OnnxOpConverter):
    """Col2Im is linear in its input: with constant image/block shapes its matrix is the ONNX
    reference applied to the basis, and the operator becomes one matmul per (batch, channel)."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        image, block = _require_consts("Col2Im", [inputs[1], inputs[2]])
        n, cb, length = _shape(x)
        bl = int(_np.prod(block))
        k = bl * length
        basis = _np.eye(k, dtype=_np.float64).reshape(k, bl, length)
        cols = _reference_constant("Col2Im", attr, [basis, image, block])  # [k, 1, *image]
        matrix = cols.reshape(k, -1)
        channels = cb // bl
        dt = _dtype(x)
        flat = relax.op.reshape(x, [n, channels, k])
        out = relax.op.matmul(flat, relax.const(matrix.astype(dt), dt))
        return relax.op.reshape(out, [n, channels] + [int(v) for v in image])


@register("DeformConv")
class DeformConv(OnnxOpConverter):
    """2-D deformable convolution (DCNv1/v2): each kernel tap samples the input bilinearly at its
    offset position (zero outside), scaled by the mask; then a grouped matmul with the weights."""

    @classmethod
    def _impl_v19(cls, bb, inputs, attr, params):
        x, w, offset = inputs[0], inputs[1], inputs[2]
        bias, mask = _opt(inputs, 3), _opt(inputs, 4)
        n, c, ih, iw = _shape(x)
        oc, cpg, kh, kw = _shape(w)
        _, _, oh, ow = _shape(offset)
        dt = _dtype(x)
        group, ogroup = int(attr.get("group", 1)), int(attr.get("offset_group", 1))
        sh, sw = attr.get("strides", (1, 1))
        dh, dw = attr.get("dilations", (1, 1))
        pt, pl = attr.get("pads", (0, 0, 0, 0))[:2]
        taps, pix = kh * kw, oh * ow
        # sampling positions [n, og, taps, pix]
        base_h = (_np.arange(kh)[:, None, None, None] * dh + _np.arange(oh)[None, None, :, None] * sh - pt)
        base_w = (_np.arange(kw)[None, :, None, None] * dw + _np.arange(ow)[None, None, None, :] * sw - pl)
        base_h = _np.broadcast_to(base_h, (kh, kw, oh, ow)).reshape(1, 1, taps, pix).astype(dt)
        base_w = _np.broadcast_to(base_w, (kh, kw, oh, ow)).reshape(1, 1, taps, pix).astype(dt)
        off = bb.normalize(relax.op.reshape(offset, [n, ogroup, taps, 2, pix]))
        ph = bb.normalize(relax.op.squeeze(relax.op.strided_slice(off, [3], [0], [1]), [3]) + relax.const(base_h, dt))
        pw = bb.normalize(relax.op.squeeze(relax.op.strided_slice(off, [3], [1], [2]), [3]) + relax.const(base_w, dt))
        h0, w0 = bb.normalize(relax.op.floor(ph)), bb.normalize(relax.op.floor(pw))
        lh, lw = bb.normalize(ph - h0), bb.normalize(pw - w0)
        flat_x = relax.op.reshape(x, [n, c, ih * iw])
        reps = c // ogroup
        sampled = None
        one = _const(1, dt)
        for dy, wy in ((0, one - lh), (1, lh)):
            for dx, wx in ((0, one - lw), (1, lw)):
                yy, xx = h0 + _const(dy, dt), w0 + _const(dx, dt)
                inside = relax.op.logical_and(
                    relax.op.logical_and(relax.op.greater_equal(yy, _const(0, dt)), relax.op.less(yy, _const(ih, dt))),
                    relax.op.logical_and(relax.op.greater_equal(xx, _const(0, dt)), relax.op.less(xx, _const(iw, dt))))
                idx = relax.op.astype(relax.op.clip(yy, 0, ih - 1) * _const(iw, dt) + relax.op.clip(xx, 0, iw - 1),
                                      "int64")
                weight = relax.op.where(inside, wy * wx, _const(0, dt))  # [n, og, taps, pix]
                idx_c = relax.op.repeat(relax.op.reshape(idx, [n, ogroup, taps * pix]), reps, axis=1)
                vals = relax.op.gather_elements(flat_x, bb.normalize(idx_c), axis=2)  # [n, c, taps*pix]
                term = vals * relax.op.repeat(relax.op.reshape(weight, [n, ogroup, taps * pix]), reps, axis=1)
                sampled = term if sampled is None else sampled + term
        if mask is not None:
            m = relax.op.reshape(mask, [n, ogroup, taps * pix])
            sampled = sampled * relax.op.repeat(m, reps, axis=1)
        cols = relax.op.reshape(bb.normalize(sampled), [n, group, cpg * taps, pix])
        wg = relax.op.reshape(w, [1, group, oc // group, cpg * taps])
        out = relax.op.reshape(relax.op.matmul(wg, cols), [n, oc, oh, ow])
        if bias is not None:
            out = out + relax.op.reshape(bias, [1, oc, 1, 1])
        return out
