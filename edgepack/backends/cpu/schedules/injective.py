"""Elementwise and data-movement kernels: activations, adds, transposes, reshapes, concatenation, padding."""

from __future__ import annotations

from edgepack.backends.cpu.schedules.anatomy import (
    child_blocks,
    is_spatial,
    stores_one_value,
    trivially_bound,
    worth_computing_once,
)
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import parallel_vectorize


class Injective(CpuRule):
    """Kernels without reductions: intermediate blocks inlined (but one that would then be computed again
    for every read: a per-channel gate broadcast over the image, ``worth_computing_once``), each remaining
    block's loops fused, split across the cores and into SIMD vectors along the innermost dimension."""

    rule_name = "cpu.Injective"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        blocks = child_blocks(sch)
        if not blocks or not all(is_spatial(sch, b) and trivially_bound(sch, b, symbolic=True) and stores_one_value(sch, b)
                                 for b in blocks):
            return False
        for block in blocks[:-1]:
            if worth_computing_once(sch, block, sch.get_consumers(block)):
                continue
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 - e.g. a block that writes a function output: kept
                pass
        for block in child_blocks(sch):
            parallel_vectorize(sch, block, cpu)
        return True
