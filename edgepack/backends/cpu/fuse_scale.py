"""A tensor scaled per channel, read in place by the 1x1 convolution after it: one kernel.

A squeeze-and-excitation block (MobileNetV3, PP-OCR's classifier) multiplies its input by a gate of one
value per channel (the hard sigmoid of a pooled, twice-projected copy of it), and a 1x1 convolution
projects the product. As two kernels the product is written whole and read back; at 2 threads half
of what the second kernel reads comes from the other core's cache, and PP-OCR cls's two largest such
products (2x96x200 and 3x96x88) took 33 us of its 317 (Zen 4, 2 threads), more than at 1 thread.
Merged, each tile of the convolution's pixels first scales its pixels (every channel) into a buffer on
the stack and its register tile reads them from L1 (``cpu.Conv2D``; the product ``x * g`` rounded as
before, then ``* w``: the same numbers to the bit): the product is never written to memory.

This pass runs after ``FuseOps`` and before ``FuseTIR`` (``fusion.py``): where a fused function of
elementwise operations only, whose output has the shape of one of its inputs and whose other inputs
hold one value per channel (channels-last), is read only by a channels-last 1x1 convolution of stride 1
as its data, the two become one fused function. Functions that compute anything costly per element
(``exp``, ``tanh``...: a sigmoid gate) are left apart: merged, the gate would be computed again for
every pixel instead of once per channel.
"""

from __future__ import annotations

from math import prod

from edgepack.backends.cpu.fuse_depthwise import pointwise_convolution
from edgepack.backends.cpu.fusion import fusion_pass, kernel_calls, merge_pairs
from edgepack.backends.relax_exprs import dtype_of, shape_of, tensor_type


def fuse_channel_scale():
    """The module pass (between ``FuseOps`` and ``FuseTIR``)."""

    def fuse(mod, func, builder):
        return merge_pairs(mod, func, builder, channel_scale, pointwise_convolution)

    return fusion_pass("EdgepackFuseChannelScale",
                       "per-channel scaling(s) read in place by the 1x1 convolution after them", fuse)


def channel_scale(mod, func) -> bool | None:
    """True for a fused function that scales a channels-last tensor by one value per channel with
    elementwise arithmetic alone (no function calls per element), else None."""
    calls = kernel_calls(func)
    if not calls or not all(_elementwise(mod[call.args[0]]) for call in calls):
        return None
    shape = _float32_shape(func.body)
    # a --dim build's kernels also take the symbolic extents they use (an R.Shape): not data
    inputs = [_float32_shape(p) for p in func.params if tensor_type(p) is not None]
    if shape is None or len(shape) != 4 or None in inputs:
        return None
    channels = shape[-1]
    data = [s for s in inputs if s == shape]
    gates = [s for s in inputs if s != shape]
    per_channel = all(all(isinstance(x, int) for x in s) and prod(s[:-1]) == 1 and s[-1] in (1, channels)
                      for s in gates if s)
    return True if len(data) == 1 and gates and per_channel and isinstance(channels, int) and channels > 1 \
        else None


def _float32_shape(expr) -> list[int | str] | None:
    """The shape, symbolic extents as their text (a ``--dim`` build's rows and columns)."""
    shape = shape_of(expr)
    return list(shape) if shape is not None and dtype_of(expr) == "float32" else None


def _elementwise(prim_func) -> bool:
    """Every block of the kernel is spatial and its values are arithmetic (adds, multiplies, min/max,
    selects), no calls: what costs a few instructions per element to recompute."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx

    if not isinstance(prim_func, tirx.PrimFunc):
        return False
    found = {"reduction": False, "call": False}

    def block(b) -> None:
        if any(iv.iter_type != tirx.IterVar.DataPar for iv in b.iter_vars):
            found["reduction"] = True

    def call(c) -> None:
        found["call"] = True

    tvm_ffi.structural_walk(prim_func.body, [(s_tir.SBlock, block), (tvm.ir.Call, call)], order="pre")
    return not found["reduction"] and not found["call"]
