"""Kernels that read a large activation walk their parallel loop backwards, within each thread's part.

A kernel writes its output in the order of its parallel loop (rows first), and the next kernel reads it
in the same order. Where the tensor outgrows a core's L2, the rows read first are the ones written
longest ago, and each read evicts the rows written last: with LRU caches nothing read is still in L2.
Read backwards, the first rows read are the last ones written, still in the cache. TVM gives each
thread one contiguous part of a parallel loop, so the reader walks each part backwards: a thread then
reads first what it wrote last itself (reversed as a whole, thread 0 would read what thread 1 wrote,
from the other core's cache).

``mark_backward_kernels`` (a Relax pass, after scheduling) picks the kernels, in the order the model
calls them: a kernel whose largest activation input exceeds ``LARGE_INPUT_BYTES`` walks backwards
where the kernel that wrote that input walked forwards (two kernels in a row both backwards would read
in the writer's order again); a kernel called at several places keeps its first choice. It marks them
(``BACKWARD_ATTR``). ``reverse_parallel_loops`` (a TIR pass, after the loops are lowered) rewrites a
marked kernel's first parallel loop to walk each part backwards, its second forwards again (a kernel
that pads its input in a pass of its own then reads the padded copy), and so on. The parts depend on
the thread count, known only when the kernel runs: the kernel asks the runtime
(``runtime.NumThreads``, the count the thread pool splits the loop by). Any count gives the same
numbers (each part's iterations are a permutation of it); a count that differs only loses the gain.

MobileNetV2 (its four fused depthwise/pointwise kernels over 112x112 and 56x56 expansions), measured by
a prototype of this, at 1 thread: 2-7% faster in each of four comparisons of fresh processes.
"""

from __future__ import annotations

import logging
from math import prod
from typing import Any

import numpy as np

from edgepack.backends.relax_exprs import dtype_of, static_shape

logger = logging.getLogger("edgepack.schedules")

#: The PrimFunc attribute that marks a kernel whose parallel loops alternate, the first one backwards.
BACKWARD_ATTR = "edgepack.backward_parallel"
#: An input larger than this (a core's L2 on the CPUs edgepack targets: 0.5-2 MiB) is read backwards.
LARGE_INPUT_BYTES = 1 << 20


def parallel_extents(prim_func) -> list[int | None]:
    """The extents of ``prim_func``'s parallel loops, in order (None: not a constant)."""
    import tvm_ffi
    from tvm import tirx

    found: list[int | None] = []

    def visit(loop) -> None:
        if loop.kind == tirx.ForKind.PARALLEL:
            found.append(int(loop.extent.value) if isinstance(loop.extent, tirx.IntImm) else None)

    tvm_ffi.structural_walk(prim_func.body, [(tirx.For, visit)], order="pre")
    return found


def row_chunk(extent: int | None, output) -> int:
    """Iterations per output row of a parallel loop of ``extent`` over ``output``'s pixels (NHWC: the
    loop splits batch x rows, then each row in tiles), 1 where it does not divide so."""
    shape = static_shape(output)
    if extent is None or shape is None or len(shape) != 4 or extent % (shape[0] * shape[1]):
        return 1
    return extent // (shape[0] * shape[1])


def _bytes(expr) -> int:
    """The size of a tensor of static shape (0 for anything else)."""
    shape, dtype = static_shape(expr), dtype_of(expr)
    if shape is None or dtype is None:
        return 0
    try:
        return prod(shape) * np.dtype(dtype).itemsize
    except TypeError:  # a dtype numpy does not know (bfloat16, bool vectors): not a large activation here
        return 0


def _kernel_call(mod, value):
    """(the PrimFunc's GlobalVar, its arguments) of a ``call_tir``, or None."""
    from tvm import relax, tirx

    if not isinstance(value, relax.Call) or getattr(value.op, "name", "") != "relax.call_tir":
        return None
    gvar = value.args[0]
    if gvar not in mod.get_global_vars() or not isinstance(mod[gvar], tirx.PrimFunc):
        return None
    return gvar, list(value.args[1].fields) if isinstance(value.args[1], relax.Tuple) else [value.args[1]]


def choose_backward(mod) -> dict[Any, int]:
    """Per called PrimFunc (GlobalVar): 0 where it walks forwards, else the iterations of its first
    parallel loop that it walks forwards as one chunk (``row_chunk``) while walking the chunks backwards."""
    from tvm import relax

    choice: dict[Any, int] = {}
    written_backwards: dict[Any, bool] = {}  # var -> its writer's last parallel loop walked backwards
    for _gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = _kernel_call(mod, getattr(binding, "value", None))
                if call is None:
                    continue
                gvar, args = call
                loops = parallel_extents(mod[gvar])
                if gvar not in choice:
                    inputs = [a for a in args if isinstance(a, relax.Var)]
                    largest = max(inputs, key=_bytes, default=None)
                    backward = bool(loops) and largest is not None and _bytes(largest) > LARGE_INPUT_BYTES \
                        and not written_backwards.get(largest, False)
                    choice[gvar] = row_chunk(loops[0], binding.var) if backward else 0
                written_backwards[binding.var] = bool(choice[gvar]) and len(loops) % 2 == 1
    return choice


def mark_backward_kernels(marked: list[str] | None = None):
    """The Relax pass: marks the kernels ``choose_backward`` picks; their names go to ``marked``."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="EdgepackBackwardKernels")
    def _pass(mod, _ctx):
        chosen = {gvar: chunk for gvar, chunk in choose_backward(mod).items() if chunk}
        for gvar, chunk in chosen.items():
            mod[gvar] = mod[gvar].with_attr(BACKWARD_ATTR, chunk)
            logger.info("%s walks backwards, in chunks of %d", gvar.name_hint, chunk)
        if marked is not None:
            marked.extend(sorted(g.name_hint for g in chosen))
        return mod

    return _pass


def _backwards(loop, threads, chunk: int):
    """``loop`` (parallel, lowered) walking each of ``threads`` contiguous parts backwards, by chunks of
    ``chunk`` iterations (an output row's tiles), each chunk forwards: a parallel loop over the parts, in
    each a serial loop from its last chunk down to its first (no division per iteration)."""
    from tvm import tirx

    dtype = str(loop.extent.ty.dtype)

    def const(value: int):
        return tirx.IntImm(dtype, value)

    def var(name: str):
        return tirx.Var(f"{loop.loop_var.name}_{name}", dtype)

    count = tirx.Cast(dtype, tirx.Max(threads, tirx.IntImm("int32", 1)))
    part, thread, lo, hi, back, start, end, step = (var(n) for n in (
        "part", "thread", "lo", "hi", "back", "start", "end", "step"))
    last = tirx.FloorDiv(tirx.Sub(hi, const(1)), const(chunk))  # the part's last chunk
    first = tirx.FloorDiv(lo, const(chunk))
    chunk_start = tirx.Mul(tirx.Sub(last, back), const(chunk))
    forwards = tirx.For(step, const(0), tirx.Sub(end, start), tirx.ForKind.SERIAL,
                        tirx.SeqStmt([tirx.Bind(loop.loop_var, tirx.Add(loop.min, tirx.Add(start, step))),
                                      loop.body]))
    chunks = tirx.For(back, const(0), tirx.Sub(tirx.Add(last, const(1)), first), tirx.ForKind.SERIAL,
                      tirx.SeqStmt([tirx.Bind(start, tirx.Max(chunk_start, lo)),
                                    tirx.Bind(end, tirx.Min(tirx.Add(chunk_start, const(chunk)), hi)),
                                    forwards]))
    per_thread = tirx.SeqStmt([
        tirx.Bind(lo, tirx.Min(tirx.Mul(thread, part), loop.extent)),
        tirx.Bind(hi, tirx.Min(tirx.Mul(tirx.Add(thread, const(1)), part), loop.extent)),
        tirx.IfThenElse(tirx.LT(lo, hi), chunks, None),
    ])
    return tirx.SeqStmt([
        # TVM's split of a parallel loop over its threads: ceil(extent / threads) iterations each
        tirx.Bind(part, tirx.FloorDiv(tirx.Sub(tirx.Add(loop.extent, count), const(1)), count)),
        tirx.For(thread, const(0), count, loop.kind, per_thread, loop.thread_binding, loop.annotations),
    ])


def reverse_parallel_loops():
    """The TIR pass (lowered loops, before ``LowerTVMBuiltin``): in each marked kernel, the first parallel
    loop walks each thread's part backwards, the second forwards, the third backwards, ..."""
    import tvm_ffi
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.ReverseParallelLoops")
    def _pass(func, _mod, _ctx):
        chunk = int(func.attrs[BACKWARD_ATTR]) if func.attrs and BACKWARD_ATTR in func.attrs else 0
        if chunk <= 0:
            return func
        threads = tirx.Var("threads", "int32")
        seen = [0]

        def visit(loop):
            if loop.kind != tirx.ForKind.PARALLEL:
                return loop
            seen[0] += 1
            return _backwards(loop, threads, chunk) if seen[0] % 2 == 1 else loop

        body = tvm_ffi.structural_map(func.body, [(tirx.For, visit)])
        if not seen[0]:
            return func
        return func.with_body(tirx.SeqStmt([tirx.Bind(threads, tirx.call_packed("runtime.NumThreads")), body]))

    return _pass
