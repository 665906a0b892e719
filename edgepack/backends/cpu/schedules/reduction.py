"""Reductions the register-tiled rules do not take: softmax, layer/instance norms, sums and means along
the innermost axis, several reductions in one kernel."""

from __future__ import annotations

from math import prod

from edgepack.backends.cpu.schedules.anatomy import (
    child_blocks,
    is_spatial,
    static_extent,
    stores_one_value,
    trivially_bound,
)
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import PARALLEL_MIN_ELEMENTS, parallel_vectorize, power_of_two_divisor


class Reduction(CpuRule):
    """Every block on its own: rows across the cores, elementwise blocks in SIMD vectors, and each
    reduction's innermost loop split into vector-length chunks that LLVM unrolls.

    An elementwise block read by one block only is inlined into it; one read by several (softmax's
    ``exp``) is computed once and kept, so no work is repeated.
    """

    rule_name = "cpu.Reduction"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        blocks = child_blocks(sch)
        if all(is_spatial(sch, b) for b in blocks) or \
                not all(trivially_bound(sch, b, symbolic=True) and stores_one_value(sch, b) for b in blocks):
            return False
        for block in blocks[:-1]:
            if is_spatial(sch, block) and len(sch.get_consumers(block)) == 1:
                try:
                    sch.compute_inline(block)
                except Exception:  # noqa: BLE001 - kept as a block of its own
                    pass
        for block in child_blocks(sch):
            if is_spatial(sch, block):
                parallel_vectorize(sch, block, cpu, odd_vectors=False)
            else:
                _schedule_reduction(sch, block, cpu)
        return True


# rows at least this many SIMD vectors long are reduced in partial results (``_partial_results``)
PARTIAL_RESULTS_MIN_EXTENT = 4


def _schedule_reduction(sch, block, cpu: CpuInfo) -> None:
    from tvm import tirx

    def rows_in_parallel(block) -> list:
        """The block's spatial loops first, fused and across the cores; its reduction loops."""
        loops = sch.get_loops(block)
        kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
        spatial = [loop for loop, kind in zip(loops, kinds) if kind == tirx.IterVar.DataPar]
        reduce = [loop for loop, kind in zip(loops, kinds) if kind != tirx.IterVar.DataPar]
        sch.reorder(*spatial, *reduce)
        _parallel_rows(sch, spatial, prod(static_extent(sch, loop) or 1 for loop in loops))
        return reduce

    simd = cpu.lanes(int(sch.get(block).writes[0].source.dtype.bits))
    innermost = _trailing_reductions_fused(sch, block)
    extent = static_extent(sch, innermost) or 1
    if len(sch.get_loops(block)) == 1 and extent >= PARALLEL_MIN_ELEMENTS \
            and extent % (WHOLE_TENSOR_PARTS * simd) == 0 and _whole_tensor_in_parts(sch, block, innermost, simd):
        return
    if sch.get(block).iter_vars[-1].iter_type != tirx.IterVar.DataPar \
            and extent >= PARTIAL_RESULTS_MIN_EXTENT * simd:
        partial = _partial_results(sch, block, innermost, simd)
        if partial is not None:
            *rows, chunks, lane = sch.get_loops(partial)  # rfactor put the lanes before the chunks
            sch.reorder(chunks, lane)
            _parallel_rows(sch, rows, prod(static_extent(sch, r) or 1 for r in rows) * extent)
            if extent % simd == 0:
                sch.vectorize(lane)
            else:
                sch.unroll(lane)
            rows_in_parallel(block)
            return
    reduce = rows_in_parallel(block)
    innermost = reduce[-1]
    extent = static_extent(sch, innermost) or 1
    lanes = power_of_two_divisor(extent, simd)
    if lanes > 1 and extent > lanes:
        _, chunk = sch.split(innermost, [None, lanes])
        sch.unroll(chunk)


# a whole tensor's reduction is this many contiguous parts, across the cores (``_whole_tensor_in_parts``)
WHOLE_TENSOR_PARTS = 8


def _whole_tensor_in_parts(sch, block, row, simd: int) -> bool:
    """A reduction of a whole tensor (``row``: all its loops fused) as ``WHOLE_TENSOR_PARTS`` contiguous parts
    across the cores, each reduced in ``simd`` partial results, then those combined. On one core, the
    min and max of the dynamically quantized CRNN's activations (x11 each, 160K values) got slower with
    2 threads than with 1 (0.12 -> 0.20 ms): the other core had written them. False where ``rfactor``
    does not take the block (nothing is changed then)."""
    def partial_results(s):  # each part's lanes as one loop, factored out of the reduction
        parts, chunks, lane = s.split(row, [WHOLE_TENSOR_PARTS, None, simd])
        s.reorder(parts, lane, chunks)
        return s.rfactor(s.fuse(parts, lane), 0)

    try:
        partial_results(sch.copy())
    except Exception:  # noqa: BLE001 - a ScheduleError: a reducer rfactor does not take (argmax's pairs)
        return False
    partial = partial_results(sch)
    both, chunks = sch.get_loops(partial)
    parts, lane = sch.split(both, [WHOLE_TENSOR_PARTS, simd])
    sch.reorder(parts, chunks, lane)
    sch.parallel(parts)
    sch.vectorize(lane)
    return True


def _trailing_reductions_fused(sch, block):
    """The block's innermost loop, with the reduction loops after its last spatial one fused into it: a
    reduction over a whole tensor (the min and max of a dynamic quantization's range) is then one long row
    for ``_partial_results``, not rows of reduction loops that cannot run in parallel. (Split by axis, the
    rule gave up on it: PP-OCRv2's dynamically quantized CRNN spent 3.7 of its 16.6 ms in such ranges.)"""
    from tvm import tirx

    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    trailing = len(kinds) - max((i + 1 for i, kind in enumerate(kinds) if kind == tirx.IterVar.DataPar), default=0)
    if trailing < 2 or any(static_extent(sch, loop) is None for loop in loops[-trailing:]):
        return loops[-1]
    return sch.fuse(*loops[-trailing:])


def _parallel_rows(sch, rows: list, elements: int) -> None:
    """``rows`` (a block's outer loops) fused into one loop, across the cores where there is more than one
    row and the block covers at least ``PARALLEL_MIN_ELEMENTS``."""
    if not rows:
        return
    fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    if (static_extent(sch, fused) or 1) > 1 and elements >= PARALLEL_MIN_ELEMENTS:
        sch.parallel(fused)


def _partial_results(sch, block, innermost, simd: int):
    """A long reduction as ``simd`` partial results, one per lane (TVM's ``rfactor``), combined at the end:
    each partial result is a chain of its own, so the adds (or max) of neighbouring elements no longer
    wait on each other. Summed in one chain, a row's reduction runs at one element per add latency (3-4
    cycles); LLVM may not reorder float adds itself. A row the lanes do not divide (a recogniser's 6625
    characters) has its last chunk guarded. The block of partial results, or None where ``rfactor`` does not
    take the block (it is then as it was)."""
    chunks, lane = sch.split(innermost, [None, simd])
    try:
        return sch.rfactor(lane, 0)
    except Exception:  # noqa: BLE001 - a ScheduleError: a reducer rfactor does not take (argmax's pairs)
        sch.fuse(chunks, lane)
        return None
