"""Resize and Upsample: TVM's resize where it computes what ONNX specifies, otherwise exact
separable per-axis gathers / interpolation matrices taken from the ONNX reference implementation.
"""

from __future__ import annotations

import numpy as _np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _attr_str, _const, _const_value, _dtype, _shape
from edgepack.frontends.onnx_ops.registry import register


def _resize_axis_matrix(n_in: int, n_out: int, scale: float, roi, attr: dict, mode: str):
    """(weights [n_out, n_in], extrapolated rows [n_out] bool) of ONNX Resize along one axis.

    The weights come from the ONNX reference implementation (interpolation is linear in the data,
    so resizing the identity matrix yields the matrix), which makes every mode/coordinate
    transformation/antialias/exclude_outside combination exact by construction.
    """
    from onnx.reference.ops import op_resize as ref

    antialias = attr.get("antialias", 0)
    if mode == "nearest":
        nearest_mode = _attr_str(attr, "nearest_mode", "round_prefer_floor")

        def coeffs(x, scale_factor):
            return ref._nearest_coeffs(x, mode=nearest_mode)
    elif mode == "cubic":
        cubic = ref._cubic_coeffs_antialias if antialias else ref._cubic_coeffs
        a = attr.get("cubic_coeff_a", -0.75)

        def coeffs(x, scale_factor):
            return cubic(x, scale_factor, A=a)
    else:
        coeffs = ref._linear_coeffs_antialias if antialias else ref._linear_coeffs
    kwargs = {"roi": roi,
              "coordinate_transformation_mode": _attr_str(attr, "coordinate_transformation_mode", "half_pixel"),
              "exclude_outside": bool(attr.get("exclude_outside", 0))}
    weights = ref._interpolate_1d_along_axis(_np.eye(n_in), 0, scale, n_out, coeffs, extrapolation_value=0.0,
                                             **kwargs)
    outside = ref._interpolate_1d_along_axis(_np.zeros((n_in, 1)), 0, scale, n_out, coeffs,
                                             extrapolation_value=1.0, **kwargs)[:, 0] != 0
    return _np.asarray(weights, dtype=_np.float64), outside


def _resize_plan(shape: list[int], roi, scales, sizes, attr: dict):
    """Per-axis (output size, scale factor, roi pair) like the ONNX reference computes them."""
    rank = len(shape)
    axes = [a + rank if a < 0 else a for a in attr.get("axes", range(rank))]
    full_roi = None
    if roi is not None and roi.size:
        full_roi = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = float(roi[i]), float(roi[len(axes) + i])
    if sizes is not None and sizes.size:
        out = list(shape)
        for i, a in enumerate(axes):
            out[a] = int(sizes[i])
        factors = [out[i] / shape[i] for i in range(rank)]
        policy = _attr_str(attr, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            chosen = [factors[a] for a in axes]
            scale = min(chosen) if policy == "not_larger" else max(chosen)
            factors = [scale if i in axes else 1.0 for i in range(rank)]
            out = [int(scale * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]
    else:
        factors = [1.0] * rank
        for i, a in enumerate(axes):
            factors[a] = float(scales[i])
        out = [int(f * d) for f, d in zip(factors, shape)]
    plan = []
    for a in range(rank):
        pair = None if full_roi is None else [full_roi[a], full_roi[rank + a]]
        if out[a] == shape[a] and abs(factors[a] - 1.0) < 1e-12 and (pair is None or pair == [0.0, 1.0]):
            continue
        plan.append((a, out[a], factors[a], pair))
    return plan


def _resize_exact(bb, x, roi, scales, sizes, attr: dict, mode: str):
    shape = _shape(x)
    dt = _dtype(x)
    compute_dt = dt if dt.startswith("float") else "float32"
    y = x if compute_dt == dt else relax.op.astype(x, compute_dt)
    extrapolated = None
    for axis, n_out, factor, pair in _resize_plan(shape, roi, scales, sizes, attr):
        weights, outside = _resize_axis_matrix(shape[axis], n_out, factor, pair, attr, mode)
        one_hot = ((weights == 0) | (weights == 1)).all() and (weights.sum(axis=1) <= 1).all()
        if one_hot:  # nearest: a gather, not a matrix product
            idx = weights.argmax(axis=1).astype("int64")
            y = relax.op.take(y, relax.const(idx, "int64"), axis=axis)
        else:
            rank = len(shape)
            perm = [i for i in range(rank) if i != axis] + [axis]
            inv = [perm.index(i) for i in range(rank)]
            moved = relax.op.permute_dims(y, perm) if axis != rank - 1 else y
            prod = relax.op.matmul(moved, relax.const(weights.T.astype(compute_dt), compute_dt))
            y = relax.op.permute_dims(prod, inv) if axis != rank - 1 else prod
        if outside.any():
            mask_shape = [1] * len(shape)
            mask_shape[axis] = n_out
            m = relax.const(outside.reshape(mask_shape), "bool")
            extrapolated = m if extrapolated is None else relax.op.logical_or(extrapolated, m)
        shape = shape[:axis] + [n_out] + shape[axis + 1:]
    if extrapolated is not None:
        value = _const(attr.get("extrapolation_value", 0.0), compute_dt)
        y = relax.op.where(extrapolated, value, y)
    if compute_dt != dt:
        info = _np.iinfo(dt) if dt != "bool" else None
        y = relax.op.round(y)
        if info is not None:
            y = relax.op.clip(y, int(info.min), int(info.max))
        y = relax.op.astype(y, dt)
    return y


def _tvm_resize_is_exact(shape, roi, scales, sizes, attr: dict, mode: str) -> bool:
    """Configurations where TVM's resize2d/3d computes what ONNX specifies (the common ones)."""
    coord = _attr_str(attr, "coordinate_transformation_mode", "half_pixel")
    if attr.get("antialias", 0) or "axes" in attr or coord in ("half_pixel_symmetric", "tf_crop_and_resize"):
        return False
    if _attr_str(attr, "keep_aspect_ratio_policy", "stretch") != "stretch" or mode == "cubic":
        return False
    if len(shape) not in (4, 5):
        return False
    plan = _resize_plan(shape, roi, scales, sizes, attr)
    if any(axis < 2 for axis, *_ in plan):
        return False
    # TVM maps coordinates with out/in; ONNX with the given scale: equal only when out == in * scale
    return all(abs(n_out - shape[axis] * factor) < 1e-6 and (coord != "align_corners" or n_out > 1)
               for axis, n_out, factor, _ in plan)


@register("Resize")
class Resize(OnnxOpConverter):
    """ONNX Resize with constant scales/sizes: TVM's resize where it is exact, otherwise separable
    per-axis gathers (nearest) or interpolation matrices (linear/cubic, antialias, axes, aspect
    ratio policies, tf_crop_and_resize, half_pixel_symmetric, fractional scales)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        scales = _const_value(inputs[1])
        if scales is None:
            return _tvm.Resize.get_converter(10)(bb, inputs, attr, params)
        attr = dict(attr, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        return _resize_exact(bb, inputs[0], None, scales, None, attr, _attr_str(attr, "mode", "nearest"))

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        roi = _const_value(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        scales = _const_value(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
        sizes = _const_value(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        given = [v for v in (scales, sizes) if v is not None and v.size]
        if len(given) != 1 or not isinstance(x.ty, relax.TensorType) or x.ty.shape is None \
                or not all(isinstance(d, tvm.tirx.IntImm) for d in x.ty.shape):
            if scales is not None and scales.size and x.ty.shape is not None and len(given) == 1 \
                    and _np.all(scales == _np.round(scales)) \
                    and _np.all(scales >= 1):
                # a symbolic extent (--dim) scaled by a whole number: the output extent as integer arithmetic
                # (TVM's float product cannot be proven equal to the map it is added to), exact coordinates
                inputs = type(inputs)([x, inputs[1], relax.ShapeExpr([int(v) for v in scales]), *inputs[3:]])
            return _tvm.Resize.get_converter(18)(bb, inputs, attr, params)
        mode = _attr_str(attr, "mode", "nearest")
        if _tvm_resize_is_exact(_shape(x), roi, scales, sizes, attr, mode):
            return _tvm.Resize.get_converter(18)(bb, inputs, attr, params)
        return _resize_exact(bb, x, roi, scales, sizes, attr, mode)


@register("Upsample")
class Upsample(OnnxOpConverter):
    """Upsample (deprecated Resize): nearest uses floor(out / scale), linear is asymmetric."""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        scales = attr.get("scales")
        if scales is None and len(inputs) > 1:
            scales = _const_value(inputs[1])
        if scales is None:
            return _tvm.Upsample.get_converter(9)(bb, inputs, attr, params)
        mode = _attr_str(attr, "mode", "nearest")
        mode = "linear" if mode in ("linear", "bilinear", "trilinear") else mode
        attr = dict(attr, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        attr.pop("scales", None)
        return _resize_exact(bb, inputs[0], None, _np.asarray(scales, dtype="float64"), None, attr, mode)
