"""The Relax module pass the CPU pipeline's convolution and matrix-product rewrites share (``winograd.py``,
``channels.py``): each ``relax.nn.conv2d`` (or ``relax.matmul``) whose weights are constants is offered to a
rewrite, which replaces it or keeps it, and the pass logs how many calls each rewrite took."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from edgepack.backends.relax_exprs import bound_constant

logger = logging.getLogger("edgepack.schedules")

#: ``rewrite(call, weight, builder)``: the call's replacement (emitted through ``builder``) and what was
#: done to it ("as Winograd F(4x4, 3x3)"), or None to keep the call as it is.
Rewrite = Callable[[Any, np.ndarray, Any], "tuple[Any, str] | None"]


def conv2d_rewrite_pass(name: str, rewrite: Rewrite, op: str = "relax.nn.conv2d", noun: str = "convolution",
                        plan: Callable[[Any], None] | None = None):
    """A Relax module pass named ``name``: every call of ``op`` (a convolution) whose second operand, the
    weights, is a constant (directly or through variables, transposes and casts: ``bound_constant``) goes
    through ``rewrite``; then dead bindings are dropped and "N <noun>(s) <what>" is logged for each kind
    of rewrite done. ``plan(mod)``, where given, sees the whole module first (a rewrite that decides each
    call against the others)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    rewritten = tvm.ir.Op.get(op)

    @mutator
    class Rewriter(PyExprMutator):
        def __init__(self, mod) -> None:
            super().__init__(mod)
            self.bindings: dict[Any, Any] = {}
            self.done: Counter[str] = Counter()

        def visit_var_binding_(self, binding) -> None:
            self.bindings[binding.var] = binding.value
            super().visit_var_binding_(binding)

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(rewritten):
                return call
            weight = bound_constant(call.args[1], self.bindings)
            result = None if weight is None else rewrite(call, weight, self.builder_)
            if result is None:
                return call
            replacement, what = result
            self.done[what] += 1
            return replacement

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod, _ctx):
        if plan is not None:
            plan(mod)
        rewriter = Rewriter(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
        for what, count in sorted(rewriter.done.items()):
            logger.info("%d %s(s) %s", count, noun, what)
        return relax.transform.DeadCodeElimination()(rewriter.builder_.finalize())

    return _pass
