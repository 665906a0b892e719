"""NonMaxSuppression: TVM's converter, with the number of selected boxes left to run time.

TVM's ``all_class_non_max_suppression`` (ONNX format) types ``selected_indices`` with its upper bound
(every box of every class) but returns only the rows selected: a model whose outputs or later operators
trust that static row count reads past the tensor (the C API refused the output as not matching its
metadata). Here the row count is a run-time dimension, as in ONNX.
"""

from __future__ import annotations

from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend as _tvm

from edgepack.frontends.onnx_ops.registry import register


@register("NonMaxSuppression")
class NonMaxSuppression(_tvm.NonMaxSuppression):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        selected = super()._impl_v10(bb, inputs, attr, params)
        rows = tirx.Var("num_selected_indices", "int64")
        return bb.match_cast(selected, relax.TensorType([rows, 3], "int64"))
