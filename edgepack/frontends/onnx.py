"""ONNX models: read what they hold, and import them into Relax through TVM's frontend with edgepack's
converters (``edgepack.frontends.onnx_ops``) after ONNX Runtime's basic constant folding.

``onnx_ops`` subclasses TVM's converters, so importing it imports TVM (seconds): it is imported where
it is used, not when this module loads (``edgepack --help`` must stay quick)."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from edgepack.dims import DimRange, Dims, dims_used
from edgepack.errors import ModelError, first_line
from edgepack.files import file_sha256
from edgepack.frontends.types import ModelInfo
from edgepack.tensors import Dim, TensorSpec, worth_storing


def load_onnx(path: Path):
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise ModelError(
            f"{path} is not a readable ONNX model: {first_line(exc)}.",
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


def inspect_onnx(path: Path) -> ModelInfo:
    model = load_onnx(path)
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_onnx_value_spec(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_onnx_value_spec(v) for v in model.graph.output)
    counts = Counter(_onnx_op_name(node) for node in model.graph.node)
    from edgepack.frontends.onnx_ops import supported_operators

    supported = supported_operators()
    unsupported = {op: n for op, n in counts.items() if op not in supported}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return ModelInfo(path, "onnx", file_sha256(path), inputs, outputs, dict(counts.most_common()),
                     unsupported, opset, _onnx_output_steps(model, outputs))


def _onnx_output_steps(model, outputs: tuple[TensorSpec, ...]) -> dict[str, float]:
    """8-bit outputs (step 1) and float outputs a DequantizeLinear makes (step: its largest scale)."""
    from onnx import numpy_helper

    constants = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    producers = {out: node for node in model.graph.node for out in node.output}
    steps = {}
    for spec in outputs:
        node = producers.get(spec.name)
        if spec.dtype in ("int8", "uint8"):
            steps[spec.name] = 1.0
        elif node is not None and node.op_type == "DequantizeLinear" and len(node.input) > 1 \
                and node.input[1] in constants:
            steps[spec.name] = float(abs(numpy_helper.to_array(constants[node.input[1]])).max())
    return steps


def _onnx_op_name(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def import_onnx(info: ModelInfo, inputs: tuple[TensorSpec, ...], dims: Dims | None = None):
    """The model as a Relax IRModule; a dimension named in ``inputs`` is a symbolic variable of ``main``
    whose largest value (``dims``) plans its memory."""
    from edgepack.frontends.onnx_ops import from_onnx  # TVM's frontend with edgepack's converters

    static = load_onnx(info.path)
    folded = _fold_onnx_constants(static, inputs)  # also fixes the input shapes of ``static``
    dims = dims or {}
    symbols = {name: SteppedDim(dims[name]) for name in dims_used(inputs)}
    kwargs = {"shape_dict": {t.name: [symbols[d].value if d in symbols else d for d in t.shape] for t in inputs},
              "dtype_dict": {t.name: t.dtype for t in inputs}, "opset": info.opset}
    try:
        mod = from_onnx(folded, **kwargs)
    except Exception as first:
        if folded is static:
            raise
        # ONNX Runtime inlines function operators it has no kernel for (GroupNormalization-21, ...)
        # into shape arithmetic TVM cannot import; edgepack converts those itself: try the graph as written.
        try:
            mod = from_onnx(static, **kwargs)
        except Exception:  # noqa: BLE001 - the folded graph's error is the one to report
            raise first from None
    return with_symbolic_inputs(mod, inputs, symbols) if symbols else mod


class SteppedDim:
    """A ``--dim`` in the program. With a step the model sees ``step * n + rest`` (``rest = min % step``) and
    ``n`` is the variable: a detector's H in 320..640:32 is ``32 * n``, so that the 1/32 feature map it makes
    (``(H - 1) // 32 + 1``) upsampled twice is provably the 1/16 map it is added to, as the model's grid
    promises; ``main`` takes the plain H and defines ``n`` from it (checking the step at run time)."""

    def __init__(self, r: DimRange):
        from tvm import tirx

        self.range = r
        self.outer = tirx.Var(r.name, "int64")  # what main's parameter shape says
        self.rest = r.min % r.step
        self.inner = tirx.Var(r.inner_name, "int64") if r.step > 1 else self.outer
        self.value = self.inner * r.step + self.rest if r.step > 1 else self.outer

    @property
    def stepped(self) -> bool:
        return self.range.step > 1

    def upper_bounds(self) -> dict[str, int]:
        bounds = {self.outer.name: self.range.max}
        if self.stepped:
            bounds[self.inner.name] = (self.range.max - self.rest) // self.range.step
        return bounds


def with_symbolic_inputs(mod, inputs: tuple[TensorSpec, ...], symbols: dict[str, SteppedDim]):
    """``main`` taking each input with its plain dims (``x: 1,3,H,W``), the stepped ones' variables defined from
    them in a first binding block, and annotated with every variable's largest value, which Relax's memory
    planning reads (``tir_var_upper_bound``), and as non-negative (``tir_non_negative_var``)."""
    from tvm import relax, tirx

    main = mod["main"]
    stepped = [d for d in symbols.values() if d.stepped]
    if stepped:
        params, bindings = [], []
        known = relax.ShapeExpr([tirx.floordiv(d.outer - d.rest, d.range.step) for d in stepped])
        bindings.append(relax.MatchCast(relax.Var("stepped_dims", relax.ShapeType([d.inner for d in stepped])), known,
                                        relax.ShapeType([d.inner for d in stepped])))
        by_name = {t.name: t for t in inputs}
        for param in main.params:
            spec = by_name.get(param.name)
            if spec is None or not any(isinstance(d, str) and symbols[d].stepped for d in spec.shape):
                params.append(param)
                continue
            outer_shape = [symbols[d].outer if isinstance(d, str) else d for d in spec.shape]
            plain = relax.Var(param.name, relax.TensorType(outer_shape, param.ty.dtype))
            params.append(plain)
            bindings.append(relax.MatchCast(param, plain, param.ty))  # H == step * n + rest, checked
        body = main.body
        body = relax.SeqExpr([relax.BindingBlock(bindings), *body.blocks], body.body)
        main = relax.Function(params, body, main.ret_ty, main.is_pure, main.attrs)
    bounds = {k: v for d in symbols.values() for k, v in d.upper_bounds().items()}
    main = main.with_attr("tir_var_upper_bound", bounds)
    main = main.with_attr("tir_non_negative_var", list(bounds))
    mod["main"] = main
    return mod


def _tensor_bytes(tensor) -> int:
    """A TensorProto's size from its dims and type (its data is not read)."""
    import numpy as np
    from onnx import helper

    return int(np.prod(tensor.dims, dtype=np.int64)) * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def _expansions_computed(original, folded):
    """``folded`` with each constant ONNX Runtime made that is many times what it was made from
    (``tensors.worth_storing``: a ConstantOfShape, an Expand or a Tile of a few values) computed again by
    the original nodes that make it, from the original's initializers: stored, an 80 KB model became a
    78 MB program. A chain that reads a model input (a shape) stays folded: TVM's importer needs those."""
    import onnx

    produced = {out: (index, node) for index, node in enumerate(original.graph.node) for out in node.output}
    sources = {t.name: t for t in original.graph.initializer}
    kept = {t.name: t for t in folded.graph.initializer}
    graph_inputs = {v.name for v in original.graph.input}
    nodes: dict[int, onnx.NodeProto] = {}
    leaves: dict[str, onnx.TensorProto] = {}
    dropped: set[str] = set()
    for made in folded.graph.initializer:
        made_bytes = _tensor_bytes(made)
        if made.name in sources or made.name not in produced or worth_storing(made_bytes, 0):
            continue  # the model's own, or small whatever it is made from
        chain: dict[int, onnx.NodeProto] = {}
        read: dict[str, onnx.TensorProto] = {}
        source_bytes, stack, seen = 0, [made.name], set()
        while stack:
            name = stack.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            if name in sources or (name != made.name and name in kept):
                read[name] = sources.get(name) or kept[name]
                source_bytes += _tensor_bytes(read[name])
                continue
            if name in graph_inputs or name not in produced:
                chain = {}
                break
            index, node = produced[name]
            chain[index] = node
            for attribute in node.attribute:  # a Constant node's value
                if attribute.type == onnx.AttributeProto.TENSOR:
                    source_bytes += _tensor_bytes(attribute.t)
            stack.extend(node.input)
        if not chain or worth_storing(made_bytes, source_bytes):
            continue
        dropped.add(made.name)
        nodes.update(chain)
        leaves.update(read)
    if not dropped:
        return folded
    result = onnx.ModelProto()
    result.CopyFrom(folded)
    del result.graph.initializer[:]
    result.graph.initializer.extend(t for t in folded.graph.initializer if t.name not in dropped)
    result.graph.initializer.extend(t for name, t in leaves.items() if name not in kept)
    restored = [nodes[i] for i in sorted(nodes)]
    del result.graph.node[:]
    result.graph.node.extend([*restored, *folded.graph.node])
    return result


def _fold_onnx_constants(model, inputs: tuple[TensorSpec, ...]):
    """Fix the input shapes in the graph, then let ONNX Runtime fold what they make constant.

    Exporters often compute reshape targets at run time (Shape -> Slice -> Concat -> Reshape);
    TVM's importer needs them constant. ONNX Runtime's *basic* level only folds constants and
    fuses standard operators (no contrib ops), so the result is still a plain ONNX graph.
    If ONNX Runtime cannot load the static-shape model, the model with its own (dynamic) input shapes is
    folded instead; if it cannot load that either, the static-shape model is returned unchanged.
    """
    import onnx

    # Old ONNX IR (< 4) lists every weight as a graph input too; for deployment they are constants.
    initializers = {init.name for init in model.graph.initializer}
    real_inputs = [v for v in model.graph.input if v.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(real_inputs)
    model.ir_version = max(model.ir_version, 4)
    dynamic = onnx.ModelProto()
    dynamic.CopyFrom(model)
    shapes = {t.name: t.shape for t in inputs}
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name]):
                dim.Clear()
                if isinstance(size, str):
                    dim.dim_param = size  # changes at run time: ONNX Runtime folds what does not depend on it
                else:
                    dim.dim_value = int(size)
    # With the static shapes first; if ONNX Runtime rejects that (shape inference of an If branch that
    # cannot run for these shapes, e.g. Silero VAD), with the model's own input shapes: that still
    # folds the constant-only chains (pads, axes) that TVM's importer needs constant.
    for candidate in (model, dynamic):
        try:
            import onnxruntime as ort

            with tempfile.TemporaryDirectory(prefix="edgepack-onnx-") as tmp:
                source, folded = Path(tmp) / "static.onnx", Path(tmp) / "folded.onnx"
                onnx.save(candidate, str(source))
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
                options.optimized_model_filepath = str(folded)
                options.log_severity_level = 3
                ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
                return _expansions_computed(candidate, onnx.load(str(folded)))
        except Exception:  # noqa: BLE001, S112 - folding is an optimisation; TVM may still import the original
            continue
    return model
