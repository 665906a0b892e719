"""Half precision (``compile --precision fp16``): a Relax program that stores and computes its float
tensors in float16, as LiteRT's GPU delegate does on phones.

TVM's ``ToMixedPrecision`` does the work: convolutions and matrix products take float16 operands and sum
in the profile's accumulator type (``[precision] accumulate``), elementwise operators follow their
operands, and what it keeps in float32 (reductions such as mean and softmax) gets casts around it. The
model's inputs and outputs stay float32, so a caller feeds and reads the same tensors as an fp32 build.
Weights become float16 constants when the GPU pipeline folds their casts (``folding.py``): a float16
TFLite model's weights, widened at import, go back to float16.

``ToMixedPrecision`` takes every operand for a tensor, so ``clip``'s bounds (scalars) would stop it; they
become a ``maximum`` and a ``minimum`` with constant tensors first (the same kernel once fused).
"""

from __future__ import annotations

from edgepack.backends.relax_exprs import call_rewrite_pass, op_name
from edgepack.errors import CompileError, first_line


def _clip_as_tensors(call, _builder):
    from tvm import relax

    if op_name(call) != "relax.clip":
        return None
    x, low, high = call.args
    dtype = str(x.ty.dtype)

    def bound(p):
        value = p.value
        return relax.const(float(getattr(value, "value", value)), dtype)

    return relax.op.minimum(relax.op.maximum(x, bound(low)), bound(high))


def _conv1d_in_fp32(call, builder):
    """A float32 1-D convolution as its TOPI kernel, which ``ToMixedPrecision`` leaves in float32: an audio
    model's front end (Silero VAD's STFT over raw samples, 256-sample windows whose sums are then squared)
    lost its numbers in fp16 (its state 1.9 off; 0.0025 with these convolutions in fp32)."""
    from tvm import topi

    if op_name(call) != "relax.nn.conv1d" or str(call.args[0].ty.dtype) != "float32":
        return None
    a = call.attrs
    return builder.call_te(topi.nn.conv1d, call.args[0], call.args[1], [int(s) for s in a.strides],
                           [int(p) for p in a.padding], [int(d) for d in a.dilation], int(a.groups),
                           str(a.data_layout), str(a.kernel_layout), "float32", primfunc_name_hint="conv1d")


def half_precision(mod, accumulate: str, model: str):
    """``mod`` computing in float16, products accumulated in ``accumulate`` ("float32" or "float16").
    Raises a CompileError naming the model where TVM's pass cannot convert it."""
    import tvm
    from tvm import relax

    passes = tvm.transform.Sequential([
        call_rewrite_pass("edgepack_clip_as_tensors", _clip_as_tensors),
        call_rewrite_pass("edgepack_conv1d_in_fp32", _conv1d_in_fp32),
        relax.transform.ConvertToDataflow(),
        relax.transform.ToMixedPrecision(out_dtype=accumulate),
    ])
    try:
        return passes(mod)
    except Exception as exc:  # TVM raises its own error types from inside the pass
        raise CompileError(f"{model} cannot be converted to half precision: TVM's ToMixedPrecision failed "
                           f"({first_line(exc)}).",
                           "Compile it with --precision fp32, and report the model.") from exc
