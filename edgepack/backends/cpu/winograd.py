"""3x3 convolutions of stride 1 as Winograd F(2x2, 3x3): 16 multiplies per 2x2 output tile and channel
pair instead of 36 (2.25x fewer), in three kernels the default rules already schedule well.

    d = pad(x)                             the input padded to whole 4x4 windows (fused into the kernel
                                           that makes x)
    V[e, p, c] = (B^T d_p B)[e]            input transform of each 4x4 window p (stride 2): its own rule,
                                           schedules/winograd.py; nothing is fused into it
    M[e, p, k] = sum_c V[e, p, c] U[e, c, k]   16 matrix products, one per window position e (cpu.Matmul)
    Y[n, h, w, k] = (A^T M_p A)[h % 2, w % 2]  output transform; the bias, activation, residual add or
                                           concatenation after it fuse into it (cpu.Injective)

``U = G g G^T`` is computed here, once, from the constant weights (a model whose weights are not
constants keeps the direct convolution); it is 16/9 the size of the weights it replaces. The transforms'
coefficients are 0 and +-1 (``G``'s also +-1/2), so F(2x2, 3x3) keeps float32's accuracy (measured: the
same or smaller differences from ONNX Runtime than the direct convolution). Only channels-last (NHWC,
OHWI) convolutions are rewritten, those with enough channels that the products outweigh the transforms.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edgepack.backends.cpu.schedules.winograd import INPUT_BLOCK
from edgepack.backends.relax_exprs import attr, const_value, dtype_of, op_name, static_shape

logger = logging.getLogger("edgepack.schedules")

# below these the transforms (memory-bound, and serial below the parallel threshold) cost more than the
# multiplies saved (measured on a Zen 4 core, each convolution with its transforms against the direct
# one: 0.56-0.83x from 16 to 512 channels at 1 thread; 16 -> 16 channels at 56x56 was 0.8x at 1 thread
# but 1.5-2x at 2 threads)
MIN_CHANNELS = 16  # input and output channels
MIN_CHANNEL_PRODUCT = 32 * 32  # input times output channels
MIN_OUTPUT = 4  # output rows and columns

# F(2x2, 3x3) (Lavin & Gray): Y = A^T [(G g G^T) * (B^T d B)] A
G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]], dtype=np.float64)
# B^T's row a is d[I1[a]] + S[a] * d[I2[a]]
I1, I2, S = (0, 1, 2, 1), (2, 2, 1, 3), (-1.0, 1.0, -1.0, -1.0)
# A^T's row r is M[r] + (1 - 2r) * (M[r + 1] + M[r + 2])


def transformed_weights(weight_ohwi: np.ndarray) -> np.ndarray:
    """``U[e, c, k]`` (e = 4 * a + b) from OHWI weights ``g[k, i, j, c]``."""
    u = np.einsum("ai,kijc,bj->abck", G, weight_ohwi.astype(np.float64), G)
    k, c = weight_ohwi.shape[0], weight_ohwi.shape[3]
    return np.ascontiguousarray(u.reshape(16, c, k)).astype(weight_ohwi.dtype)


def _pick(index, values):
    """``values[index]`` for a small integer expression ``index`` (a chain of selects on constants)."""
    from tvm import tirx

    result = tirx.const(values[-1], "float32" if isinstance(values[-1], float) else "int32")
    for k in range(len(values) - 2, -1, -1):
        value = tirx.const(values[k], "float32" if isinstance(values[k], float) else "int32")
        result = tirx.Select(index == k, value, result)
    return result


def input_transform(padded, tiles_h: int, tiles_w: int):
    """TE: ``V[e, p, c]`` for the 2x2 output tiles of a padded NHWC input (4x4 windows at stride 2)."""
    from tvm import te

    n, c = int(padded.shape[0]), int(padded.shape[3])

    def compute(e, p, ch):
        a, b = e // 4, e % 4
        batch, th, tw = p // (tiles_h * tiles_w), (p // tiles_w) % tiles_h, p % tiles_w

        def at(i, j):
            return padded[batch, th * 2 + i, tw * 2 + j, ch]

        i1, i2, s = _pick(a, I1), _pick(a, I2), _pick(a, S).astype(padded.dtype)
        j1, j2, t = _pick(b, I1), _pick(b, I2), _pick(b, S).astype(padded.dtype)
        return (at(i1, j1) + t * at(i1, j2)) + s * (at(i2, j1) + t * at(i2, j2))

    return te.compute((16, n * tiles_h * tiles_w, c), compute, name=INPUT_BLOCK)


def output_transform(products, n: int, out_h: int, out_w: int):
    """TE: the NHWC output from ``M[e, p, k]``."""
    from tvm import te

    tiles_h, tiles_w = (out_h + 1) // 2, (out_w + 1) // 2
    k = int(products.shape[2])
    dtype = products.dtype

    def compute(batch, y, x, ch):
        r, s = y % 2, x % 2
        p = batch * tiles_h * tiles_w + (y // 2) * tiles_w + x // 2
        sign_r, sign_s = (1 - 2 * r).astype(dtype), (1 - 2 * s).astype(dtype)

        def row(col):  # (A^T M)[r, col]
            return products[r * 4 + col, p, ch] + sign_r * (products[(r + 1) * 4 + col, p, ch]
                                                            + products[(r + 2) * 4 + col, p, ch])

        return row(s) + sign_s * (row(s + 1) + row(s + 2))

    return te.compute((n, out_h, out_w, k), compute, name="winograd_output")


def _constant_of(expr, bindings: dict) -> np.ndarray | None:
    """The value of ``expr`` when it is a constant, directly, through a variable or a transpose."""
    from tvm import relax

    seen = 0
    while isinstance(expr, relax.Var) and expr in bindings and seen < 8:
        expr, seen = bindings[expr], seen + 1
    if op_name(expr) == "relax.permute_dims":
        inner = _constant_of(expr.args[0], bindings)
        axes = attr(expr, "axes")
        return None if inner is None else np.transpose(inner, [int(a) for a in axes] if axes is not None else None)
    return const_value(expr)


def suits(call, weight: np.ndarray | None) -> bool:
    """A stride-1, undilated, ungrouped 3x3 float32 convolution, channels-last, with constant weights and
    enough channels and outputs."""
    attrs = call.attrs
    if weight is None or str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" \
            or str(attrs.out_layout) != "NHWC" or int(attrs.groups) != 1:
        return False
    if any(int(s) != 1 for s in attrs.strides) or any(int(d) != 1 for d in attrs.dilation):
        return False
    data, out = static_shape(call.args[0]), static_shape(call)
    if data is None or out is None or weight.ndim != 4 or tuple(weight.shape[1:3]) != (3, 3):
        return False
    dtypes = {dtype_of(call.args[0]), dtype_of(call), str(weight.dtype)}
    if dtypes != {"float32"}:
        return False
    channels_out, channels_in = int(weight.shape[0]), int(weight.shape[3])
    return min(channels_out, channels_in) >= MIN_CHANNELS and channels_out * channels_in >= MIN_CHANNEL_PRODUCT \
        and min(out[1], out[2]) >= MIN_OUTPUT


# TVM's kOpaque, for the input transform: FuseOps fuses nothing into it. (An output transform before it,
# inlined, would be recomputed by every window that reads its pixels: 4x the work, 2.2 ms instead of 0.5.)
OPAQUE = 8


def winograd_convolutions():
    """A Relax module pass: every convolution that ``suits`` becomes the three Winograd kernels."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    conv2d = tvm.ir.Op.get("relax.nn.conv2d")

    @mutator
    class Rewriter(PyExprMutator):
        def __init__(self, mod) -> None:
            super().__init__(mod)
            self.bindings: dict[Any, Any] = {}
            self.rewritten = 0

        def visit_var_binding_(self, binding) -> None:
            self.bindings[binding.var] = binding.value
            super().visit_var_binding_(binding)

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(conv2d):
                return call
            weight = _constant_of(call.args[1], self.bindings)
            if not suits(call, weight):
                return call
            top, left = (int(p) for p in call.attrs.padding[:2])
            batch, height, width, _channels = static_shape(call.args[0])
            _batch, out_h, out_w, _out_channels = static_shape(call)
            tiles_h, tiles_w = (out_h + 1) // 2, (out_w + 1) // 2
            # every 4x4 window inside: rows and columns past the input's (and its padding's) are zeros
            bottom, right = tiles_h * 2 + 2 - height - top, tiles_w * 2 + 2 - width - left
            bb = self.builder_
            padded = bb.emit(relax.op.nn.pad(call.args[0], [0, 0, top, bottom, left, right, 0, 0]))
            tiles = bb.emit_te(input_transform, padded, tiles_h, tiles_w, primfunc_name_hint=INPUT_BLOCK)
            kernel = bb.lookup_binding(tiles).args[0]  # the call_tir's PrimFunc
            bb.update_func(kernel, bb.get()[kernel].with_attr("op_pattern", OPAQUE))
            products = bb.emit(relax.op.matmul(tiles, relax.const(transformed_weights(weight))))
            self.rewritten += 1
            return bb.call_te(output_transform, products, batch, out_h, out_w,
                              primfunc_name_hint="winograd_output")

    @tvm.transform.module_pass(opt_level=0, name="EdgepackWinograd")
    def _pass(mod, _ctx):
        rewriter = Rewriter(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        if rewriter.rewritten:
            logger.info("%d convolution(s) as Winograd F(2x2, 3x3)", rewriter.rewritten)
        return relax.transform.DeadCodeElimination()(rewriter.builder_.finalize())

    return _pass
