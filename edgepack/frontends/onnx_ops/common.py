"""Small helpers shared by the converter modules: shapes and dtypes of Relax expressions,
constants, optional inputs and attributes, and evaluating a node with the ONNX reference.
"""

from __future__ import annotations

import numpy as _np
import tvm
from tvm import relax


def _rank(expr) -> int:
    return len(expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _shape(expr) -> list[int]:
    return [int(d) for d in expr.ty.shape]


def _const(value, dtype: str):
    return relax.const(_np.array(value, dtype=dtype), dtype)


def _constant_of(expr):
    """The numpy value of a Relax constant, else None."""
    import tvm

    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _const_value(expr):
    """The numpy value of a Relax constant, or None (an empty optional input counts as absent)."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    return None


def _attr_str(attr: dict, name: str, default: str) -> str:
    value = attr.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def _opt(inputs, i):
    return inputs[i] if len(inputs) > i and inputs[i] is not None else None


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
