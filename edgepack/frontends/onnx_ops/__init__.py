"""edgepack's ONNX operator converters, registered on top of TVM's Relax ONNX frontend.

TVM 0.27's ``from_onnx`` has no hook for extra converters: its importer looks operators up in the
module function ``_get_convert_map()``. Rather than patching the installed package, edgepack runs
the frontend's own ``ONNXGraphImporter`` through a subclass whose two lookups use
:func:`convert_map` (TVM's map with edgepack's converters laid over it). Everything else (graph
walking, attributes, If subgraphs, constants) is TVM's code, unchanged. The subclass also handles
the operators whose bodies are subgraphs (Loop and Scan, unrolled over static trip counts, and
FlexAttention's score/prob modifiers), and keeps sub-byte types (INT4, FLOAT4E2M1...) in 8-bit
containers because TVM tensors must be whole bytes.

Each converter here fixes a case TVM gets wrong or lacks; most delegate to TVM's converter for the
configurations TVM handles (so common models keep TVM's kernels) and take over the rest. The ONNX
backend node suite (``scripts/onnx_conformance.py``, last run in ``docs/conformance.md``) measures them.
"""

from __future__ import annotations

import contextvars
import itertools
from typing import Any

from tvm.relax.frontend.onnx import onnx_frontend as _tvm

# Operators edgepack converts itself: name -> OnnxOpConverter subclass (filled in below).
EDGEPACK_CONVERTERS: dict[str, type] = {}


# Sub-byte ONNX types (INT4, UINT4, INT2, UINT2, FLOAT4E2M1): TVM tensors must be whole bytes, so
# edgepack carries such values in 8-bit containers, one value per byte, as numpy/ml_dtypes hold them
# (integers by value, FLOAT4E2M1 by its 4-bit code). Model inputs/outputs of these types cross the
# compiled library's boundary as the container type (``to_container`` / ``from_container``).
SUBBYTE_CONTAINERS = {"int4": "int8", "uint4": "uint8", "int2": "int8", "uint2": "uint8", "float4_e2m1fn": "uint8"}
_SUBBYTE_BITS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}


def container_dtype(dtype: str) -> str:
    return SUBBYTE_CONTAINERS.get(str(dtype), str(dtype))


def to_container(array):
    """A numpy array of a sub-byte type as its 8-bit container (others unchanged)."""
    name = str(array.dtype)
    if name == "float4_e2m1fn":
        return _np.asarray(array).view(_np.uint8)
    if name in SUBBYTE_CONTAINERS:
        return _np.asarray(array).astype(SUBBYTE_CONTAINERS[name])
    return array


def from_container(array, dtype: str):
    """The inverse of ``to_container`` for an output whose ONNX type is ``dtype``."""
    import ml_dtypes

    if dtype == "float4_e2m1fn":
        return _np.asarray(array, dtype=_np.uint8).view(ml_dtypes.float4_e2m1fn)
    if dtype in SUBBYTE_CONTAINERS:
        return _np.asarray(array).astype(getattr(ml_dtypes, dtype))
    return array


# While a graph is imported: Relax expression -> its ONNX sub-byte type (the container hides it).
_SUBBYTE_TYPES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("edgepack_subbyte", default=None)


def _true_dtype(expr) -> str:
    known = _SUBBYTE_TYPES.get() or {}
    return known.get(expr, _dtype(expr))


def _mark(bb, expr, dtype: str):
    """Record that ``expr`` (normalized here) holds values of the sub-byte type ``dtype``."""
    expr = bb.normalize(expr)
    known = _SUBBYTE_TYPES.get()
    if known is not None and dtype in SUBBYTE_CONTAINERS:
        known[expr] = dtype
    return expr


# Operators the importer handles itself (their bodies are subgraphs), besides the converter map.
_SUBGRAPH_OPS = {"If", "Loop", "Scan", "Constant", "FlexAttention"}
# Operators of other domains edgepack converts, as ``inspect`` names them (domain.op).
_DOMAIN_OPS = {"ai.onnx.preview.FlexAttention", "ai.onnx.ml.Binarizer", "ai.onnx.ml.ArrayFeatureExtractor",
               "ai.onnx.preview.training.Adagrad", "ai.onnx.preview.training.Adam",
               "ai.onnx.preview.training.Momentum"}


def _constant_of(expr):
    """The numpy value of a Relax constant, else None."""
    import tvm

    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


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
        sym = converter(self.bb, inputs, attrs, [self._nodes, self._params])
        from tvm import relax

        if isinstance(sym, relax.Expr):
            sym = self.bb.normalize(sym)
        return sym


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
        return _Importer(shape_dict, dtype_dict).from_onnx(model.graph, opset)
    finally:
        _SUBBYTE_TYPES.reset(token)


# --- helpers -------------------------------------------------------------------------------------

import numpy as _np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter


def _rank(expr) -> int:
    return len(expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _shape(expr) -> list[int]:
    return [int(d) for d in expr.ty.shape]


def _const(value, dtype: str):
    return relax.const(_np.array(value, dtype=dtype), dtype)


def _log1p(e, dt: str):
    """log(1 + e) for e >= 0, accurate for small e (float32 1 + e drops e's low digits)."""
    series = e * (_const(1, dt) - e * (_const(0.5, dt) - e / _const(3, dt)))
    return relax.op.where(relax.op.less(e, _const(0.01, dt)), series, relax.op.log(_const(1, dt) + e))


def _axes_from(axis: int, rank: int) -> list[int]:
    axis = axis + rank if axis < 0 else axis
    return list(range(axis, rank))


# --- activations ---------------------------------------------------------------------------------


@register("Celu")
class Celu(OnnxOpConverter):
    """celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1)); TVM has no converter."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        alpha = _const(attr.get("alpha", 1.0), dt)
        zero = _const(0, dt)
        neg = alpha * (relax.op.exp(x / alpha) - _const(1, dt))
        return relax.op.maximum(x, zero) + relax.op.minimum(zero, neg)


def _softplus(x, dt: str):
    return relax.op.maximum(x, _const(0, dt)) + _log1p(relax.op.exp(-relax.op.abs(x)), dt)


def _tanh(x, dt: str):
    # TVM's tanh is ~1e-3 relative off for |x| < 1e-4: the series there (error < 1e-9 below 0.01)
    series = x * (_const(1, dt) - x * x / _const(3, dt))
    return relax.op.where(relax.op.less(relax.op.abs(x), _const(0.01, dt)), series, relax.op.tanh(x))


@register("Softplus")
class Softplus(OnnxOpConverter):
    """max(x, 0) + log1p(exp(-|x|)): TVM's log(1 + ...) drops the low digits of small results."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return _softplus(inputs[0], _dtype(inputs[0]))


@register("Tanh")
class Tanh(OnnxOpConverter):
    @classmethod
    def _impl_v6(cls, bb, inputs, attr, params):
        dt = _dtype(inputs[0])
        return _tanh(inputs[0], dt) if dt.startswith("float") else relax.op.tanh(inputs[0])


@register("Mish")
class Mish(OnnxOpConverter):
    """x * tanh(softplus(x)), accurate for large negative x too (TVM's version is off by ~1e-3
    relative there). ONNX Runtime's folding usually inlines Mish into Softplus + Tanh + Mul."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        return x * _tanh(bb.normalize(_softplus(x, dt)), dt)


# --- normalisation -------------------------------------------------------------------------------


@register("LayerNormalization")
class LayerNormalization(OnnxOpConverter):
    """All three outputs (Y, Mean, InvStdDev); TVM returns placeholders for the last two."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        if attr["tvm_custom"]["num_outputs"] == 1:  # the usual inference graph: TVM's fused layer_norm
            return _tvm.LayerNormalization.get_converter(17)(bb, inputs, attr, params)
        x, scale, bias = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
        rank = _rank(x)
        axes = _axes_from(attr.get("axis", -1), rank)
        eps = attr.get("epsilon", 1e-5)
        in_dt = _dtype(x)
        stash = "float32" if attr.get("stash_type", 1) == 1 else in_dt
        xs = relax.op.astype(x, stash) if stash != in_dt else x
        mean = relax.op.mean(xs, axes, keepdims=True)
        centered = xs - mean
        var = relax.op.mean(centered * centered, axes, keepdims=True)
        inv_std = relax.op.rsqrt(var + _const(eps, stash))
        normed = centered * inv_std
        if stash != in_dt:
            normed = relax.op.astype(normed, in_dt)
        y = normed * scale
        if bias is not None:
            y = y + bias
        return relax.Tuple([y, mean, inv_std])


@register("RMSNormalization")
class RMSNormalization(OnnxOpConverter):
    """Written out with reductions: TVM's rms_norm fails to compile when the axes start at 0."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        x, scale = inputs[0], inputs[1]
        rank = _rank(x)
        axes = _axes_from(attr.get("axis", -1), rank)
        in_dt = _dtype(x)
        stash = "float32" if attr.get("stash_type", 1) == 1 else in_dt
        xs = relax.op.astype(x, stash) if stash != in_dt else x
        ms = relax.op.mean(xs * xs, axes, keepdims=True)
        normed = xs * relax.op.rsqrt(ms + _const(attr.get("epsilon", 1e-5), stash))
        if stash != in_dt:
            normed = relax.op.astype(normed, in_dt)
        return normed * scale


@register("BatchNormalization")
class BatchNormalization(OnnxOpConverter):
    """Inference mode is TVM's; training mode (batch statistics + updated running mean/var) is ours."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._impl_v15(bb, inputs, attr, params)

    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        if not attr.get("training_mode", 0):
            return _tvm.BatchNormalization.get_converter(15)(bb, inputs, attr, params)
        x, scale, bias, mean_in, var_in = inputs[:5]
        rank = _rank(x)
        axes = [0] + list(range(2, rank))
        dt = _dtype(x)
        eps, momentum = attr.get("epsilon", 1e-5), attr.get("momentum", 0.9)
        mean = relax.op.mean(x, axes, keepdims=True)
        centered = x - mean
        var = relax.op.mean(centered * centered, axes, keepdims=True)
        bshape = [1, -1] + [1] * (rank - 2)
        y = centered * relax.op.rsqrt(var + _const(eps, dt)) * relax.op.reshape(scale, bshape) \
            + relax.op.reshape(bias, bshape)
        m = _const(momentum, _dtype(mean_in))
        one_m = _const(1 - momentum, _dtype(mean_in))
        run_mean = mean_in * m + relax.op.astype(relax.op.squeeze(mean, axes), _dtype(mean_in)) * one_m
        run_var = var_in * m + relax.op.astype(relax.op.squeeze(var, axes), _dtype(var_in)) * one_m
        return relax.Tuple([y, run_mean, run_var])


@register("LpNormalization")
class LpNormalization(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        axis = attr.get("axis", -1)
        p = attr.get("p", 2)
        if p == 1:
            norm = relax.op.sum(relax.op.abs(x), [axis], keepdims=True)
        else:
            norm = relax.op.sqrt(relax.op.sum(x * x, [axis], keepdims=True))
        # an all-zero slice normalises to zeros (ONNX Runtime / the reference), not NaN
        zero = _const(0, _dtype(x))
        norm = relax.op.where(relax.op.equal(norm, zero), _const(1, _dtype(x)), norm)
        return x / norm


# --- convolution ---------------------------------------------------------------------------------


@register("ConvTranspose")
class ConvTranspose(OnnxOpConverter):
    """TVM's converter, plus the ``output_shape`` attribute (pads derived per the ONNX spec)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "output_shape" in attr:
            x, w = inputs[0], inputs[1]
            spatial = _rank(x) - 2
            in_sizes = _shape(x)[2:]
            kernel = list(attr.get("kernel_shape", _shape(w)[2:]))
            strides = list(attr.get("strides", [1] * spatial))
            dil = list(attr.get("dilations", [1] * spatial))
            out_pad = list(attr.get("output_padding", [0] * spatial))
            target = list(attr.pop("output_shape"))[-spatial:]
            auto_pad = attr.pop("auto_pad", b"NOTSET")
            auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
            begin, end = [], []
            for i in range(spatial):
                total = strides[i] * (in_sizes[i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - target[i]
                if total < 0:  # the target is larger than the full output: extra output padding
                    out_pad[i] += -total
                    total = 0
                lo = total - total // 2 if auto_pad == "SAME_LOWER" else total // 2
                begin.append(lo)
                end.append(total - lo)
            attr["pads"] = begin + end
            attr["output_padding"] = out_pad
        return _tvm.ConvTranspose.get_converter(1)(bb, inputs, attr, params)


# --- Resize --------------------------------------------------------------------------------------


def _attr_str(attr: dict, name: str, default: str) -> str:
    value = attr.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _const_value(expr):
    """The numpy value of a Relax constant, or None (an empty optional input counts as absent)."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    return None


def _resize_axis_matrix(n_in: int, n_out: int, scale: float, roi, attr: dict, mode: str):
    """(weights [n_out, n_in], extrapolated rows [n_out] bool) of ONNX Resize along one axis.

    The weights come from the ONNX reference implementation (interpolation is linear in the data,
    so resizing the identity matrix yields the matrix), which makes every mode/coordinate
    transformation/antialias/exclude_outside combination exact by construction.
    """
    from onnx.reference.ops import op_resize as ref

    antialias = attr.get("antialias", 0)
    if mode == "nearest":
        nearest_mode = _attr_str(attr, "nearest_mode", "round_prefer_floor")

        def coeffs(x, scale_factor):
            return ref._nearest_coeffs(x, mode=nearest_mode)
    elif mode == "cubic":
        cubic = ref._cubic_coeffs_antialias if antialias else ref._cubic_coeffs
        a = attr.get("cubic_coeff_a", -0.75)

        def coeffs(x, scale_factor):
            return cubic(x, scale_factor, A=a)
    else:
        coeffs = ref._linear_coeffs_antialias if antialias else ref._linear_coeffs
    kwargs = {"roi": roi,
              "coordinate_transformation_mode": _attr_str(attr, "coordinate_transformation_mode", "half_pixel"),
              "exclude_outside": bool(attr.get("exclude_outside", 0))}
    weights = ref._interpolate_1d_along_axis(_np.eye(n_in), 0, scale, n_out, coeffs, extrapolation_value=0.0,
                                             **kwargs)
    outside = ref._interpolate_1d_along_axis(_np.zeros((n_in, 1)), 0, scale, n_out, coeffs,
                                             extrapolation_value=1.0, **kwargs)[:, 0] != 0
    return _np.asarray(weights, dtype=_np.float64), outside


def _resize_plan(shape: list[int], roi, scales, sizes, attr: dict):
    """Per-axis (output size, scale factor, roi pair) like the ONNX reference computes them."""
    rank = len(shape)
    axes = [a + rank if a < 0 else a for a in attr.get("axes", range(rank))]
    full_roi = None
    if roi is not None and roi.size:
        full_roi = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = float(roi[i]), float(roi[len(axes) + i])
    if sizes is not None and sizes.size:
        out = list(shape)
        for i, a in enumerate(axes):
            out[a] = int(sizes[i])
        factors = [out[i] / shape[i] for i in range(rank)]
        policy = _attr_str(attr, "keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            chosen = [factors[a] for a in axes]
            scale = min(chosen) if policy == "not_larger" else max(chosen)
            factors = [scale if i in axes else 1.0 for i in range(rank)]
            out = [int(scale * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]
    else:
        factors = [1.0] * rank
        for i, a in enumerate(axes):
            factors[a] = float(scales[i])
        out = [int(f * d) for f, d in zip(factors, shape)]
    plan = []
    for a in range(rank):
        pair = None if full_roi is None else [full_roi[a], full_roi[rank + a]]
        if out[a] == shape[a] and abs(factors[a] - 1.0) < 1e-12 and (pair is None or pair == [0.0, 1.0]):
            continue
        plan.append((a, out[a], factors[a], pair))
    return plan


def _resize_exact(bb, x, roi, scales, sizes, attr: dict, mode: str):
    shape = _shape(x)
    dt = _dtype(x)
    compute_dt = dt if dt.startswith("float") else "float32"
    y = x if compute_dt == dt else relax.op.astype(x, compute_dt)
    extrapolated = None
    for axis, n_out, factor, pair in _resize_plan(shape, roi, scales, sizes, attr):
        weights, outside = _resize_axis_matrix(shape[axis], n_out, factor, pair, attr, mode)
        one_hot = ((weights == 0) | (weights == 1)).all() and (weights.sum(axis=1) <= 1).all()
        if one_hot:  # nearest: a gather, not a matrix product
            idx = weights.argmax(axis=1).astype("int64")
            y = relax.op.take(y, relax.const(idx, "int64"), axis=axis)
        else:
            rank = len(shape)
            perm = [i for i in range(rank) if i != axis] + [axis]
            inv = [perm.index(i) for i in range(rank)]
            moved = relax.op.permute_dims(y, perm) if axis != rank - 1 else y
            prod = relax.op.matmul(moved, relax.const(weights.T.astype(compute_dt), compute_dt))
            y = relax.op.permute_dims(prod, inv) if axis != rank - 1 else prod
        if outside.any():
            mask_shape = [1] * len(shape)
            mask_shape[axis] = n_out
            m = relax.const(outside.reshape(mask_shape), "bool")
            extrapolated = m if extrapolated is None else relax.op.logical_or(extrapolated, m)
        shape = shape[:axis] + [n_out] + shape[axis + 1:]
    if extrapolated is not None:
        value = _const(attr.get("extrapolation_value", 0.0), compute_dt)
        y = relax.op.where(extrapolated, value, y)
    if compute_dt != dt:
        info = _np.iinfo(dt) if dt != "bool" else None
        y = relax.op.round(y)
        if info is not None:
            y = relax.op.clip(y, int(info.min), int(info.max))
        y = relax.op.astype(y, dt)
    return y


def _tvm_resize_is_exact(shape, roi, scales, sizes, attr: dict, mode: str) -> bool:
    """Configurations where TVM's resize2d/3d computes what ONNX specifies (the common ones)."""
    coord = _attr_str(attr, "coordinate_transformation_mode", "half_pixel")
    if attr.get("antialias", 0) or "axes" in attr or coord in ("half_pixel_symmetric", "tf_crop_and_resize"):
        return False
    if _attr_str(attr, "keep_aspect_ratio_policy", "stretch") != "stretch" or mode == "cubic":
        return False
    if len(shape) not in (4, 5):
        return False
    plan = _resize_plan(shape, roi, scales, sizes, attr)
    if any(axis < 2 for axis, *_ in plan):
        return False
    # TVM maps coordinates with out/in; ONNX with the given scale: equal only when out == in * scale
    return all(abs(n_out - shape[axis] * factor) < 1e-6 and (coord != "align_corners" or n_out > 1)
               for axis, n_out, factor, _ in plan)


@register("Resize")
class Resize(OnnxOpConverter):
    """ONNX Resize with constant scales/sizes: TVM's resize where it is exact, otherwise separable
    per-axis gathers (nearest) or interpolation matrices (linear/cubic, antialias, axes, aspect
    ratio policies, tf_crop_and_resize, half_pixel_symmetric, fractional scales)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        scales = _const_value(inputs[1])
        if scales is None:
            return _tvm.Resize.get_converter(10)(bb, inputs, attr, params)
        attr = dict(attr, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        return _resize_exact(bb, inputs[0], None, scales, None, attr, _attr_str(attr, "mode", "nearest"))

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        roi = _const_value(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        scales = _const_value(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
        sizes = _const_value(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
        given = [v for v in (scales, sizes) if v is not None and v.size]
        if len(given) != 1 or not isinstance(x.ty, relax.TensorType) or x.ty.shape is None \
                or not all(isinstance(d, tvm.tirx.IntImm) for d in x.ty.shape):
            return _tvm.Resize.get_converter(18)(bb, inputs, attr, params)
        mode = _attr_str(attr, "mode", "nearest")
        if _tvm_resize_is_exact(_shape(x), roi, scales, sizes, attr, mode):
            return _tvm.Resize.get_converter(18)(bb, inputs, attr, params)
        return _resize_exact(bb, x, roi, scales, sizes, attr, mode)


@register("Upsample")
class Upsample(OnnxOpConverter):
    """Upsample (deprecated Resize): nearest uses floor(out / scale), linear is asymmetric."""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        scales = attr.get("scales")
        if scales is None and len(inputs) > 1:
            scales = _const_value(inputs[1])
        if scales is None:
            return _tvm.Upsample.get_converter(9)(bb, inputs, attr, params)
        mode = _attr_str(attr, "mode", "nearest")
        mode = "linear" if mode in ("linear", "bilinear", "trilinear") else mode
        attr = dict(attr, coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        attr.pop("scales", None)
        return _resize_exact(bb, inputs[0], None, _np.asarray(scales, dtype="float64"), None, attr, mode)


@register("GroupNormalization")
class GroupNormalization(OnnxOpConverter):
    """Opset 18 (per-group scale/bias) and 21 (per-channel), statistics in float32."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr, per_channel=False)

    @classmethod
    def _impl_v21(cls, bb, inputs, attr, params):
        return cls._convert(bb, inputs, attr, per_channel=True)

    @classmethod
    def _convert(cls, bb, inputs, attr, per_channel: bool):
        x, scale, bias = inputs[:3]
        shape = _shape(x)
        groups = int(attr["num_groups"])
        n, c = shape[0], shape[1]
        dt = _dtype(x)
        stash = "float32" if attr.get("stash_type", 1) == 1 else dt
        xs = relax.op.astype(x, stash) if stash != dt else x
        grouped = relax.op.reshape(xs, [n, groups, -1])
        mean = relax.op.mean(grouped, [2], keepdims=True)
        centered = grouped - mean
        var = relax.op.mean(centered * centered, [2], keepdims=True)
        normed = relax.op.reshape(centered * relax.op.rsqrt(var + _const(attr.get("epsilon", 1e-5), stash)), shape)
        if stash != dt:
            normed = relax.op.astype(normed, dt)
        if not per_channel:  # one value per group -> one per channel
            scale = relax.op.repeat(scale, c // groups, axis=0)
            bias = relax.op.repeat(bias, c // groups, axis=0)
        bshape = [1, c] + [1] * (len(shape) - 2)
        return normed * relax.op.reshape(scale, bshape) + relax.op.reshape(bias, bshape)


# --- losses (training graphs exported for inference, metric heads) -------------------------------


def _nll(bb, logp, target, weight, attr):
    """NegativeLogLikelihoodLoss on log-probabilities ``logp`` [N, C, d...] and targets [N, d...]."""
    dt = _dtype(logp)
    ignore = attr.get("ignore_index")
    tdt = _dtype(target)
    if ignore is not None:
        ignored = relax.op.equal(target, _const(ignore, tdt))
        safe = relax.op.where(ignored, _const(0, tdt), target)
    else:
        ignored, safe = None, target
    picked = relax.op.squeeze(
        relax.op.gather_elements(logp, relax.op.expand_dims(safe, 1), axis=1), [1])
    w = relax.op.take(weight, safe, axis=0) if weight is not None else relax.op.ones_like(picked)
    if ignored is not None:
        w = relax.op.where(ignored, _const(0, dt), w)
    loss = -picked * w
    reduction = _attr_str(attr, "reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return relax.op.sum(loss)
    return relax.op.sum(loss) / relax.op.sum(w)


@register("NegativeLogLikelihoodLoss")
class NegativeLogLikelihoodLoss(OnnxOpConverter):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        weight = inputs[2] if len(inputs) > 2 else None
        return _nll(bb, inputs[0], inputs[1], weight, attr)


@register("SoftmaxCrossEntropyLoss")
class SoftmaxCrossEntropyLoss(OnnxOpConverter):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        logp = bb.normalize(relax.op.nn.log_softmax(inputs[0], axis=1))
        weight = inputs[2] if len(inputs) > 2 else None
        loss = _nll(bb, logp, inputs[1], weight, attr)
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([loss, logp])
        return loss


# --- pooling with indices, dropout masks ---------------------------------------------------------


@register("MaxPool")
class MaxPool(OnnxOpConverter):
    """TVM's MaxPool, plus the optional Indices output (2-D): the window positions are unrolled
    into strided slices, so values and argmax come from one reduction over the kernel axis."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if attr["tvm_custom"]["num_outputs"] < 2 or _rank(inputs[0]) != 4:
            return _tvm.MaxPool.get_converter(22)(bb, inputs, attr, params)
        x = inputs[0]
        n, c, h, w = _shape(x)
        kh, kw = attr["kernel_shape"]
        sh, sw = attr.get("strides", (1, 1))
        dh, dw = attr.get("dilations", (1, 1))
        pt, pl, pb, pr = attr.get("pads", (0, 0, 0, 0))
        rounding = _np.ceil if attr.get("ceil_mode", 0) else _np.floor
        oh = int(rounding((h + pt + pb - ((kh - 1) * dh + 1)) / sh)) + 1
        ow = int(rounding((w + pl + pr - ((kw - 1) * dw + 1)) / sw)) + 1
        # pad enough for every window (ceil_mode may reach past the given end pads)
        eb = max(pb, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
        er = max(pr, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pl)
        dt = _dtype(x)
        low = float(_np.finfo(dt).min) if dt.startswith("float") else int(_np.iinfo(dt).min)
        xp = relax.op.nn.pad(x, [0, 0, 0, 0, pt, eb, pl, er], pad_value=low)
        windows, positions = [], []
        rows, cols = _np.arange(oh)[:, None], _np.arange(ow)[None, :]
        column_major = attr.get("storage_order", 0) == 1
        for i in range(kh):
            for j in range(kw):
                windows.append(relax.op.strided_slice(
                    xp, axes=[2, 3], begin=[i * dh, j * dw],
                    end=[i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1], strides=[sh, sw]))
                hh, ww = rows * sh + i * dh - pt, cols * sw + j * dw - pl
                positions.append((ww * h + hh) if column_major else (hh * w + ww))
        stacked = bb.normalize(relax.op.stack(windows, axis=0))
        values = relax.op.max(stacked, axis=0)
        arg = bb.normalize(relax.op.argmax(stacked, axis=0))
        index = relax.op.zeros((n, c, oh, ow), "int64")
        for k, pos in enumerate(positions):
            hit = relax.op.equal(arg, relax.const(_np.array(k, dtype=str(arg.ty.dtype)), str(arg.ty.dtype)))
            index = relax.op.where(hit, relax.const(pos.astype("int64").reshape(1, 1, oh, ow), "int64"), index)
        base = (_np.arange(n * c, dtype="int64") * h * w).reshape(n, c, 1, 1)
        return relax.Tuple([values, index + relax.const(base, "int64")])


@register("Dropout")
class Dropout(OnnxOpConverter):
    """Inference: the data unchanged and an all-true bool mask (TVM's mask is float32)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        if attr["tvm_custom"]["num_outputs"] < 2:
            return x
        return relax.Tuple([x, relax.op.ones(x.ty.shape, "bool")])


# --- arithmetic ----------------------------------------------------------------------------------


@register("Clip")
class Clip(OnnxOpConverter):
    """Clip with constant bounds as Relax ``maximum``/``minimum`` against scalars.

    TVM's converter emits TE calls, which Relax passes cannot see through: ``ConvertLayout`` then
    wraps every ReLU6 in a pair of transposes. NaN bounds mean "unbounded", as in ONNX Runtime.
    Bounds computed at run time keep TVM's converter.
    """

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._clip(bb, inputs[0], attr.get("min"), attr.get("max"))

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        given = (list(inputs) + [None, None])[1:3]
        bounds = [None if x is None else _constant_of(x) for x in given]
        if any(x is not None and b is None for x, b in zip(given, bounds)):
            return _tvm.Clip.get_converter(13)(bb, inputs, attr, params)
        return cls._clip(bb, inputs[0], *bounds)

    @staticmethod
    def _clip(bb, x, lo, hi):
        dtype = _dtype(x)
        result = x
        for bound, op in ((lo, relax.op.maximum), (hi, relax.op.minimum)):
            if bound is None or _np.isnan(float(bound)):
                continue
            result = bb.normalize(op(result, relax.const(_np.asarray(bound).astype(dtype), dtype)))
        return result


class _PairwiseVariadic(OnnxOpConverter):
    """Sum/Mean/Min/Max folded pairwise with broadcasting binary ops.

    TVM's converter broadcasts every input to the common shape, stacks them into a new tensor and
    reduces over it: extra copies of the data, and a residual ``Sum`` cannot fuse into the
    convolution before it (in resnet50-light those kernels took about 7% of the model's time).
    Constant inputs keep TVM's converter (it folds them).
    """

    tvm_converter: type
    binary = staticmethod(relax.op.add)

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if all(_constant_of(x) is not None for x in inputs):
            return cls.tvm_converter.get_converter(13)(bb, inputs, attr, params)
        result = inputs[0]
        for rhs in inputs[1:]:
            result = bb.normalize(cls.binary(result, rhs))
        if cls.tvm_converter is _tvm.Mean and len(inputs) > 1:
            result = relax.op.divide(result, relax.const(len(inputs), _dtype(result)))
        return result


@register("Sum")
class Sum(_PairwiseVariadic):
    tvm_converter = _tvm.Sum


@register("Mean")
class Mean(_PairwiseVariadic):
    tvm_converter = _tvm.Mean


@register("Min")
class Min(_PairwiseVariadic):
    tvm_converter = _tvm.Min
    binary = staticmethod(relax.op.minimum)


@register("Max")
class Max(_PairwiseVariadic):
    tvm_converter = _tvm.Max
    binary = staticmethod(relax.op.maximum)


@register("Pow")
class Pow(OnnxOpConverter):
    """ONNX Pow allows an exponent of another type than the base (the result has the base's type);
    integer bases are computed in float64 and rounded back."""

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        base, exp = inputs[0], inputs[1]
        bdt, edt = _dtype(base), _dtype(exp)
        if bdt == edt and bdt.startswith("float"):
            return _tvm.Pow.get_converter(7)(bb, inputs, attr, params)
        if bdt.startswith("float"):
            return relax.op.power(base, relax.op.astype(exp, bdt))
        result = relax.op.power(relax.op.astype(base, "float64"), relax.op.astype(exp, "float64"))
        return relax.op.astype(relax.op.round(result), bdt)


@register("CumProd")
class CumProd(OnnxOpConverter):
    """CumProd (opset 26) with a constant axis, ``exclusive`` and ``reverse``."""

    @classmethod
    def _impl_v26(cls, bb, inputs, attr, params):
        x = inputs[0]
        axis_value = _const_value(inputs[1])
        if axis_value is None:
            raise ValueError("CumProd needs a constant axis.")
        rank = _rank(x)
        axis = int(axis_value.reshape(-1)[0])
        axis = axis + rank if axis < 0 else axis
        dt = _dtype(x)
        if attr.get("reverse", 0):
            x = bb.normalize(relax.op.flip(x, axis))
        if attr.get("exclusive", 0):  # shift by one along the axis, filling with the identity 1
            n = _shape(x)[axis]
            pads = [0, 0] * rank
            pads[2 * axis] = 1
            ones = relax.op.nn.pad(x, pads, pad_value=1.0)
            x = relax.op.strided_slice(ones, axes=[axis], begin=[0], end=[n])
        out = relax.op.cumprod(x, axis=axis, dtype=dt)
        return relax.op.flip(out, axis) if attr.get("reverse", 0) else out


# --- attention -----------------------------------------------------------------------------------


def _opt(inputs, i):
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


@register("Attention")
class Attention(OnnxOpConverter):
    """ONNX Attention (opset 23/24): 3-D or 4-D Q/K/V, grouped-query heads, KV cache (past/present),
    bool or additive masks (shorter masks padded), causal masking, softcap, scale, softmax precision,
    nonpad_kv_seqlen and the optional QK output. Follows the ONNX reference implementation step by step.
    TVM's converter of the same name is the com.microsoft contrib op (``num_heads``): kept for that."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "num_heads" in attr:
            return _tvm.Attention.get_converter(1)(bb, inputs, attr, params)
        return cls._impl_v23(bb, inputs, attr, params)

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        if "num_heads" in attr:
            return _tvm.Attention.get_converter(1)(bb, inputs, attr, params)
        q, k, v = inputs[0], inputs[1], inputs[2]
        mask, past_k, past_v, nonpad = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5), _opt(inputs, 6)
        dt = _dtype(q)
        three_d = _rank(q) == 3
        if three_d:
            qh, kvh = int(attr["q_num_heads"]), int(attr["kv_num_heads"])

            def heads(t, n):
                b, s, hidden = _shape(t)
                return bb.normalize(relax.op.permute_dims(relax.op.reshape(t, [b, s, n, hidden // n]), [0, 2, 1, 3]))

            q, k, v = heads(q, qh), heads(k, kvh), heads(v, kvh)
        batch, q_heads, q_len, head = _shape(q)
        scale = attr.get("scale")
        scale = float(1 / _np.sqrt(head)) if scale is None else float(scale)
        root = _const(_np.sqrt(scale), dt)
        present_k = bb.normalize(relax.op.concat([past_k, k], axis=2)) if past_k is not None else k
        present_v = bb.normalize(relax.op.concat([past_v, v], axis=2)) if past_v is not None else v
        kv_len = _shape(present_k)[2]
        neg_inf = _const(-_np.inf, dt)
        bias = None
        if mask is not None:
            mask_len = _shape(mask)[-1]
            is_bool = _dtype(mask) == "bool"
            if mask_len < kv_len:
                pads = [0, 0] * (_rank(mask) - 1) + [0, kv_len - mask_len]
                if is_bool:
                    mask = relax.op.astype(relax.op.nn.pad(relax.op.astype(mask, "int8"), pads, pad_value=0.0), "bool")
                else:
                    mask = relax.op.nn.pad(mask, pads, pad_value=float("-inf"))
            bias = relax.op.where(mask, _const(0, dt), neg_inf) if is_bool else mask
        if attr.get("is_causal", 0):
            past = _shape(past_k)[2] if past_k is not None else 0
            causal = _np.zeros((q_len, kv_len), dtype=dt)
            tri = _np.triu(_np.ones((q_len, kv_len - past)), k=1) == 1
            causal[:, past:][tri] = -_np.inf
            causal_c = relax.const(causal, dt)
            bias = causal_c if bias is None else bias + causal_c
        if nonpad is not None:
            positions = relax.const(_np.arange(kv_len, dtype=_dtype(nonpad)).reshape(1, 1, 1, kv_len), _dtype(nonpad))
            keep = relax.op.less(positions, relax.op.reshape(nonpad, [batch, 1, 1, 1]))
            pad_bias = relax.op.where(keep, _const(0, dt), neg_inf)
            bias = pad_bias if bias is None else bias + pad_bias
        kv_heads = _shape(present_k)[1]
        kk, vv = present_k, present_v
        if kv_heads != q_heads and q_heads % kv_heads == 0:  # grouped-query: h0, h0, h1, h1, ...
            kk = relax.op.repeat(kk, q_heads // kv_heads, axis=1)
            vv = relax.op.repeat(vv, q_heads // kv_heads, axis=1)
        qk = bb.normalize(relax.op.matmul(q * root, relax.op.permute_dims(kk * root, [0, 1, 3, 2])))
        softcap = float(attr.get("softcap", 0.0))
        if softcap > 0:
            cap = _const(softcap, dt)
            qk = bb.normalize(relax.op.tanh(qk / cap) * cap)
        with_bias = bb.normalize(qk + bias) if bias is not None else qk
        mode = int(attr.get("qk_matmul_output_mode", 0))
        precision = attr.get("softmax_precision")
        sdt = dt
        if precision is not None:
            from onnx import helper

            sdt = str(helper.tensor_dtype_to_np_dtype(int(precision)))
        scores = relax.op.astype(with_bias, sdt) if sdt != dt else with_bias
        probs = bb.normalize(relax.op.nn.softmax(scores, axis=-1))
        vv_s = relax.op.astype(vv, sdt) if sdt != dt else vv
        out = relax.op.matmul(probs, vv_s)
        if sdt != dt:
            out = relax.op.astype(out, dt)
        if three_d:
            out = relax.op.reshape(bb.normalize(relax.op.permute_dims(out, [0, 2, 1, 3])), [batch, q_len, -1])
        qk_out = {2: with_bias, 3: probs}.get(mode, qk)
        if _dtype(bb.normalize(qk_out)) != dt:
            qk_out = relax.op.astype(qk_out, dt)
        results = [out, present_k, present_v, qk_out]
        n = attr["tvm_custom"]["num_outputs"]
        return out if n == 1 else relax.Tuple(results[:n])


# --- casts: float8 through lookup tables ---------------------------------------------------------

_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
_FP_SIGN_BIT = {"float4_e2m1fn": 0x8}  # float8 formats: 0x80
_SMALL_FLOATS = (*_FLOAT8, "float4_e2m1fn")  # converted through code tables


def _float8_tables(name: str, saturate: bool):
    """(decode table [256] float32, encode boundaries, encode codes, overflow bound, overflow strict,
    nan code, overflow code) for one float8 format, derived from ml_dtypes (round to nearest even)."""
    import ml_dtypes

    f8 = getattr(ml_dtypes, name)
    sign = _FP_SIGN_BIT.get(name, 0x80)
    codes = _np.arange(2 * sign, dtype=_np.uint8)
    decoded = codes.view(f8).astype(_np.float32)
    finite_pos = [(float(v), int(c)) for c, v in zip(codes, decoded) if c < sign and _np.isfinite(v)]
    finite_pos.sort()
    values = _np.array([v for v, _ in finite_pos], dtype=_np.float64)
    enc_codes = _np.array([c for _, c in finite_pos], dtype=_np.int32)
    bounds = []
    for lo, hi in itertools.pairwise(values):
        mid = _np.float32((lo + hi) / 2)
        rounds_up = float(_np.float32(mid).astype(f8).astype(_np.float32)) == float(hi)
        # bucketize counts the boundaries strictly below |x|: a tie that rounds up needs the
        # boundary just below the midpoint
        bounds.append(_np.nextafter(mid, _np.float32(-_np.inf)) if rounds_up else mid)
    top = values[-1]
    step = top - values[-2]
    over = _np.float32(top + step / 2)  # halfway to the next (unrepresentable) step
    strict = float(_np.float32(over).astype(f8).astype(_np.float32)) == float(top)  # the tie stays finite
    nan_code = {"float4_e2m1fn": 0x8}.get(name, 0x80 if name.endswith("fnuz") else 0x7F)  # float4: -0
    if saturate or name == "float4_e2m1fn":
        over_code = int(enc_codes[-1])
    else:
        over_code = 0x7C if name == "float8_e5m2" else nan_code
    return decoded, _np.array(bounds, dtype=_np.float32), enc_codes, over, strict, nan_code, over_code


def _float8_decode(bb, x, to: str):
    src = _true_dtype(x)
    decoded = _float8_tables(src, True)[0]
    raw = x if _dtype(x) == "uint8" else relax.op.memory.view(x, dtype="uint8")  # float4: its container
    bits = relax.op.astype(raw, "int32")
    out = relax.op.take(relax.const(decoded, "float32"), bits, axis=0)
    return out if to == "float32" else relax.op.astype(out, to)


def _float8_encode(bb, x, to: str, saturate: bool):
    _, bounds, enc_codes, over, strict, nan_code, over_code = _float8_tables(to, saturate)
    xf = bb.normalize(x if _dtype(x) == "float32" else relax.op.astype(x, "float32"))
    a = bb.normalize(relax.op.abs(xf))
    idx = relax.op.bucketize(a, relax.const(bounds, "float32"), out_int32=True, right=False)
    code = bb.normalize(relax.op.take(relax.const(enc_codes, "int32"), idx, axis=0))
    too_big = relax.op.greater(a, _const(over, "float32")) if strict else \
        relax.op.greater_equal(a, _const(over, "float32"))
    code = relax.op.where(too_big, _const(over_code, "int32"), code)
    negative = relax.op.less(relax.op.memory.view(xf, dtype="int32"), _const(0, "int32"))  # -0.0 too
    if to.endswith("fnuz"):  # no negative zero in these formats
        negative = relax.op.logical_and(negative, relax.op.not_equal(code, _const(0, "int32")))
    sign = _FP_SIGN_BIT.get(to, 0x80)
    signed = relax.op.where(negative, relax.op.bitwise_or(code, _const(sign, "int32")), code)
    if to.endswith("fnuz"):
        signed = relax.op.where(relax.op.equal(code, _const(0x80, "int32")), code, signed)
    signed = relax.op.where(relax.op.isnan(xf), _const(nan_code, "int32"), signed)
    as_bytes = bb.normalize(relax.op.astype(signed, "uint8"))
    if to in SUBBYTE_CONTAINERS:
        return _mark(bb, as_bytes, to)
    return relax.op.memory.view(as_bytes, dtype=to)


def _int_wrap(bb, x, to: str):
    """Cast to a sub-byte integer type: truncate, keep the low bits (ml_dtypes' wrap-around)."""
    bits = _SUBBYTE_BITS[to]
    v = relax.op.astype(relax.op.trunc(x) if _dtype(x).startswith("float") else x, "int32")
    wrapped = relax.op.floor_mod(v, _const(1 << bits, "int32"))
    if to.startswith("int"):
        half = 1 << (bits - 1)
        wrapped = relax.op.floor_mod(v + _const(half, "int32"), _const(1 << bits, "int32")) - _const(half, "int32")
    return _mark(bb, relax.op.astype(wrapped, SUBBYTE_CONTAINERS[to]), to)


def _cast(bb, x, to: str, attr: dict, params, fallback):
    src = _true_dtype(x) if isinstance(getattr(x, "ty", None), relax.TensorType) else None
    if src in _SMALL_FLOATS and to in ("float32", "float16", "float64"):
        return _float8_decode(bb, x, to)
    if to in _SMALL_FLOATS and src in ("float32", "float16"):
        return _float8_encode(bb, x, to, bool(attr.get("saturate", 1)))
    if to in _SUBBYTE_BITS and src is not None:
        return _int_wrap(bb, x, to)
    if src in _SUBBYTE_BITS:  # the container holds the value: a plain cast of the container
        return relax.op.astype(x, to)
    return fallback()


@register("Cast")
class Cast(OnnxOpConverter):
    """TVM's Cast, except float8 <-> float: TVM's conversions get zeros, subnormals, NaN, infinities
    and saturation wrong, so those go through 256-entry tables (decode) and bucketize (encode)."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        from onnx import helper

        to = str(helper.tensor_dtype_to_np_dtype(int(attr["to"]))) if isinstance(attr["to"], int) else attr["to"]
        return _cast(bb, inputs[0], to, attr, params, lambda: _tvm.Cast.get_converter(13)(bb, inputs, attr, params))


@register("CastLike")
class CastLike(OnnxOpConverter):
    @classmethod
    def _impl_v15(cls, bb, inputs, attr, params):
        target = inputs[1]
        to = _true_dtype(target) if isinstance(getattr(target, "ty", None), relax.TensorType) else None
        if to is None:
            return _tvm.CastLike.get_converter(15)(bb, inputs, attr, params)
        return _cast(bb, inputs[0], to, attr, params,
                     lambda: _tvm.CastLike.get_converter(15)(bb, inputs, attr, params))


# --- recurrent layers (unrolled over the static sequence length) ---------------------------------


def _rnn_activation(name: str, alpha, beta, dt: str):
    name = name.decode() if isinstance(name, bytes) else name
    key = name.lower()

    def f(x):
        if key == "sigmoid":
            return relax.op.sigmoid(x)
        if key == "tanh":
            return relax.op.tanh(x)
        if key == "relu":
            return relax.op.nn.relu(x)
        if key == "leakyrelu":
            return relax.op.nn.leakyrelu(x, alpha if alpha is not None else 0.01)
        if key == "hardsigmoid":
            a, b = (alpha if alpha is not None else 0.2), (beta if beta is not None else 0.5)
            return relax.op.clip(x * _const(a, dt) + _const(b, dt), 0, 1)
        if key == "elu":
            a = alpha if alpha is not None else 1.0
            return relax.op.where(relax.op.less(x, _const(0, dt)), _const(a, dt) * (relax.op.exp(x) - _const(1, dt)), x)
        if key == "softsign":
            return x / (_const(1, dt) + relax.op.abs(x))
        if key == "softplus":
            return _softplus(x, dt)
        if key == "affine":
            return x * _const(alpha, dt) + _const(beta, dt)
        if key == "scaledtanh":
            return _const(alpha, dt) * relax.op.tanh(x * _const(beta, dt))
        if key == "thresholdedrelu":
            a = alpha if alpha is not None else 1.0
            return relax.op.where(relax.op.greater(x, _const(a, dt)), x, _const(0, dt))
        raise ValueError(f"RNN activation {name} is not supported")

    return f


_TAKES_ALPHA = {"leakyrelu", "hardsigmoid", "elu", "affine", "scaledtanh", "thresholdedrelu"}
_TAKES_BETA = {"hardsigmoid", "affine", "scaledtanh"}


def _rnn_activations(attr: dict, defaults: tuple[str, ...], num_dirs: int, dt: str):
    names = list(attr.get("activations", [])) or list(defaults) * num_dirs
    if len(names) == len(defaults) and num_dirs == 2:
        names = names * 2
    alphas, betas = list(attr.get("activation_alpha", [])), list(attr.get("activation_beta", []))
    funcs = []
    for name in names:
        key = (name.decode() if isinstance(name, bytes) else name).lower()
        alpha = alphas.pop(0) if key in _TAKES_ALPHA and alphas else None
        beta = betas.pop(0) if key in _TAKES_BETA and betas else None
        funcs.append(_rnn_activation(name, alpha, beta, dt))
    per = len(defaults)
    return [funcs[d * per:(d + 1) * per] for d in range(num_dirs)]


class _Recurrent(OnnxOpConverter):
    """Shared driver of RNN / GRU / LSTM: input projections for every step at once, then the
    recurrence unrolled over the (static) sequence; ``sequence_lens`` masks finished sequences."""

    gates = 1
    defaults = ("Tanh",)

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        x, w, r = inputs[0], inputs[1], inputs[2]
        b, seq_lens, h0 = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
        extra = [_opt(inputs, i) for i in range(6, len(inputs))]
        dt = _dtype(x)
        layout = attr.get("layout", 0)
        if layout == 1:
            x = bb.normalize(relax.op.permute_dims(x, [1, 0, 2]))
            h0 = bb.normalize(relax.op.permute_dims(h0, [1, 0, 2])) if h0 is not None else None
            extra = [bb.normalize(relax.op.permute_dims(e, [1, 0, 2])) if e is not None and _rank(e) == 3 else e
                     for e in extra]
        seq, batch, _ = _shape(x)
        num_dirs, gh, _ = _shape(w)
        hidden = gh // cls.gates
        direction = _attr_str(attr, "direction", "forward")
        acts = _rnn_activations(attr, cls.defaults, num_dirs, dt)
        clip = attr.get("clip")
        ys, hs, cs = [], [], []
        for d in range(num_dirs):
            wd = relax.op.squeeze(relax.op.strided_slice(w, [0], [d], [d + 1]), [0])
            rd = bb.normalize(relax.op.permute_dims(relax.op.squeeze(relax.op.strided_slice(r, [0], [d], [d + 1]), [0])))
            xw = bb.normalize(relax.op.matmul(x, relax.op.permute_dims(wd)))  # [seq, batch, gates*H]
            wb = rb = None
            if b is not None:
                bd = relax.op.squeeze(relax.op.strided_slice(b, [0], [d], [d + 1]), [0])
                wb = bb.normalize(relax.op.strided_slice(bd, [0], [0], [gh]))
                rb = bb.normalize(relax.op.strided_slice(bd, [0], [gh], [2 * gh]))
                xw = bb.normalize(xw + wb)
            state = cls.initial_state(bb, h0, extra, d, batch, hidden, dt)
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            order = range(seq - 1, -1, -1) if reverse else range(seq)
            outs = [None] * seq
            for t in order:
                xt = relax.op.squeeze(relax.op.strided_slice(xw, [0], [t], [t + 1]), [0])
                new_state = cls.step(bb, xt, state, rd, rb, extra, d, acts[d], clip, hidden, dt)
                if seq_lens is not None:
                    live = relax.op.reshape(relax.op.less(_const(t, _dtype(seq_lens)), seq_lens), [batch, 1])
                    outs[t] = bb.normalize(relax.op.where(live, new_state[0], _const(0, dt)))
                    state = tuple(bb.normalize(relax.op.where(live, n, o)) for n, o in zip(new_state, state))
                else:
                    state = new_state
                    outs[t] = state[0]
            ys.append(bb.normalize(relax.op.stack(outs, axis=0)))  # [seq, batch, H]
            hs.append(state[0])
            if len(state) > 1:
                cs.append(state[1])
        y = relax.op.stack(ys, axis=1)  # [seq, dirs, batch, H]
        y_h = relax.op.stack(hs, axis=0)
        results = [y, y_h] + ([relax.op.stack(cs, axis=0)] if cs else [])
        if layout == 1:
            results = [relax.op.permute_dims(results[0], [2, 0, 1, 3])] + \
                      [relax.op.permute_dims(e, [1, 0, 2]) for e in results[1:]]
        n = attr["tvm_custom"]["num_outputs"]
        return relax.Tuple(results[:max(n, 1)]) if n > 1 else results[0]

    @classmethod
    def initial_state(cls, bb, h0, extra, d, batch, hidden, dt):
        h = relax.op.squeeze(relax.op.strided_slice(h0, [0], [d], [d + 1]), [0]) if h0 is not None \
            else relax.op.zeros((batch, hidden), dt)
        return (bb.normalize(h),)

    @staticmethod
    def _clip(x, clip, dt):
        return relax.op.clip(x, -float(clip), float(clip)) if clip is not None else x


@register("RNN")
class RNN(_Recurrent):
    gates = 1
    defaults = ("Tanh",)

    @classmethod
    def step(cls, bb, xt, state, rd, rb, extra, d, acts, clip, hidden, dt):
        pre = xt + relax.op.matmul(state[0], rd)
        if rb is not None:
            pre = pre + rb
        return (bb.normalize(acts[0](cls._clip(pre, clip, dt))),)


@register("GRU")
class GRU(_Recurrent):
    gates = 3
    defaults = ("Sigmoid", "Tanh")

    @classmethod
    def step(cls, bb, xt, state, rd, rb, extra, d, acts, clip, hidden, dt):
        f, g = acts
        h = state[0]
        hr = bb.normalize(relax.op.matmul(h, rd))  # [batch, 3H]
        if rb is not None:
            hr = bb.normalize(hr + rb)

        def part(e, i):
            return relax.op.strided_slice(e, [1], [i * hidden], [(i + 1) * hidden])

        z = f(cls._clip(part(xt, 0) + part(hr, 0), clip, dt))
        rr = f(cls._clip(part(xt, 1) + part(hr, 1), clip, dt))
        if cls._linear_before_reset:
            cand = part(xt, 2) + rr * part(hr, 2)
        else:
            rd_h = relax.op.strided_slice(rd, [1], [2 * hidden], [3 * hidden])
            cand = part(xt, 2) + relax.op.matmul(rr * h, rd_h)
            if rb is not None:
                cand = cand + relax.op.strided_slice(rb, [0], [2 * hidden], [3 * hidden])
        hh = g(cls._clip(cand, clip, dt))
        return (bb.normalize((_const(1, dt) - z) * hh + z * h),)

    _linear_before_reset = False

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        impl = _GRULinearBeforeReset if attr.get("linear_before_reset", 0) else GRU
        return _Recurrent._impl_v7.__func__(impl, bb, inputs, attr, params)


class _GRULinearBeforeReset(GRU):
    _linear_before_reset = True


@register("LSTM")
class LSTM(_Recurrent):
    gates = 4
    defaults = ("Sigmoid", "Tanh", "Tanh")

    @classmethod
    def initial_state(cls, bb, h0, extra, d, batch, hidden, dt):
        (h,) = _Recurrent.initial_state(bb, h0, extra, d, batch, hidden, dt)
        c0 = extra[0] if extra else None
        c = relax.op.squeeze(relax.op.strided_slice(c0, [0], [d], [d + 1]), [0]) if c0 is not None \
            else relax.op.zeros((batch, hidden), dt)
        return (h, bb.normalize(c))

    @classmethod
    def step(cls, bb, xt, state, rd, rb, extra, d, acts, clip, hidden, dt):
        f, g, hact = acts
        h, c = state
        pre = bb.normalize(xt + relax.op.matmul(h, rd) + (rb if rb is not None else _const(0, dt)))
        p = extra[1] if len(extra) > 1 else None
        peep = None
        if p is not None:
            peep = bb.normalize(relax.op.squeeze(relax.op.strided_slice(p, [0], [d], [d + 1]), [0]))

        def part(e, i):
            return relax.op.strided_slice(e, [len(e.ty.shape) - 1], [i * hidden], [(i + 1) * hidden])

        gi, go, gf, gc = (part(pre, i) for i in range(4))
        if peep is not None:
            gi = gi + part(peep, 0) * c
            gf = gf + part(peep, 2) * c
        it = f(cls._clip(gi, clip, dt))
        ft = f(cls._clip(gf, clip, dt))
        ct = g(cls._clip(gc, clip, dt))
        c_new = bb.normalize(ft * c + it * ct)
        if peep is not None:
            go = go + part(peep, 1) * c_new
        ot = f(cls._clip(go, clip, dt))
        return (bb.normalize(ot * hact(c_new)), c_new)


# --- operators whose result is fixed at compile time: the ONNX reference computes them ------------


def _reference_constant(op_type: str, attr: dict, values: list, domain: str = ""):
    """Evaluate one node with ONNX's reference implementation on constant inputs."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" for i in range(len(values))]
    kwargs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attr.items() if k != "tvm_custom"}
    node = helper.make_node(op_type, names, ["out"], domain=domain, **kwargs)
    inits = [numpy_helper.from_array(_np.asarray(v), n) for n, v in zip(names, values)]
    graph = helper.make_graph([node], "g", [], [helper.make_value_info("out", helper.TypeProto())], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, 26 if not domain else 1)])
    return _np.asarray(ReferenceEvaluator(model).run(None, {})[0])


def _require_consts(op: str, exprs) -> list:
    values = [_const_value(e) for e in exprs]
    if any(v is None for v in values):
        raise ValueError(f"{op} needs constant inputs (its output size depends on them).")
    return values


class _ConstantOp(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        values = _require_consts(cls.op_type, [i for i in inputs if i is not None])
        out = _reference_constant(cls.op_type, attr, values)
        return relax.const(out, str(out.dtype))


for _op in ("HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"):
    register(_op)(type(_op, (_ConstantOp,), {"op_type": _op}))


@register("EyeLike")
class EyeLike(OnnxOpConverter):
    """Only the input's shape matters: the identity is a constant (TVM mixes up the dtype attribute)."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        from onnx import helper

        x = inputs[0]
        dt = str(helper.tensor_dtype_to_np_dtype(int(attr["dtype"]))) if "dtype" in attr else _dtype(x)
        rows, cols = (_shape(x) * 2)[:2] if _rank(x) == 1 else _shape(x)
        return relax.const(_np.eye(rows, cols, k=int(attr.get("k", 0)), dtype=dt), dt)


# --- small element-wise / data-movement operators ------------------------------------------------


@register("Swish")
class Swish(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        return x * relax.op.sigmoid(x * _const(attr.get("alpha", 1.0), _dtype(x)))


@register("BitCast")
class BitCast(OnnxOpConverter):
    """Reinterpret the bytes (same element size): a view, no copy."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        from onnx import helper

        x = inputs[0]
        to = str(helper.tensor_dtype_to_np_dtype(int(attr["to"])))
        if _np.dtype(to).itemsize != _np.dtype(_dtype(x)).itemsize:
            raise ValueError(f"BitCast between element sizes ({_dtype(x)} -> {to}) is not supported.")
        if to == "bool":  # bytes 0/1 only: a view is exact, but TVM's bool views are not byte-wise
            return relax.op.not_equal(relax.op.memory.view(x, dtype="uint8"), _const(0, "uint8"))
        if _dtype(x) == "bool":
            return relax.op.memory.view(bb.normalize(relax.op.astype(x, "uint8")), dtype=to)
        return relax.op.memory.view(x, dtype=to)


@register("OneHot")
class OneHot(OnnxOpConverter):
    """Constant depth; indices and (off, on) values may be run-time tensors; negative indices wrap."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        indices, depth_e, values = inputs
        depth = _const_value(depth_e)
        if depth is None:
            return _tvm.OneHot.get_converter(11)(bb, inputs, attr, params)
        depth = int(depth.reshape(-1)[0])
        rank = _rank(indices)
        axis = attr.get("axis", -1)
        axis = axis + rank + 1 if axis < 0 else axis
        idt = _dtype(indices)
        idx = indices if idt in ("int32", "int64") else relax.op.astype(indices, "int64")
        idt = _dtype(bb.normalize(idx))
        idx = relax.op.where(relax.op.less(idx, _const(0, idt)), idx + _const(depth, idt), idx)
        idx = relax.op.expand_dims(idx, axis)
        shape = [1] * (rank + 1)
        shape[axis] = depth
        positions = relax.const(_np.arange(depth, dtype=idt).reshape(shape), idt)
        hit = relax.op.equal(idx, positions)
        off = relax.op.take(values, relax.const(0, "int64"), axis=0)
        on = relax.op.take(values, relax.const(1, "int64"), axis=0)
        return relax.op.where(hit, on, off)


@register("ReverseSequence")
class ReverseSequence(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, lens = inputs
        shape = _shape(x)
        t_axis, b_axis = attr.get("time_axis", 0), attr.get("batch_axis", 1)
        ldt = _dtype(lens)
        tshape = [1] * len(shape)
        tshape[t_axis] = shape[t_axis]
        bshape = [1] * len(shape)
        bshape[b_axis] = shape[b_axis]
        t = relax.const(_np.arange(shape[t_axis], dtype=ldt).reshape(tshape), ldt)
        n = relax.op.reshape(lens, bshape)
        idx = relax.op.where(relax.op.less(t, n), n - _const(1, ldt) - t, t)
        idx = relax.op.broadcast_to(idx, shape)
        return relax.op.gather_elements(x, idx, axis=t_axis)


@register("CenterCropPad")
class CenterCropPad(OnnxOpConverter):
    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        (target,) = _require_consts("CenterCropPad", [inputs[1]])
        shape = _shape(x)
        rank = len(shape)
        axes = [a + rank if a < 0 else a for a in attr.get("axes", range(rank))]
        for a, size in zip(axes, [int(v) for v in target]):
            dim = shape[a]
            if size < dim:
                start = (dim - size) // 2
                x = relax.op.strided_slice(x, [a], [start], [start + size])
            elif size > dim:
                before = (size - dim) // 2
                pads = [0, 0] * rank
                pads[2 * a], pads[2 * a + 1] = before, size - dim - before
                x = relax.op.nn.pad(x, pads)
            x = bb.normalize(x)
            shape[a] = size
        return x


@register("RotaryEmbedding")
class RotaryEmbedding(OnnxOpConverter):
    """RotaryEmbedding (opset 23), as the ONNX reference computes it (3-D or 4-D input,
    position_ids or per-position caches, interleaved or split halves, partial rotary_embedding_dim)."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        x, cos, sin, pos = inputs[0], inputs[1], inputs[2], _opt(inputs, 3)
        original = _shape(x)
        four_d = len(original) == 4
        if four_d:  # [b, heads, s, d] -> [b, s, heads, d]
            x = bb.normalize(relax.op.permute_dims(x, [0, 2, 1, 3]))
        else:
            b, s, hidden = original
            heads = int(attr["num_heads"])
            x = bb.normalize(relax.op.reshape(x, [b, s, heads, hidden // heads]))
        b, s, heads, head = _shape(x)
        rot = int(attr.get("rotary_embedding_dim", 0)) or head
        half = rot // 2
        if pos is not None:
            cos, sin = relax.op.take(cos, pos, axis=0), relax.op.take(sin, pos, axis=0)
        cos = bb.normalize(relax.op.expand_dims(cos, 2))
        sin = bb.normalize(relax.op.expand_dims(sin, 2))
        x_rot = relax.op.strided_slice(x, [3], [0], [rot])
        if attr.get("interleaved", 0):
            x1 = relax.op.strided_slice(x_rot, [3], [0], [rot], [2])
            x2 = relax.op.strided_slice(x_rot, [3], [1], [rot], [2])
        else:
            x1 = relax.op.strided_slice(x_rot, [3], [0], [half])
            x2 = relax.op.strided_slice(x_rot, [3], [half], [rot])
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if attr.get("interleaved", 0):
            rotated = relax.op.reshape(relax.op.stack([real, imag], axis=4), [b, s, heads, rot])
        else:
            rotated = relax.op.concat([real, imag], axis=3)
        out = rotated if rot == head else relax.op.concat([rotated, relax.op.strided_slice(x, [3], [rot], [head])], axis=3)
        out = bb.normalize(out)
        return relax.op.permute_dims(out, [0, 2, 1, 3]) if four_d else relax.op.reshape(out, original)


@register("CausalConvWithState")
class CausalConvWithState(OnnxOpConverter):
    """Depthwise causal Conv1d over [past_state | input] with optional SiLU; returns the output and
    the last k-1 input positions as the next state (opset 26)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, w, bias, past = inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3)
        batch, channels, length = _shape(x)
        k = _shape(w)[2]
        dt = _dtype(x)
        if k > 1:
            pad = past if past is not None else relax.op.zeros((batch, channels, k - 1), dt)
            padded = bb.normalize(relax.op.concat([pad, x], axis=2))
        else:
            padded = x
        out = relax.op.nn.conv1d(padded, w, groups=channels)
        if bias is not None:
            out = out + relax.op.reshape(bias, [1, channels, 1])
        act = _attr_str(attr, "activation", "none")
        if act in ("silu", "swish"):
            of = relax.op.astype(out, "float32") if dt != "float32" else out
            of = of * relax.op.sigmoid(of)
            out = relax.op.astype(of, dt) if dt != "float32" else of
        if k > 1:
            state = relax.op.strided_slice(padded, [2], [length], [length + k - 1])
        else:
            state = relax.op.zeros((batch, channels, 0), dt)
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([out, state])
        return out


# --- spectral: DFT / STFT as constant matrices ---------------------------------------------------


def _dft_matrix(length: int, comps: int, n: int, inverse: bool, onesided: bool):
    """The real matrix [length*comps, m*comps_out] of ONNX DFT along one axis (numpy's FFT on the
    basis signals: the transform is linear in the real and imaginary parts)."""
    basis = _np.eye(length).astype(_np.complex128)
    rows = [basis] if comps == 1 else [basis, 1j * basis]
    blocks = []
    for b in rows:
        if inverse and onesided:
            out = _np.fft.irfft(b, n=n, axis=1)[..., None]
        elif inverse:
            out = _np.fft.ifft(b, n=n, axis=1)
        else:
            out = _np.fft.fft(b, n=n, axis=1)
            if onesided:
                out = out[:, : n // 2 + 1]
        if _np.iscomplexobj(out):
            out = _np.stack([out.real, out.imag], axis=-1)
        blocks.append(out)  # [length, m, comps_out]
    stacked = _np.stack(blocks, axis=1)  # [length, comps, m, comps_out]
    m, comps_out = stacked.shape[2], stacked.shape[3]
    return stacked.reshape(length * comps, m * comps_out), m, comps_out


def _apply_dft(bb, x, axis: int, n: int | None, inverse: bool, onesided: bool):
    shape = _shape(x)
    rank = len(shape)
    axis = axis % rank
    length, comps = shape[axis], shape[-1]
    if n is None:
        n = 2 * (length - 1) if inverse and onesided else length
    matrix, m, comps_out = _dft_matrix(length, comps, n, inverse, onesided)
    dt = _dtype(x)
    # move the signal axis next to the component axis: [..., L, c] -> flatten (L, c) -> matmul
    perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
    moved = bb.normalize(relax.op.permute_dims(x, perm))
    lead = [shape[i] for i in perm[:-2]]
    flat = relax.op.reshape(moved, lead + [length * comps])
    # float64 accumulation: the reference's near-zero outputs (e.g. imaginary parts) need it
    out = relax.op.matmul(relax.op.astype(flat, "float64"), relax.const(matrix, "float64"))
    out = bb.normalize(relax.op.astype(relax.op.reshape(out, lead + [m, comps_out]), dt))
    inv = [0] * rank
    for i, p in enumerate(perm):
        inv[p] = i
    return relax.op.permute_dims(out, inv)


@register("DFT")
class DFT(OnnxOpConverter):
    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        n = _const_value(_opt(inputs, 1)) if _opt(inputs, 1) is not None else None
        return _apply_dft(bb, inputs[0], int(attr.get("axis", 1)), None if n is None else int(n.reshape(-1)[0]),
                          bool(attr.get("inverse", 0)), bool(attr.get("onesided", 0)))

    @classmethod
    def _impl_v20(cls, bb, inputs, attr, params):
        n_e, axis_e = _opt(inputs, 1), _opt(inputs, 2)
        n = _const_value(n_e) if n_e is not None else None
        axis = _const_value(axis_e) if axis_e is not None else _np.array(-2)
        if (n_e is not None and n is None) or axis is None:
            raise ValueError("DFT needs constant dft_length and axis.")
        return _apply_dft(bb, inputs[0], int(axis.reshape(-1)[0]), None if n is None else int(n.reshape(-1)[0]),
                          bool(attr.get("inverse", 0)), bool(attr.get("onesided", 0)))


@register("STFT")
class STFT(OnnxOpConverter):
    """Frames gathered with constant indices, windowed, then the DFT matrix (onesided by default)."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        x, step_e, window, length_e = inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3)
        step = int(_require_consts("STFT", [step_e])[0].reshape(-1)[0])
        if length_e is not None:
            frame = int(_require_consts("STFT", [length_e])[0].reshape(-1)[0])
        else:
            frame = _shape(window)[0]
        _, signal, _ = _shape(x)
        frames = 1 + (signal - frame) // step
        idx = (_np.arange(frames)[:, None] * step + _np.arange(frame)[None, :]).astype("int64")
        framed = relax.op.take(x, relax.const(idx, "int64"), axis=1)  # [batch, frames, frame, comps]
        if window is not None:
            framed = framed * relax.op.reshape(window, [1, 1, frame, 1])
        return _apply_dft(bb, bb.normalize(framed), 2, frame, False, bool(attr.get("onesided", 1)))


# --- integer (quantized) matmul / conv: int32 accumulation like the reference -------------------


def _minus_zero_point(x, zp, axis_shape=None):
    x32 = relax.op.astype(x, "int32")
    if zp is None:
        return x32
    z = relax.op.astype(zp, "int32")
    if axis_shape is not None:
        z = relax.op.reshape(z, axis_shape)
    return x32 - z


def _requantize(bb, acc, factor, y_zp, out_dtype: str):
    """round(acc * factor) + zero point, saturated: in float64 as the reference promotes it."""
    d = relax.op.astype(acc, "float64") * relax.op.astype(factor, "float64")
    if y_zp is not None:
        d = d + relax.op.astype(y_zp, "float64")
    info = _np.iinfo(out_dtype)
    return relax.op.astype(relax.op.clip(relax.op.round(d), int(info.min), int(info.max)), out_dtype)


@register("QLinearMatMul")
class QLinearMatMul(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (inputs + [None] * 8)[:8]
        acc = relax.op.matmul(_minus_zero_point(a, a_zp), _minus_zero_point(b, b_zp), out_dtype="int32")
        factor = a_s * b_s / y_s
        out_dtype = _dtype(y_zp) if y_zp is not None else _dtype(a)
        return _requantize(bb, acc, factor, y_zp, out_dtype)


@register("ConvInteger")
class ConvInteger(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w, x_zp, w_zp = (list(inputs) + [None] * 4)[:4]
        wz = None
        if w_zp is not None and _rank(w_zp) == 1 and _shape(w_zp)[0] > 1:
            wz = [_shape(w_zp)[0]] + [1] * (_rank(w) - 1)
        xi = bb.normalize(_minus_zero_point(x, x_zp))
        wi = bb.normalize(_minus_zero_point(w, w_zp, wz))
        return _tvm.Conv.get_converter(11)(bb, [xi, wi, None], attr, params)


@register("QLinearConv")
class QLinearConv(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = inputs[:8]
        bias = _opt(inputs, 8)
        wz = [_shape(w_zp)[0]] + [1] * (_rank(w) - 1) if w_zp is not None and _rank(w_zp) == 1 and _shape(w_zp)[0] > 1 else None
        xi = bb.normalize(_minus_zero_point(x, x_zp))
        wi = bb.normalize(_minus_zero_point(w, w_zp, wz))
        acc = bb.normalize(_tvm.Conv.get_converter(11)(bb, [xi, wi, None], attr, params))
        if bias is not None:
            acc = acc + relax.op.reshape(relax.op.astype(bias, "int32"), [1, -1] + [1] * (_rank(x) - 2))
        ws = w_s if _rank(w_s) == 0 or _shape(w_s) == [1] else relax.op.reshape(w_s, [1, -1] + [1] * (_rank(x) - 2))
        out_dtype = _dtype(y_zp) if y_zp is not None else _dtype(x)
        return _requantize(bb, acc, x_s * ws / y_s, y_zp, out_dtype)


@register("LinearAttention")
class LinearAttention(OnnxOpConverter):
    """LinearAttention (opset 26): the reference's recurrence (linear / gated / delta / gated_delta
    update rules, grouped-query heads) unrolled over the static sequence length, in float32."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        q, k, v = inputs[0], inputs[1], inputs[2]
        past, decay, beta = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
        rule = _attr_str(attr, "update_rule", "gated_delta")
        gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        qh, kvh = int(attr["q_num_heads"]), int(attr["kv_num_heads"])
        out_dt = _dtype(q)
        b, t, _ = _shape(q)
        dk, dv = _shape(q)[2] // qh, _shape(v)[2] // kvh
        group = qh // kvh

        def heads(x, n):  # (B, T, H*D) -> (B, H, T, D) float32
            x = bb.normalize(relax.op.astype(x, "float32")) if _dtype(x) != "float32" else x
            return bb.normalize(relax.op.permute_dims(relax.op.reshape(x, [b, t, n, -1]), [0, 2, 1, 3]))

        q4, k4, v4 = heads(q, qh), heads(k, kvh), heads(v, kvh)
        if gating:
            decay4 = heads(decay, kvh)  # (B, Hkv, T, 1) per head or (B, Hkv, T, dk) per key dimension
        if delta:
            beta4 = heads(beta, _shape(beta)[2])  # (B, Hkv or 1, T, 1)
        if past is not None:
            state = bb.normalize(relax.op.astype(past, "float32") if _dtype(past) != "float32" else past)
            state_dt = _dtype(past)
        else:
            state = bb.normalize(relax.op.zeros((b, kvh, dk, dv), "float32"))
            state_dt = out_dt
        scale = attr.get("scale")
        scale = float(1 / _np.sqrt(dk)) if not scale else float(scale)

        def at(x, i):
            return relax.op.squeeze(relax.op.strided_slice(x, [2], [i], [i + 1]), [2])

        outs = []
        for i in range(t):
            k_t, v_t = at(k4, i), at(v4, i)
            if gating:
                state = state * relax.op.expand_dims(relax.op.exp(at(decay4, i)), -1)
            if delta:
                retrieved = relax.op.squeeze(relax.op.matmul(relax.op.expand_dims(k_t, 2), state), [2])
                v_t = at(beta4, i) * (v_t - retrieved)
            state = bb.normalize(state + relax.op.expand_dims(k_t, -1) * relax.op.expand_dims(v_t, 2))
            read = state if group == 1 else relax.op.repeat(state, group, axis=1)
            o = relax.op.matmul(relax.op.expand_dims(at(q4, i), 2), read)  # (B, Hq, 1, dv)
            outs.append(bb.normalize(o * _const(scale, "float32")))
        y = bb.normalize(relax.op.concat(outs, axis=2))  # (B, Hq, T, dv)
        y = relax.op.reshape(bb.normalize(relax.op.permute_dims(y, [0, 2, 1, 3])), [b, t, qh * dv])
        if out_dt != "float32":
            y = relax.op.astype(y, out_dt)
        present = relax.op.astype(state, state_dt) if state_dt != "float32" else state
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([y, present])
        return y


@register("Col2Im")
class Col2Im(OnnxOpConverter):
    """Col2Im is linear in its input: with constant image/block shapes its matrix is the ONNX
    reference applied to the basis, and the operator becomes one matmul per (batch, channel)."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        x = inputs[0]
        image, block = _require_consts("Col2Im", [inputs[1], inputs[2]])
        n, cb, length = _shape(x)
        bl = int(_np.prod(block))
        k = bl * length
        basis = _np.eye(k, dtype=_np.float64).reshape(k, bl, length)
        cols = _reference_constant("Col2Im", attr, [basis, image, block])  # [k, 1, *image]
        matrix = cols.reshape(k, -1)
        channels = cb // bl
        dt = _dtype(x)
        flat = relax.op.reshape(x, [n, channels, k])
        out = relax.op.matmul(flat, relax.const(matrix.astype(dt), dt))
        return relax.op.reshape(out, [n, channels] + [int(v) for v in image])


# --- quantize / dequantize: float8 formats and blocked scales on top of TVM's converters ---------


def _q_param(bb, p, x_rank: int, axis: int, block: int):
    """Scale or zero point broadcastable against x: per-tensor, per-axis (1-D) or blocked."""
    if p is None:
        return None
    rank = _rank(p)
    if block and rank == x_rank:
        return bb.normalize(relax.op.repeat(p, block, axis=axis))
    if rank == 1 and x_rank > 1 and _shape(p)[0] > 1:
        shape = [1] * x_rank
        shape[axis] = _shape(p)[0]
        return relax.op.reshape(p, shape)
    return p


def _to_float32(bb, x):
    if _true_dtype(x) in _SMALL_FLOATS:
        return bb.normalize(_float8_decode(bb, x, "float32"))
    return bb.normalize(relax.op.astype(x, "float32")) if _dtype(x) != "float32" else x


@register("DequantizeLinear")
class DequantizeLinear(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, scale, zp = inputs[0], inputs[1], _opt(inputs, 2)
        block = int(attr.get("block_size", 0))
        if _true_dtype(x) not in _SMALL_FLOATS and _true_dtype(x) not in _SUBBYTE_BITS and not block:
            return _tvm.DequantizeLinear.get_converter(21)(bb, inputs, attr, params)
        axis = attr.get("axis", 1) % max(_rank(x), 1)
        xf = _to_float32(bb, x)
        if zp is not None:
            xf = xf - _q_param(bb, _to_float32(bb, zp), _rank(x), axis, block)
        out = xf * _q_param(bb, _to_float32(bb, scale), _rank(x), axis, block)
        out_dt = _dtype(scale)
        return relax.op.astype(out, out_dt) if out_dt != "float32" else out


@register("QuantizeLinear")
class QuantizeLinear(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, scale, zp = inputs[0], inputs[1], _opt(inputs, 2)
        block = int(attr.get("block_size", 0))
        from onnx import helper

        out_dt = _true_dtype(zp) if zp is not None else (
            str(helper.tensor_dtype_to_np_dtype(int(attr["output_dtype"]))) if attr.get("output_dtype") else "uint8")
        if out_dt not in _SMALL_FLOATS and out_dt not in _SUBBYTE_BITS and not block:
            return _tvm.QuantizeLinear.get_converter(10)(bb, inputs, attr, params)
        axis = attr.get("axis", 1) % max(_rank(x), 1)
        y = _to_float32(bb, x) / _q_param(bb, _to_float32(bb, scale), _rank(x), axis, block)
        if out_dt in _SMALL_FLOATS:
            if zp is not None:
                y = y + _q_param(bb, _to_float32(bb, zp), _rank(x), axis, block)
            return _float8_encode(bb, bb.normalize(y), out_dt, bool(attr.get("saturate", 1)))
        y = relax.op.round(y)
        if zp is not None:
            y = y + _q_param(bb, _to_float32(bb, zp), _rank(x), axis, block)
        if out_dt in _SUBBYTE_BITS:
            bits = _SUBBYTE_BITS[out_dt]
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if out_dt.startswith("int") else (0, (1 << bits) - 1)
            return _mark(bb, relax.op.astype(relax.op.clip(y, lo, hi), SUBBYTE_CONTAINERS[out_dt]), out_dt)
        info = _np.iinfo(out_dt)
        return relax.op.astype(relax.op.clip(y, int(info.min), int(info.max)), out_dt)


@register("TensorScatter")
class TensorScatter(OnnxOpConverter):
    """TensorScatter (opset 24, KV-cache writes): each output position along ``axis`` takes the
    update row it receives (linear or circular write from write_indices[batch]) or keeps the cache."""

    @classmethod
    def _impl_v24(cls, bb, inputs, attr, params):
        past, update, where = inputs[0], inputs[1], _opt(inputs, 2)
        shape = _shape(past)
        rank = len(shape)
        axis = attr.get("axis", -2) % rank
        max_len, seq = shape[axis], _shape(update)[axis]
        pos_shape = [1] * rank
        pos_shape[axis] = max_len
        pos = relax.const(_np.arange(max_len, dtype="int64").reshape(pos_shape), "int64")
        if where is not None:
            start = relax.op.reshape(relax.op.astype(where, "int64"), [shape[0]] + [1] * (rank - 1))
            offset = pos - start
        else:
            offset = pos
        if _attr_str(attr, "mode", "linear") == "circular":
            offset = relax.op.floor_mod(offset, _const(max_len, "int64"))
        offset = bb.normalize(offset)
        inside = relax.op.logical_and(relax.op.greater_equal(offset, _const(0, "int64")),
                                      relax.op.less(offset, _const(seq, "int64")))
        idx_shape = list(shape)
        idx = relax.op.broadcast_to(relax.op.clip(offset, 0, seq - 1), idx_shape)
        picked = relax.op.gather_elements(update, idx, axis=axis)
        return relax.op.where(relax.op.broadcast_to(inside, idx_shape), picked, past)


@register("Det")
class Det(OnnxOpConverter):
    """Determinant of [..., n, n] by cofactor expansion (n <= 4: what graphs contain in practice)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        n = _shape(x)[-1]
        if n > 4:
            raise ValueError(f"Det of {n}x{n} matrices is not supported (at most 4x4).")
        rank = _rank(x)

        def entry(i, j):
            return bb.normalize(relax.op.squeeze(relax.op.strided_slice(x, [rank - 2, rank - 1], [i, j], [i + 1, j + 1]),
                                                 [rank - 2, rank - 1]))

        cells = [[entry(i, j) for j in range(n)] for i in range(n)]

        def det(rows, cols):
            if len(rows) == 1:
                return cells[rows[0]][cols[0]]
            total = None
            for k, c in enumerate(cols):
                term = cells[rows[0]][c] * det(rows[1:], cols[:k] + cols[k + 1:])
                total = term if total is None else (total - term if k % 2 else total + term)
            return bb.normalize(total)

        return det(list(range(n)), list(range(n)))


class _ReduceExtreme(OnnxOpConverter):
    """TVM's ReduceMax/ReduceMin, plus bool inputs and reductions over empty axes."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        tvm_conv = getattr(_tvm, cls.op_type).get_converter(18)
        if not isinstance(getattr(x, "ty", None), relax.TensorType) or x.ty.shape is None:
            return tvm_conv(bb, inputs, attr, params)
        shape = _shape(x)
        axes = attr.get("axes")
        if axes is None and len(inputs) > 1 and inputs[1] is not None:
            axes = _const_value(inputs[1])
        axes = list(range(len(shape))) if axes is None or len(axes) == 0 else [int(a) % len(shape) for a in axes]
        keep = attr.get("keepdims", 1)
        if any(shape[a] == 0 for a in axes):
            out_shape = [1 if a in axes else d for a, d in enumerate(shape)] if keep else \
                [d for a, d in enumerate(shape) if a not in axes]
            dt = _dtype(x)
            big = _np.inf if dt.startswith("float") else _np.iinfo(dt).max
            fill = -big if cls.op_type == "ReduceMax" else big
            return relax.const(_np.full(out_shape, fill, dtype=dt), dt)
        if _dtype(x) == "bool":
            as_int = bb.normalize(relax.op.astype(x, "int8"))
            out = tvm_conv(bb, [as_int] + list(inputs[1:]), attr, params)
            return relax.op.astype(bb.normalize(out), "bool")
        return tvm_conv(bb, inputs, attr, params)


for _op in ("ReduceMax", "ReduceMin"):
    register(_op)(type(_op, (_ReduceExtreme,), {"op_type": _op}))


@register("MaxUnpool")
class MaxUnpool(OnnxOpConverter):
    """Scatter the values to their (flat) indices in a zero tensor of the output shape."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        x, idx, out_shape_e = inputs[0], inputs[1], _opt(inputs, 2)
        shape = _shape(x)
        spatial = len(shape) - 2
        kernel = list(attr["kernel_shape"])
        strides = list(attr.get("strides", [1] * spatial))
        pads = list(attr.get("pads", [0] * 2 * spatial))
        inferred = shape[:2] + [(shape[2 + i] - 1) * strides[i] - pads[i] - pads[spatial + i] + kernel[i]
                                for i in range(spatial)]
        out_shape = inferred
        if out_shape_e is not None:
            out_shape = [int(v) for v in _require_consts("MaxUnpool", [out_shape_e])[0]]
        if out_shape != inferred:  # the indices address the inferred shape: re-address them
            idt = _dtype(idx)
            rest, coords = idx, []
            for d in reversed(inferred):
                coords.append(relax.op.floor_mod(rest, _const(d, idt)))
                rest = relax.op.floor_divide(rest, _const(d, idt))
            coords.reverse()
            idx = coords[0]
            for c, d in zip(coords[1:], out_shape[1:]):
                idx = idx * _const(d, idt) + c
            idx = bb.normalize(idx)
        dt = _dtype(x)
        total = int(_np.prod(out_shape))
        flat = relax.op.scatter_elements(relax.op.zeros((total,), dt), relax.op.reshape(idx, [-1]),
                                         relax.op.reshape(x, [-1]), axis=0)
        return relax.op.reshape(flat, out_shape)


@register("DeformConv")
class DeformConv(OnnxOpConverter):
    """2-D deformable convolution (DCNv1/v2): each kernel tap samples the input bilinearly at its
    offset position (zero outside), scaled by the mask; then a grouped matmul with the weights."""

    @classmethod
    def _impl_v19(cls, bb, inputs, attr, params):
        x, w, offset = inputs[0], inputs[1], inputs[2]
        bias, mask = _opt(inputs, 3), _opt(inputs, 4)
        n, c, ih, iw = _shape(x)
        oc, cpg, kh, kw = _shape(w)
        _, _, oh, ow = _shape(offset)
        dt = _dtype(x)
        group, ogroup = int(attr.get("group", 1)), int(attr.get("offset_group", 1))
        sh, sw = attr.get("strides", (1, 1))
        dh, dw = attr.get("dilations", (1, 1))
        pt, pl = attr.get("pads", (0, 0, 0, 0))[:2]
        taps, pix = kh * kw, oh * ow
        # sampling positions [n, og, taps, pix]
        base_h = (_np.arange(kh)[:, None, None, None] * dh + _np.arange(oh)[None, None, :, None] * sh - pt)
        base_w = (_np.arange(kw)[None, :, None, None] * dw + _np.arange(ow)[None, None, None, :] * sw - pl)
        base_h = _np.broadcast_to(base_h, (kh, kw, oh, ow)).reshape(1, 1, taps, pix).astype(dt)
        base_w = _np.broadcast_to(base_w, (kh, kw, oh, ow)).reshape(1, 1, taps, pix).astype(dt)
        off = bb.normalize(relax.op.reshape(offset, [n, ogroup, taps, 2, pix]))
        ph = bb.normalize(relax.op.squeeze(relax.op.strided_slice(off, [3], [0], [1]), [3]) + relax.const(base_h, dt))
        pw = bb.normalize(relax.op.squeeze(relax.op.strided_slice(off, [3], [1], [2]), [3]) + relax.const(base_w, dt))
        h0, w0 = bb.normalize(relax.op.floor(ph)), bb.normalize(relax.op.floor(pw))
        lh, lw = bb.normalize(ph - h0), bb.normalize(pw - w0)
        flat_x = relax.op.reshape(x, [n, c, ih * iw])
        reps = c // ogroup
        sampled = None
        one = _const(1, dt)
        for dy, wy in ((0, one - lh), (1, lh)):
            for dx, wx in ((0, one - lw), (1, lw)):
                yy, xx = h0 + _const(dy, dt), w0 + _const(dx, dt)
                inside = relax.op.logical_and(
                    relax.op.logical_and(relax.op.greater_equal(yy, _const(0, dt)), relax.op.less(yy, _const(ih, dt))),
                    relax.op.logical_and(relax.op.greater_equal(xx, _const(0, dt)), relax.op.less(xx, _const(iw, dt))))
                idx = relax.op.astype(relax.op.clip(yy, 0, ih - 1) * _const(iw, dt) + relax.op.clip(xx, 0, iw - 1),
                                      "int64")
                weight = relax.op.where(inside, wy * wx, _const(0, dt))  # [n, og, taps, pix]
                idx_c = relax.op.repeat(relax.op.reshape(idx, [n, ogroup, taps * pix]), reps, axis=1)
                vals = relax.op.gather_elements(flat_x, bb.normalize(idx_c), axis=2)  # [n, c, taps*pix]
                term = vals * relax.op.repeat(relax.op.reshape(weight, [n, ogroup, taps * pix]), reps, axis=1)
                sampled = term if sampled is None else sampled + term
        if mask is not None:
            m = relax.op.reshape(mask, [n, ogroup, taps * pix])
            sampled = sampled * relax.op.repeat(m, reps, axis=1)
        cols = relax.op.reshape(bb.normalize(sampled), [n, group, cpg * taps, pix])
        wg = relax.op.reshape(w, [1, group, oc // group, cpg * taps])
        out = relax.op.reshape(relax.op.matmul(wg, cols), [n, oc, oh, ow])
        if bias is not None:
            out = out + relax.op.reshape(bias, [1, oc, 1, 1])
        return out


# --- ai.onnx.ml operators that are plain tensor math ---------------------------------------------


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


# --- ai.onnx.preview.training optimizers (update rules are element-wise math) --------------------


class _Optimizer(OnnxOpConverter):
    """Inputs: R (learning rate), T (step), then ``groups`` lists of tensors (X..., G..., ...)."""

    groups = 3

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        r, t = inputs[0], inputs[1]
        n = (len(inputs) - 2) // cls.groups
        lists = [inputs[2 + g * n: 2 + (g + 1) * n] for g in range(cls.groups)]
        results = [cls.update(bb, r, t, *items, attr) for items in zip(*lists)]
        flat = [res[k] for k in range(len(results[0])) for res in results]
        return relax.Tuple(flat)


def _f(value, dt):
    return _const(float(value), dt)


@register("Adagrad")
class Adagrad(_Optimizer):
    groups = 3

    @classmethod
    def update(cls, bb, r, t, x, g, h, attr):
        dt = _dtype(x)
        rr = relax.op.astype(r, dt) / (_f(1, dt) + relax.op.astype(t, dt) * _f(attr.get("decay_factor", 0.0), dt))
        g_reg = _f(attr.get("norm_coefficient", 0.0), dt) * x + g
        h_new = bb.normalize(h + g_reg * g_reg)
        x_new = x - rr * g_reg / (relax.op.sqrt(h_new) + _f(attr.get("epsilon", 0.0), dt))
        return bb.normalize(x_new), h_new


@register("Momentum")
class Momentum(_Optimizer):
    groups = 3

    @classmethod
    def update(cls, bb, r, t, x, g, v, attr):
        dt = _dtype(x)
        alpha, beta = _f(attr["alpha"], dt), _f(attr["beta"], dt)
        g_reg = _f(attr.get("norm_coefficient", 0.0), dt) * x + g
        beta_t = relax.op.where(relax.op.greater(t, _const(0, _dtype(t))), beta, _f(1, dt))
        v_new = bb.normalize(alpha * v + beta_t * g_reg)
        rr = relax.op.astype(r, dt)
        if _attr_str(attr, "mode", "standard") == "nesterov":
            x_new = x - rr * (g_reg + alpha * v_new)
        else:
            x_new = x - rr * v_new
        return bb.normalize(x_new), v_new


@register("Adam")
class Adam(_Optimizer):
    groups = 4

    @classmethod
    def update(cls, bb, r, t, x, g, v, h, attr):
        dt = _dtype(x)
        alpha, beta = _f(attr.get("alpha", 0.9), dt), _f(attr.get("beta", 0.999), dt)
        g_reg = _f(attr.get("norm_coefficient", 0.0), dt) * x + g
        v_new = bb.normalize(alpha * v + (_f(1, dt) - alpha) * g_reg)
        h_new = bb.normalize(beta * h + (_f(1, dt) - beta) * g_reg * g_reg)
        tf = relax.op.astype(t, dt)
        rr = relax.op.astype(r, dt)
        adjusted = rr * relax.op.sqrt(_f(1, dt) - relax.op.power(beta, tf)) / (_f(1, dt) - relax.op.power(alpha, tf))
        rr = relax.op.where(relax.op.greater(t, _const(0, _dtype(t))), adjusted, rr)
        x_new = x - rr * (v_new / (relax.op.sqrt(h_new) + _f(attr.get("epsilon", 0.0), dt)))
        x_final = (_f(1, dt) - _f(attr.get("norm_coefficient_post", 0.0), dt)) * x_new
        return bb.normalize(x_final), v_new, h_new


@register("Trilu")
class Trilu(OnnxOpConverter):
    """Mask by (column - row) against k, which may be a run-time scalar (empty tensors included)."""

    @classmethod
    def _impl_v14(cls, bb, inputs, attr, params):
        x, k = inputs[0], _opt(inputs, 1)
        rows, cols = _shape(x)[-2:]
        diff = (_np.arange(cols)[None, :] - _np.arange(rows)[:, None]).astype("int64")
        kk = relax.op.astype(k, "int64") if k is not None else _const(0, "int64")
        diff_c = relax.const(diff, "int64")
        keep = relax.op.greater_equal(diff_c, kk) if attr.get("upper", 1) else relax.op.less_equal(diff_c, kk)
        return relax.op.where(keep, x, relax.op.zeros_like(x))


@register("IsInf")
class IsInf(OnnxOpConverter):
    """Honours detect_negative / detect_positive (TVM's converter flags both signs always)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x = inputs[0]
        dt = _dtype(x)
        inf = relax.op.isinf(x)
        pos, neg = attr.get("detect_positive", 1), attr.get("detect_negative", 1)
        if pos and neg:
            return inf
        if not pos and not neg:
            return relax.op.zeros(x.ty.shape, "bool")
        side = relax.op.greater(x, _const(0, dt)) if pos else relax.op.less(x, _const(0, dt))
        return relax.op.logical_and(inf, side)
