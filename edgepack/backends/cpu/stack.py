"""Kernel-local buffers on the stack: the TIR pipeline of CPU builds.

TVM gives a buffer the stack only when its scope is ``global`` and it is under 1 KiB; every other one
(the ``local`` accumulators of a register tile, a tile's padded input copy) is asked of the runtime's
workspace pool (``TVMBackendAllocWorkspace``) where it is declared: inside a parallel loop, once per
iteration, and LLVM then keeps the accumulators in memory, not in registers. On a Zen 4 core,
PP-OCR's 24x96 pointwise 8 -> 8 convolution ran in 6.9 us with its loop parallel, 3.2 us with its
tile on the stack (one thread either way). So CPU builds lower every buffer of a known size up to
``STACK_LIMIT_BYTES`` to a stack slot (the runtime's and a phone's worker threads have at least
512 KiB of stack), one whose extents change at run time (a register tile over a ``--dim`` size) at the
bound of its extents, through TVM's own opt-out of the workspace call (``disable_lower_builtin``). The
pipeline also rounds half to even with an instruction LLVM vectorizes (``round_even.py``) and keeps
integer sums scaled to float from being contracted into fused multiply-adds (``separate_products.py``).

``tir_pipeline()`` registers, once, TVM's default TIR pipeline with that pass added before
``LowerTVMBuiltin`` and returns its name (candidates built for tuning use it too, so that records and
default schedules are timed alike). TVM is imported only then: ``edgepack --help`` does not need it.
"""

from __future__ import annotations

import functools
from math import prod

from edgepack.backends.cpu.round_even import round_even
from edgepack.backends.cpu.whole_tiles import unpredicated_tiles
from edgepack.backends.separate_products import separate_products

TIR_PIPELINE = "edgepack-cpu"
STACK_LIMIT_BYTES = 16 * 1024
_KEEP_OFF_WORKSPACE = "disable_lower_builtin"  # TVM's kDisableLowerTVMBuiltin


def _bytes(buffer) -> int | None:
    try:
        elements = prod(int(extent) for extent in buffer.shape)
    except TypeError:  # a dynamic extent
        return None
    return elements * buffer.dtype.bits * buffer.dtype.lanes // 8


def _bounded(buffer):
    """``buffer`` (a kernel-local one with run-time extents) at the largest size they can take, where that is
    known: a register tile over a ``--dim`` size is declared ``min(W, 4) * 24`` values, at most 96. None
    where the size has no bound or is known already."""
    from tvm import sym, tirx

    if _bytes(buffer) is not None:
        return None
    analyzer = sym.Analyzer()
    bounds = [analyzer.const_int_bound(extent).max_value for extent in buffer.shape]
    if any(b >= sym.ConstIntBound.POS_INF or b <= 0 for b in bounds):
        return None
    shape = [tirx.IntImm(str(extent.ty.dtype), b) for extent, b in zip(buffer.shape, bounds)]
    return tirx.decl_buffer(shape, buffer.dtype, buffer.name, scope=buffer.scope())


def _on_stack(alloc):
    from tvm import tirx

    size = _bytes(alloc.buffer)
    if not size or size > STACK_LIMIT_BYTES or _KEEP_OFF_WORKSPACE in alloc.annotations:  # 0: TVM refuses it
        return alloc
    annotations = dict(alloc.annotations)
    annotations[_KEEP_OFF_WORKSPACE] = tirx.IntImm("int32", 1)
    return tirx.AllocBuffer(alloc.buffer, annotations)


def _stack_allocations():
    """The pass: every buffer of a known size up to ``STACK_LIMIT_BYTES`` declared in a kernel on the stack."""
    import tvm_ffi
    from tvm import tirx
    from tvm.ir.expr import Var

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.StackAllocations")
    def stack_allocations(func, _mod, _ctx):
        allocs: list = []
        tvm_ffi.structural_walk(func.body, [(tirx.AllocBuffer, allocs.append)], order="pre")
        bounded = [(a.buffer, new) for a in allocs if (new := _bounded(a.buffer)) is not None]

        def at_bound(var):  # the buffer is a variable: its declaration and every load and store name it
            return next((new for old, new in bounded if var.same_as(old)), var)

        body = tvm_ffi.structural_map(func.body, [(Var, at_bound)]) if bounded else func.body
        return func.with_body(tvm_ffi.structural_map(body, [(tirx.AllocBuffer, _on_stack)]))

    return stack_allocations


def _pipeline():
    import tvm
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower, finalize_host, finalize_device = default_s_tir_pipeline()
    # rounding rewritten before TVM's vectorizer, which writes a vector ``nearbyint`` lane by lane
    return (tvm.transform.Sequential([unpredicated_tiles(), round_even(), separate_products(), lower]),
            lambda: tvm.transform.Sequential([_stack_allocations(), finalize_host()]), finalize_device)


@functools.cache
def tir_pipeline() -> str:
    """The name of the CPU builds' TIR pipeline, registered with TVM (once per process)."""
    from tvm import tirx

    tirx.register_tir_pipeline(TIR_PIPELINE, _pipeline)
    return TIR_PIPELINE
