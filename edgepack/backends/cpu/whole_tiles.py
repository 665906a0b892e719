"""Whole tiles without bounds checks: the tiles of a kernel over a size that changes at run time (``--dim``).

A register tile of, say, 4 pixels of a row whose width ``W`` is only known at run time cannot be proven
to fit: TVM guards every multiply-add of the tile with ``if x * 4 + k < W``, inside the reduction, where
each check costs as much as the arithmetic it guards and keeps LLVM from holding the tile in registers
(PP-OCRv4's recognizer at W = 160: 2.7x its fixed-size build, against 1.25x for a width on a 32-column
step that every tile divides). Only the last tile of a row can be partial.

The pass (TIR, after TVM's lowering) rewrites each loop over a run-time extent whose body is guarded so:

    for x in range((W + 3) // 4):                 for x in range((W + 3) // 4):
        ... if x * 4 + k < W: acc[k] += ...   ->      if x * 4 + 3 < W:  (every guard of the body)
                                                          ... acc[k] += ...      (no guard: a whole tile)
                                                      else:
                                                          ... if x * 4 + k < W: acc[k] += ...

The guards taken are those that depend on the loop and on sizes set outside it, never on a loop inside
it or on memory: true for one iteration, true for its whole body. Kernels of static shapes are left as
they are (their loops have constant extents).
"""

from __future__ import annotations


def _guards(body, loop_var) -> list[tuple]:
    """The conditions of ``body``'s ``if`` statements that name ``loop_var`` and, with the values of the
    variables bound in ``body`` put in (TVM's common-subexpression pass names the tile's row so), nothing
    else defined in ``body``: pairs (the condition, the condition in terms of ``loop_var``)."""
    import tvm_ffi
    from tvm import tirx
    from tvm.ir.expr import TensorLoad, Var  # a buffer's load (``tirx.BufferLoad`` makes one)

    loops: list = []
    bound: list[tuple] = []
    conditions: list = []
    tvm_ffi.structural_walk(body, [(tirx.For, lambda n: loops.append(n.loop_var)),
                                   ((tirx.Bind, tirx.Let), lambda n: bound.append((n.var, n.value))),
                                   (tirx.IfThenElse, lambda n: conditions.append(n.condition))], order="pre")

    def value(var):
        return next((v for b, v in bound if var.same_as(b)), var)

    found: list[tuple] = []
    for condition in conditions:
        expanded = condition
        for _ in range(len(bound) + 1):  # each pass puts in one level of bound values
            names = tirx.analysis.undefined_vars(expanded, [])
            if not any(any(n.same_as(b) for b, _v in bound) for n in names):
                break
            expanded = tvm_ffi.structural_map(expanded, [(Var, value)])
        names = tirx.analysis.undefined_vars(expanded, [])
        loads: list = []
        tvm_ffi.structural_walk(expanded, [(TensorLoad, loads.append)], order="pre")
        if loads or not any(n.same_as(loop_var) for n in names) or len(names) < 2 \
                or any(any(n.same_as(d) for d in loops) or any(n.same_as(b) for b, _v in bound) for n in names):
            continue
        if not any(tvm_ffi.structural_equal(condition, c) for c, _e in found):
            found.append((condition, expanded))
    return found


def _strongest(guards, analyzer):
    """``guards`` joined into one condition, leaving out each ``a < b`` that a kept ``c < d`` implies
    (``c - d >= a - b``: the tile's last row in range implies every row before it)."""
    from tvm import tirx

    def implies(k, g) -> bool:
        return isinstance(k, tirx.LT) and isinstance(g, tirx.LT) and analyzer.can_prove(
            (k.a - k.b) - (g.a - g.b) >= 0)

    kept: list = []
    for g in (analyzer.simplify(g) for g in guards):
        if not any(implies(k, g) for k in kept):
            kept = [k for k in kept if not implies(g, k)] + [g]
    whole = kept[0]
    for g in kept[1:]:
        whole = tirx.And(whole, g)
    return whole


def _without(body, guards):
    """``body`` with every ``if`` on one of ``guards`` replaced by its then-branch (the guards hold there)."""
    import tvm_ffi
    from tvm import tirx

    def taken(node):
        if any(tvm_ffi.structural_equal(node.condition, g) for g in guards):
            return node.then_case
        return node

    return tvm_ffi.structural_map(body, [(tirx.IfThenElse, taken)])


def _split_loops(stmt, analyzer):
    """``stmt`` with each loop over a run-time extent that has guards split as the module docstring shows."""
    import tvm_ffi
    from tvm import tirx

    def visit(loop):
        if isinstance(loop.extent, tirx.IntImm):
            return loop
        guards = _guards(loop.body, loop.loop_var)
        if not guards:
            return loop
        whole = _strongest([e for _c, e in guards], analyzer)
        body = tirx.IfThenElse(whole, _without(loop.body, [c for c, _e in guards]), loop.body)
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                        loop.annotations, loop.step)

    return tvm_ffi.structural_map(stmt, [(tirx.For, visit)])


def whole_tiles():
    """The TIR pass: each loop over a run-time extent runs its whole iterations without their bounds checks."""
    import tvm
    from tvm import sym, tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.WholeTiles")
    def _pass(func, _mod, _ctx):
        return func.with_body(_split_loops(func.body, sym.Analyzer()))

    # both copies of a loop's body define the same variables: TVM's ConvertSSA renames one copy's
    return tvm.transform.Sequential([_pass, tirx.transform.ConvertSSA()])
