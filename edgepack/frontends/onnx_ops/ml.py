"""ai.onnx.ml operators that are plain tensor math: Binarizer and ArrayFeatureExtractor."""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const, _dtype, _rank, _shape
from edgepack.frontends.onnx_ops.registry import register


@register("Binarizer")
class Binarizer(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        return relax.op.astype(relax.op.greater(x, _const(attr.get("threshold", 0.0), dt)), dt)


@register("ArrayFeatureExtractor")
class ArrayFeatureExtractor(OnnxOpConverter):
    """Select features along the last axis (indices flattened, as the ONNX-ML reference does)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, idx = inputs
        count = int(_np.prod(_shape(idx)))
        picked = relax.op.take(x, relax.op.reshape(idx, [count]), axis=_rank(x) - 1)
        shape = [1, count] if _rank(x) == 1 else _shape(x)[:-1] + [count]
        return relax.op.reshape(picked, shape)
