"""Transposed convolutions as one ordinary convolution and a pixel shuffle.

TVM computes ``conv2d_transpose`` as a convolution over its input with zeros inserted between the pixels
(stride - 1 of them) and a border: for stride 2, three of every four multiplies are by an inserted zero,
and every read goes through a bounds check (PP-OCR's DBNet head: 85% of the model's time at 2.8 GFLOP/s).
Output pixel ``i = t * s + r`` (phase ``r`` of stride ``s``) only ever sees the kernel taps
``r, r + s, r + 2s, ...``: so each phase is an ordinary stride-1 convolution of the input with those taps,
reversed, and all ``s_h * s_w`` phases are one convolution with ``s_h * s_w`` times the output channels
(the kernel padded with zero taps to a multiple of the stride, so every phase has as many). Its output,
shuffled (each channel group to its phase's pixels) and cropped by the padding, is the transposed
convolution's. A 2x2 kernel of stride 2 becomes a 1x1 convolution. The CPU rules schedule that
convolution like any other (channels-last, register tiles, Winograd where it pays).

Only float32 NCHW/IOHW, ungrouped, undilated transposed convolutions with constant weights are rewritten;
others stay as they are (kept NCHW by the channels-last pass, ``channels_last.py``).
"""

from __future__ import annotations

import math

import numpy as np

from edgepack.backends.relax_exprs import const_value, dtype_of, tensor_type


def phase_weights(weight: np.ndarray, strides: tuple[int, int]) -> np.ndarray:
    """The OIHW weights of the convolution whose output channel ``(co, ry, rx)`` is phase ``(ry, rx)`` of
    output channel ``co``, from IOHW transposed-convolution weights."""
    channels_in, channels_out, kh, kw = weight.shape
    sh, sw = strides
    m, n = math.ceil(kh / sh), math.ceil(kw / sw)
    padded = np.zeros((channels_in, channels_out, m * sh, n * sw), weight.dtype)
    padded[:, :, :kh, :kw] = weight
    phases = np.empty((channels_out, sh, sw, channels_in, m, n), weight.dtype)
    for ry in range(sh):
        for rx in range(sw):
            for a in range(m):
                for b in range(n):
                    phases[:, ry, rx, :, a, b] = padded[:, :, ry + (m - 1 - a) * sh, rx + (n - 1 - b) * sw].T
    return phases.reshape(channels_out * sh * sw, channels_in, m, n)


def suits(call, weight: np.ndarray | None) -> bool:
    attrs = call.attrs
    return (weight is not None and weight.ndim == 4 and str(attrs.data_layout) == "NCHW"
            and str(attrs.kernel_layout) == "IOHW" and str(attrs.out_layout) in ("", "NCHW")
            and int(attrs.groups) == 1 and all(int(d) == 1 for d in attrs.dilation)
            and {dtype_of(call.args[0]), str(weight.dtype)} == {"float32"}
            and _shape(call.args[0]) is not None and _shape(call) is not None)


def _shape(expr) -> list | None:
    """A 4-D tensor's shape, its extents that change at run time (``--dim``) as expressions."""
    ty = tensor_type(expr)
    values = getattr(ty.shape, "values", None) if ty is not None and ty.shape is not None else None
    return list(values) if values is not None and len(values) == 4 else None


def _simplified(expr):
    """``expr`` as simple as it goes: a shape that changes at run time written ``H // 32 * 8 + 1 - 1`` kept the
    reshapes around it out of the kernels next to them."""
    from tvm import sym

    return sym.Analyzer().simplify(expr)


def _constant(expr) -> int | None:
    """``expr`` simplified to a number (a transposed convolution's output padding is one at any size)."""
    from tvm import sym, tirx

    value = sym.Analyzer().simplify(expr)
    return int(value.value) if isinstance(value, tirx.IntImm) else None


def conv_transpose_as_convolution():
    """A Relax module pass: every transposed convolution that ``suits`` as a convolution and a pixel shuffle
    (see the module docstring)."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    pattern = is_op("relax.nn.conv2d_transpose")(wildcard(), is_const())

    def rewrite(expr, _matches):
        weight = const_value(expr.args[1])
        if not suits(expr, weight):
            return expr
        attrs = expr.attrs
        sh, sw = (int(s) for s in attrs.strides)
        top, left = (int(p) for p in attrs.padding[:2])
        batch, _channels_in, height, width = _shape(expr.args[0])
        _, channels_out, out_h, out_w = _shape(expr)
        kernel = phase_weights(weight, (sh, sw))
        m, n = kernel.shape[2:]
        phases = relax.op.nn.conv2d(expr.args[0], relax.const(kernel), padding=[m - 1, n - 1, m - 1, n - 1],
                                    data_layout="NCHW", kernel_layout="OIHW")
        rows, cols = _simplified(height + m - 1), _simplified(width + n - 1)
        shuffled = relax.op.reshape(
            relax.op.permute_dims(relax.op.reshape(phases, [batch, channels_out, sh, sw, rows, cols]),
                                  [0, 1, 4, 2, 5, 3]),
            [batch, channels_out, rows * sh, cols * sw])
        bottom, right = _constant(top + out_h - rows * sh), _constant(left + out_w - cols * sw)
        if bottom is None or right is None:
            return expr
        if bottom > 0 or right > 0:  # output padding past what any tap reaches: zeros
            shuffled = relax.op.nn.pad(shuffled, [0, 0, 0, 0, 0, max(bottom, 0), 0, max(right, 0)])
        # in bounds by construction: a crop whose end changes at run time (``--dim``) is then sized as written
        return relax.op.strided_slice(shuffled, axes=[2, 3], begin=[top, left], end=[top + out_h, left + out_w],
                                      assume_inbound=True)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackConvTransposeAsConvolution")
    def _pass(mod, _ctx):
        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                mod[gvar] = rewrite_call(pattern, rewrite, func)
        return mod

    return _pass
