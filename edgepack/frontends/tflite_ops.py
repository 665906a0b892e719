"""edgepack's fixes to TVM's TFLite frontend: an ``OperatorConverter`` subclass (``from_tflite``'s
``op_converter`` hook) and a pass over the imported module.

* Sparse weights: DENSIFY makes the dense tensor at import time (a "prefetched" constant), but TVM's
  DEQUANTIZE then reads the raw buffer of DENSIFY's output, which has none, and fails with
  ``TypeError: a bytes-like object is required, not 'int'``. Here DEQUANTIZE takes the densified
  constant (fp16 weights are widened to fp32, int8 ones dequantized with their parameters).
* int8 data movement (``QUANTIZED_MOVEMENT``: transpose, squeeze, slices, pads, depth/space, nearest
  resize, gather, tile): TVM refuses these on quantized tensors, but they only move values, so they run
  on the int8 data as they are (a requantize follows where the output's scale or zero point differs;
  PAD already pads with the zero point).
* PRELU: alpha kept at its own size (TVM broadcast it to the input's shape: every slope H x W times in the
  library); int8 PRELU computed in float between a dequantize and a quantize (TVM refuses it).
* ARG_MAX / ARG_MIN: the output has the tensor's type (``OutputType``: int32 or int64; TVM always
  made int64).
* TRANSPOSE_CONV: TVM imports it as an NHWC ``conv2d_transpose``, which no Relax legalization lowers
  ("CodeGenVM cannot emit this Relax operator"); ``fix_imported`` converts it to NCHW with transposes
  around it.
"""

from __future__ import annotations

#: TFLite operators that only move (or repeat) values: exact on int8 data with the same parameters.
QUANTIZED_MOVEMENT = frozenset({
    "DEPTH_TO_SPACE", "GATHER", "MIRROR_PAD", "PAD", "PADV2", "RESIZE_NEAREST_NEIGHBOR", "SLICE", "SPACE_TO_DEPTH",
    "SQUEEZE", "STRIDED_SLICE", "TILE", "TRANSPOSE",
})


def operator_converter():
    """TVM's TFLite OperatorConverter with edgepack's fixes (see the module docstring)."""
    from tvm import relax
    from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

    class EdgepackOperatorConverter(OperatorConverter):
        _SUPPORTED_QUANTIZED_OPS = OperatorConverter._SUPPORTED_QUANTIZED_OPS | QUANTIZED_MOVEMENT | {"PRELU"}

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for name in QUANTIZED_MOVEMENT & set(self.convert_map):
                self.convert_map[name] = self._requantized(self.convert_map[name])
            for name in ("ARG_MAX", "ARG_MIN"):
                self.convert_map[name] = self._output_typed(self.convert_map[name])

        def _requantized(self, convert):
            def run(op):
                out = convert(op)
                source, result = self.get_input_tensors(op)[0], self.get_output_tensors(op)[0]
                if source.qnn_params and result.qnn_params and not self.has_same_qnn_params(source, result):
                    out = self.quantize(self.dequantize(out, source), result)
                return out

            return run

        def _output_typed(self, convert):
            def run(op):
                out = self.bb.normalize(convert(op))
                want = self.get_tensor_type_str(self.get_output_tensors(op)[0].tensor.Type())
                return relax.op.astype(out, want) if out.ty.dtype != want else out

            return run

        def convert_prelu(self, op):
            data, alpha = self.get_input_tensors(op)
            x = self.get_tensor_expr(data)
            if data.qnn_params:
                x = self.bb.normalize(self.dequantize(x, data))
            slope = self.get_tensor_expr(alpha)
            if alpha.qnn_params:
                slope = self.bb.normalize(self.dequantize(slope, alpha))
            out = self._prelu(x, slope, [int(d) for d in self.get_tensor_shape(data)],
                              [int(d) for d in self.get_tensor_shape(alpha)])
            return self.quantize(out, self.get_output_tensors(op)[0]) if data.qnn_params else out

        def _prelu(self, x, slope, shape: list[int], alpha_shape: list[int]):
            """``x >= 0 ? x : alpha * x`` with alpha at its own size (TVM broadcast it to the input's shape
            and flattened both, and constant folding then stored H x W copies of every slope: a 1.9 MB
            palm detector became a 15 MB library)."""
            channels = shape[-1] if shape else 1
            if alpha_shape and all(d == 1 for d in alpha_shape[:-1]) and alpha_shape[-1] == channels:
                flat = self.bb.normalize(relax.op.reshape(slope, [channels]))  # one slope per channel
                return relax.op.nn.prelu(x, flat, axis=len(shape) - 1)
            zero = relax.const(0.0, x.ty.dtype)
            return relax.op.where(relax.op.greater_equal(x, zero), x, relax.op.multiply(x, slope))

        def convert_dequantize(self, op):
            tensor = self.get_input_tensors(op)[0]
            if not self.is_prefetched(tensor.tensor_idx):
                return super().convert_dequantize(op)
            dtype = self.get_tensor_type_str(tensor.tensor.Type())
            dense = self.get_prefetched_node(tensor.tensor_idx)
            const = self.exp_tab.new_const(dense, dtype=dtype, source_name=tensor.tensor.Name())
            if dtype == "float16":
                return relax.op.astype(const, "float32")
            return self.dequantize(const, tensor)

    return EdgepackOperatorConverter


def fix_imported(mod):
    """The imported module with NHWC transposed convolutions in a layout Relax lowers (NCHW, IOHW)."""
    from tvm import relax

    return relax.transform.ConvertLayout({"relax.nn.conv2d_transpose": ["NCHW", "IOHW"]})(mod)
