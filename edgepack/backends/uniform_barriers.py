"""Workgroup barriers that every thread of the workgroup reaches.

TVM's ``LowerThreadAllreduce`` ends a shared-memory reduction over a workgroup with its last steps (the
"warp" of ``thread_warp_size`` threads) inside ``if (threadIdx < 8) { ... }``, with a ``warp`` sync between
each load and store. The OpenCL code generator prints that sync as ``barrier(CLK_LOCAL_MEM_FENCE)``, a
workgroup barrier, which OpenCL requires every work-item of the group to reach: in a conditional, the
kernel is undefined. PoCL ran it in builds of fixed sizes, but not in a dynamic build's kernels (loop bounds
that depend on ``--dim``): PP-OCR's direction classifier with ``--dim W=32..256:32`` did not return from its
first kernel in 10 minutes, and one workgroup of its ``mean`` kernel, launched alone, not in 20 s (the
fixed-size build's: 0.2 s; the same kernel with its barriers made uniform by hand: 0.2 s).

This pass rewrites such a block into one every thread runs: each value the block binds is computed under
the condition (``if_then_else``, the other threads compute nothing), each store is made under it, and
each barrier is reached by all threads. What the reduction computes is unchanged.
"""

from __future__ import annotations

from typing import Any

_SYNC = "tirx.tvm_storage_sync"


def _is_sync(stmt) -> bool:
    from tvm import ir, tirx

    return (isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, ir.Call)
            and getattr(stmt.value.op, "name", "") == _SYNC)


def _has_sync(stmt) -> bool:
    found: list = []
    _visit(stmt, found)
    return bool(found)


def _visit(stmt, found: list) -> None:
    from tvm import tirx

    if _is_sync(stmt):
        found.append(1)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _visit(s, found)
    elif isinstance(stmt, tirx.For):
        _visit(stmt.body, found)
    elif isinstance(stmt, tirx.IfThenElse):
        _visit(stmt.then_case, found)
        if stmt.else_case is not None:
            _visit(stmt.else_case, found)


def _uniform(stmt, cond) -> Any | None:
    """``stmt`` (run where ``cond`` holds) as a statement every thread runs, or None where its form is not
    the reduction's (``Bind``s, stores, syncs in sequence)."""
    from tvm import tirx

    if _is_sync(stmt):
        return stmt
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_uniform(s, cond) for s in stmt.seq]
        return None if any(p is None for p in parts) else tirx.SeqStmt(parts)
    if isinstance(stmt, tirx.Bind):  # a value bound for the statements after it
        return tirx.Bind(stmt.var, tirx.if_then_else(cond, stmt.value, tirx.const(0, str(stmt.var.ty.dtype))))
    if _has_sync(stmt):
        return None  # a loop or a nested condition with barriers inside: not the reduction's form
    return tirx.IfThenElse(cond, stmt, None)


def _rewrite(node):
    from tvm import tirx

    if node.else_case is not None or not _has_sync(node.then_case):
        return node
    uniform = _uniform(node.then_case, node.condition)
    return node if uniform is None else uniform


def uniform_barriers():
    """The TIR pass (device functions): no workgroup barrier inside a condition that splits the workgroup."""
    import tvm_ffi
    from tvm import tirx

    @tirx.transform.prim_func_pass(opt_level=0, name="edgepack.UniformBarriers")
    def barriers(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.IfThenElse, _rewrite)]))

    return barriers
