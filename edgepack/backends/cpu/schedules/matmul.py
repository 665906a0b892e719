"""Dense layers, matmul and batch matmul."""

from __future__ import annotations

from edgepack.backends.cpu.schedules.anatomy import reduction_anatomy
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import register_tile


class Matmul(CpuRule):
    """A reduction of the product of two operands without a window: ``Y[b, m, n] = sum_k A * B``.

    Register-tiled along ``n`` (SIMD lanes) and ``m`` (repeats; a single row, as in a batch-1 dense
    layer, gets several vectors side by side instead); a constant ``B`` is rewritten at compile time so
    each of its loads is a contiguous vector.
    """

    rule_name = "cpu.Matmul"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        anatomy = reduction_anatomy(sch)
        if anatomy is None or len(anatomy.reads) != 2 or anatomy.window or anatomy.vector_axis is None:
            return False
        register_tile(sch, anatomy, cpu)
        return True
