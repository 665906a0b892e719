"""Sub-byte ONNX types (INT4, UINT4, INT2, UINT2, FLOAT4E2M1) in 8-bit containers.

The container dtypes and the numpy conversions at the compiled model's boundary (``to_container`` /
``from_container``), and the record, kept while a graph is imported, of which Relax expressions hold
sub-byte values (the container dtype hides it): ``_mark`` writes it, ``_true_dtype`` reads it.
"""

from __future__ import annotations

import contextvars

import numpy as _np

from edgepack.frontends.onnx_ops.common import _dtype

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
