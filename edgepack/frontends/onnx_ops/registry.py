"""The converter registry: edgepack's ONNX converters by operator name, laid over TVM's map.

TVM 0.27's ``from_onnx`` looks operators up in ``_get_convert_map()``; :func:`convert_map` is that
map with :data:`EDGEPACK_CONVERTERS` (filled by the ``@register`` decorators of the family modules,
which ``edgepack.frontends.onnx_ops`` imports) laid over it.
"""

from __future__ import annotations

from tvm.relax.frontend.onnx import onnx_frontend as _tvm

# Operators edgepack converts itself: name -> OnnxOpConverter subclass (filled in by the
# ``@register`` decorators of the family modules).
EDGEPACK_CONVERTERS: dict[str, type] = {}


# Operators the importer handles itself (their bodies are subgraphs), besides the converter map.
_SUBGRAPH_OPS = {"If", "Loop", "Scan", "Constant", "FlexAttention"}
# Operators of other domains edgepack converts, as ``inspect`` names them (domain.op).
_DOMAIN_OPS = {"ai.onnx.preview.FlexAttention", "ai.onnx.ml.Binarizer", "ai.onnx.ml.ArrayFeatureExtractor",
               "ai.onnx.preview.training.Adagrad", "ai.onnx.preview.training.Adam",
               "ai.onnx.preview.training.Momentum",
               *(f"com.microsoft.{op}" for op in ("QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
                                                  "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat",
                                                  "QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                                                  "DynamicQuantizeLSTM"))}


def register(*names: str):
    def wrap(cls):
        for name in names:
            EDGEPACK_CONVERTERS[name] = cls
        return cls

    return wrap


def convert_map() -> dict[str, type]:
    """TVM's ONNX converters with edgepack's fixes and additions laid over them."""
    merged = _tvm._get_convert_map()
    merged.update(EDGEPACK_CONVERTERS)
    return merged


def supported_operators() -> set[str]:
    """Every ONNX operator (default domain) the importer can convert."""
    return set(convert_map()) | _SUBGRAPH_OPS | _DOMAIN_OPS
