"""Read ONNX and TFLite models: what they contain, and their Relax IRModule.

``inspect_model`` never needs input shapes and never fails on unsupported operators: it reports them.
``import_model`` turns the model into a Relax IRModule with static input shapes, or raises a clear
:class:`~edgepack.errors.EdgepackError` naming what is wrong.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgepack.errors import ModelError, ShapeError
from edgepack.fileutil import file_sha256

ModelFormat = Literal["onnx", "tflite"]
Dim = int | str  # a str names a dynamic dimension
Shape = tuple[int, ...]

_TFLITE_CUSTOM = 32  # tflite.BuiltinOperator.CUSTOM
_TFLITE_DTYPES = {
    0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16",
    9: "int8", 10: "float64", 12: "uint64", 15: "uint32", 16: "uint16",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def dynamic_dims(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not isinstance(d, int)]

    @property
    def is_static(self) -> bool:
        return not self.dynamic_dims

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(data["name"], data["dtype"], tuple(data["shape"]))


@dataclass(frozen=True)
class ModelInfo:
    """What a model file contains, as read without compiling it."""

    path: Path
    format: ModelFormat
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    operator_counts: dict[str, int]
    unsupported_operators: dict[str, int] = field(default_factory=dict)
    opset: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "sha256": self.sha256,
            "opset": self.opset,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "operator_counts": self.operator_counts,
            "unsupported_operators": self.unsupported_operators,
            # per operator: whether edgepack (TVM's frontend + edgepack's converters) can compile it
            "operators": [{"name": op, "count": n, "supported": op not in self.unsupported_operators}
                          for op, n in self.operator_counts.items()],
            "support": self.support_summary(),
        }

    def support_summary(self) -> dict[str, int]:
        nodes = sum(self.operator_counts.values())
        bad_nodes = sum(self.unsupported_operators.values())
        return {"operators": len(self.operator_counts),
                "supported_operators": len(self.operator_counts) - len(self.unsupported_operators),
                "unsupported_operators": len(self.unsupported_operators),
                "nodes": nodes, "supported_nodes": nodes - bad_nodes, "unsupported_nodes": bad_nodes}


@dataclass(frozen=True)
class ImportedModel:
    info: ModelInfo
    mod: Any  # tvm.IRModule
    inputs: tuple[TensorSpec, ...]  # static shapes, in the order of the Relax main function


def detect_format(path: Path) -> ModelFormat:
    """Tell ONNX from TFLite by content, not by file name."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"Model file {path} does not exist.", "Check the path.")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) >= 8 and head[4:8] in (b"TFL3", b"TFL2"):
        return "tflite"
    if head[:1] == b"\x08":  # protobuf field 1 (ir_version), varint: every ONNX ModelProto starts so
        return "onnx"
    raise ModelError(
        f"{path} is neither an ONNX nor a TFLite model (unrecognised header {head[:8]!r}).",
        "Pass a .onnx file (ONNX ModelProto) or a .tflite flatbuffer.",
    )


def inspect_model(path: Path | str) -> ModelInfo:
    path = Path(path)
    fmt = detect_format(path)
    return _inspect_onnx(path) if fmt == "onnx" else _inspect_tflite(path)


def parse_input_shapes(specs: list[str] | None) -> dict[str, Shape]:
    """Parse ``NAME:1,3,224,224`` strings (the CLI's ``--input-shape``)."""
    shapes: dict[str, Shape] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
            if not shape or any(d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"Cannot read input shape {spec!r}.",
                "Write it as NAME:D0,D1,... with positive integers, e.g. --input-shape x:1,3,224,224.",
            ) from None
        shapes[name] = shape
    return shapes


def resolve_input_shapes(info: ModelInfo, overrides: dict[str, Shape] | None) -> tuple[TensorSpec, ...]:
    """Static input specs: the model's shapes with ``overrides`` applied, or a ShapeError."""
    overrides = dict(overrides or {})
    names = [t.name for t in info.inputs]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ShapeError(
            f"--input-shape names {', '.join(unknown)}, which the model does not have.",
            f"The model's inputs are: {', '.join(names)}.",
        )
    resolved, dynamic = [], []
    for spec in info.inputs:
        if spec.name in overrides:
            shape = overrides[spec.name]
            if len(shape) != len(spec.shape):
                raise ShapeError(
                    f"Input {spec.name!r} has rank {len(spec.shape)} {_fmt_shape(spec.shape)},"
                    f" but --input-shape gives rank {len(shape)} {_fmt_shape(shape)}.",
                    f"Give {len(spec.shape)} dimensions.",
                )
            for i, (want, got) in enumerate(zip(spec.shape, shape)):
                if isinstance(want, int) and want != got:
                    raise ShapeError(
                        f"Input {spec.name!r} has a fixed dimension {i} of {want}, but --input-shape gives {got}.",
                        f"Only dynamic dimensions can be set; use {_fmt_shape(spec.shape)} with the dynamic ones filled in.",
                    )
            resolved.append(TensorSpec(spec.name, spec.dtype, shape))
        elif spec.is_static:
            resolved.append(spec)
        else:
            dynamic.append(spec)
    if dynamic:
        listing = "; ".join(
            f"{s.name} {_fmt_shape(s.shape)} (dynamic: {', '.join(f'dim {i}' for i in s.dynamic_dims)})"
            for s in dynamic
        )
        example = " ".join(
            f"--input-shape {s.name}:{','.join(str(d) if isinstance(d, int) else '1' for d in s.shape)}"
            for s in dynamic
        )
        raise ShapeError(
            f"The model has dynamic input dimensions: {listing}.",
            f"Fix them with --input-shape, e.g. {example}",
        )
    return tuple(resolved)


def import_model(path: Path | str, input_shapes: dict[str, Shape] | None = None) -> ImportedModel:
    """Import the model into a Relax IRModule with static input shapes."""
    info = inspect_model(path)
    require_supported_operators(info)
    inputs = resolve_input_shapes(info, input_shapes)
    try:
        mod = _import_onnx(info, inputs) if info.format == "onnx" else _import_tflite(info, inputs)
    except Exception as exc:  # TVM's frontends raise anything from OpNotImplemented to KeyError
        raise ModelError(
            f"TVM's {info.format.upper()} importer failed on {info.path.name}: {_first_line(exc)}",
            "This operator configuration is not supported yet; `edgepack inspect` lists the operators."
            " Please report it with the model attached.",
        ) from exc
    return ImportedModel(info=info, mod=mod, inputs=inputs)


def require_supported_operators(info: ModelInfo) -> None:
    if info.unsupported_operators:
        listing = ", ".join(f"{op} (x{n})" for op, n in sorted(info.unsupported_operators.items()))
        raise ModelError(
            f"{info.path.name} uses operators edgepack cannot compile: {listing}.",
            "Re-export the model without them (e.g. a lower ONNX opset, or TFLite builtins instead of"
            " custom ops), or replace them in the model.",
        )


# --- ONNX -------------------------------------------------------------------------------------


def _load_onnx(path: Path):
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ModelError(
            f"{path} is not a readable ONNX model: {_first_line(exc)}.",
            "The file is corrupt or truncated; export or download it again.",
        ) from exc
    if not model.graph.node or not model.graph.output:
        raise ModelError(
            f"{path} parses as ONNX but holds no graph (no nodes or no outputs); it is corrupt or truncated.",
            "Export or download the model again.",
        )
    return model


def _onnx_value_spec(value) -> TensorSpec:
    from onnx import helper

    tensor_type = value.type.tensor_type
    dtype = str(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)) if tensor_type.elem_type else "float32"
    dims: list[Dim] = []
    for i, d in enumerate(tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or f"?{i}")
    return TensorSpec(value.name, dtype, tuple(dims))


def _onnx_supported_ops() -> set[str]:
    from edgepack.onnx_ops import supported_operators

    return supported_operators()


def _inspect_onnx(path: Path) -> ModelInfo:
    model = _load_onnx(path)
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_onnx_value_spec(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_onnx_value_spec(v) for v in model.graph.output)
    counts = Counter(_onnx_op_name(node) for node in model.graph.node)
    supported = _onnx_supported_ops()
    unsupported = {op: n for op, n in counts.items() if op not in supported}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return ModelInfo(path, "onnx", file_sha256(path), inputs, outputs, dict(counts.most_common()),
                     unsupported, opset)


def _onnx_op_name(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _import_onnx(info: ModelInfo, inputs: tuple[TensorSpec, ...]):
    from edgepack.onnx_ops import from_onnx  # TVM's frontend with edgepack's converters

    static = _load_onnx(info.path)
    folded = _fold_onnx_constants(static, inputs)  # also fixes the input shapes of ``static``
    kwargs = {"shape_dict": {t.name: list(t.shape) for t in inputs},
              "dtype_dict": {t.name: t.dtype for t in inputs}, "opset": info.opset}
    try:
        return from_onnx(folded, **kwargs)
    except Exception as first:
        if folded is static:
            raise
        # ONNX Runtime inlines function operators it has no kernel for (GroupNormalization-21, ...)
        # into shape arithmetic TVM cannot import; edgepack converts those itself: try the graph as written.
        try:
            return from_onnx(static, **kwargs)
        except Exception:  # noqa: BLE001 - the folded graph's error is the one to report
            raise first from None


def _fold_onnx_constants(model, inputs: tuple[TensorSpec, ...]):
    """Fix the input shapes in the graph, then let ONNX Runtime fold what they make constant.

    Exporters often compute reshape targets at run time (Shape -> Slice -> Concat -> Reshape);
    TVM's importer needs them constant. ONNX Runtime's *basic* level only folds constants and
    fuses standard operators (no contrib ops), so the result is still a plain ONNX graph.
    If ONNX Runtime cannot load the model, the static-shape model is returned unchanged.
    """
    import tempfile

    import onnx

    # Old ONNX IR (< 4) lists every weight as a graph input too; for deployment they are constants.
    initializers = {init.name for init in model.graph.initializer}
    real_inputs = [v for v in model.graph.input if v.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(real_inputs)
    model.ir_version = max(model.ir_version, 4)
    shapes = {t.name: t.shape for t in inputs}
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        import onnxruntime as ort

        with tempfile.TemporaryDirectory(prefix="edgepack-onnx-") as tmp:
            source, folded = Path(tmp) / "static.onnx", Path(tmp) / "folded.onnx"
            onnx.save(model, str(source))
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            options.optimized_model_filepath = str(folded)
            options.log_severity_level = 3
            ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
            return onnx.load(str(folded))
    except Exception:  # noqa: BLE001 - folding is an optimisation; TVM may still import the original
        return model


# --- TFLite -----------------------------------------------------------------------------------


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
            f"{path} is not a readable TFLite model ({type(exc).__name__}: {_first_line(exc)}).",
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


def _inspect_tflite(path: Path) -> ModelInfo:
    model = _load_tflite(path)
    graph = model.Subgraphs(0)
    converter = _tflite_converter(model)
    try:
        ops = [_tflite_op_name(converter, model, graph.Operators(i)) for i in range(graph.OperatorsLength())]
    except Exception as exc:
        raise ModelError(
            f"{path} has an operator table TVM cannot read: {_first_line(exc)}.",
            "The model may come from a newer TFLite schema; re-convert it with a TFLite converter of 2.18 or older.",
        ) from exc
    counts = Counter(ops)
    unsupported = {op: n for op, n in counts.items() if op not in converter.convert_map}
    inputs = tuple(_tflite_tensor_spec(graph.Tensors(graph.Inputs(i))) for i in range(graph.InputsLength()))
    outputs = tuple(_tflite_tensor_spec(graph.Tensors(graph.Outputs(i))) for i in range(graph.OutputsLength()))
    return ModelInfo(path, "tflite", file_sha256(path), inputs, outputs, dict(counts.most_common()), unsupported)


def _import_tflite(info: ModelInfo, inputs: tuple[TensorSpec, ...]):
    from tvm.relax.frontend.tflite import from_tflite

    model = _load_tflite(info.path)
    return from_tflite(
        model,
        shape_dict={t.name: tuple(t.shape) for t in inputs},
        dtype_dict={t.name: t.dtype for t in inputs},
        op_converter=_tflite_operator_converter(),
    )


def _tflite_operator_converter():
    """TVM's TFLite OperatorConverter with edgepack's fixes (``from_tflite``'s op_converter hook).

    Sparse weights: DENSIFY makes the dense tensor at import time (a "prefetched" constant), but
    TVM's DEQUANTIZE then reads the raw buffer of DENSIFY's output, which has none, and fails with
    ``TypeError: a bytes-like object is required, not 'int'``. Here DEQUANTIZE takes the densified
    constant (fp16 weights are widened to fp32, int8 ones dequantized with their parameters).
    """
    from tvm import relax
    from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

    class EdgepackOperatorConverter(OperatorConverter):
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


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # TVM errors put the useful line last (after a C++ backtrace)
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line.strip()[:400]
    return lines[0].strip()[:400] if lines else text
