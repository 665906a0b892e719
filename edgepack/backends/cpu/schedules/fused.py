"""A depthwise convolution and the pointwise convolution after it, in one kernel (``cpu/fuse_depthwise.py``)."""

from __future__ import annotations

from edgepack.backends.cpu.schedules.anatomy import (
    Anatomy,
    anatomy_of,
    child_blocks,
    is_padding,
    is_spatial,
    static_extent,
    stores_one_value,
)
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import (
    Tile,
    choose_tile,
    divisors,
    inline_epilogue,
    register_tile,
    store_vectors,
)

# the depthwise output of one tile of pixels lives on the stack (``cpu/stack.py`` keeps buffers up to
# 16 KiB there): the pointwise tile is narrowed until it fits
MAX_TILE_BYTES = 16 << 10


class DepthwisePointwise(CpuRule):
    """A kernel of two reductions: a channels-last depthwise convolution (its bias and activation), then
    a 1x1 convolution of its output (bias, residual add...).

    The pointwise convolution is register-tiled as ``cpu.Conv2D`` tiles it, its tiles of pixels in
    parallel; in each, the depthwise convolution first computes every channel of those pixels into a
    buffer on the stack (its own register tile: channels in SIMD lanes, neighbouring pixels sharing
    their taps), then every tile of output channels reads it from L1. The depthwise output never goes
    to memory.
    """

    rule_name = "cpu.DepthwisePointwise"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        blocks = child_blocks(sch)
        if not all(stores_one_value(sch, b) for b in blocks):
            return False
        reductions = [i for i, b in enumerate(blocks) if not is_spatial(sch, b)]
        if len(reductions) != 2:
            return False
        depthwise_block, pointwise_block = blocks[reductions[0]], blocks[reductions[1]]
        for producer in blocks[:reductions[0]]:  # padding read in place, bounds checked: few taps per input
            sch.compute_inline(producer)
        depthwise = anatomy_of(sch, depthwise_block)
        if depthwise is None or len(depthwise.reads) != 2 or not depthwise.window \
                or depthwise.channel_reduction != 1 or depthwise.vector_axis is None \
                or depthwise.register_axis is None:
            return False
        # the depthwise result, its bias and activation applied, stored from the accumulators
        stored = sch.cache_write(depthwise_block, 0, "local")
        inline_epilogue(sch, stored)
        for copy in sch.get_producers(pointwise_block):  # the pointwise convolution's copy of its input
            if not sch.get(copy).same_as(sch.get(stored)) and not is_padding(sch, copy):
                sch.compute_inline(copy)
        producers = sch.get_producers(pointwise_block)
        if len(producers) != 1 or not sch.get(producers[0]).same_as(sch.get(stored)):
            return False  # something else between the two convolutions
        pointwise = anatomy_of(sch, pointwise_block)
        if pointwise is None or len(pointwise.reads) != 2 or pointwise.vector_axis is None \
                or pointwise.register_axis is None:
            return False
        tile = pointwise_tile(pointwise, depthwise.extents[depthwise.vector_axis] * depthwise.dtype_bits // 8, cpu)
        if tile is None:
            return False

        def depthwise_per_tile(loop) -> None:
            sch.compute_at(stored, loop)
            sch.compute_at(depthwise_block, loop)
            _tile_depthwise(sch, depthwise, stored, loop, tile.repeat, cpu)

        register_tile(sch, pointwise, cpu, tile, at_tile=depthwise_per_tile)
        return True


def pointwise_tile(pointwise: Anatomy, pixel_bytes: int, cpu: CpuInfo) -> Tile | None:
    """The pointwise convolution's register tile, its pixels few enough that their depthwise output
    (``pixel_bytes`` each) fits ``MAX_TILE_BYTES``; None where not even one pixel's does."""
    pixels = pointwise.extents[pointwise.register_axis]
    tile = choose_tile(pointwise.extents[pointwise.vector_axis], pixels, cpu.lanes(pointwise.dtype_bits), cpu)
    fits = [r for r in divisors(pixels) if r <= tile.repeat and r * pixel_bytes <= MAX_TILE_BYTES]
    return Tile(tile.lanes, tile.vectors, max(fits)) if fits else None


def _tile_depthwise(sch, anatomy: Anatomy, stored, pixel_loop, pixels: int, cpu: CpuInfo) -> None:
    """The depthwise convolution of one tile of ``pixels`` (every channel), under the pixel loop: a
    register tile of channels (SIMD lanes) by pixels, stored with its epilogue from the accumulators."""
    block = anatomy.block
    vector, register = anatomy.vector_axis, anatomy.register_axis
    tile = choose_tile(anatomy.extents[vector], pixels, cpu.lanes(anatomy.dtype_bits), cpu, depthwise=True)
    own = _loops_of_iter_vars(sch, block, pixel_loop)  # compute_at made a loop for each variable of more than one value
    if own[vector] is None:
        raise ValueError("the depthwise tile has no loop over its channels")
    c_outer, c_vectors, c_lanes = sch.split(own[vector], [None, tile.vectors, tile.lanes])
    pixel = own[register] if own[register] is not None else sch.add_unit_loop(c_outer)  # one pixel: a unit loop
    p_outer, p_inner = sch.split(pixel, [None, tile.repeat])
    reductions = [own[k] for k in anatomy.reduce if own[k] is not None]
    sch.reorder(p_outer, c_outer, *reductions, p_inner, c_vectors, c_lanes)
    sch.reverse_compute_at(stored, c_outer)
    if tile.lanes > 1:
        sch.vectorize(c_lanes)
    sch.unroll(c_vectors)
    sch.unroll(p_inner)
    for loop in reductions:  # the window unrolled: neighbouring pixels' taps share their loads
        sch.unroll(loop)
    store = [loop for loop in _loops_of_iter_vars(sch, stored, c_outer) if loop is not None]  # the tile's pixels, channels
    flat = sch.fuse(*store) if len(store) > 1 else store[0]
    if tile.lanes > 1 and (static_extent(sch, flat) or 1) % tile.lanes == 0:
        store_vectors(sch, flat, tile.lanes)
    sch.decompose_reduction(block, reductions[0] if reductions else p_inner)


def _loops_of_iter_vars(sch, block, below) -> list:
    """Per iteration variable of ``block``, the loop under ``below`` that its binding runs over (None: it
    takes a single value there)."""
    import tvm_ffi
    from tvm import tirx

    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body
    outer = sch.get(below)
    loops = loops[[sch.get(loop).same_as(outer) for loop in loops].index(True) + 1:]
    found = []
    for value in realize.iter_values:
        used: list = []
        tvm_ffi.structural_walk(value, [(tirx.Var, used.append)], order="pre")
        match = [loop for loop in loops if any(v.same_as(sch.get(loop).loop_var) for v in used)]
        found.append(match[-1] if match else None)
    return found
