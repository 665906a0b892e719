"""GPU schedules within the target's limits (issue 42): threads per workgroup and workgroup memory.

A profile's ``[limits]`` set the TVM target's ``max_num_threads`` and ``max_shared_memory_per_block``, but
not every dlight rule reads them: ``GeneralReduction`` launches 256 threads whatever the target says, and
``Matmul``'s tiles of workgroup memory follow its own configuration. A schedule over either limit would be a
kernel the GPU cannot launch (a phone's driver refuses it, PoCL asserts). ``over_limits`` says so of a
scheduled function, and the recording schedule pass (``scheduling.py``) then offers the function to the
next rule (``Fallback`` takes anything: one thread per element, no workgroup memory), so the kernel is
scheduled within the limits instead of being refused. The build still checks every kernel afterwards
(``GpuBackend.check_limits``).
"""

from __future__ import annotations

import math


def buffer_bytes(buffer) -> int:
    import tvm
    from tvm import tirx

    if not all(isinstance(d, tirx.IntImm) for d in buffer.shape):
        return 0  # a symbolic size: the driver checks it at launch
    dtype = tvm.runtime.DataType(str(buffer.dtype))
    return math.prod(int(d.value) for d in buffer.shape) * max(1, dtype.bits * dtype.lanes // 8)


def workgroup_memory(body) -> int:
    """Bytes of workgroup (OpenCL ``__local``, WGSL ``var<workgroup>``) memory a lowered kernel allocates: its
    ``shared`` buffers (a symbolic size counts as 0 here; the driver checks it at launch)."""
    import tvm_ffi
    from tvm import tirx

    total = [0]

    def visit(node):
        if str(node.buffer.scope()).startswith("shared"):
            total[0] += buffer_bytes(node.buffer)

    tvm_ffi.structural_walk(body, [(tirx.AllocBuffer, visit)], order="pre")
    return total[0]


def _allocated_shared(func) -> int:
    """Bytes of the workgroup-memory buffers the schedule's blocks allocate, at their full extents (an
    upper bound: lowering compacts a tile's buffer to what one workgroup touches)."""
    import tvm_ffi
    from tvm import s_tir

    total = [0]

    def visit(block):
        total[0] += sum(buffer_bytes(b) for b in block.alloc_buffers if str(b.scope()).startswith("shared"))

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)], order="pre")
    return total[0]


def _reduction_buffers(func, threads: dict) -> int:
    """Bytes of workgroup memory TVM's ``LowerThreadAllreduce`` adds for the schedule's cross-thread
    reductions (a block whose reduction iterator is bound to ``threadIdx``): one value per thread each."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx

    total = [0]

    def visit(realize):
        block = realize.block
        for iv, value in zip(block.iter_vars, realize.iter_values):
            if int(iv.iter_type) != 2:  # CommReduce
                continue
            used = []
            tvm_ffi.structural_walk(value, [(tirx.Var, used.append)], order="pre")
            spread = math.prod(threads[v][1] for v in {id(u): u for u in used}.values() if v in threads)
            if spread > 1:
                dtype = tvm.runtime.DataType(str(block.writes[0].source.dtype)) if block.writes else None
                total[0] += spread * (max(1, dtype.bits // 8) if dtype is not None else 4)
                return

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlockRealize, visit)], order="pre")
    return total[0]


def _thread_vars(func) -> dict:
    """The loop variables bound to ``threadIdx.*``, with their tags and constant extents."""
    import tvm_ffi
    from tvm import tirx

    found = {}

    def visit(loop):
        binding = loop.thread_binding
        if (loop.kind == tirx.ForKind.THREAD_BINDING and binding is not None
                and str(binding.thread_tag).startswith("threadIdx") and isinstance(loop.extent, tirx.IntImm)):
            found[loop.loop_var] = (str(binding.thread_tag), int(loop.extent.value))

    tvm_ffi.structural_walk(func.body, [(tirx.For, visit)], order="pre")
    return found


def _lowered_shared(func, target) -> int | None:
    """Bytes of workgroup memory the function allocates once lowered (buffers compacted); None where it does
    not lower."""
    import tvm
    from tvm import s_tir, tirx

    lower = tvm.transform.Sequential([
        s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(), s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(), s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
    ])
    try:
        with target:
            lowered = lower(tvm.IRModule({"main": func.with_attrs({"target": target, "global_symbol": "main"})}))
    except Exception:  # noqa: BLE001 - TVM's check failures: the next rule may lower
        return None
    return workgroup_memory(lowered["main"].body)


def over_limits(func, target) -> str | None:
    """Why the scheduled ``func`` asks more of a workgroup than ``target`` allows (``max_num_threads``,
    ``max_shared_memory_per_block``), or None when it does not."""
    attrs = target.attrs
    max_threads = int(attrs["max_num_threads"]) if "max_num_threads" in attrs else 0
    max_shared = int(attrs["max_shared_memory_per_block"]) if "max_shared_memory_per_block" in attrs else 0
    bound = _thread_vars(func)
    per_tag: dict[str, int] = {}  # a workgroup's size per threadIdx tag: the largest loop bound to it
    for tag, extent in bound.values():
        per_tag[tag] = max(per_tag.get(tag, 1), extent)
    threads = math.prod(per_tag.values())
    if max_threads and threads > max_threads:
        return f"{threads} threads per workgroup, over the target's {max_threads}"
    if not max_shared:
        return None
    reductions = _reduction_buffers(func, bound)
    if _allocated_shared(func) + reductions > max_shared:
        used = _lowered_shared(func, target)
        if used is None or used + reductions > max_shared:
            return (f"{used + reductions} bytes of workgroup memory, over the target's {max_shared}"
                    if used is not None else f"workgroup memory over the target's {max_shared} bytes (it does not lower)")
    return None
