"""Pooling and reductions over axes other than the innermost: max/average pooling, global mean, sums."""

from __future__ import annotations

from edgepack.backends.cpu.schedules.anatomy import reduction_anatomy
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import register_tile


class Pool(CpuRule):
    """A reduction of one operand whose innermost dimension is not reduced (NHWC pooling, mean over H, W).

    SIMD lanes run along that innermost dimension (the channels), the same register tile as a
    convolution; a reduction along the innermost dimension is RowReduction's.
    """

    rule_name = "cpu.Pool"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        anatomy = reduction_anatomy(sch)
        if anatomy is None or len(anatomy.reads) != 1 or anatomy.vector_axis is None:
            return False
        if not anatomy.contiguous_in(anatomy.reads[0], anatomy.vector_axis):
            return False
        register_tile(sch, anatomy, cpu)
        return True
