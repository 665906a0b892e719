"""Register tiling of a reduction block, the loop nest the convolution, matmul and pooling rules share.

For an output ``Y[..., r, v] = sum_k f(X, W)`` (``v`` the innermost output dimension, ``r`` the next
one longer than 1)::

    parallel for (outer spatial tiles)                # all cores, one fused loop
        acc[R, M, L] = init                           # R*M vector accumulators in registers
        for k... (the reduction, in the model's order)
            for r in R (unrolled): for m in M (unrolled): acc[r, m, :] += X[...] * W[..., :]   # L SIMD lanes
        Y[tile] = epilogue(acc)                       # bias, activation, residual add: vectorized, once

``L`` is the SIMD width, or what of it divides ``v`` (``vector_lanes``), ``R*M`` fills the vector
registers the target has for accumulators. Constant weights (``layout_free_buffers``) are rewritten, at
compile time, into the order this loop nest reads them (MetaSchedule's ``RewriteLayout``; the pipeline
folds the rewrite into the constants), so every weight load is one contiguous vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import gcd, prod
from typing import Any

from edgepack.backends.cpu.schedules.anatomy import (
    Anatomy,
    child_blocks,
    dim_hint,
    extent_hint,
    index_period,
    is_spatial,
    scalar_only,
    shape_key,
    static_extent,
    stores_one_value,
)
from edgepack.backends.cpu.schedules.machine import CpuInfo

MAX_REGISTER_REPEAT = 16  # unrolled repeats along the register axis
MAX_VECTOR_REPEAT = 8  # vectors side by side along the vector axis
# A depthwise convolution whose output is larger than this is written to memory that is not in cache
# (MobileNetV2's 56x56x144: 1.8 MB). It stores whole pixels, every channel of a pixel in one iteration,
# contiguously: a tile of 48 of the 144 channels of 4 pixels ran 130 us alone and 330-380 us in the
# model (Zen 4, one thread), one of all 144 channels of one pixel 155-180 us alone and 210 us in the
# model (MobileNetV2 3-4% faster at 1 and 2 threads). Smaller outputs keep the tile that computes
# fastest (BlazeFace and PP-OCR cls, all in cache, ran 1-3% slower with whole pixels)
STREAMED_OUTPUT_BYTES = 1 << 20
# Below these a kernel runs on one thread. Forking and joining the pool's threads costs ~1 us (Zen 4
# VM, 2 threads), but a kernel left to one thread reads what the kernel before it wrote on every core,
# half of it from another core's cache (BlazeFace's 16x16x72 depthwise 3x3: 4.2 us alone, 10 us in the
# model at 2 threads). At 2^16 multiply-adds rather than 2^18, BlazeFace ran 16% faster at 2 threads and
# PP-OCR cls 11%, both the same at 1 thread, as MobileNetV2 at both
PARALLEL_MIN_MULTIPLY_ADDS = 1 << 16
# A tile reads vectors x SIMD-width weights per step of its reduction, each used by its repeats. Where
# those of the whole reduction outgrow L1 they come from L2 again at every tile, and with few repeats
# the tile waits on L2: resnet50-light's 14x14 256 -> 1024 1x1 convolution tiled 2 pixels x 8 vectors
# read a 128 KB slice at 32 bytes per FMA cycle, tiled 7 x 2 a 32 KB one at 9 (Zen 4, in the model, 1
# thread: its 1x1 convolutions of 14x14 pixels 4-12% faster, its 3x3 stride-2 28x28x256 one 16%, the
# model 3%; MetaSchedule's best record of the first one tiles 7 pixels x 1 vector)
L1_WEIGHT_BYTES = 32 * 1024
MIN_L2_REPEAT = 4
# a matrix product over rows of a run-time count runs its column tiles in parallel (each reading its weights
# once) where it has at least this many (the CRNN's 6625 classes: 83)
MIN_PARALLEL_COLUMN_TILES = 16
PARALLEL_MIN_ELEMENTS = 1 << 14
# A tile's padded copy of an input whose channels make no SIMD vector (an odd count: a network's first
# convolution, 3 colours) was a loop nest copying element by element, each behind its bounds checks,
# and MobileNetV2's 224x224x3 3x3 stride-2 convolution ran at 88 GFLOP/s. Unrolled, the copy is
# straight-line code whose checks fold per row and column: that convolution 248 -> 219 us in the model,
# BlazeFace's 5x5 stride-2 one 161 -> 143 us (the model 2.5% faster), PP-OCR cls's 20 -> 15 us,
# resnet50-light's 7x7 2.44 -> 2.34 ms (Zen 4, 1 thread). Up to this many elements per tile (a 7x7
# window over 15 pixels of stride 2: 7 x 35 x 3 = 735, 11% faster unrolled)
MAX_UNROLLED_PADDING = 1024


# The most taps of a window unrolled in a depthwise kernel (a 7x7 window: 49). A convolution of one input
# channel is such a kernel too, and an STFT's is 256 taps wide (Silero VAD's 1-D convolution over raw
# samples): unrolled, every tap was a copy of the register tile's loop, 3072 loops behind bounds checks at a
# run-time length, which LLVM took 8 minutes to compile.
MAX_UNROLLED_TAPS = 64


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def power_of_two_divisor(n: int, cap: int) -> int:
    """The largest power of two that divides ``n`` and is at most ``cap``."""
    value = 1
    while value * 2 <= cap and n % (value * 2) == 0:
        value *= 2
    return value


@dataclass(frozen=True)
class Tile:
    lanes: int  # SIMD lanes along the vector axis (L)
    vectors: int  # vectors side by side along it (M)
    repeat: int  # repeats along the register axis (R)

    @property
    def accumulators(self) -> int:
        return self.vectors * self.repeat


def vector_lanes(span: int, lanes: int) -> int:
    """SIMD lanes for an axis of ``span`` elements: a power of two dividing it if one fills at least half a
    register, else its largest divisor that fits one (42 channels: 14 lanes of 16, not 2; LLVM masks the
    rest). Never more than a register: a vector across two registers splits badly (measured 3-4x slower)."""
    simd = power_of_two_divisor(span, lanes)
    if simd * 2 >= lanes:
        return simd
    return max(d for d in divisors(span) if d <= lanes)


def depthwise_accumulators(cpu: CpuInfo) -> int:
    """Accumulators of a depthwise tile: 14 of AVX-512's or NEON's 32 registers, 7 of 16. Each input
    vector of a depthwise convolution serves one output vector per tap, so a tile of few pixels loads
    almost once per multiply-add; more pixels in a row share taps (3x3, stride 1: 1.0 loads per
    multiply-add for 2 pixels, 0.57 for 7). On a Zen 4 core, at 12 accumulators the tile was 6 vectors
    of 2 pixels, at 14 it is 2 vectors of 7: MobileNetV2's 14x14x384 3x3 124 -> 86 us in the model,
    28x28x192 128 -> 84, 14x14x576 114 -> 64; 24 accumulators ran 15-100% slower (they spill)."""
    return cpu.accumulators * 7 // 12


def choose_tile(vector_extent: int, register_extent: int, lanes: int, cpu: CpuInfo,
                group: int | None = None, *, depthwise: bool = False, streamed: bool = False,
                reduction: int = 0) -> Tile:
    """Lanes, vectors and repeats that divide their axes and fit the registers (the accumulators, the
    weight vectors of one step and an input): the most accumulators (latency hidden, fewest loop
    trips), then the fewest loads per multiply-add (balanced); but first, where the weights a tile
    reads over its whole ``reduction`` outgrow L1, a tile of at least ``MIN_L2_REPEAT`` repeats.
    ``depthwise`` (no reduction over
    channels: every input is a vector load of its own) has fewer accumulators
    (``depthwise_accumulators``). A depthwise tile whose output is
    ``streamed`` (``STREAMED_OUTPUT_BYTES``) spans every channel when they fit those accumulators."""
    span = group if group else vector_extent  # a vector must not cross a convolution group
    simd = vector_lanes(span, lanes)
    budget = depthwise_accumulators(cpu) if depthwise else cpu.accumulators
    whole = span // simd
    if depthwise and streamed and span == vector_extent and whole <= budget \
            and whole + 2 <= cpu.vector_registers:
        repeat = max(r for r in divisors(register_extent) if r <= MAX_REGISTER_REPEAT and whole * r <= budget)
        return Tile(simd, whole, repeat)
    element_bytes = cpu.vector_bits // 8 // lanes
    best: tuple[tuple[bool, int, int], Tile] | None = None
    for vectors in divisors(span // simd):
        if vectors > MAX_VECTOR_REPEAT:
            break
        for repeat in divisors(register_extent):
            accumulators = vectors * repeat
            if repeat > MAX_REGISTER_REPEAT or accumulators > budget \
                    or accumulators + vectors + 1 > cpu.vector_registers:
                continue
            waits_on_l2 = repeat < MIN_L2_REPEAT and vectors * simd * element_bytes * reduction > L1_WEIGHT_BYTES
            key = (not waits_on_l2, vectors * repeat, -(vectors + repeat))
            if best is None or key > best[0]:
                best = (key, Tile(simd, vectors, repeat))
    assert best is not None  # vectors = repeat = 1 always fits
    return best[1]


def tile_for(anatomy: Anatomy, cpu: CpuInfo) -> Tile:
    """The register tile ``register_tile`` gives ``anatomy``'s kernel by default."""
    vector, register = anatomy.vector_axis, anatomy.register_axis
    if vector is None:
        raise ValueError("no output dimension longer than 1")
    return choose_tile(anatomy.extents[vector], anatomy.extents[register] if register is not None else 1,
                       cpu.lanes(anatomy.dtype_bits), cpu, anatomy.group_size(vector),
                       depthwise=anatomy.window and anatomy.channel_reduction == 1,
                       streamed=_output_bytes(anatomy) > STREAMED_OUTPUT_BYTES,
                       reduction=prod(anatomy.extents[k] for k in anatomy.reduce) if register is not None else 0)


def register_tile(sch, anatomy: Anatomy, cpu: CpuInfo, tile: Tile | None = None, *,
                  at_tile: Callable[[Any], None] | None = None) -> None:
    """Schedule ``anatomy``'s kernel as the loop nest in the module docstring (in place).

    ``at_tile(loop)``: places what is computed once per tile of pixels (a fused depthwise convolution's
    output) under the parallel loop of pixel tiles; the loop over tiles of output channels then runs
    inside it, serially, so that every channel tile reads what ``at_tile`` computed."""
    block = anatomy.block
    vector, register = anatomy.vector_axis, anatomy.register_axis
    if vector is None:
        raise ValueError("no output dimension longer than 1")
    tile = tile or tile_for(anatomy, cpu)

    loops = sch.get_loops(block)
    v_outer, v_vectors, v_lanes = sch.split(loops[vector], [None, tile.vectors, tile.lanes])
    channel_tile_count = static_extent(sch, v_outer) or 1
    inner = [v_vectors, v_lanes]
    r_outer = None
    if register is not None:
        r_outer, r_inner = sch.split(loops[register], [None, tile.repeat])
        inner.insert(0, r_inner)
    others = [loops[k] for k in anatomy.spatial if k not in (vector, register)]
    # batch first, then output-channel tiles (their weights stay in cache across the rows), rows, columns;
    # a depthwise convolution's weights are few and each channel tile reads only its channels of every
    # pixel: its channel tiles go innermost, so that a pass reads whole pixels (MobileNetV2's 56x56x144
    # depthwise convolution read its 1.8 MB input three times, 48 channels of each pixel at a time: 3x
    # slower than ONNX Runtime). So do those of any convolution whose input outweighs its weights: the
    # threads then split the rows, as in the kernels before and after it, and each finds the pixels it
    # reads in its own core's cache (MobileNetV2 at 2 threads ~4% faster, SqueezeNet 3-5%)
    tiles = others[1:] + ([r_outer] if r_outer is not None else [])
    channel_tiles = []  # a serial loop of its own inside the tile of pixels (``at_tile``)
    if at_tile is not None:
        outer, channel_tiles = others[:1] + tiles, [v_outer]
    elif anatomy.window and (anatomy.channel_reduction == 1 or _pixels_outweigh_weights(anatomy)):
        outer = others[:1] + tiles + [v_outer]
    else:
        outer = others[:1] + [v_outer] + tiles
    rows_inside = None  # a run-time loop of rows kept inside the parallel loop of column tiles
    if not anatomy.pads and at_tile is None:
        # loops whose extent changes at run time (``--dim``) go outermost: the fused loop is then split back
        # into the others by numbers known at compile time, so the weights' layout can be rewritten for
        # the loop nest (PP-OCRv4's 6625-class projection at W = 160: 1.04 -> 0.91 ms). Not where padding
        # or a fused producer is computed per tile: their regions under such a loop came out too small
        # (a run then wrote past its stack buffers)
        symbolic = [x for x in outer if static_extent(sch, x) is None]
        static = [x for x in outer if static_extent(sch, x) is not None]
        outer = symbolic + static
        if not anatomy.window and symbolic == [r_outer] and static \
                and prod(static_extent(sch, x) for x in static) >= MIN_PARALLEL_COLUMN_TILES:
            # a product over run-time rows with many tiles of columns: the column tiles in parallel, every
            # row inside each, so that a tile of the weights is read once, not once per tile of rows
            outer, rows_inside = static, r_outer
    reductions = [loops[k] for k in anatomy.reduce]
    sch.reorder(*outer, *([rows_inside] if rows_inside is not None else []), *channel_tiles, *reductions, *inner)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if extent_hint(sch, fused) > 1 and prod(anatomy.extents) >= PARALLEL_MIN_MULTIPLY_ADDS:
        sch.parallel(fused)
    # where one register tile's output is stored
    tile_loop = channel_tiles[0] if channel_tiles else rows_inside if rows_inside is not None else fused

    # accumulate in registers; the epilogue (every elementwise block after) runs once per tile
    write_back, cropped = cache_with_epilogue(sch, block, "local")
    sch.reverse_compute_at(write_back, tile_loop)
    place_padding(sch, anatomy, fused, cpu, channel_tile_count)
    if at_tile is not None:
        at_tile(fused)

    body = sch.get_loops(block)
    if tile.lanes > 1:
        sch.vectorize(body[-1])
    sch.unroll(body[-2])
    if register is not None:
        sch.unroll(body[-3])
    taps = prod(static_extent(sch, loop) or MAX_UNROLLED_TAPS + 1 for loop in reductions)
    if anatomy.window and anatomy.channel_reduction == 1 and taps <= MAX_UNROLLED_TAPS:  # depthwise: the
        for loop in reductions:  # window unrolled, so that the taps of neighbouring pixels share their loads
            sch.unroll(loop)  # (and bounds checks): Zen 4, BlazeFace's 64x64x24 3x3 0.056 -> 0.051 ms,
            # MobileNetV2's 7x7x960 0.027 -> 0.025
    tile_loops = sch.get_loops(write_back)[2 if channel_tiles or rows_inside is not None else 1:]  # its own loops
    store_tile(sch, write_back, tile_loops, tile.lanes, cpu.lanes(anatomy.dtype_bits), cropped)
    sch.decompose_reduction(block, reductions[0])
    schedule_leftovers(sch, fused, cpu)
    rewrite_weight_layouts(sch)


def cache_with_epilogue(sch, block, scope: str):
    """``block``'s output accumulated in a ``scope`` cache (``local``: registers; a tensorized block needs
    ``global``, a small array on the stack), with the elementwise blocks after it folded into the store.
    Where a crop follows (output channels padded to whole vectors, ``cpu/channels.py``), the crop is the
    store: it keeps its part of the tile straight from the accumulators, the epilogue after it fused in.
    Returns (the storing block, whether it crops)."""
    write_back = sch.cache_write(block, 0, scope)
    inline_epilogue(sch, write_back)
    consumers = sch.get_consumers(write_back)
    cropped = len(consumers) == 1 and _crops(_output_shape(sch, write_back), _output_shape(sch, consumers[0]))
    if cropped:
        write_back = consumers[0]
        sch.compute_inline(sch.get_producers(write_back)[0])
        inline_epilogue(sch, write_back)
    return write_back, cropped


def store_tile(sch, write_back, tile_loops, lanes: int, row_lanes: int, cropped: bool) -> None:
    """A tile's store (``write_back``'s ``tile_loops``) in SIMD vectors: of ``lanes`` over the whole tile,
    or, where it crops, row by row in vectors of up to ``row_lanes`` that divide the kept row. Scalar where
    the epilogue cannot be vectorized (e.g. a fused cosh)."""
    if not tile_loops:
        return
    if cropped:
        lanes = vector_lanes(static_extent(sch, tile_loops[-1]) or 1, row_lanes)
        if lanes > 1 and not scalar_only(sch, write_back):
            store_vectors(sch, tile_loops[-1], lanes, tile_loops[:-1])
        return
    flat = sch.fuse(*tile_loops) if len(tile_loops) > 1 else tile_loops[0]
    if lanes > 1 and not scalar_only(sch, write_back):
        store_vectors(sch, flat, lanes)


def store_vectors(sch, loop, lanes: int, outer=()) -> None:
    """A tile's store from its accumulators: ``loop`` split into SIMD vectors of ``lanes``, and the loop
    over those vectors unrolled, with the ``outer`` loops of the store (rows of a cropped tile). Every
    access to the accumulators is then at a constant index and LLVM keeps them in registers from the
    reduction to the store. Left a loop, LLVM stored the accumulators to the stack and the epilogue
    read them back (where it did not unroll the loop itself): MobileNetV2 3-5% faster at 1 thread, 3%
    at 2; PP-OCR cls 5% at both, BlazeFace 3-4%; resnet50-light and SqueezeNet the same (Zen 4,
    interleaved A/B in one process)."""
    vectors, lane = sch.split(loop, [None, lanes])
    sch.vectorize(lane)
    for unrolled in (*outer, vectors):
        sch.unroll(unrolled)


def schedule_leftovers(sch, nest, cpu: CpuInfo) -> None:
    """The spatial blocks outside the tile loop ``nest``: inputs of the epilogue (a residual padded to more
    channels) or what could not join it (BlazeFace's max-pooled residual padded, added and ReLU'd after
    the pool). A chain of them is folded into its last block, one pass rather than one per operator;
    each pass runs in parallel, vectorized."""

    def outside(b) -> bool:
        loops = sch.get_loops(b)
        return bool(loops) and not sch.get(loops[0]).same_as(sch.get(nest)) and is_spatial(sch, b)

    leftovers = [b for b in child_blocks(sch) if outside(b)]
    for leftover in leftovers[:-1]:
        consumers = sch.get_consumers(leftover)
        if len(consumers) == 1 and outside(consumers[0]) and stores_one_value(sch, leftover):
            _folds(sch.compute_inline, leftover)
    for leftover in child_blocks(sch):
        if outside(leftover):
            parallel_vectorize(sch, leftover, cpu)


def _vectorize_after_symbolic(sch, loops, first_static: int, lanes: int) -> None:
    """A block whose loops before ``first_static`` have extents that change at run time (``--dim``): those
    fused into the parallel loop, the static ones after them into SIMD vectors. Fused with the static
    ones, every vector's indices were split back out of one loop by a run-time extent, which TVM could
    not prove to stay in one row: each lane was computed and stored apart (PP-OCRv4's recognizer: a
    transpose and hard-swish of 12x40x240 values 0.40 ms against 0.015 ms at a fixed size)."""
    head, tail = loops[:first_static], loops[first_static:]
    inner = sch.fuse(*tail) if len(tail) > 1 else tail[0]
    vectors, lane = sch.split(inner, [None, lanes])
    sch.vectorize(lane)
    rows = sch.fuse(*head) if len(head) > 1 else head[0]
    if prod(extent_hint(sch, loop) for loop in (rows, vectors)) * lanes >= PARALLEL_MIN_ELEMENTS:
        sch.parallel(rows)


def _rows_of_run_time_length(sch, loops, first_symbolic: int) -> None:
    """A block whose last loop's extent changes at run time (``--dim``) and whose first ones do not: those
    fused into the parallel loop, the rest left as loops, so that a row steps its indices. Fused into
    one loop, every element's indices were divided out of it by a run-time extent (the NHWC -> NCHW
    transpose of a 96x8xW output at W = 160: 0.21 ms against 0.10 ms at a fixed size). Also a block whose
    last run-time loop has a few static values per step (a pixel shuffle's (H, 2, W, 2) output: 2): the
    loops before that one are the rows (PP-OCRv3's detector at 160x160: 0.61 ms, fixed 0.14 ms fused)."""
    head = loops[:first_symbolic]
    elements = prod(extent_hint(sch, loop) for loop in loops)  # before the fuse: it removes the head's loops
    rows = sch.fuse(*head) if len(head) > 1 else head[0]
    if elements >= PARALLEL_MIN_ELEMENTS and extent_hint(sch, rows) > 1:
        sch.parallel(rows)


def _output_bytes(anatomy: Anatomy) -> int:
    return prod(anatomy.extents[k] for k in anatomy.spatial) * anatomy.dtype_bits // 8


def _pixels_outweigh_weights(anatomy: Anatomy) -> bool:
    """The operands that move with the output pixels (the input) are larger than those that do not
    (the weights)."""
    register = anatomy.register_axis
    if register is None:
        return False
    sizes = {True: 0, False: 0}
    for read in anatomy.reads:
        uses = any(register in anatomy.vars_in(index) for index in read.indices)
        sizes[uses] += prod(dim_hint(x) for x in read.buffer.shape)
    return sizes[True] > sizes[False]


def inline_epilogue(sch, block) -> None:
    """Fold the chain of elementwise blocks after ``block`` into it. Only blocks of its own output
    shape: TVM folds a crop into its producer without bounds (writing past the cropped buffer). A block
    that also reads another block of the kernel (a residual padded to more channels, BlazeFace's) gets
    that one inlined first: left apart, the pad, the add and the activation each ran as a pass over the
    whole tensor after the convolution (BlazeFace 11% faster at 1 thread, 17% at 2, with them folded
    into the tile's store)."""
    while consumers := sch.get_consumers(block):
        if len(consumers) > 1:  # the output read twice (hardswish: x * relu6(x + 3) / 6): each branch is
            if not any(_folds(sch.compute_inline, c) for c in consumers  # folded into what reads it, until
                       if _elementwise_step(sch, c, block)):  # one block reads the output
                break
            continue
        if _output_shape(sch, consumers[0]) != _output_shape(sch, block):
            break
        if not _folds(sch.reverse_compute_inline, consumers[0]) and not (
                _inline_other_operands(sch, consumers[0], block) and _folds(sch.reverse_compute_inline, consumers[0])):
            break  # not elementwise on the same indices: it stays a block of its own


def _elementwise_step(sch, candidate, block) -> bool:
    """``candidate`` is a step of an elementwise chain after ``block``: spatial, of its shape, and read
    by exactly one block (so that inlining it computes nothing twice)."""
    return is_spatial(sch, candidate) and stores_one_value(sch, candidate) \
        and _output_shape(sch, candidate) == _output_shape(sch, block) and len(sch.get_consumers(candidate)) == 1


def _folds(primitive, block) -> bool:
    """Whether the inlining ``primitive`` took ``block`` (TVM raises where its form does not allow it)."""
    try:
        primitive(block)
    except Exception:  # noqa: BLE001 - a ScheduleError: the block stays as it is
        return False
    return True


def _inline_other_operands(sch, consumer, block) -> bool:
    """Inline into ``consumer`` the spatial blocks it reads besides ``block`` (a residual input padded
    to more channels): TVM folds a block into its producer only when that is all it reads from the
    kernel. Whether any was inlined."""
    others = [b for b in sch.get_producers(consumer)
              if not sch.get(b).same_as(sch.get(block)) and is_spatial(sch, b) and stores_one_value(sch, b)]
    return sum(_folds(sch.compute_inline, other) for other in others) > 0


def _crops(shape: tuple, kept: tuple) -> bool:
    """``kept`` is a part of ``shape`` (no larger along any axis, smaller along one; an extent that changes
    at run time only where both are the same)."""
    return len(kept) == len(shape) and kept != shape and all(
        k == s or (isinstance(k, int) and isinstance(s, int) and k <= s) for k, s in zip(kept, shape))


def _output_shape(sch, block) -> tuple:
    """The block's output extents: ints, or the text of those that change at run time."""
    return shape_key(sch.get(block).writes[0].source)


def place_padding(sch, anatomy: Anatomy, tile_loop, cpu: CpuInfo, channel_tiles: int = 1) -> None:
    """Padding read in place (its bounds checked on every load: cheap when each input value serves few
    multiply-adds, as in a depthwise convolution) or copied, per tile, into a small padded buffer (when
    the reduction also sums over input channels: 3x3 convolutions reach 90-100 GFLOP/s on a Zen 4 core
    instead of 50-70 with the checks in the inner loop): in vectors along the channels, or unrolled
    where the channels make no vector (``MAX_UNROLLED_PADDING``).

    A tile's copy is made again by every tile of output channels (``channel_tiles``) that reads the same
    pixels. Where there are several and the input's channels make whole vectors, the input is padded
    once, in a pass of its own inside the kernel, and read in place without checks: resnet50-light's
    3x3 stride-2 convolutions (4, 8 and 16 channel tiles of 128-512 channels) 5-14% faster in the model,
    the model 0.6-1.2% at 1 and 2 threads (Zen 4, interleaved in one process). Images' 3 colours keep
    their unrolled copy: padded once, MobileNetV2's, BlazeFace's and PP-OCR cls's first convolutions
    ran 15-140% slower."""
    for pad in anatomy.pads:
        if anatomy.channel_reduction == 1:
            sch.compute_inline(pad)
            continue
        bits = max(8, int(sch.get(pad).writes[0].source.dtype.bits))
        channels = _output_shape(sch, pad)[-1]
        if channel_tiles > 1 and channels % cpu.lanes(bits) == 0:
            continue  # padded once: ``schedule_leftovers`` runs the pass in parallel, in vectors
        if not _folds(lambda b: sch.compute_at(b, tile_loop), pad):
            continue  # extents that change at run time TVM cannot bound per tile: a pass of its own (leftovers)
        loops = sch.get_loops(pad)[1:]
        if not loops:
            continue
        extents = [static_extent(sch, loop) for loop in loops]
        lanes = power_of_two_divisor(extents[-1] or 1, cpu.lanes(bits))
        if lanes > 1:
            sch.vectorize(sch.split(loops[-1], [None, lanes])[1])
        elif None not in extents and prod(extents) <= MAX_UNROLLED_PADDING:
            for loop in loops:
                sch.unroll(loop)


def rewrite_weight_layouts(sch) -> None:
    """Constant weights in the order the loop nest reads them (a no-op for kernels without any)."""
    from tvm.s_tir.meta_schedule.postproc import RewriteLayout

    RewriteLayout().apply(sch)


def parallel_vectorize(sch, block, cpu: CpuInfo, *, odd_vectors: bool = True) -> None:
    """A spatial block at the root: all its loops fused, split across the cores and into SIMD vectors.
    ``odd_vectors=False``: where the row makes no vector of a power of two lanes filling half a register
    (6625 elements: vectors of 5), the rows are left to LLVM's loop vectorizer (full vectors, a scalar
    tail) rather than vectors of an odd width."""
    loops = sch.get_loops(block)
    if not loops:
        return
    innermost = static_extent(sch, loops[-1]) or 1
    bits = max(8, int(sch.get(block).writes[0].source.dtype.bits))
    scalar = scalar_only(sch, block)
    if not scalar:
        period = index_period(sch, block)  # vectors stay inside what the indices divide the row into
        lanes = vector_lanes(gcd(innermost, period) if period else innermost, cpu.lanes(bits))
    if scalar or (not odd_vectors and lanes & (lanes - 1)):
        # the loop nest as it is (fused, LLVM contracted the index arithmetic differently; and LLVM's own
        # vectorizer takes an odd-width row): its first loop of more than one trip runs in parallel
        extents = [extent_hint(sch, loop) for loop in loops]
        first = next((k for k, extent in enumerate(extents[:-1]) if extent > 1), None)
        if first is not None and prod(extents) >= PARALLEL_MIN_ELEMENTS:
            sch.parallel(loops[first])
        return
    symbolic = [k for k, loop in enumerate(loops) if static_extent(sch, loop) is None]
    if symbolic and symbolic[-1] < len(loops) - 1 and lanes > 1:
        tail = prod(static_extent(sch, loop) for loop in loops[symbolic[-1] + 1:])
        if tail >= cpu.lanes(bits):
            _vectorize_after_symbolic(sch, loops, symbolic[-1] + 1, lanes)
        else:  # a few values per step of the last run-time loop (a pixel shuffle's 2): rows of that loop
            _rows_of_run_time_length(sch, loops, symbolic[-1])
        return
    if symbolic and symbolic[-1] == len(loops) - 1 and symbolic[0] > 0:
        _rows_of_run_time_length(sch, loops, symbolic[0])
        return
    flat = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = extent_hint(sch, flat)
    elements = total
    if lanes > 1:
        outer, lane = sch.split(flat, [None, lanes])
        sch.vectorize(lane)
        flat, total = outer, total // lanes
    if total > 1 and elements >= PARALLEL_MIN_ELEMENTS:
        sch.parallel(flat)
