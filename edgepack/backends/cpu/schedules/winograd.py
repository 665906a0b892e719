"""The input transform of a Winograd convolution (``backends/cpu/winograd.py`` makes it)."""

from __future__ import annotations

from edgepack.backends.cpu.schedules.anatomy import child_blocks, static_extent
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import PARALLEL_MIN_ELEMENTS, vector_lanes

#: The name of the input transform's block (``V[e, p, c]``: tile position, tile, channel).
INPUT_BLOCK = "winograd_input"


class WinogradInput(CpuRule):
    """``V[e, p, c]``, 16 values per 4x4 input window ``p`` and channel: the tiles run in parallel, the
    16 positions unrolled (their coefficients become constants, the window's 16 loads are shared), the
    channels in SIMD vectors. (The generic elementwise loop nest, all loops fused, recomputes the
    window's indices for every vector and ran 4x slower.)"""

    rule_name = "cpu.WinogradInput"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        blocks = child_blocks(sch)
        if len(blocks) != 1 or sch.get(blocks[0]).name_hint != INPUT_BLOCK:
            return False
        block = blocks[0]
        position, tile, channel = sch.get_loops(block)
        channels = static_extent(sch, channel) or 1
        bits = int(sch.get(block).writes[0].source.dtype.bits)
        lanes = vector_lanes(channels, cpu.lanes(bits))
        outer, lane = sch.split(channel, [None, lanes])
        sch.reorder(tile, outer, position, lane)
        if lanes > 1:
            sch.vectorize(lane)
        sch.unroll(position)
        if (static_extent(sch, tile) or 1) * 16 * channels >= PARALLEL_MIN_ELEMENTS:
            sch.parallel(tile)
        return True
