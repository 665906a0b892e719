"""Read a model whatever its format: what it holds (``inspect_model``, never failing on unsupported
operators: it reports them) and its Relax IRModule with static input shapes (``import_model``, or a
clear :class:`~edgepack.errors.EdgepackError` naming what is wrong)."""

from __future__ import annotations

from pathlib import Path

from edgepack.dims import Dims, dims_used, is_dim_name
from edgepack.errors import ModelError, ShapeError, first_line
from edgepack.frontends.onnx import import_onnx, inspect_onnx
from edgepack.frontends.tflite import import_tflite, inspect_tflite
from edgepack.frontends.types import ImportedModel, ModelInfo, format_shape
from edgepack.tensors import Dim, ModelFormat, TensorSpec


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
    return inspect_onnx(path) if fmt == "onnx" else inspect_tflite(path)


def parse_input_shapes(specs: list[str] | None) -> dict[str, tuple[Dim, ...]]:
    """Parse ``NAME:1,3,224,224`` strings (the CLI's ``--input-shape``); a dimension may name a ``--dim``
    (``x:1,3,48,W``)."""
    shapes: dict[str, tuple[Dim, ...]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(d.strip() if is_dim_name(d.strip()) else int(d) for d in dims.split(",") if d.strip())
            if not shape or any(isinstance(d, int) and d <= 0 for d in shape):
                raise ValueError
        except ValueError:
            raise ShapeError(
                f"Cannot read input shape {spec!r}.",
                "Write it as NAME:D0,D1,... with positive integers, or names of --dim ranges for the dimensions"
                " that change at run time, e.g. --input-shape x:1,3,224,224 or --input-shape x:1,3,48,W --dim W=32..1280.",
            ) from None
        shapes[name] = shape
    return shapes


def resolve_input_shapes(info: ModelInfo, overrides: dict[str, tuple[Dim, ...]] | None,
                         dims: Dims | None = None) -> tuple[TensorSpec, ...]:
    """Input specs: the model's shapes with ``overrides`` applied, or a ShapeError. Dimensions may name a range
    of ``dims``; every other dimension is fixed."""
    overrides = dict(overrides or {})
    dims = dict(dims or {})
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
                    f"Input {spec.name!r} has rank {len(spec.shape)} {format_shape(spec.shape)},"
                    f" but --input-shape gives rank {len(shape)} {format_shape(shape)}.",
                    f"Give {len(spec.shape)} dimensions.",
                )
            for i, (want, got) in enumerate(zip(spec.shape, shape)):
                if isinstance(got, str) and got not in dims:
                    raise ShapeError(
                        f"--input-shape {spec.name}:{','.join(map(str, shape))} names the dimension {got}, which has"
                        " no range.", f"Give its range with --dim, e.g. --dim {got}=32..1024.")
                if isinstance(want, int) and want != got:
                    raise ShapeError(
                        f"Input {spec.name!r} has a fixed dimension {i} of {want}, but --input-shape gives {got}.",
                        f"Only dynamic dimensions can be set; use {format_shape(spec.shape)} with the dynamic ones filled in.",
                    )
            resolved.append(TensorSpec(spec.name, spec.dtype, shape))
        elif spec.is_static:
            resolved.append(spec)
        else:
            dynamic.append(spec)
    unused = sorted(set(dims) - set(dims_used(tuple(resolved))))
    if unused:
        raise ShapeError(f"--dim {', '.join(unused)} is not used by any --input-shape.",
                         "Name it in the input's shape, e.g. --input-shape x:1,3,48," + unused[0] + ".")
    if dynamic:
        listing = "; ".join(
            f"{s.name} {format_shape(s.shape)} (dynamic: {', '.join(f'dim {i}' for i in s.dynamic_dims)})"
            for s in dynamic
        )
        example = " ".join(
            f"--input-shape {s.name}:{','.join(str(d) if isinstance(d, int) else '1' for d in s.shape)}"
            for s in dynamic
        )
        raise ShapeError(
            f"The model has dynamic input dimensions: {listing}.",
            f"Fix them with --input-shape, e.g. {example}; or name the ones that change at run time and give"
            " their range, e.g. --input-shape x:1,3,48,W --dim W=32..1280.",
        )
    return tuple(resolved)


def import_model(path: Path | str, input_shapes: dict[str, tuple[Dim, ...]] | None = None,
                 dims: Dims | None = None) -> ImportedModel:
    """Import the model into a Relax IRModule with the given input shapes: static, or with dimensions that
    name a range of ``dims`` (symbolic in the program, which is planned for their largest sizes)."""
    info = inspect_model(path)
    require_supported_operators(info)
    inputs = resolve_input_shapes(info, input_shapes, dims)
    if dims and info.format != "onnx":
        raise ShapeError(f"{info.path.name}: dimensions that change at run time (--dim) work for ONNX models;"
                         " TFLite models are compiled at fixed shapes so far.",
                         "Drop --dim and fix the shape with --input-shape (one build per size).")
    try:
        mod = import_onnx(info, inputs, dims) if info.format == "onnx" else import_tflite(info, inputs)
    except Exception as exc:  # TVM's frontends raise anything from OpNotImplemented to KeyError
        raise ModelError(
            f"TVM's {info.format.upper()} importer failed on {info.path.name}: {first_line(exc)}",
            "This operator configuration is not supported yet; `edgepack inspect` lists the operators."
            " Please report it with the model attached.",
        ) from exc
    return ImportedModel(info=info, mod=mod, inputs=inputs, dims=dict(dims or {}))


def require_supported_operators(info: ModelInfo) -> None:
    if info.unsupported_operators:
        listing = ", ".join(f"{op} (x{n})" for op, n in sorted(info.unsupported_operators.items()))
        raise ModelError(
            f"{info.path.name} uses operators edgepack cannot compile: {listing}.",
            "Re-export the model without them (e.g. a lower ONNX opset, or TFLite builtins instead of"
            " custom ops), or replace them in the model.",
        )
