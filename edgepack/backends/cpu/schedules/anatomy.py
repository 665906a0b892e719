"""How a fused kernel is built: its one reduction block, the blocks after it, and the roles of the
reduction's iteration variables. The rules decide from this whether a kernel is theirs.

Kernels come straight from TVM's legalisation and fusion, so every block's iteration variables are bound
one to one to its loops (``T.axis.remap``); a kernel in another form is left to the next rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Any


@dataclass
class Read:
    buffer: Any
    indices: list[Any]  # one index expression per dimension


@dataclass
class Anatomy:
    """The reduction block of a kernel and what is known of its iteration variables (by position)."""

    block: Any  # the reduction block (its producers already inlined into it)
    after: list[Any]  # blocks after it (bias, activation, residual add...)
    pads: list[Any]  # padding blocks before it (every other producer is inlined into it, or computed once)
    iter_vars: list[Any]
    spatial: list[int]  # positions of data-parallel iteration variables
    reduce: list[int]  # positions of reduction variables
    extents: list[int]
    output_axes: list[int | None]  # per output dimension, the variable indexing it (None: an expression)
    reads: list[Read]  # what the reduction reads, its own output excluded
    dtype_bits: int  # the accumulator's width

    def vars_in(self, expr) -> set[int]:
        """Positions of the iteration variables that ``expr`` uses."""
        import tvm_ffi
        from tvm import tirx

        found: set[int] = set()

        def visit(node):
            for k, iv in enumerate(self.iter_vars):
                if node.same_as(iv.var):
                    found.add(k)

        tvm_ffi.structural_walk(expr, [(tirx.Var, visit)], order="pre")
        return found

    @property
    def window(self) -> bool:
        """Some read index adds a spatial and a reduction variable: a convolution or pooling window
        (of any size: a 1x1 convolution's window variables have extent 1)."""
        spatial, reduce = set(self.spatial), set(self.reduce)
        return any((found := self.vars_in(index)) & spatial and found & reduce
                   for read in self.reads for index in read.indices)

    @property
    def channel_reduction(self) -> int:
        """How many terms the reduction sums besides its window: the input channels of a convolution
        (1 for a depthwise one, whose window is all it reduces)."""
        windowed: set[int] = set()
        for read in self.reads:
            for index in read.indices:
                found = self.vars_in(index)
                if found & set(self.spatial):
                    windowed |= found
        size = 1
        for k in self.reduce:
            if k not in windowed:
                size *= self.extents[k]
        return size

    @property
    def vector_axis(self) -> int | None:
        """The variable of the innermost output dimension longer than 1: SIMD lanes run along it."""
        for var in reversed(self.output_axes):
            if var is not None and self.extents[var] > 1:
                return var
        return None

    @property
    def register_axis(self) -> int | None:
        """The variable of the next output dimension longer than 1: a register tile repeats along it."""
        vector, seen = self.vector_axis, False
        for var in reversed(self.output_axes):
            if var is not None and var == vector:
                seen = True
            elif seen and var is not None and self.extents[var] > 1:
                return var
        return None

    def contiguous_in(self, read: Read, var: int) -> bool:
        """Whether ``var`` indexes the read's innermost dimension (consecutive values, adjacent elements)."""
        return bool(read.indices) and var in self.vars_in(read.indices[-1])

    def group_size(self, var: int) -> int | None:
        """For a grouped convolution the input channel is ``out_channel // group_size * ...``: SIMD lanes
        along the output channels must not cross a group. The group size, if reads divide ``var``."""
        target = self.iter_vars[var].var
        return divisor_gcd([index for read in self.reads for index in read.indices], target) or None


def child_blocks(sch) -> list[Any]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_spatial(sch, block) -> bool:
    from tvm import tirx

    return all(iv.iter_type == tirx.IterVar.DataPar for iv in sch.get(block).iter_vars)


def is_padding(sch, block) -> bool:
    """A spatial block that copies its input or a constant at the border (``T.if_then_else``)."""
    import tvm
    from tvm import tirx

    stmt = sch.get(block)
    if not is_spatial(sch, block) or not isinstance(stmt.body, tirx.BufferStore):
        return False
    value = stmt.body.value
    return isinstance(value, tvm.ir.Call) and str(getattr(value.op, "name", "")).endswith("if_then_else")


def stores_one_value(sch, block) -> bool:
    """The block computes one element (its body a single store), as TE's blocks do; a block whose body
    runs loops of its own (e.g. a hand-written top-K row) must not be vectorised or reordered."""
    from tvm import tirx

    return isinstance(sch.get(block).body, tirx.BufferStore)


# math functions LLVM gets as calls to the C library (sinhf, coshf): TVM 0.27 lowers them for one value
# only ("unknown intrinsic tirx.sinh" for a vector), so a block computing them is not vectorised
SCALAR_ONLY_OPS = frozenset({"tirx.sinh", "tirx.cosh"})


def scalar_only(sch, block) -> bool:
    """Whether the block stays scalar: it calls a math function without a vector form
    (``SCALAR_ONLY_OPS``), or it reads at an index computed in floating point (nearest-neighbour resize:
    LLVM contracts the vector form's multiply and subtract into one FMA, which moved an index that lies
    on a rounding boundary by one row on NEON; the scalar code matches the reference there). Gathers at
    computed indices gain little from vectors anyway."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    found = []

    def visit_call(node) -> None:
        if str(getattr(node.op, "name", "")) in SCALAR_ONLY_OPS:
            found.append(node)

    def visit_cast(node) -> None:
        if "float" in str(node.value.ty) and "int" in str(node.ty):
            found.append(node)

    def visit_load(node) -> None:
        for index in node.indices:
            tvm_ffi.structural_walk(index, [(tirx.Cast, visit_cast)], order="pre")

    tvm_ffi.structural_walk(sch.get(block).body, [(tvm.ir.Call, visit_call), (tvm.ir.expr.TensorLoad, visit_load)],
                            order="pre")
    return bool(found)


def index_period(sch, block) -> int:
    """The gcd of the constant divisors (``//``, ``%``) applied to the block's innermost index in what
    it reads and writes (0: none). A vector must not cross such a boundary: TVM 0.27's vectorizer
    computed ``(i // 32, i % 8)`` wrongly for 16 lanes that straddle an ``% 8`` (ONNX RotaryEmbedding on
    AVX-512; 8 lanes were right)."""
    stmt = sch.get(block)
    return divisor_gcd([stmt.body], stmt.iter_vars[-1].var) if stmt.iter_vars else 0


def divisor_gcd(exprs, var) -> int:
    """The gcd of the constant divisors of every ``//`` and ``%`` in ``exprs`` whose dividend uses ``var``
    (0: none)."""
    import tvm_ffi
    from tvm import tirx

    found = 0

    def visit(node) -> None:
        nonlocal found
        if isinstance(node.b, tirx.IntImm):
            uses: list[bool] = []
            tvm_ffi.structural_walk(node.a, [(tirx.Var, lambda v: uses.append(v.same_as(var)))], order="pre")
            if any(uses):
                found = gcd(found, int(node.b.value))

    for expr in exprs:
        tvm_ffi.structural_walk(expr, [(tirx.FloorDiv, visit), (tirx.FloorMod, visit)], order="pre")
    return found


def is_constant(extent) -> bool:
    """An extent known at compile time (a ``tirx.IntImm``; a ``Cast`` of a symbolic one has a ``value`` too)."""
    from tvm import tirx

    return isinstance(extent, tirx.IntImm)


def shape_key(buffer) -> tuple[int | str, ...]:
    """A buffer's shape, extents that change at run time (``--dim``) as their text: what shapes are compared by."""
    return tuple(int(x) if is_constant(x) else str(x) for x in buffer.shape)


def static_extent(sch, loop) -> int | None:
    extent = sch.get(loop).extent
    return int(extent.value) if is_constant(extent) else None


#: what a schedule assumes of an extent that changes at run time (an input's ``--dim``) where it needs a number:
#: long enough to be worth a parallel loop
SYMBOLIC_EXTENT = 256


def dim_hint(extent) -> int:
    """A buffer's or loop's extent as a number: ``SYMBOLIC_EXTENT`` where it changes at run time."""
    return int(extent.value) if is_constant(extent) else SYMBOLIC_EXTENT


def extent_hint(sch, loop) -> int:
    """A loop's extent, or ``SYMBOLIC_EXTENT`` where it changes at run time."""
    return dim_hint(sch.get(loop).extent)


def trivially_bound(sch, block, symbolic: bool = False) -> bool:
    """Each iteration variable is bound to one loop of the same, static extent, in loop order (``symbolic``:
    or of the same extent that changes at run time); a block outside any loop computes one value."""
    import tvm_ffi

    loops = sch.get_loops(block)
    ivars = sch.get(block).iter_vars
    if not loops:  # a scalar (a dynamic quantization's scale and zero point): iterations of one, if any
        return all(is_constant(iv.dom.extent) and int(iv.dom.extent.value) == 1 for iv in ivars)
    if len(loops) != len(ivars):
        return False
    for loop, iv in zip(loops, ivars):
        extent = static_extent(sch, loop)
        if extent is None and symbolic and not is_constant(iv.dom.extent) \
                and tvm_ffi.structural_equal(sch.get(loop).extent, iv.dom.extent):
            continue
        if extent is None or not is_constant(iv.dom.extent) or extent != int(iv.dom.extent.value):
            return False
    return True


#: arithmetic per element (operations, after its own producers are folded into it) from which a producer the
#: reduction reads more than once per element is computed once, as a pass of its own, rather than inlined
#: into the reduction, which would compute it again for every output channel and window tap
RECOMPUTE_LIMIT = 2


def arithmetic(sch, block) -> int:
    """The arithmetic operations of the value ``block`` stores (index arithmetic excluded)."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    stmt = sch.get(block)
    if not isinstance(stmt.body, tirx.BufferStore):
        return 0
    counted = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min, tvm.ir.Call)
    found = []

    def skip(_node, _visitor) -> None:  # what a load's indices compute is not work
        return None

    def count(node, visitor) -> None:
        found.append(node)
        visitor.default_visit(node)

    tvm_ffi.structural_visit(stmt.body.value, [(tvm.ir.expr.TensorLoad, skip), (counted, count)])
    return len(found)


def reads_per_element(sch, consumer, producer) -> float:
    """How many times the consumer reads each element the producer writes: its iterations over the
    producer's elements (a convolution: its output channels times its window's taps over the stride
    squared; a per-channel value broadcast over an image: the pixels)."""
    stmt = sch.get(consumer)
    written = sch.get(producer).writes[0].source
    elements = hinted_count(written.shape)
    iterations = hinted_count([iv.dom.extent for iv in stmt.iter_vars])
    return iterations / elements if elements else 1.0


def hinted_count(extents) -> int:
    """The product of ``extents``, each variable that changes at run time (``--dim``) taken as
    ``SYMBOLIC_EXTENT``: a ratio of two such counts is right whatever the size (``(W - 1) // 4 + 1`` pixels
    read 240 times each over ``(W - 1) // 4 + 1`` pixels)."""
    import tvm_ffi
    from tvm import sym, tirx

    analyzer, bound, total = sym.Analyzer(), set(), 1
    for extent in extents:
        if is_constant(extent):
            total *= int(extent.value)
            continue
        found: list = []
        tvm_ffi.structural_walk(extent, [(tirx.Var, found.append)], order="pre")
        for var in found:
            if var.name not in bound:
                bound.add(var.name)
                analyzer.bind(var, tirx.IntImm("int64", SYMBOLIC_EXTENT))  # shape variables are int64
        value = analyzer.simplify(extent)
        total *= int(value.value) if is_constant(value) else SYMBOLIC_EXTENT
    return total


def reduction_anatomy(sch, keep: Any = None) -> Anatomy | None:
    """The anatomy of a kernel with exactly one reduction block, its producers inlined into it, padding
    apart. ``keep``: a producer the caller schedules itself (``cpu.Conv2D``'s per-channel scaling of a
    1x1 convolution's input); what it reads is inlined into it. A producer chain with arithmetic
    (``RECOMPUTE_LIMIT``) that the reduction reads more than once per element (a layout transpose and a
    hard-swish before a convolution) is folded into its last block, which stays a pass of its own: each
    value computed once (``register_tile``'s ``schedule_leftovers`` parallelises and vectorizes it).

    None for kernels of another shape: no or several reductions, producers that cannot be inlined,
    symbolic extents."""
    blocks = child_blocks(sch)
    reductions = [i for i, b in enumerate(blocks) if not is_spatial(sch, b)]
    if len(reductions) != 1 or not all(stores_one_value(sch, b) for b in blocks):
        return None
    index = reductions[0]
    block = blocks[index]
    kept = [b for b in blocks[:index] if keep is not None and sch.get(b).same_as(sch.get(keep))]
    pads = [b for b in blocks[:index] if b not in kept and is_padding(sch, b)]
    computed_once = _computed_once(sch, block, [b for b in blocks[:index] if b not in kept], pads)
    for producer in blocks[:index]:
        if producer in kept or producer in pads or any(sch.get(producer).same_as(sch.get(c)) for c in computed_once):
            continue
        try:
            sch.compute_inline(producer)
        except Exception:  # noqa: BLE001 - a producer read twice or in another shape: not this form
            return None
    return anatomy_of(sch, block, pads, list(blocks[index + 1:]))


def worth_computing_once(sch, producer, consumers) -> bool:
    """Whether ``producer`` (its own producers folded in) has ``RECOMPUTE_LIMIT`` operations per element and
    a consumer reads its elements more than once: inlined, its arithmetic would be done again per read."""
    return arithmetic(sch, producer) >= RECOMPUTE_LIMIT and any(reads_per_element(sch, c, producer) > 1.5
                                                                 for c in consumers)


def _computed_once(sch, reduction, producers: list[Any], pads: list[Any]) -> list[Any]:
    """The producers the reduction (or its padding) reads directly whose chain has at least
    ``RECOMPUTE_LIMIT`` operations per element and whose elements the reduction reads more than once."""
    def same(a, b) -> bool:
        return sch.get(a).same_as(sch.get(b))

    work = {}
    for producer in producers:  # in order: a block's producers come before it
        upstream = [p for p in producers if any(same(p, q) for q in sch.get_producers(producer))]
        work[producer] = arithmetic(sch, producer) + sum(work.get(p, 0) for p in upstream)
    readers = [reduction, *pads]
    chosen = []
    for producer in producers:
        if any(same(producer, p) for p in pads):
            continue
        consumers = sch.get_consumers(producer)
        if not any(same(c, r) for c in consumers for r in readers) or work[producer] < RECOMPUTE_LIMIT:
            continue
        target = next((p for p in pads if any(same(c, p) for c in consumers)), reduction)
        if reads_per_element(sch, target if target is reduction else reduction, producer) > 1.5:
            chosen.append(producer)
    return chosen


def anatomy_of(sch, block, pads: list[Any] | None = None, after: list[Any] | None = None) -> Anatomy | None:
    """The anatomy of the reduction ``block`` as it reads now (its producers inlined as the caller
    chose), None where its loops are not bound one to one or it is not a reduction over a tensor."""
    from tvm import tirx

    if not trivially_bound(sch, block, symbolic=True):
        return None
    stmt = sch.get(block)
    ivars = list(stmt.iter_vars)
    spatial = [k for k, iv in enumerate(ivars) if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [k for k, iv in enumerate(ivars) if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce) != len(ivars) or not spatial or not reduce:
        return None

    def var_of(expr) -> int | None:
        return next((k for k, iv in enumerate(ivars) if expr.same_as(iv.var)), None)

    output = stmt.writes[0]
    return Anatomy(
        block=block, after=list(after or []), pads=list(pads or []), iter_vars=ivars, spatial=spatial, reduce=reduce,
        extents=[dim_hint(iv.dom.extent) for iv in ivars],
        output_axes=[var_of(r.min) for r in output.region],
        reads=[Read(r.source, [x.min for x in r.region]) for r in stmt.reads if not r.source.same_as(output.source)],
        dtype_bits=int(output.source.dtype.bits),
    )
