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

Layout: ``importer`` (the importer subclass and :func:`from_onnx`), ``static_if`` (``If`` nodes decided
by the static shapes import only the branch taken), ``registry`` (the ``register``
decorator and the merged converter map), ``subbyte`` (the 8-bit containers of sub-byte types),
``common`` (helpers shared by the converters), and one module per operator family: ``activations``,
``normalization``, ``convolution``, ``pooling``, ``resize``, ``elementwise``, ``reductions``,
``data_movement``, ``attention``, ``recurrent``, ``casts``, ``quantization``, ``generators``,
``spectral``, ``losses``, ``detection`` (NonMaxSuppression), ``ml`` (ai.onnx.ml), ``optimizers``
(ai.onnx.preview.training) and ``qlinear_contrib`` (com.microsoft's quantized operators).
Importing this package imports every family module, which registers its converters.
"""

from __future__ import annotations

# importing a family module registers its converters (``@register``)
from edgepack.frontends.onnx_ops import (  # noqa: F401
    activations,
    attention,
    casts,
    convolution,
    data_movement,
    detection,
    elementwise,
    generators,
    losses,
    ml,
    normalization,
    optimizers,
    pooling,
    qlinear_contrib,
    quantization,
    recurrent,
    reductions,
    resize,
    spectral,
)
from edgepack.frontends.onnx_ops.importer import from_onnx
from edgepack.frontends.onnx_ops.registry import EDGEPACK_CONVERTERS, convert_map, register, supported_operators
from edgepack.frontends.onnx_ops.subbyte import SUBBYTE_CONTAINERS, container_dtype, from_container, to_container

__all__ = [
    "EDGEPACK_CONVERTERS",
    "SUBBYTE_CONTAINERS",
    "container_dtype",
    "convert_map",
    "from_container",
    "from_onnx",
    "register",
    "supported_operators",
    "to_container",
]
