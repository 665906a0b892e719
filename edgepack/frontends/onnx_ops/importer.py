"""TVM's ONNX graph importer running edgepack's converter map, and ``from_onnx``.

TVM 0.27's ``from_onnx`` has no hook for extra converters: its importer looks operators up in the
module function ``_get_convert_map()``. Rather than patching the installed package, edgepack runs
the frontend's own ``ONNXGraphImporter`` through a subclass whose two lookups use
:func:`~edgepack.frontends.onnx_ops.registry.convert_map` (TVM's map with edgepack's converters laid
over it). Everything else (graph walking, attributes, If subgraphs, constants) is TVM's code, unchanged.
The subclass also handles the operators whose bodies are subgraphs (Loop and Scan, unrolled over
static trip counts, and FlexAttention's score/prob modifiers), and keeps sub-byte types (INT4,
FLOAT4E2M1...) in 8-bit containers because TVM tensors must be whole bytes. ``from_onnx`` runs it with
``static_if.StaticIfs`` in front: ``If`` nodes that the static input shapes decide import only the
branch taken, and ``main`` records the ONNX node name of each variable.
"""

from __future__ import annotations

from typing import Any

from tvm.relax.frontend.onnx import onnx_frontend as _tvm

from edgepack.frontends.onnx_ops.common import _constant_of
from edgepack.frontends.onnx_ops.registry import _SUBGRAPH_OPS, convert_map
from edgepack.frontends.onnx_ops.static_if import StaticIfs
from edgepack.frontends.onnx_ops.subbyte import _SUBBYTE_TYPES, SUBBYTE_CONTAINERS, container_dtype, to_container
from edgepack.frontends.onnx_ops.symbolic import (
    agree_operands,
    folded_shape_arithmetic,
    shape_arithmetic,
    static_shape_as_constant,
)


class _Importer(_tvm.ONNXGraphImporter):
    """TVM's graph importer, looking operators up in edgepack's map instead of TVM's."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._edgepack_map = convert_map()

    def _parse_array(self, tensor_proto):
        from onnx import numpy_helper

        array = numpy_helper.to_array(tensor_proto).reshape(tuple(tensor_proto.dims))
        import tvm

        return tvm.runtime.tensor(to_container(array))

    def _parse_graph_initializers(self, graph) -> None:
        super()._parse_graph_initializers(graph)
        self._mark_subbyte(graph.initializer, lambda t: t.data_type)

    def _parse_graph_input(self, graph) -> None:
        super()._parse_graph_input(graph)
        self._mark_subbyte(graph.input, lambda v: v.type.tensor_type.elem_type)

    def _mark_subbyte(self, values, elem_type) -> None:
        from onnx import helper

        known = _SUBBYTE_TYPES.get()
        for value in values:
            code = elem_type(value)
            name = str(helper.tensor_dtype_to_np_dtype(code)) if code else ""
            if known is not None and name in SUBBYTE_CONTAINERS and value.name in self._nodes:
                known[self._nodes[value.name]] = name

    def _check_for_unsupported_ops(self, graph) -> None:
        missing = sorted({n.op_type for n in graph.node} - set(self._edgepack_map) - _SUBGRAPH_OPS)
        if missing:
            import tvm

            raise tvm.error.OpNotImplemented(
                "The following operators are not supported for frontend ONNX: " + ", ".join(missing))

    # --- Loop / Scan: unrolled, since their bodies are subgraphs (like TVM's own If handling) ---

    def _convert_operator(self, op_name: str, inputs, attrs: dict, opset: int):
        if op_name == "FlexAttention":
            return self._convert_flex_attention(inputs, attrs)
        if op_name == "Loop":
            return self._convert_loop(inputs, attrs)
        if op_name == "Scan":
            return self._convert_scan(inputs, attrs, opset)
        return self._convert_mapped(op_name, inputs, attrs, opset)

    def _convert_flex_attention(self, inputs, attrs: dict):
        """ai.onnx.preview.FlexAttention: attention whose scores / probabilities pass through
        user subgraphs (score_mod, prob_mod), converted inline like If branches."""
        import numpy as np
        from tvm import relax

        bb = self.bb
        q, k, v = inputs[0], inputs[1], inputs[2]
        dt = str(q.ty.dtype)
        head, q_heads, kv_heads = int(q.ty.shape[3]), int(q.ty.shape[1]), int(k.ty.shape[1])
        scale = attrs.get("scale")
        scale = 1.0 / np.sqrt(head) if scale is None else float(scale)
        if q_heads != kv_heads:
            k = bb.normalize(relax.op.repeat(k, q_heads // kv_heads, axis=1))
            v = bb.normalize(relax.op.repeat(v, q_heads // kv_heads, axis=1))
        root = relax.const(np.array(np.sqrt(np.float32(scale)), dtype=dt), dt)
        scores = bb.normalize(relax.op.matmul(q * root, relax.op.permute_dims(bb.normalize(k * root), [0, 1, 3, 2])))
        precision = attrs.get("softmax_precision")
        if precision is not None:
            from onnx import helper

            cdt = str(helper.tensor_dtype_to_np_dtype(int(precision)))
        else:
            cdt = "float32" if dt in ("float16", "bfloat16") else dt
        if cdt != dt:
            scores = bb.normalize(relax.op.astype(scores, cdt))
        if "score_mod" in attrs:
            graph = attrs["score_mod"]
            scores = self._run_body(graph, {graph.input[0].name: scores})[0]
        probs = bb.normalize(relax.op.nn.softmax(scores, axis=-1))
        if "prob_mod" in attrs:
            graph = attrs["prob_mod"]
            probs = self._run_body(graph, {graph.input[0].name: probs})[0]
        vv = bb.normalize(relax.op.astype(v, cdt)) if cdt != str(v.ty.dtype) else v
        out = relax.op.matmul(probs, vv)
        return relax.op.astype(out, str(v.ty.dtype)) if cdt != str(v.ty.dtype) else out

    def _run_body(self, graph, bindings: dict) -> list:
        from tvm import relax

        saved = dict(self._nodes)
        self._nodes.update(bindings)
        try:
            result = self._convert_subgraph(self.bb, graph)
        finally:
            self._nodes = saved
        items = list(result.fields) if isinstance(result, relax.Tuple) else [result]
        return [self.bb.normalize(item) for item in items]

    def _convert_loop(self, inputs, attrs: dict):
        """Loop with a constant trip count (and a condition that stays constant): the body is
        converted once per iteration with the iteration number as a constant."""
        import numpy as np
        from tvm import relax

        body = attrs["body"]
        trip = _constant_of(inputs[0]) if inputs[0] is not None else None
        if trip is None:
            raise ValueError("Loop needs a constant trip count (M) to be unrolled.")
        cond = inputs[1] if len(inputs) > 1 else None
        cond_value = True if cond is None else _constant_of(cond)
        if cond_value is None:
            raise ValueError("Loop needs a constant initial condition to be unrolled.")
        carried = list(inputs[2:])
        scans: list[list] = []
        names = [v.name for v in body.input]
        for i in range(int(np.asarray(trip).reshape(-1)[0])):
            if not bool(np.asarray(cond_value).reshape(-1)[0]):
                break
            bindings = {names[0]: relax.const(np.array(i, dtype="int64"), "int64"),
                        names[1]: relax.const(np.array(True), "bool")}
            bindings.update({n: v for n, v in zip(names[2:], carried)})
            outs = self._run_body(body, bindings)
            cond_value = _constant_of(outs[0])
            if cond_value is None:
                raise ValueError("Loop's condition depends on run-time data; only constant conditions unroll.")
            carried = outs[1:1 + len(carried)]
            for j, s in enumerate(outs[1 + len(carried):]):
                if len(scans) <= j:
                    scans.append([])
                scans[j].append(s)
        results = carried + [self.bb.normalize(relax.op.stack(s, axis=0)) for s in scans]
        return results[0] if len(results) == 1 else relax.Tuple(results)

    def _convert_scan(self, inputs, attrs: dict, opset: int):
        from tvm import relax

        body = attrs["body"]
        n_scan = int(attrs["num_scan_inputs"])
        if opset < 9:  # Scan-8: a leading sequence_lens input and a batch axis on everything
            states, xs = list(inputs[1:len(inputs) - n_scan]), list(inputs[len(inputs) - n_scan:])
            batch = int(xs[0].ty.shape[0])
            per_batch = []
            for b in range(batch):
                pick = [self.bb.normalize(relax.op.squeeze(relax.op.strided_slice(t, [0], [b], [b + 1]), [0]))
                        for t in states + xs]
                per_batch.append(self._scan(body, pick[:len(states)], pick[len(states):], attrs, scan_axis_default=0))
            outs = [self.bb.normalize(relax.op.stack([p[k] for p in per_batch], axis=0))
                    for k in range(len(per_batch[0]))]
        else:
            states, xs = list(inputs[:len(inputs) - n_scan]), list(inputs[len(inputs) - n_scan:])
            outs = self._scan(body, states, xs, attrs, scan_axis_default=0)
        return outs[0] if len(outs) == 1 else relax.Tuple(outs)

    def _scan(self, body, states, xs, attrs, scan_axis_default):
        from tvm import relax

        in_axes = list(attrs.get("scan_input_axes", [scan_axis_default] * len(xs)))
        in_dirs = list(attrs.get("scan_input_directions", [0] * len(xs)))
        steps = [int(d) for d in xs[0].ty.shape][in_axes[0]]
        names = [v.name for v in body.input]
        collected: list[list] = []
        for t in range(steps):
            bindings = dict(zip(names, states))
            for j, x in enumerate(xs):
                axis = in_axes[j] % len(x.ty.shape)
                idx = steps - 1 - t if in_dirs[j] else t
                bindings[names[len(states) + j]] = self.bb.normalize(
                    relax.op.squeeze(relax.op.strided_slice(x, [axis], [idx], [idx + 1]), [axis]))
            outs = self._run_body(body, bindings)
            states = outs[:len(states)]
            for j, s in enumerate(outs[len(states):]):
                if len(collected) <= j:
                    collected.append([])
                collected[j].append(s)
        out_axes = list(attrs.get("scan_output_axes", [0] * len(collected)))
        out_dirs = list(attrs.get("scan_output_directions", [0] * len(collected)))
        stacked = []
        for j, items in enumerate(collected):
            items = items[::-1] if out_dirs[j] else items
            rank = len(items[0].ty.shape) + 1
            stacked.append(self.bb.normalize(relax.op.stack(items, axis=out_axes[j] % rank)))
        return list(states) + stacked

    def _convert_mapped(self, op_name: str, inputs, attrs: dict, opset: int):
        if op_name not in self._edgepack_map:
            raise NotImplementedError(f"Operator {op_name} not implemented.")
        converter = self._edgepack_map[op_name].get_converter(opset)
        shape = shape_arithmetic(op_name, inputs, attrs)
        if shape is not None:
            return static_shape_as_constant(shape)
        inputs = agree_operands(self.bb, op_name, inputs, attrs)
        sym = converter(self.bb, inputs, attrs, [self._nodes, self._params])
        from tvm import relax

        if isinstance(sym, relax.Expr):
            sym = self.bb.normalize(sym)
            sym = folded_shape_arithmetic(op_name, inputs, attrs, sym)
        return static_shape_as_constant(sym)


class _ModelImporter(StaticIfs, _Importer):
    """edgepack's importer with ``If`` nodes decided by the static shapes (``static_if``) seen first."""


def from_onnx(model, shape_dict: dict[str, list] | None = None, dtype_dict: dict[str, str] | str | None = "float32",
              opset: int | None = None):
    """``tvm.relax.frontend.onnx.from_onnx`` with edgepack's converters (same arguments)."""
    if model.ir_version < 3:
        raise ValueError(f"Model IR version {model.ir_version} is too old (ONNX before 1.1.0).")
    if opset is None:
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if isinstance(dtype_dict, dict):
        dtype_dict = {k: container_dtype(v) for k, v in dtype_dict.items()}
    token = _SUBBYTE_TYPES.set({})
    try:
        return _ModelImporter(shape_dict, dtype_dict).from_onnx(model.graph, opset)
    finally:
        _SUBBYTE_TYPES.reset(token)
