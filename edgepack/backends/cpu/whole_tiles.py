"""Register tiles computed whole at run-time sizes: the TIR pass ``unpredicated_tiles``.

A register tile over a dimension whose size is known only at run time (``--dim``) does not divide it, so
TVM's split guards every block under it with a predicate (``T.where(x < W)``): the accumulators' init and
update, the tile's depthwise output, each behind a branch inside the reduction loop. PP-OCRv2's fused
depthwise + pointwise convolutions ran 2.6x slower than at a fixed width (3.93 ms against 1.54 at
W = 160), one branch per pixel of the tile per input channel.

The blocks that only write the kernel's own buffers (accumulators, a tile's buffer on the stack) need no
predicate over their data-parallel loops (one over a reduction's loop stays: past its extent it would add
to the outputs inside it). What they compute past the edge is never stored: the block that writes the
kernel's output keeps its predicate. So here:

- the predicate goes, and the block's iteration domains widen to every value their bindings take (TVM's
  simplifier would otherwise assume the predicate still holds);
- the kernel's own buffers those blocks reach get room for the indices past the edge (TVM compacts a
  buffer to its accesses, but within its declared extents: a register tile of 64 pixels over a row of 4
  had overlapped the next row's);
- their reads of the kernel's inputs are clamped into each input's extents: a pixel past the edge reads one
  at the edge (a value nobody keeps), and no read leaves its buffer.

Only predicates over a run-time size are dropped; kernels of fixed shapes are unchanged. PP-OCRv2's fused
convolutions at W = 160: 3.93 -> 1.66 ms (fixed width 1.54).
"""

from __future__ import annotations


def _vars(expr) -> list:
    import tvm_ffi
    from tvm.ir.expr import Var

    found: list = []
    tvm_ffi.structural_walk(expr, [(Var, found.append)], order="pre")
    return found


def _mentions(expr, names: set) -> bool:
    return any(v.name in names for v in _vars(expr))


def _clamp(index, extent):
    """``index`` within ``[0, extent)``, in the index's own type."""
    from tvm import tirx

    dtype = str(index.ty.dtype)
    last = tirx.Cast(dtype, extent) - 1 if str(extent.ty.dtype) != dtype else extent - 1
    return tirx.max(tirx.min(index, last), tirx.const(0, dtype))


def _mentions_only(expr, names: set) -> bool:
    return all(v.name in names for v in _vars(expr))


def _largest(values):
    from tvm import tirx

    out = values[0]
    for v in values[1:]:
        out = tirx.max(out, v)
    return out


def _is_buffer(var) -> bool:
    try:
        var.shape  # noqa: B018 - only a buffer has one
    except Exception:  # noqa: BLE001 - "shape is only available on a Var with BufferType"
        return False
    return True


def with_room(buffer, tops: list):
    """``buffer`` declared large enough for the largest index of each dimension in ``tops`` (one list per
    access)."""
    from tvm import sym, tirx

    shape = [sym.Analyzer().simplify(_largest([extent, *(t[d] + 1 for t in tops)]))
             for d, extent in enumerate(buffer.shape)]
    return tirx.decl_buffer(shape, buffer.dtype, buffer.name, scope=buffer.scope())


def unpredicated_tiles():
    """The TIR pass (see the module docstring)."""
    import tvm_ffi
    from tvm import s_tir, sym, tirx
    from tvm.ir import Range
    from tvm.ir.expr import TensorLoad, Var

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.UnpredicatedTiles")
    def unpredicated(func, _mod, _ctx):
        params = list(func.params)
        buffers = [p for p in params if _is_buffer(p)]
        # the run-time sizes: scalar parameters, and the variables of the inputs' and outputs' shapes
        sizes = {p.name for p in params if not _is_buffer(p)}
        sizes |= {v.name for b in buffers for extent in b.shape for v in _vars(extent)}
        if not sizes:
            return func

        def is_input(buffer) -> bool:
            return any(buffer.same_as(b) for b in buffers)

        def clamped(load):
            if not is_input(load.source):
                return load
            indices = [_clamp(i, extent) for i, extent in zip(load.indices, load.source.shape)]
            return tirx.BufferLoad(load.source, indices)

        loops: list = []  # (loop variable, its range)

        def note_loop(loop):
            loops.append((loop.loop_var, Range.from_min_extent(loop.min, loop.extent)))

        tvm_ffi.structural_walk(func.body, [(tirx.For, note_loop)], order="pre")

        def widened(iv, value):
            """``iv`` over every value its binding takes (the block's domain assumed the predicate)."""
            analyzer = sym.Analyzer()
            for v in _vars(value):
                for var, extent in loops:
                    if v.same_as(var):
                        analyzer.bind(v, extent)
            top = analyzer.int_set(value).max_value
            if not _mentions_only(top, sizes):
                return None  # a binding over more than the loops (an outer block's variables): left as it is
            extent = analyzer.simplify(tirx.max(iv.dom.extent, top + 1 - iv.dom.min))
            return tirx.IterVar(Range.from_min_extent(iv.dom.min, extent), iv.var, iv.iter_type, iv.thread_tag)

        reach: list = []  # (a buffer of the kernel's own, the largest index of each dimension a block reaches)

        def reached(block, iter_vars) -> list | None:
            """The indices past the edge the unpredicated ``block`` reaches in the kernel's own buffers: they are
            sized to hold them (TVM compacts a buffer to its accesses, but within its declared extents). None
            where a bound is not known in terms of the run-time sizes."""
            analyzer = sym.Analyzer()
            for iv in iter_vars:
                analyzer.bind(iv.var, iv.dom)
            accesses: list = []
            for stmt in (block.body, block.init):
                if stmt is not None:
                    tvm_ffi.structural_walk(stmt, [(TensorLoad, accesses.append), (tirx.BufferStore, accesses.append)],
                                            order="pre")
            found = []
            for access in accesses:
                buffer = access.source if isinstance(access, TensorLoad) else access.buffer
                if not is_input(buffer):
                    tops = [analyzer.int_set(i).max_value for i in access.indices]
                    if not all(_mentions_only(t, sizes) for t in tops):
                        return None
                    found.append((buffer, tops))
            return found

        def realize(node):
            predicate = node.predicate
            if isinstance(predicate, tirx.IntImm) or not _mentions(predicate, sizes):
                return node
            block = node.block
            if any(is_input(w.source) for w in block.writes):
                return node  # the kernel's outputs: stored only inside their extents
            guarded = {v.name for v in _vars(predicate)}
            if any(int(iv.iter_type) != tirx.IterVar.DataPar and any(v.name in guarded for v in _vars(value))
                   for iv, value in zip(block.iter_vars, node.iter_values)):
                return node  # a reduction past its extent would add to the outputs inside it
            body = tvm_ffi.structural_map(block.body, [(TensorLoad, clamped)])
            init = tvm_ffi.structural_map(block.init, [(TensorLoad, clamped)]) if block.init is not None else None
            iter_vars = [widened(iv, value) if _mentions(value, guarded) else iv
                         for iv, value in zip(block.iter_vars, node.iter_values)]
            if any(iv is None for iv in iter_vars) or (found := reached(block, iter_vars)) is None:
                return node
            reach.extend(found)
            new = s_tir.SBlock(iter_vars, block.reads, block.writes, block.name_hint, body, init,
                               block.alloc_buffers, block.match_buffers, block.annotations)
            return s_tir.SBlockRealize(node.iter_values, True, new)

        body = tvm_ffi.structural_map(func.body, [(s_tir.SBlockRealize, realize)])
        resized = []  # (buffer, the buffer with room for every index reached)
        for buffer, _top in reach:
            if any(buffer.same_as(old) for old, _new in resized):
                continue
            resized.append((buffer, with_room(buffer, [top for b, top in reach if b.same_as(buffer)])))

        def at_size(var):
            return next((new for old, new in resized if var.same_as(old)), var)

        return func.with_body(tvm_ffi.structural_map(body, [(Var, at_size)]) if resized else body)

    return unpredicated
