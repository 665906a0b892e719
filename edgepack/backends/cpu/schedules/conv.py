"""Convolutions: regular, grouped, depthwise and pointwise, in any layout (channels-last runs fastest)."""

from __future__ import annotations

from edgepack.backends.cpu.schedules.anatomy import reduction_anatomy
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import register_tile


class Conv2D(CpuRule):
    """A reduction over a window of the input times a weight (two operands, a window in the indices).

    Register-tiled along the output channels (SIMD lanes) and the output columns (repeats); the
    weights are rewritten at compile time into the order the tile reads them; padding is read in
    place (inlined), the bias, activation and residual add run on the accumulators of each tile.
    """

    rule_name = "cpu.Conv2D"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        anatomy = reduction_anatomy(sch)
        if anatomy is None or len(anatomy.reads) != 2 or not anatomy.window or anatomy.vector_axis is None:
            return False
        register_tile(sch, anatomy, cpu)
        return True
