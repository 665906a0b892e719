"""Convolutions: regular, grouped, depthwise and pointwise, in any layout (channels-last runs fastest)."""

from __future__ import annotations

from typing import Any

from edgepack.backends.cpu.schedules.anatomy import (
    child_blocks,
    is_constant,
    is_spatial,
    reduction_anatomy,
    shape_key,
    static_extent,
    stores_one_value,
)
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import register_tile, tile_for, vector_lanes

# a tile's scaled input lives on the stack (``cpu/stack.py`` keeps buffers up to 16 KiB there); larger,
# the scaling runs as a pass of its own before the convolution
MAX_SCALED_TILE_BYTES = 16 << 10


class Conv2D(CpuRule):
    """A reduction over a window of the input times a weight (two operands, a window in the indices).

    Register-tiled along the output channels (SIMD lanes) and the output columns (repeats); the
    weights are rewritten at compile time into the order the tile reads them; padding is read in
    place (inlined), the bias, activation and residual add run on the accumulators of each tile.

    A 1x1 convolution merged with the per-channel scaling of its input (``cpu/fuse_scale.py``) scales
    each tile's input pixels, every channel, into a buffer on the stack, in SIMD vectors, and the tile
    reads them from L1: the scaled input is never written to memory. (Inlined into the reduction
    instead, the scaling was one scalar multiply per input value and channel tile, and PP-OCR cls's
    merged kernels ran 16% slower than the two apart at 1 thread.)
    """

    rule_name = "cpu.Conv2D"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        scaling = scaled_input(sch)
        anatomy = reduction_anatomy(sch, keep=scaling)
        if anatomy is None or len(anatomy.reads) != 2 or not anatomy.window or anatomy.vector_axis is None:
            return False
        if scaling is None:
            register_tile(sch, anatomy, cpu)
            return True
        tile = tile_for(anatomy, cpu)
        channels = int(anatomy.reads[0].buffer.shape[-1])  # input channels (the data's and the weights' last axis)
        if tile.repeat * channels * anatomy.dtype_bits // 8 > MAX_SCALED_TILE_BYTES:
            register_tile(sch, anatomy, cpu, tile)  # the scaling a pass of its own (``schedule_leftovers``)
            return True
        register_tile(sch, anatomy, cpu, tile, at_tile=lambda loop: _scale_in_tile(sch, scaling, loop, cpu))
        return True


def scaled_input(sch) -> Any:
    """The block of a kernel that scales a channels-last tensor by one value per channel
    (``cpu/fuse_scale.py``) for the kernel's one reduction to read, or None."""
    blocks = child_blocks(sch)
    reductions = [b for b in blocks if not is_spatial(sch, b)]
    if len(reductions) != 1:
        return None
    for block in blocks:
        stmt = sch.get(block)
        if not is_spatial(sch, block) or not stores_one_value(sch, block) or len(stmt.writes) != 1:
            continue
        shape = shape_key(stmt.writes[0].source)
        if len(shape) != 4 or not isinstance(shape[-1], int) or shape[-1] < 2:
            continue
        sources = [r.source for r in stmt.reads]
        same = [b for b in sources if shape_key(b) == shape]
        factors = [b for b in sources if _static(b) and _per_channel(b, shape[-1])]
        if len(same) == 1 and factors and len(same) + len(factors) == len(sources) \
                and _reaches(sch, block, reductions[0]):
            return block
    return None


def _static(buffer) -> bool:
    return all(is_constant(x) for x in buffer.shape)


def _per_channel(buffer, channels: int) -> bool:
    shape = [int(x) for x in buffer.shape]
    return len(shape) == 4 and shape[:3] == [1, 1, 1] and shape[3] in (1, channels)


def _reaches(sch, block, reduction) -> bool:
    """``reduction`` reads what ``block`` writes, directly or through spatial blocks (a copy, a pad)."""
    seen, todo = set(), list(sch.get_consumers(block))
    while todo:
        consumer = todo.pop()
        if sch.get(consumer).same_as(sch.get(reduction)):
            return True
        name = sch.get(consumer).name_hint
        if name not in seen and is_spatial(sch, consumer):
            seen.add(name)
            todo.extend(sch.get_consumers(consumer))
    return False


def _scale_in_tile(sch, block, loop, cpu: CpuInfo) -> None:
    """The scaling of one tile's input (its pixels, every channel) under the tile loop: each pixel's
    channels in SIMD vectors that divide them (a vector across two pixels would gather its factors),
    the pixels innermost and unrolled, so that each vector of factors is loaded once for all of them."""
    sch.compute_at(block, loop)
    loops = sch.get_loops(block)
    position = [sch.get(x).same_as(sch.get(loop)) for x in loops].index(True)
    lanes = vector_lanes(static_extent(sch, loops[-1]) or 1, cpu.lanes(32))
    vectors, lane = sch.split(loops[-1], [None, lanes])
    pixels = [x for x in loops[position + 1:-1] if (static_extent(sch, x) or 1) > 1]
    sch.reorder(vectors, *pixels, lane)
    if lanes > 1:
        sch.vectorize(lane)
    for pixel in pixels:
        sch.unroll(pixel)
