"""The input and output transforms of a Winograd convolution (``backends/cpu/winograd.py`` makes them)."""

from __future__ import annotations

from math import gcd

from edgepack.backends.cpu.schedules.anatomy import (
    child_blocks,
    is_spatial,
    static_extent,
    stores_one_value,
    trivially_bound,
)
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import PARALLEL_MIN_ELEMENTS, vector_lanes

#: The name of the input transform's block (``V[e, p, c]``: tile position, tile, channel).
INPUT_BLOCK = "winograd_input"
#: The name of the output transform's block (``Y[n, y, x, k]``).
OUTPUT_BLOCK = "winograd_output"


class WinogradInput(CpuRule):
    """``V[e, p, c]``, alpha^2 values per alpha x alpha input window ``p`` and channel: the tiles run in parallel, the
    alpha^2 positions unrolled (their coefficients become constants, the window's loads are shared), the
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
        positions = static_extent(sch, position) or 1
        if (static_extent(sch, tile) or 1) * positions * channels >= PARALLEL_MIN_ELEMENTS:
            sch.parallel(tile)
        return True


class WinogradOutput(CpuRule):
    """``Y[n, y, x, k] = (A^T M_p A)[y % m, x % m]`` with the bias, activation, residual add,
    concatenation or transposition after it: the output's rows and columns split into m x m tiles, the
    tiles in parallel; per tile, the transform is computed into a small local buffer, channels in SIMD
    vectors, the tile's pixels unrolled (each pixel's coefficients become constants, its zero terms drop
    out, the tile's alpha^2 loads of ``M`` are shared), then everything after it (inlined) stores the
    tile, the pixels past the output's edge left out. (The generic elementwise loop nest computes every
    pixel with all alpha^2 terms: 2.5x slower for F(4x4, 3x3).)"""

    rule_name = "cpu.WinogradOutput"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        blocks = child_blocks(sch)
        found = [b for b in blocks if sch.get(b).name_hint == OUTPUT_BLOCK]
        if len(found) != 1 or not all(is_spatial(sch, b) and trivially_bound(sch, b) and stores_one_value(sch, b)
                                      for b in blocks):
            return False
        transform, last = found[0], blocks[-1]
        tile = round(int(sch.get(transform).reads[0].source.shape[0]) ** 0.5) - 2
        whole = [int(d) for d in sch.get(transform).writes[0].source.shape]  # [n, rows, columns, k]
        loops = sch.get_loops(last)
        order = _store_order([static_extent(sch, loop) for loop in loops], whole, tile)
        if order is None:
            return False
        for block in blocks[:-1]:
            if not sch.get(block).same_as(sch.get(transform)):
                sch.compute_inline(block)
        bits = int(sch.get(transform).writes[0].source.dtype.bits)
        lanes = vector_lanes(whole[3], cpu.lanes(bits))
        batch, rows, columns, channel = (loops[i] for i in order)
        stored_after = not sch.get(transform).same_as(sch.get(last))
        cuts: list[int] = []  # where a concatenation's inputs meet in a channels-last store
        row_tiles, row = sch.split(rows, [None, tile])
        column_tiles, column = sch.split(columns, [None, tile])
        if order == CHANNELS_LAST:
            stored = static_extent(sch, channel)
            cuts = _concatenation_cuts(sch, last, stored)
            store_lanes = vector_lanes(gcd(whole[3], stored, *cuts), cpu.lanes(bits))
            vector_loop, lane = sch.split(channel, [None, store_lanes])
            sch.reorder(batch, row_tiles, column_tiles, vector_loop, row, column, lane)
            _unroll_tile(sch, row, column, lane, store_lanes)
        else:  # the model's NCHW output: channel by channel, the tile's pixels unrolled
            sch.reorder(batch, row_tiles, column_tiles, channel, row, column)
            _unroll_tile(sch, row, column, None, 1)
        if stored_after:
            # the whole tile, all channels, before the stores: a concatenation reads only some of the
            # output's channels from it, and a tile computed per output vector would be under that test
            sch.compute_at(transform, column_tiles)
            sch.set_scope(transform, 0, "local")
            row, column, channel = sch.get_loops(transform)[-3:]
            channels, lane = sch.split(channel, [None, lanes])
            sch.reorder(channels, row, column, lane)
            _unroll_tile(sch, row, column, lane, lanes)
        if cuts:  # each part's vectors come from one input of the concatenation
            sch.loop_partition(vector_loop, [width // store_lanes for width in _widths(cuts)] + [None])
        if whole[0] * whole[1] * whole[2] * whole[3] >= PARALLEL_MIN_ELEMENTS:
            sch.parallel(sch.fuse(batch, row_tiles))
        return True


CHANNELS_LAST = (0, 1, 2, 3)


def _store_order(shape: list, whole: list[int], tile: int) -> tuple[int, ...] | None:
    """Which of the last block's four loops are (batch, rows, columns, channels): NHWC, or NCHW where the
    output is transposed back for the model's output; None for anything else (the generic rule)."""
    def covers(extent, whole_extent: int) -> bool:
        return extent is not None and -(-extent // tile) * tile == whole_extent

    if len(shape) != 4 or None in shape:
        return None
    if covers(shape[1], whole[1]) and covers(shape[2], whole[2]):
        return CHANNELS_LAST
    if covers(shape[2], whole[1]) and covers(shape[3], whole[2]):
        return (0, 2, 3, 1)
    return None


def _concatenation_cuts(sch, block, channels: int) -> list[int]:
    """The channels where the inputs of a concatenation stored by ``block`` meet (none: no concatenation).
    The store's vectors divide its parts, and its loop over them is partitioned there, so that which
    input a vector comes from is known where it is stored. (Over the whole concatenation, that test
    stays per lane, and where the tiles overhang the output TVM stored every vector lane by lane:
    SqueezeNet's 55x55x128 fire module on a Zen 4 core 146 -> 63 us.)"""
    from tvm import sym, tirx

    stmt, analyzer = sch.get(block), sym.Analyzer()
    var = stmt.iter_vars[-1].var
    cuts = set()
    for read in stmt.reads:
        offset = analyzer.simplify(var - read.region[-1].min)
        if isinstance(offset, tirx.IntImm):  # channel c of the output is channel c - offset of this input
            cuts.update(cut for cut in (offset.value, offset.value + int(read.source.shape[-1])) if 0 < cut < channels)
    return sorted(cuts)


def _widths(cuts: list[int]) -> list[int]:
    return [end - start for start, end in zip([0, *cuts], cuts)]


def _unroll_tile(sch, row, column, lane, lanes: int) -> None:
    if lanes > 1:
        sch.vectorize(lane)
    sch.unroll(row)
    sch.unroll(column)
