"""Symbolic input dimensions (``--dim W=32..1280``): operands whose extents the model promises are equal.

A detector's feature pyramid adds a map upsampled 2x to the map of the next stage; with a fixed input
both are 40x40, with a symbolic one they are ``2 * ((H - 1) // 32 + 1)`` and ``(H - 1) // 16 + 1``, equal
only for the sizes the model supports (H a multiple of 32) and so unknown to Relax's type inference,
which then gives the sum an unknown shape that every later operator refuses. ONNX requires broadcast
operands (and the non-axis extents of Concat's) to agree at run time, so ``agree_operands`` states it:
each later operand is cast (``match_cast``, checked at run time by the VM) to the first one's extents
where both are symbolic and differ as written. A size off the model's grid then fails that check
instead of computing garbage; ``edgepack`` itself refuses such sizes earlier (the dim's step).
"""

from __future__ import annotations

from tvm import relax, tirx
from tvm.sym import Analyzer

from edgepack.frontends.onnx_ops.common import _const_value, _reference_constant

# operators whose operands broadcast against each other (or, Concat, agree off its axis)
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "PRelu",
                          "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
                          "BitShift", "Mod", "Concat"})


def _symbolic(dim) -> bool:
    return not isinstance(dim, tirx.IntImm)


def agree_operands(bb: relax.BlockBuilder, op_name: str, inputs: list, attrs: dict) -> list:
    """``inputs`` with symbolic extents cast to the first tensor operand's where they differ as written."""
    if op_name not in BROADCASTING:
        return inputs
    tensors = [(i, x) for i, x in enumerate(inputs)
               if isinstance(x, relax.Expr) and isinstance(x.ty, relax.TensorType) and x.ty.shape is not None]
    if len(tensors) < 2:
        return inputs
    _, first = tensors[0]
    rank = len(first.ty.shape)
    axis = int(attrs.get("axis", 0)) % rank if op_name == "Concat" and rank else None
    analyzer = Analyzer()
    result = type(inputs)(inputs)  # TVM's onnx_input: None past its end
    for i, x in tensors[1:]:
        dims = list(x.ty.shape)
        if len(dims) != rank:
            continue  # broadcasting across ranks: leading extents come from one side only
        changed = False
        for k, (want, have) in enumerate(zip(first.ty.shape, dims)):
            if k == axis or not (_symbolic(want) and _symbolic(have)):
                continue
            if not analyzer.can_prove_equal(want, have):
                dims[k], changed = want, True
        if changed:
            result[i] = bb.match_cast(x, relax.TensorType(dims, x.ty.dtype))
    return result


# --- shape arithmetic: Shape -> Cast/Slice/Gather/Concat/Mul ... -> Reshape, kept as a Relax shape ---

def _shape_values(expr) -> list | None:
    """The extents a Relax shape value holds, or None."""
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.ShapeType) and ty.values is not None:
        return list(ty.values)
    return None


def _int_constant(expr) -> list | None:
    """A constant 0-d or 1-d integer tensor as a list of ints, or None."""
    import numpy as np

    value = _const_value(expr)
    if value is None or value.ndim > 1 or not np.issubdtype(value.dtype, np.integer):
        return None
    return [int(v) for v in value.reshape(-1)]


def _operand(expr) -> list | None:
    values = _shape_values(expr)
    return values if values is not None else _int_constant(expr)


def _elementwise(op_name: str, a: list, b: list) -> list | None:
    if len(a) != len(b):
        if len(a) == 1:
            a = a * len(b)
        elif len(b) == 1:
            b = b * len(a)
        else:
            return None
    ops = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
           "Div": lambda x, y: tirx.floordiv(x, y) if not isinstance(y, int) or y else None}
    out = [ops[op_name](tirx.IntImm("int64", x) if isinstance(x, int) else x, y) for x, y in zip(a, b)]
    return None if any(v is None for v in out) else out


def shape_arithmetic(op_name: str, inputs: list, attrs: dict) -> relax.ShapeExpr | None:
    """The result of an integer op on a shape value (what ``Shape`` of a symbolic tensor gives) and constants,
    as a Relax shape, which Reshape, Expand, Tile and friends take as their target; None for anything else.

    ONNX exporters compute reshape targets at run time (Shape -> Slice -> Cast -> Concat -> Reshape); with
    fixed inputs ONNX Runtime folds those chains to constants before import, with a symbolic dimension they
    stay, and TVM's converters turn the shape into a tensor at the first Cast or Slice, after which Reshape
    has no shape to take. Only 1-d shape values are followed (the reshape targets exporters write), and only
    where an extent is symbolic."""
    present = [x for x in inputs if x is not None]
    if not present or all(_shape_values(x) is None for x in present):
        return None
    operands = [_operand(x) for x in present]
    if any(o is None for o in operands):
        return None
    if all(isinstance(v, int | tirx.IntImm) for o in operands for v in o):
        return None  # static shapes: TVM's converters as they are (they fold them)
    values = operands[0]
    if op_name in ("Cast", "Identity"):
        if op_name == "Cast" and int(attrs.get("to", 7)) not in (6, 7):  # int32, int64
            return None
        out = values
    elif op_name == "Concat":
        out = [v for o in operands for v in o]
    elif op_name == "Slice" and len(operands) >= 3:
        starts, ends = operands[1], operands[2]
        axes = operands[3] if len(operands) > 3 else [0]
        steps = operands[4] if len(operands) > 4 else [1]
        if len(starts) != 1 or axes not in ([0], [-1]) or steps != [1]:
            return None
        out = values[slice(starts[0], min(ends[0], len(values)) if ends[0] >= 0 else ends[0])]
    elif op_name == "Gather" and len(operands) == 2 and int(attrs.get("axis", 0)) == 0 \
            and _int_constant(present[1]) is not None and present[1].value.numpy().ndim == 1:
        out = [values[i] for i in operands[1]]
    elif op_name in ("Add", "Sub", "Mul", "Div") and len(operands) == 2:
        out = _elementwise(op_name, operands[0], operands[1])
    else:
        return None
    if out is None or not out:
        return None
    return relax.ShapeExpr([tirx.IntImm("int64", v) if isinstance(v, int) else v for v in out])


def static_shape_as_constant(expr):
    """A Relax shape whose extents are all static as an int64 constant; anything else as it is.

    With a symbolic input, ``Shape`` gives a Relax shape, and what is sliced or gathered from it stays one
    even where it picks only static extents (Paddle's exports tile an LSTM's zero state by the batch size,
    ``Concat(Shape(x)[0:1], [1, 1])``, beside a symbolic sequence length). TVM's importer lets only a few
    operators take a shape (not Tile, Mul, Range, ...); a constant every converter takes and folds."""
    import numpy as np

    if isinstance(expr, relax.ShapeExpr) and not any(map(_symbolic, expr.values)):
        return relax.const(np.array([int(v) for v in expr.values], "int64"), "int64")
    return expr


FOLDED_ELEMENTS = 64  # the most elements of an integer or bool result computed at import (shape arithmetic)


def folded_shape_arithmetic(op_name: str, inputs: list, attrs: dict, result):
    """``result`` (a converter's output) as a constant where it is a small integer or bool tensor computed
    from constants only; anything else as it is.

    With fixed input shapes ONNX Runtime folds an exporter's shape arithmetic before import; with a symbolic
    one (``--dim``) it stays, and some of TVM's converters compute on constants at run time (a Slice of step
    -1: Silero's STFT pads, ``Concat -> Reshape -> Slice(::-1) -> Transpose -> Reshape``), after which Pad
    refuses its pads as dynamic; an ``Equal`` of two extents would leave the ``If`` it decides to the run time.
    ONNX's reference evaluates the node instead."""
    import numpy as np

    ty = getattr(result, "ty", None)
    if not isinstance(result, relax.Call) or not isinstance(ty, relax.TensorType) or ty.shape is None \
            or str(ty.dtype) not in ("int32", "int64", "bool"):
        return result
    dims = [d for d in ty.shape]
    if any(_symbolic(d) for d in dims) or int(np.prod([int(d) for d in dims])) > FOLDED_ELEMENTS:
        return result
    given = list(inputs)
    while given and given[-1] is None:  # trailing optional inputs left out
        given.pop()
    values = [_const_value(x) if x is not None else None for x in given]
    if not values or any(v is None for v in values):  # a run-time operand, or an optional one skipped
        return result
    try:
        value = _reference_constant(op_name, attrs, values)
    except Exception:  # noqa: BLE001  the reference cannot evaluate it: leave it to the run time
        return result
    return relax.const(value.astype(str(ty.dtype)), str(ty.dtype))
