"""8-bit convolutions on dot-product instructions (``cpu/dot_product.py`` makes the kernel)::

    u = x_q + shift, padded                                     # a pass of its own, 8-bit (none where the
                                                                # input is the operand as it is)
    parallel for (rows, column tiles, output-channel tiles)
        acc[R, M, L] = 0                                        # R pixels x M vectors of L int32 lanes
        for kh, kw, c/4:
            for r in R, m in M (unrolled): acc[r, m, :] = dot(acc[r, m, :], u[r, c:c+4], w[m, :, :])
        Y[tile] = epilogue(acc)                                 # requantization, activation: vectorized

Each ``dot`` is one instruction (``tensorize``): 4 input channels of one pixel broadcast against the
L x 4 packed weights of L output channels. A matrix instruction (``smmla``, ``DotProduct.pixels`` 2) takes
2 pixels x 8 input channels against 2 output channels' 8 weights into a 2 x 2 block of accumulators.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from edgepack.backends.cpu.schedules.anatomy import child_blocks, static_extent
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.tiling import cache_with_epilogue, schedule_leftovers, store_tile

MAX_PIXELS = 8  # pixels side by side in a tile: 4 and 8 ran alike on ResNet-8's 3x3 convolutions
MAX_VECTORS = 4  # output-channel vectors per tile
# Below this many 4-way dot products a kernel runs on one thread (``tiling.PARALLEL_MIN_MULTIPLY_ADDS``'s
# reasoning, for instructions that do four times the work of a float multiply-add)
PARALLEL_MIN_DOT_PRODUCTS = 1 << 18


#: The block annotation that marks the dot-product reduction for ``schedules/dot_product.py``: its value
#: is the name of the tensor intrinsic that computes one L x 4 block.
DOT_PRODUCT_ATTR = "edgepack.dot_product"


@dataclass(frozen=True)
class DotProduct:
    """One dot-product instruction (or a short sequence) as a tensor intrinsic: ``lanes`` int32 outputs,
    each the sum of 4 products of ``data_dtype`` input and int8 weights."""

    name: str  # the TensorIntrin's registered name
    lanes: int
    data_dtype: str  # "uint8" (VNNI), "int8" (sdot) or "int16" (widened once, in the input's padded copy)
    #: the smallest weight the sequence sums exactly (the widening one adds two products in 16 bits)
    weight_min: int = -128
    #: vector registers one output vector's weights take while a tile's pixels use them, and the ones its
    #: sequence needs besides (the input broadcast, products in flight)
    weight_registers: int = 1
    scratch_registers: int = 1
    #: the L x 4 weights of one instruction stored as channels 0-1 of every lane, then 2-3 (``[2, L, 2]``)
    #: rather than lane by lane (``[L, 4]``): ``cpu/dot_product.py``'s packing, this kernel's reading
    pairs: bool = False
    #: pixels one instruction computes (a matrix instruction's rows: 2 for ``smmla``), and the input
    #: channels it sums per output (``depth``)
    pixels: int = 1
    depth: int = 4
    #: where the kernel cannot take this instruction (a strided window, an odd row for 2 pixels at a
    #: time), the one it takes instead
    fallback: DotProduct | None = None


VNNI = DotProduct("edgepack_vnni_16x4_u8i8i32", 16, "uint8")
SDOT = DotProduct("edgepack_sdot_4x4_i8i8i32", 4, "int8")
#: NEON without the dot-product extension (Cortex-A72: rpi4; Cortex-A53): ``smull`` x2 (16 products in
#: 16 bits), ``addp`` (pairs: |2 x 128 x 127| fits in 16 bits, so no weight may be -128), ``sadalp`` (pairs
#: again, into the int32 lanes): 16 multiply-adds in 4 instructions, where int32 multiply-adds take 4 plus
#: the widening of the 8-bit operands.
SMULL = DotProduct("edgepack_smull_4x4_i8i8i32", 4, "int8", weight_min=-127)
#: The same on 32-bit ARM NEON (Cortex-A53 in armv7 mode: rpi3): ``vmull`` x2, ``vpadd`` x2 (on the halves),
#: ``vpadal``.
VMULL = DotProduct("edgepack_vmull_4x4_i8i8i32", 4, "int8", weight_min=-127)
#: AVX-VNNI (Alder Lake and later client CPUs: VNNI without AVX-512): ``vpdpbusd`` on 256 bits.
AVX_VNNI = DotProduct("edgepack_avxvnni_8x4_u8i8i32", 8, "uint8")
#: AVX2 without VNNI (Haswell to Skylake, Zen 1-3): ``vpmaddwd`` x2 on the bytes widened to 16 bits (each
#: int32 lane the sum of 2 exact products; ``_pmaddwd_impl``).
#: ``vpmaddubsw`` would take the bytes as they are, but sums two products in 16 bits with saturation:
#: 2 x 255 x 127 does not fit.
PMADDWD = DotProduct("edgepack_pmaddwd_8x4_i16i8i32", 8, "int16", weight_registers=2, scratch_registers=3,
                     pairs=True)
#: Armv8.6's 8-bit matrix multiply (``+i8mm``: Cortex-A510/A710/X2 and later): ``smmla`` sums 2 x 2
#: outputs of 8 products each, 32 multiply-adds per instruction to ``sdot``'s 16, at the same issue rate
#: on those cores. Its operands: 2 pixels' 8 input channels (two 8-byte loads), 2 output channels' 8
#: weights (one 16-byte load); its accumulator a 2 x 2 block.
SMMLA = DotProduct("edgepack_smmla_2x2x8_i8i8i32", 2, "int8", pixels=2, depth=8, fallback=SDOT)
INSTRUCTIONS = {"vnni": VNNI, "avxvnni": AVX_VNNI, "pmaddwd": PMADDWD, "smmla": SMMLA, "sdot": SDOT,
                "smull": SMULL, "vmull": VMULL}


def dot_product_of(cpu: CpuInfo) -> DotProduct | None:
    """The target's dot-product instruction, registered as a tensor intrinsic, or None."""
    found = INSTRUCTIONS.get(cpu.dot_product or "")
    if found is not None:
        _register(found)
    return found


_REGISTERED: set[str] = set()


def _register(dot: DotProduct) -> None:
    if dot.name in _REGISTERED:
        return
    from tvm.s_tir import TensorIntrin

    if dot is SMMLA:
        desc, impl = _matrix_desc(), _smmla_impl()
    else:
        desc = _pairs_desc(dot.lanes, dot.data_dtype) if dot.pairs else _desc(dot)
        if dot is SMULL:
            impl = _widening_impl("llvm.aarch64.neon.smull.v8i16", _aarch64_accumulate)
        elif dot is VMULL:
            impl = _widening_impl("llvm.arm.neon.vmulls.v8i16", _armv7_accumulate)
        elif dot is PMADDWD:
            impl = _pmaddwd_impl()
        else:
            impl = _instruction_impl(dot)
    TensorIntrin.register(dot.name, desc, impl, override=True)
    _REGISTERED.add(dot.name)


def _desc(dot: DotProduct):
    """What one instruction computes: ``lanes`` int32 sums, each of 4 products of the input and that lane's
    4 weights (stored lane by lane, ``[L, 4]``)."""
    from tvm.script import tirx as T

    lanes, dtype = dot.lanes, dot.data_dtype

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), dtype, offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.Cast("int32", A[vk]) * T.Cast("int32", B[vi, vk])

    return desc


def _instruction_impl(dot: DotProduct):
    """VNNI's, AVX-VNNI's and sdot's intrinsic: the 4 input bytes broadcast to every lane, one instruction.
    LLVM 22's intrinsics take the 8-bit operands as byte vectors (TVM's own VNNI intrinsic passes them as
    int32x16 and fails LLVM's verifier); AVX-VNNI's is AVX-512 VNNI's 256-bit one, which LLVM encodes as VEX
    where the CPU has no AVX-512."""
    from tvm.script import tirx as T

    lanes, dtype = dot.lanes, dot.data_dtype
    intrinsic = {VNNI: "llvm.x86.avx512.vpdpbusd.512", AVX_VNNI: "llvm.x86.avx512.vpdpbusd.256",
                 SDOT: "llvm.aarch64.neon.sdot.v4i32.v16i8"}[dot]
    data_vector, weight_vector, acc_vector = f"{dtype}x{4 * lanes}", f"int8x{4 * lanes}", f"int32x{lanes}"

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), dtype, offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            four = T.reinterpret(A.vload([0], f"{dtype}x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(intrinsic),
                C.vload([0], dtype=acc_vector),
                T.reinterpret(T.broadcast(four, lanes), dtype=data_vector),
                B.vload([0, 0], dtype=weight_vector),
                dtype=acc_vector,
            )

    return impl


def _widening_impl(multiply: str, accumulate):
    """A widening sequence's intrinsic: the 4 input bytes twice side by side times 2 output channels' 4
    weights each (``multiply``, an LLVM intrinsic: 8 products in 16 bits), for lanes 0-1 (``low``) and 2-3
    (``high``); ``accumulate(acc, low, high)`` adds each lane's 4 products into the int32 accumulator."""
    from tvm.script import tirx as T

    widening = T.llvm_lookup_intrinsic_id(multiply)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "int8", offset_factor=1)
        B = T.match_buffer(b, (4, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (4,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:4], A[0:4], B[0:4, 0:4])
            T.writes(C[0:4])
            twice = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "int8x4"), dtype="int32"), 2),
                                  dtype="int8x8")
            low = T.call_llvm_pure_intrin(widening, twice, B.vload([0, 0], dtype="int8x8"), dtype="int16x8")
            high = T.call_llvm_pure_intrin(widening, twice, B.vload([2, 0], dtype="int8x8"), dtype="int16x8")
            C[T.ramp(T.int32(0), 1, 4)] = accumulate(C.vload([0], dtype="int32x4"), low, high)

    return impl


def _pairs_desc(lanes: int, dtype: str):
    """The desc of an instruction whose weights are stored by pairs of channels (``DotProduct.pairs``)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), dtype, offset_factor=1)
        B = T.match_buffer(b, (2, lanes, 2), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:2, 0:lanes, 0:2])
            T.writes(C[0:lanes])
            for i, k in T.grid(lanes, 4):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.Cast("int32", A[vk]) * T.Cast("int32", B[vk // 2, vi, vk % 2])

    return desc


def _pmaddwd_impl():
    """PMADDWD's intrinsic: input channels 0-1 (16 bits: the input's padded copy widened them once) as one
    32-bit pair broadcast to the 8 lanes, times each lane's weights 0-1 (``vpmaddwd``: 8 sums of 2 exact
    products), the same for channels 2-3, both added to the accumulator. The weights are stored by pairs
    (``DotProduct.pairs``): each half is one widening load. Summing 4 channels' products in one ``vpmaddwd``
    instead leaves pairs to add across lanes (``vphaddd`` and a ``vpermq``: 3 shuffle-port micro-ops per
    32 multiply-adds; MobileNetV2's 1x1 convolutions ran at 70 GOP/s), and regrouping lane-by-lane weights
    in registers took 4 shuffles per weight vector and tile."""
    from tvm.script import tirx as T

    madd = T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd")

    def pair(A, k):  # channels k, k + 1 in every lane
        return T.reinterpret(T.broadcast(T.reinterpret(A.vload([k], "int16x2"), dtype="int32"), 8), dtype="int16x16")

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "int16", offset_factor=1)
        B = T.match_buffer(b, (2, 8, 2), "int8", offset_factor=1)
        C = T.match_buffer(c, (8,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:8], A[0:4], B[0:2, 0:8, 0:2])
            T.writes(C[0:8])
            first = T.Cast("int16x16", B.vload([0, 0, 0], dtype="int8x16"))
            second = T.Cast("int16x16", B.vload([1, 0, 0], dtype="int8x16"))
            C[T.ramp(T.int32(0), 1, 8)] = (C.vload([0], dtype="int32x8")
                                            + T.call_llvm_pure_intrin(madd, pair(A, 0), first, dtype="int32x8")
                                            + T.call_llvm_pure_intrin(madd, pair(A, 2), second, dtype="int32x8"))

    return impl


def _matrix_desc():
    """What one ``smmla`` computes: a 2 x 2 block of int32 sums (2 pixels x 2 output channels, stored
    together: ``DotProductConv`` lays the accumulators out by blocks), each of 8 products of a pixel's 8
    input channels (its row of ``A``; the pixels one input row apart) and an output channel's 8 weights
    (its row of ``B``, stored channel by channel)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2, 8), "int8", offset_factor=1, strides=[T.int32(), 1])
        B = T.match_buffer(b, (2, 8), "int8", offset_factor=1)
        C = T.match_buffer(c, (2, 2), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:8], B[0:2, 0:8])
            T.writes(C[0:2, 0:2])
            for i, j, k in T.grid(2, 2, 8):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vj, vk])

    return desc


def _smmla_impl():
    """SMMLA's intrinsic: the two pixels' 8 bytes side by side (a 2 x 8 matrix), the two channels' 16
    weight bytes as they are stored (the other 2 x 8), the accumulator block as one vector in the order
    ``smmla`` sums into (``[p0 c0, p0 c1, p1 c0, p1 c1]``)."""
    from tvm.script import tirx as T

    smmla = T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.smmla.v4i32.v16i8")
    sa = T.int32()

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2, 8), "int8", offset_factor=1, strides=[sa, 1])
        B = T.match_buffer(b, (2, 8), "int8", offset_factor=1)
        C = T.match_buffer(c, (2, 2), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:2, 0:2], A[0:2, 0:8], B[0:2, 0:8])
            T.writes(C[0:2, 0:2])
            C[0, T.ramp(T.int32(0), 1, 4)] = T.call_llvm_pure_intrin(
                smmla,
                C.vload([0, 0], dtype="int32x4"),
                T.Shuffle([A.vload([0, 0], dtype="int8x8"), A.vload([1, 0], dtype="int8x8")], list(range(16))),
                B.vload([0, 0], dtype="int8x16"),
                dtype="int32x4",
            )

    return impl


def _aarch64_accumulate(acc, low, high):
    """SMULL's: the products' pairs added (``addp``: 4 sums per half, 8 in all), their pairs added into the
    accumulator (``saddlp`` + add, which LLVM emits as one ``sadalp``)."""
    from tvm import tirx

    sums = tirx.call_llvm_pure_intrin("int16x8", "llvm.aarch64.neon.addp.v8i16", low, high)
    return acc + tirx.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.saddlp.v4i32.v8i16", sums)


def _armv7_accumulate(acc, low, high):
    """VMULL's: the pairs added per 64-bit half (armv7's ``vpadd`` has no 128-bit form), the two halves
    then one ``vpadal`` operand."""
    from tvm import tirx

    def pairs(products):
        return tirx.call_llvm_pure_intrin("int16x4", "llvm.arm.neon.vpadd.v4i16", tirx.Shuffle([products], [0, 1, 2, 3]),
                                          tirx.Shuffle([products], [4, 5, 6, 7]))

    both = tirx.Shuffle([pairs(low), pairs(high)], list(range(8)))
    return tirx.call_llvm_pure_intrin("int32x4", "llvm.arm.neon.vpadals.v4i32.v8i16", acc, both)


def register_tile(width: int, blocks: int, cpu: CpuInfo, dot: DotProduct) -> tuple[int, int]:
    """(pixels, vectors) of a tile: pixels dividing the row's ``width`` (in ``dot.pixels`` at a time),
    vectors (powers of two) the output channels' ``blocks``, at most ``cpu.accumulators`` accumulators
    (one per instruction of the tile), and with the vectors' weights, a matrix instruction's pixel operands
    and ``dot``'s other operands within the CPU's vector registers (AVX2's 16: PMADDWD's weights take two
    each, and a tile of 2 x 4 spilled); the most instructions per operand loaded (g pixel groups x v
    vectors read g inputs and v weight vectors), then the most vectors. ResNet-50's 7x7 stage took 1 pixel
    x 4 vectors with the vectors chosen first (100 GOP/s); 7 x 2 runs at ~400."""
    step = dot.pixels
    operands = 1 if step > 1 else 0  # a matrix instruction's pixels take a register per group

    def fits(groups: int, v: int) -> bool:
        return groups * v <= cpu.accumulators and groups * v + v * dot.weight_registers + groups * operands \
            + dot.scratch_registers <= cpu.vector_registers

    shapes = [(p, v) for p in range(step, min(width, MAX_PIXELS) + 1, step) if width % p == 0
              for v in (1, 2, 4, 8) if v <= MAX_VECTORS and blocks % v == 0 and fits(p // step, v)]
    return max(shapes, key=lambda pv: (pv[0] // step * pv[1] / (pv[0] // step + pv[1]), pv[1]))


class DotProductConv(CpuRule):
    """The kernel of ``cpu/dot_product.py``: tiled over pixels and output channels, its inner L x 4
    block one dot-product instruction."""

    rule_name = "cpu.DotProductConv"

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        block = next((b for b in child_blocks(sch) if DOT_PRODUCT_ATTR in sch.get(b).annotations), None)
        if block is None:
            return False
        name = str(sch.get(block).annotations[DOT_PRODUCT_ATTR])
        dot = next((d for d in INSTRUCTIONS.values() if d.name == name), None)
        if dot is None:
            return False
        _register(dot)
        intrin, lanes = dot.name, dot.lanes
        n, y, x, o, ky, kx, kb, kc = sch.get_loops(block)
        channels = static_extent(sch, o)
        width = static_extent(sch, x)
        pixels, vectors = register_tile(width, channels // lanes, cpu, dot)
        x_outer, x_inner = sch.split(x, [None, pixels])
        o_outer, o_lanes = sch.split(o, [None, lanes])
        o_tiles, o_vectors = sch.split(o_outer, [None, vectors])
        if dot.pixels > 1:  # a matrix instruction: its pixels innermost but for its channels and depth
            x_groups, x_pixels = sch.split(x_inner, [None, dot.pixels])
            sch.reorder(n, y, x_outer, o_tiles, ky, kx, kb, x_groups, o_vectors, x_pixels, o_lanes, kc)
            instruction, unrolled = x_pixels, (x_groups, o_vectors)
        else:
            sch.reorder(n, y, x_outer, o_tiles, ky, kx, kb, x_inner, o_vectors, o_lanes, kc)
            instruction, unrolled = o_lanes, (x_inner, o_vectors)
        fused = sch.fuse(n, y, x_outer, o_tiles)
        multiply_adds = prod(int(iv.dom.extent) for iv in sch.get(block).iter_vars)
        if (static_extent(sch, fused) or 1) > 1 and multiply_adds >= PARALLEL_MIN_DOT_PRODUCTS * 4:
            sch.parallel(fused)

        write_back, cropped = cache_with_epilogue(sch, block, "global")  # tensorize needs a global buffer
        if dot.pixels > 1:  # each instruction's accumulators side by side: one vector, as it sums them
            sch.transform_layout(block, ("write", 0), lambda n_, y_, x_, o_: (n_, y_, x_ // dot.pixels, o_ // lanes,
                                                                            x_ % dot.pixels, o_ % lanes))
        sch.reverse_compute_at(write_back, fused)
        # the input's padded, shifted copy (where it needs one) made once, in a pass of its own
        # (``schedule_leftovers``): made per tile, QDQ MobileNetV2 ran 6% slower at one thread

        init = sch.decompose_reduction(block, ky)
        sch.tensorize(instruction, intrin)
        for loop in unrolled:
            sch.unroll(loop)
        init_loops = sch.get_loops(init)  # the tile's loops under ``fused``
        sch.vectorize(init_loops[-1])
        for loop in init_loops[1:-1]:
            sch.unroll(loop)
        # stored in whole vectors of the tile's rows (a matrix instruction's rows are 2 lanes wide)
        store = lanes if dot.pixels == 1 else max(d for d in (1, 2, 4) if d <= cpu.lanes(32) and vectors * lanes % d == 0)
        store_tile(sch, write_back, sch.get_loops(write_back)[1:], store, store, cropped)
        schedule_leftovers(sch, fused, cpu)
        return True

