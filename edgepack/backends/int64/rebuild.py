"""Re-emitting a Relax function binding by binding through a BlockBuilder (the base of the folding and
the rewriting steps of the int64 pass)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Rebuild:
    """Re-emit a Relax function through a BlockBuilder; subclasses decide what each binding becomes
    (``binding``), with ``vmap`` (old var -> new expression) applied to every use."""

    def __init__(self, mod):
        from tvm import relax

        self.bb = relax.BlockBuilder(mod)
        self.vmap: dict = {}
        self.in_dataflow = False

    # --- expressions ---
    def map(self, expr):
        from tvm import relax

        if isinstance(expr, relax.Var):
            return self.vmap.get(expr, expr)
        if isinstance(expr, relax.Call):
            args = [self.map(a) for a in expr.args]
            if all(a.same_as(b) for a, b in zip(args, expr.args)):
                return expr
            return relax.Call(expr.op, args, expr.attrs, list(expr.ty_args) if expr.ty_args else None)
        if isinstance(expr, relax.Tuple):
            fields = [self.map(f) for f in expr.fields]
            if all(a.same_as(b) for a, b in zip(fields, expr.fields)):
                return expr
            return relax.Tuple(fields)
        if isinstance(expr, relax.TupleGetItem):
            inner = self.map(expr.tuple_value)
            return expr if inner.same_as(expr.tuple_value) else relax.TupleGetItem(inner, expr.index)
        return expr

    # --- emitting ---
    def alias(self, var, value) -> None:
        """Use ``value`` wherever ``var`` was used, binding it again only where ``var`` left a dataflow
        block that ``value`` cannot leave."""
        from tvm import relax

        if self.in_dataflow and not isinstance(var, relax.DataflowVar) and isinstance(value, relax.DataflowVar):
            value = self.bb.emit_output(value, name_hint=var.name)
        self.vmap[var] = value

    def emit(self, value, like=None, name: str = ""):
        """Bind ``value``; a replacement for a non-dataflow var inside a dataflow block stays visible
        outside it (``emit_output``)."""
        from tvm import relax

        name = name or (like.name if like is not None else "")
        if self.in_dataflow and like is not None and not isinstance(like, relax.DataflowVar):
            return self.bb.emit_output(value, name_hint=name)
        return self.bb.emit(value, name_hint=name)

    def run_function(self, func, prologue: Callable[[], None] | None = None,
                     epilogue: Callable[[Any], Any] | None = None):
        from tvm import relax

        self.bb.begin_scope(list(func.params))
        blocks = []
        if prologue is not None:
            self.bb._begin_binding_block()
            prologue()
            block = self.bb._end_block()
            if len(block.bindings):
                blocks.append(block)
        for block in func.body.blocks:
            self.in_dataflow = isinstance(block, relax.DataflowBlock)
            (self.bb._begin_dataflow_block if self.in_dataflow else self.bb._begin_binding_block)()
            for binding in block.bindings:
                self.binding(binding)
            new_block = self.bb._end_block()
            if len(new_block.bindings):
                blocks.append(new_block)
        self.in_dataflow = False
        result = self.map(func.body.body)
        if epilogue is not None:
            self.bb._begin_binding_block()
            result = epilogue(result)
            block = self.bb._end_block()
            if len(block.bindings):
                blocks.append(block)
        seq = self.bb.normalize(relax.SeqExpr(blocks, result))
        self.bb.end_scope()
        new = relax.Function(list(func.params), seq, None, func.is_pure, func.attrs)
        return self.bb.get(), new

    def arm(self, seq):
        """An If arm (SeqExpr) rebuilt as a new SeqExpr of one binding block."""
        from tvm import relax

        saved = self.in_dataflow
        self.in_dataflow = False
        self.bb._begin_binding_block()
        for block in seq.blocks:
            for binding in block.bindings:
                self.binding(binding)
        body = self.map(seq.body)
        block = self.bb._end_block()
        self.in_dataflow = saved
        return relax.SeqExpr([block] if len(block.bindings) else [], body)

    def inline_arm(self, seq):
        """The bindings of an If arm emitted in the current block; returns the arm's result."""
        for block in seq.blocks:
            for binding in block.bindings:
                self.binding(binding)
        return self.map(seq.body)

    def binding(self, binding):  # pragma: no cover - overridden
        raise NotImplementedError
