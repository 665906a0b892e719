"""TFLite models: read what they hold (operators, tensors) and import them into Relax with TVM's
frontend and edgepack's fixes (``tflite_ops``: sparse weights behind DENSIFY, int8 data movement and
PRELU, ARG_MAX types, TRANSPOSE_CONV)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from edgepack.errors import ModelError, first_line
from edgepack.files import file_sha256
from edgepack.frontends.tflite_ops import fix_imported, operator_converter
from edgepack.frontends.types import ModelInfo
from edgepack.tensors import Dim, TensorSpec

_TFLITE_CUSTOM = 32  # tflite.BuiltinOperator.CUSTOM
_TFLITE_DTYPES = {
    0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16",
    9: "int8", 10: "float64", 12: "uint64", 15: "uint32", 16: "uint16",
}


def _load_tflite(path: Path):
    import tflite

    buf = path.read_bytes()
    try:
        model = tflite.Model.GetRootAsModel(buf, 0)
        if model.SubgraphsLength() < 1:
            raise ValueError("no subgraph")
        model.Subgraphs(0).OperatorsLength()
    except Exception as exc:  # flatbuffers raises struct.error / IndexError on truncated data
        raise ModelError(
            f"{path} is not a readable TFLite model ({type(exc).__name__}: {first_line(exc)}).",
            "The file is corrupt or truncated; convert or download it again.",
        ) from exc
    return model


def _tflite_converter(model):
    from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

    return OperatorConverter(model, model.Subgraphs(0), None, None)


def _tflite_tensor_spec(tensor) -> TensorSpec:
    name = tensor.Name().decode()
    shape = [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else []
    signature = [int(d) for d in tensor.ShapeSignatureAsNumpy()] if tensor.ShapeSignatureLength() else shape
    dims: tuple[Dim, ...] = tuple(d if s >= 0 else f"?{i}" for i, (d, s) in enumerate(zip(shape, signature)))
    return TensorSpec(name, _TFLITE_DTYPES.get(tensor.Type(), f"tflite-type-{tensor.Type()}"), dims)


def _tflite_op_name(converter, model, op) -> str:
    code = model.OperatorCodes(op.OpcodeIndex())
    builtin = max(code.DeprecatedBuiltinCode(), code.BuiltinCode())
    if builtin == _TFLITE_CUSTOM:
        custom = code.CustomCode()
        return f"CUSTOM:{custom.decode() if custom else '?'}"
    return converter.builtin_op_code.get(builtin, f"BUILTIN_{builtin}")


def inspect_tflite(path: Path) -> ModelInfo:
    model = _load_tflite(path)
    graph = model.Subgraphs(0)
    converter = _tflite_converter(model)
    try:
        ops = [_tflite_op_name(converter, model, graph.Operators(i)) for i in range(graph.OperatorsLength())]
    except Exception as exc:
        raise ModelError(
            f"{path} has an operator table TVM cannot read: {first_line(exc)}.",
            "The model may come from a newer TFLite schema; re-convert it with a TFLite converter of 2.18 or older.",
        ) from exc
    counts = Counter(ops)
    unsupported = {op: n for op, n in counts.items() if op not in converter.convert_map}
    inputs = tuple(_tflite_tensor_spec(graph.Tensors(graph.Inputs(i))) for i in range(graph.InputsLength()))
    outputs = tuple(_tflite_tensor_spec(graph.Tensors(graph.Outputs(i))) for i in range(graph.OutputsLength()))
    steps = {o.name: 1.0 for o in outputs if o.dtype in ("int8", "uint8")}  # 8-bit outputs: one step is 1
    return ModelInfo(path, "tflite", file_sha256(path), inputs, outputs, dict(counts.most_common()), unsupported,
                     output_steps=steps)


def import_tflite(info: ModelInfo, inputs: tuple[TensorSpec, ...]):
    from tvm.relax.frontend.tflite import from_tflite

    model = _load_tflite(info.path)
    return fix_imported(from_tflite(
        model,
        shape_dict={t.name: tuple(t.shape) for t in inputs},
        dtype_dict={t.name: t.dtype for t in inputs},
        op_converter=operator_converter(),
    ))
