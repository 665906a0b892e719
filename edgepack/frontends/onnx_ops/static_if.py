"""ONNX ``If`` nodes whose condition the static input shapes decide: import only the branch taken.

Exporters that trace Python control flow on shapes (``if x.shape[-1] == 1: x = x.squeeze(-1)``,
``if x.dim() == 2: ...``) leave ``If`` nodes whose condition is a function of tensor shapes only,
e.g. Silero VAD: ``If(Equal(Gather(Shape(x), -1), 1))`` around a Squeeze, and
``If(Not(Equal(Size(Shape(x)), 2)))`` around an Unsqueeze before an LSTM. TVM's importer converts
both branches of every ``If`` into the same function and selects at run time, so the branch that
cannot run for the compiled shapes must still type-check: here it cannot (a Squeeze of a dimension
that is not 1, an LSTM given a rank-2 input), and the import fails.

edgepack compiles for static input shapes, so such conditions are constants. This mixin evaluates an
``If``'s condition before its branches are converted: it walks the condition's producers back
through small ONNX operators (Shape, Size, Gather, Equal, Not, Cast, Squeeze, ...) evaluated with
ONNX's reference implementation, reading tensor shapes from the Relax types TVM has already
inferred and values from Relax constants. When that gives a value, only the branch taken is
converted; the ``If`` node keeps both arms pointing at its result (``relax.If(c, X, X)``, which
returns X whatever ``c`` is at run time). A condition that depends on run-time data (a model input
such as Silero's sample rate ``sr``) is left to TVM unchanged.

:class:`StaticIfs` is a mixin for TVM's ``ONNXGraphImporter``, placed before edgepack's subclass of it
(``importer._Importer``) so that it sees every ``If`` branch and operator first. It also records on
``main`` which ONNX node produced each Relax variable (``NAMES_ATTR``), for messages that must name a
tensor the user can find in the model (``edgepack.backends.int64`` reads it).
"""

from __future__ import annotations

from typing import Any

from edgepack.frontends.onnx_ops.if_arms import inline_identical_arms

# Operators a shape condition is evaluated through (all cheap; values are kept small).
_EVALUABLE = {
    "Identity", "Cast", "CastLike", "Gather", "Equal", "Not", "And", "Or", "Xor", "Greater", "Less",
    "GreaterOrEqual", "LessOrEqual", "Squeeze", "Unsqueeze", "Concat", "Slice", "Reshape", "Add",
    "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Min", "Max", "ReduceProd", "ReduceSum", "Constant",
    "ConstantOfShape", "Range", "Where", "Expand", "Flatten",
}
_MAX_ELEMENTS = 4096  # a "shape value" larger than this is not shape arithmetic
_MAX_DEPTH = 64


class _Unknown(Exception):
    """The value depends on run-time data (or on something this evaluator does not model)."""


def _graph_key(graph) -> tuple:
    """Identify a branch GraphProto across protobuf wrapper objects: its name and its outputs'
    names (value names are unique in an ONNX model, so two branches never share outputs)."""
    return (graph.name, tuple(o.name for o in graph.output), len(graph.node))


class StaticIfs:
    """Mixin for TVM's ONNX graph importer (first among the bases): converts only the taken branch of
    ``If`` nodes whose condition is decided by static shapes and constants."""

    def from_onnx(self, graph, opset: int):
        self._static_producers: dict[str, Any] = {}
        self._static_branches: dict[tuple, tuple[str, bool, tuple]] = {}
        self._static_taken: dict[tuple, Any] = {}
        self._static_runtime_then: dict[tuple, Any] = {}
        self._static_if_names: dict[tuple, tuple[str, str]] = {}
        self.static_if_notes: list[str] = []
        self._static_node_names: list = []
        self._index_graph(graph)
        mod = inline_identical_arms(super().from_onnx(graph, opset))
        return _attach_node_names(mod, self._static_node_names)

    def _index_graph(self, graph) -> None:
        from onnx import AttributeProto

        for node in graph.node:
            for out in node.output:
                if out:
                    self._static_producers[out] = node
            branches = {}
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    self._index_graph(attr.g)
                    branches[attr.name] = attr.g
                elif attr.type == AttributeProto.GRAPHS:
                    for g in attr.graphs:
                        self._index_graph(g)
            if node.op_type == "If" and node.input and {"then_branch", "else_branch"} <= set(branches):
                then_key, else_key = _graph_key(branches["then_branch"]), _graph_key(branches["else_branch"])
                self._static_branches[then_key] = (node.input[0], True, else_key)
                self._static_branches[else_key] = (node.input[0], False, then_key)
                label = node.name or node.output[0]
                self._static_if_names[then_key] = (label, "then")
                self._static_if_names[else_key] = (label, "else")

    def _convert_subgraph(self, bb, graph):
        key = _graph_key(graph)
        found = getattr(self, "_static_branches", {}).get(key)
        if found is None:
            return super()._convert_subgraph(bb, graph)
        cond_name, is_then, other_key = found
        if key in self._static_taken:  # the other arm was decided and converted already
            return self._static_taken.pop(key)
        cond = self._static_condition(cond_name)
        if cond is None:
            return self._convert_runtime_arm(bb, graph, key, is_then, other_key)
        if cond == is_then:  # this is the branch taken
            result = super()._convert_subgraph(bb, graph)
            self._static_taken[other_key] = result
            return result
        # this branch is never taken for the compiled shapes: convert the taken one instead
        taken = self._graph_by_key(other_key)
        result = super()._convert_subgraph(bb, taken)
        self._static_taken[other_key] = result
        return result

    def _convert_runtime_arm(self, bb, graph, key, is_then: bool, other_key):
        """An arm of an If decided at run time. TVM computes both arms before selecting, so an
        arm that cannot be built for the compiled input shapes (ONNX Runtime fails in it too, e.g.
        Silero VAD's 8 kHz network given a 16 kHz frame) fails the whole import: such an arm is
        replaced by the other one, with a warning; if both fail, the first error stands."""
        try:
            result = super()._convert_subgraph(bb, graph)
        except Exception as exc:  # noqa: BLE001  TVM's converters raise anything
            if not is_then:  # the then-arm built: the If takes it whatever the condition
                self._note_dropped(key, exc)
                return self._static_runtime_then.pop(other_key)
            try:
                result = super()._convert_subgraph(bb, self._graph_by_key(other_key))
            except Exception:  # noqa: BLE001
                raise exc from None
            self._note_dropped(key, exc)
            self._static_taken[other_key] = result
            return result
        if is_then:
            self._static_runtime_then[key] = result
        return result

    def _note_dropped(self, key, exc: Exception) -> None:
        import warnings

        node, arm = self._static_if_names.get(key, ("If", "?"))
        first = next((ln.strip() for ln in reversed(str(exc).strip().splitlines()) if ln.strip()), "")
        note = (f"ONNX If node {node!r}: its {arm} branch cannot be built for the compiled input shapes "
                f"({type(exc).__name__}: {first[:200]}); the compiled model always takes the other branch "
                "(inputs that select this branch make ONNX Runtime fail as well).")
        self.static_if_notes.append(note)
        warnings.warn(note, stacklevel=2)

    def _convert_operator(self, op_name: str, inputs, attrs: dict, opset: int):
        if op_name == "Size" and inputs and inputs[0] is not None:
            # TVM's Size fails on a Shape's result (a ShapeExpr); with static shapes it is a constant
            import numpy as np
            from tvm import relax

            try:
                shape = _shape_of(inputs[0])
            except _Unknown:
                shape = None
            if shape is not None:
                return relax.const(np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64), "int64")
        inputs = self._with_arm_shapes(inputs)
        result = super()._convert_operator(op_name, inputs, attrs, opset)
        node = (attrs.get("tvm_custom") or {}).get("name") if isinstance(attrs, dict) else None
        if node:
            self._static_node_names.append((result, str(node)))
        return result

    def _with_arm_shapes(self, inputs):
        """``inputs`` with each If result whose arms have the same shape cast to that shape.

        Relax types an If by what its arms have in common and keeps a symbolic extent only where it is a plain
        variable: both arms ``(1, 1, 512 * n + 192)`` (``--dim N=512..1536:512``, Silero's STFT input) give a
        rank-3 tensor of unknown shape, which the LSTM after it cannot take. The cast (``match_cast``, checked
        at run time) restores what both arms say."""
        import tvm_ffi
        from tvm import relax

        result = type(inputs)(inputs)  # TVM's onnx_input: None past its end
        for i, x in enumerate(inputs):
            if not isinstance(x, relax.Var) or not isinstance(x.ty, relax.TensorType) or x.ty.shape is not None:
                continue
            bound = self.bb.lookup_binding(x)
            if not isinstance(bound, relax.If):
                continue
            arms = [getattr(arm, "body", arm).ty for arm in (bound.true_branch, bound.false_branch)]
            if all(isinstance(t, relax.TensorType) and t.shape is not None for t in arms) \
                    and tvm_ffi.structural_equal(arms[0], arms[1]):
                result[i] = self.bb.match_cast(x, arms[0])
        return result

    def _graph_by_key(self, key: tuple):
        for node in self._static_producers.values():
            if node.op_type != "If":
                continue
            for attr in node.attribute:
                if attr.name in ("then_branch", "else_branch") and _graph_key(attr.g) == key:
                    return attr.g
        raise KeyError(key)

    # --- evaluating a condition from static shapes and constants ---

    def _static_condition(self, name: str) -> bool | None:
        import numpy as np

        try:
            value = np.asarray(self._static_value(name, 0))
        except _Unknown:
            return None
        except Exception:  # noqa: BLE001  anything the reference implementation refuses: not static
            return None
        if value.size != 1:
            return None
        return bool(value.reshape(-1)[0])

    def _static_value(self, name: str, depth: int):
        import numpy as np
        import tvm
        from tvm import relax

        if depth > _MAX_DEPTH:
            raise _Unknown(name)
        expr = self._nodes.get(name)
        if isinstance(expr, tvm.ir.GenericConst):
            value = expr.value.numpy()
            if value.size > _MAX_ELEMENTS:
                raise _Unknown(name)
            return value
        if isinstance(expr, relax.ShapeExpr):
            return np.array([_static_int(v) for v in expr.values], dtype=np.int64)
        if expr is not None and tvm.ir.is_prim_expr(expr):  # e.g. Gather of one dimension of a shape
            return np.array(_static_int(expr), dtype=np.int64)
        node = self._static_producers.get(name)
        if node is None:
            raise _Unknown(name)  # a model input or an initializer TVM did not make a constant
        if node.op_type in ("Shape", "Size"):
            shape = self._static_shape(node.input[0])
            if node.op_type == "Size":
                return np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
            attrs = {a.name: a.i for a in node.attribute}
            start, end = attrs.get("start", 0), attrs.get("end", len(shape))
            return np.array(shape, dtype=np.int64)[start:end]
        if node.op_type not in _EVALUABLE:
            raise _Unknown(name)
        feeds = {i: self._static_value(i, depth + 1) for i in node.input if i}
        from onnx.reference import ReferenceEvaluator

        outputs = ReferenceEvaluator(node).run(None, feeds)
        value = np.asarray(outputs[list(node.output).index(name)])
        if value.size > _MAX_ELEMENTS:
            raise _Unknown(name)
        return value

    def _static_shape(self, name: str) -> list[int]:
        return _shape_of(self._nodes.get(name))


def _static_int(value) -> int:
    from tvm import tirx

    if isinstance(value, tirx.IntImm):
        return int(value.value)
    raise _Unknown(str(value))


def _shape_of(expr) -> list[int]:
    """The static shape of a Relax tensor expression (a ShapeExpr: its length), else _Unknown."""
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and ty.shape is not None:
        return [_static_int(v) for v in ty.shape.values]
    if isinstance(ty, relax.ShapeType) and ty.ndim >= 0:  # a shape value: rank 1, ndim entries
        return [int(ty.ndim)]
    raise _Unknown(str(expr)[:40])


#: Function attribute of ``main``: {Relax variable name: ONNX node name}, for messages that must name
#: a tensor the user can find in the model (edgepack.backends.int64 reads it: its NAMES_ATTR).
NAMES_ATTR = "edgepack.onnx_names"


def _name_inner_bindings(bindings: list, names: dict[str, str]) -> None:
    """Name each unnamed binding after the node of the first later binding that reads it (through unnamed
    ones): a converter that emits several bindings (NMS, then its first output, then a ``match_cast``
    naming its data-dependent shape) returns only its last."""
    import tvm_ffi
    from tvm import relax

    first_reader: dict = {}
    for binding in bindings:
        used: list = []
        tvm_ffi.structural_walk(binding.value, [(relax.Var, used.append)])
        for u in used:
            first_reader.setdefault(u, binding.var)
    for binding in reversed(bindings):
        reader = first_reader.get(binding.var)
        if binding.var.name not in names and reader is not None and reader.name in names:
            names[binding.var.name] = names[reader.name]


def _attach_node_names(mod, converted: list) -> Any:
    """``mod`` with ``main`` annotated with the ONNX node that produced each bound variable."""
    from tvm import relax

    main = mod["main"] if any(gv.name_hint == "main" for gv in mod.get_global_vars()) else None
    if main is None or not converted:
        return mod
    by_expr = {}
    for expr, node in converted:
        by_expr.setdefault(expr, node)
    names: dict[str, str] = {}
    stack = [main.body]
    while stack:
        seq = stack.pop()
        bindings = [b for block in seq.blocks for b in block.bindings]
        for binding in bindings:
            value = binding.value
            if isinstance(value, relax.If):
                stack.extend([value.true_branch, value.false_branch])
            node = by_expr.get(value)
            if node is None and isinstance(binding, relax.MatchCast):  # a data-dependent shape named
                node = by_expr.get(binding.var)
            if node is not None:
                names[binding.var.name] = node
        _name_inner_bindings(bindings, names)
    if names:
        mod.update_func(mod.get_global_var("main"), main.with_attr(NAMES_ATTR, names))
    return mod
