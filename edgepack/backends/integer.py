"""Quantized models on integer arithmetic.

An 8-bit model (ONNX in QDQ form, as ``onnxruntime.quantization`` writes it; TFLite int8/uint8) imports as
float convolutions and matrix products of dequantized tensors: ``conv2d(dequantize(x_q, s_x, z_x),
dequantize(w_q, s_w, 0))``. Computed in float, the sum is rounded at every step and drifts from what the
model was quantized for (ONNX Runtime and LiteRT accumulate the 8-bit products exactly, in 32-bit
integers, and scale once). This pass rewrites each such product into that form:

    acc = conv2d(int32(x_q) - z_x, w_q, out_dtype="int32")        exact; the weights stay 8-bit constants
    y   = float32(acc) * (s_x * s_w[c])                              one rounding, per output channel

and where the bias (quantized with the sum's scale) and a ``quantize`` follow, requantizes as ONNX
Runtime's and XNNPACK's 8-bit kernels do: the bias added to the integer sum, one multiply by
``s_x * s_w[c] / s_y``, rounding half to even, the zero point, saturation. Elsewhere what follows (the
bias, the activation, the next ``quantize``) stays as it was. Matrix products (Gemm, MatMul, TFLite's
FULLY_CONNECTED) are rewritten the same way. Weights with a zero point other than 0 and inputs quantized
per channel keep the float form.

Integer products whose weights were widened on import (ONNX's ConvInteger, MatMulInteger and QLinearConv
subtract the zero points in int32) take their weights back as 8-bit constants.

An 8-bit average pool that TVM's TFLite importer computes as an integer sum divided by the count
(truncated: up to one step low) rounds to nearest instead, as LiteRT's kernels do.
"""

from __future__ import annotations

import numpy as np

from edgepack.backends.relax_exprs import const_value, dtype_of, op_name, static_shape


def _scalar(const) -> float | int | None:
    value = const_value(const)
    return value.reshape(-1)[0].item() if value is not None and value.size == 1 else None


def narrow_integers(values: np.ndarray) -> np.ndarray | None:
    """Integer ``values`` of a wider type as int8 (or uint8) where they fit, else None."""
    if values.dtype.kind not in "iu" or values.dtype.itemsize == 1 or not values.size:
        return None
    for dtype in (np.int8, np.uint8):
        info = np.iinfo(dtype)
        if info.min <= values.min() and values.max() <= info.max:
            return values.astype(dtype)
    return None


def integer_products():
    """A Relax module pass: 8-bit convolutions and matrix products as exact integer sums scaled once, and
    8-bit average pools rounded (see the module docstring)."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    x_q, s_x, z_x = wildcard(), is_const(), is_const()
    w_q, s_w, z_w = is_const(), is_const(), is_const()
    x = is_op("relax.dequantize")(x_q, s_x, z_x)
    w = is_op("relax.dequantize")(w_q, s_w, z_w)
    w_t = is_op("relax.permute_dims")(w)
    conv = is_op("relax.nn.conv2d")(x, w)
    matmul = is_op("relax.matmul")(x, w | w_t)
    product = conv | matmul
    b_q, s_b, z_b, s_y, z_y = is_const(), is_const(), is_const(), is_const(), is_const()
    bias = is_op("relax.dequantize")(b_q, s_b, z_b)
    biased = is_op("relax.add")(product, bias | is_op("relax.reshape")(bias, wildcard()))
    requantized = is_op("relax.quantize")(biased, s_y, z_y)

    def integer_product(call, matches):
        """(the exact int32 product, the float32 scale of its sum per output channel, the shape that scale
        broadcasts in) or None where the form is not covered."""
        data, weights = matches[x_q], matches[w_q]
        weight_values = const_value(weights)
        if dtype_of(data) not in ("int8", "uint8") or weight_values is None \
                or str(weight_values.dtype) not in ("int8", "uint8") or call.attrs.out_dtype not in ("", None, "float32"):
            return None
        zero_x, scale_x = _scalar(matches[z_x]), _scalar(matches[s_x])
        zeros_w = const_value(matches[z_w])
        if zero_x is None or scale_x is None or zeros_w is None or np.any(zeros_w != 0):
            return None
        scales_w = const_value(matches[s_w]).astype(np.float32).reshape(-1)
        shifted = relax.op.astype(data, "int32")
        if zero_x != 0:
            shifted = relax.op.subtract(shifted, relax.const(int(zero_x), "int32"))
        if conv in matches and matches[conv].same_as(call):
            attrs = call.attrs
            data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
            if sorted(data_layout) != sorted("NCHW") or sorted(kernel_layout) != sorted("OIHW") \
                    or str(attrs.out_layout) not in ("", data_layout):
                return None
            out_axis, channels_at = kernel_layout.index("O"), data_layout.index("C")
            acc = relax.op.nn.conv2d(shifted, weights, strides=attrs.strides, padding=attrs.padding,
                                     dilation=attrs.dilation, groups=attrs.groups, data_layout=data_layout,
                                     kernel_layout=kernel_layout, out_dtype="int32")
            rank = 4
        else:
            if weight_values.ndim != 2:
                return None
            transposed = w_t in matches and matches[w_t] is not None
            if transposed and [int(a) for a in matches[w_t].attrs.axes] != [1, 0]:
                return None
            out_axis = 0 if transposed else 1
            rhs = relax.op.permute_dims(weights, [1, 0]) if transposed else weights
            acc = relax.op.matmul(shifted, rhs, out_dtype="int32")
            shape_of_call = static_shape(call)
            if shape_of_call is None:
                return None
            rank = len(shape_of_call)
            channels_at = rank - 1
        channels = int(weight_values.shape[out_axis])
        if scales_w.size not in (1, channels) or (scales_w.size > 1 and int(matches[w].attrs.axis) != out_axis):
            return None
        scale = (np.float32(scale_x) * np.broadcast_to(scales_w, (channels,))).astype(np.float32)
        shape = [1] * rank
        shape[channels_at] = channels
        return acc, scale, shape

    def rewrite_product(expr, matches):
        found = integer_product(expr, matches)
        if found is None:
            return expr
        acc, scale, shape = found
        return relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale.reshape(shape)))

    def rewrite_requantized(expr, matches):
        """quantize(product + bias): the bias added to the integer sum (its scale is the sum's), one rounding."""
        found = integer_product(matches[product], matches)
        bias_q, scale_out, zero_out = const_value(matches[b_q]), _scalar(matches[s_y]), _scalar(matches[z_y])
        bias_scale = const_value(matches[s_b])
        if found is None or bias_q is None or scale_out is None or zero_out is None or bias_scale is None \
                or str(bias_q.dtype) != "int32" or np.any(const_value(matches[z_b]) != 0):
            return expr
        acc, scale, shape = found
        if bias_q.size != scale.size or not np.allclose(np.broadcast_to(bias_scale.reshape(-1), scale.shape), scale,
                                                        rtol=1e-6, atol=0):
            return expr
        out_dtype = str(expr.attrs.out_dtype)
        info = np.iinfo(out_dtype)
        total = relax.op.add(acc, relax.const(bias_q.reshape(shape).astype("int32")))
        scaled = relax.op.multiply(relax.op.astype(total, "float32"),
                                   relax.const((scale / np.float32(scale_out)).astype(np.float32).reshape(shape)))
        shifted = relax.op.add(relax.op.round(scaled), relax.const(np.float32(zero_out)))
        # saturated as a minimum and a maximum, not ``clip``: those have a layout rule, so that
        # ``channels_last`` moves the whole requantization into NHWC (a clip kept a transpose on each side)
        saturated = relax.op.maximum(relax.op.minimum(shifted, relax.const(np.float32(info.max))),
                                     relax.const(np.float32(info.min)))
        return relax.op.astype(saturated, out_dtype)

    pooled_int = wildcard()
    widened = is_op("relax.astype")(pooled_int)
    summed = is_op("relax.nn.avg_pool2d")(widened)
    int_pool = is_op("relax.astype")(summed)

    def rewrite_pool(expr, matches):
        pool, source = matches[summed], matches[pooled_int]
        if dtype_of(source) not in ("int8", "uint8") or dtype_of(matches[widened]) != "int32":
            return expr
        attrs = pool.attrs
        mean = relax.op.nn.avg_pool2d(relax.op.astype(source, "float32"), pool_size=attrs.pool_size,
                                      strides=attrs.strides, padding=attrs.padding, dilation=attrs.dilation,
                                      ceil_mode=attrs.ceil_mode, count_include_pad=attrs.count_include_pad,
                                      layout=attrs.layout, out_layout=attrs.out_layout)
        return relax.op.astype(relax.op.round(mean), dtype_of(expr))

    wide_weights = is_const()
    wide_conv = is_op("relax.nn.conv2d")(wildcard(), wide_weights)
    wide_matmul = is_op("relax.matmul")(wildcard(), wide_weights)

    def rewrite_wide_weights(expr, matches):
        """An int32 product with int32 constant weights that fit in 8 bits (ONNX's ConvInteger, MatMulInteger,
        QLinearConv widen their weights on import) on the 8-bit constant: a quarter of the library."""
        weights = const_value(matches[wide_weights])
        narrow = narrow_integers(weights) if weights is not None and dtype_of(expr) == "int32" else None
        if narrow is None or dtype_of(expr.args[0]) != "int32":
            return expr
        if op_name(expr) == "relax.matmul":
            return relax.op.matmul(expr.args[0], relax.const(narrow), out_dtype="int32")
        a = expr.attrs
        return relax.op.nn.conv2d(expr.args[0], relax.const(narrow), strides=a.strides, padding=a.padding,
                                  dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                                  kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype="int32")

    @tvm.transform.module_pass(opt_level=0, name="EdgepackIntegerProducts")
    def _pass(mod, _ctx):
        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                func = rewrite_call(requantized, rewrite_requantized, func)
                func = rewrite_call(product, rewrite_product, func)
                func = rewrite_call(wide_conv | wide_matmul, rewrite_wide_weights, func)
                mod[gvar] = rewrite_call(int_pool, rewrite_pool, func)
        return mod

    return _pass


def elementwise_quantization():
    """A Relax module pass: per-tensor ``quantize`` and ``dequantize`` (what ``integer_products`` leaves:
    residual adds, pooling, concatenations between 8-bit tensors) as the elementwise operators they are,

        dequantize(x_q, s, z) = (float32(x_q) - z) * s
        quantize(x, s, z)     = saturate(round(x / s) + z)      half to even, as ONNX and LiteRT

    which have layout rules: ``channels_last`` then keeps a residual block in NHWC (as its own operators,
    TVM's quantize/dequantize kept a transpose on each side: light ResNet-50's 8-bit build ran 1.2 ms of
    transposes)."""
    import tvm
    from tvm import relax
    from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

    value, scale, zero = wildcard(), is_const(), is_const()
    dequantized = is_op("relax.dequantize")(value, scale, zero)
    quantized = is_op("relax.quantize")(value, scale, zero)

    def per_tensor(matches):
        s, z = _scalar(matches[scale]), _scalar(matches[zero])
        return None if s is None or z is None else (np.float32(s), z)

    def rewrite_dequantize(expr, matches):
        found = per_tensor(matches)
        if found is None or str(expr.attrs.out_dtype) != "float32":
            return expr
        s, z = found
        widened = relax.op.astype(matches[value], "float32")
        if z:
            widened = relax.op.subtract(widened, relax.const(np.float32(z)))
        return relax.op.multiply(widened, relax.const(s))

    def rewrite_quantize(expr, matches):
        found = per_tensor(matches)
        out_dtype = str(expr.attrs.out_dtype)
        if found is None or out_dtype not in ("int8", "uint8") or dtype_of(matches[value]) != "float32":
            return expr
        s, z = found
        info = np.iinfo(out_dtype)
        shifted = relax.op.add(relax.op.round(relax.op.divide(matches[value], relax.const(s))),
                               relax.const(np.float32(z)))
        saturated = relax.op.maximum(relax.op.minimum(shifted, relax.const(np.float32(info.max))),
                                     relax.const(np.float32(info.min)))
        return relax.op.astype(saturated, out_dtype)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackElementwiseQuantization")
    def _pass(mod, _ctx):
        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                func = rewrite_call(dequantized, rewrite_dequantize, func)
                mod[gvar] = rewrite_call(quantized, rewrite_quantize, func)
        return mod

    return _pass

