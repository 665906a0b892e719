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
                not all(trivially_bound(sch, b) and stores_one_value(sch, b) for b in blocks):
            return False
        for block in blocks[:-1]:
            if is_spatial(sch, block) and len(sch.get_consumers(block)) == 1:
                try:
                    sch.compute_inline(block)
                except Exception:  # noqa: BLE001 - kept as a block of its own
                    pass
        for block in child_blocks(sch):
            if is_spatial(sch, block):
                parallel_vectorize(sch, block, cpu)
            else:
                _schedule_reduction(sch, block, cpu)
        return True


def _schedule_reduction(sch, block, cpu: CpuInfo) -> None:
    from tvm import tirx

    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == tirx.IterVar.DataPar]
    reduce = [loop for loop, kind in zip(loops, kinds) if kind != tirx.IterVar.DataPar]
    sch.reorder(*spatial, *reduce)
    if spatial:
        rows = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
        size = prod(static_extent(sch, loop) or 1 for loop in sch.get_loops(block))
        if (static_extent(sch, rows) or 1) > 1 and size >= PARALLEL_MIN_ELEMENTS:
            sch.parallel(rows)
    innermost = reduce[-1]
    extent = static_extent(sch, innermost) or 1
    lanes = power_of_two_divisor(extent, cpu.lanes(int(sch.get(block).writes[0].source.dtype.bits)))
    if lanes > 1 and extent > lanes:
        _, chunk = sch.split(innermost, [None, lanes])
        sch.unroll(chunk)
