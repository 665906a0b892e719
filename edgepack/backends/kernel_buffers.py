"""Kernels within a GPU's storage buffers per shader stage.

A fused kernel binds one storage buffer per tensor it reads or writes. TVM's ``FuseOps`` fuses without a
limit (``max_function_args`` is not read by the pinned TVM): a fused LSTM step of PP-OCRv2's recogniser
bound 83 buffers, where lavapipe allows 32 per shader stage, phones fewer and WebGPU's default limit
(what wgpu-native guarantees on every adapter) is 8. A fused group that would bind more than the limit is
dissolved before ``FuseTIR``: its operators run as kernels of their own, each within it. An operator of
more operands than that (the stack of an LSTM's 40 steps, a concatenation of many tensors) becomes a tree of
smaller ones first (``split_wide_operators``).
"""

from __future__ import annotations

import logging
from typing import Any

from edgepack.backends.relax_exprs import call_rewrite_pass

logger = logging.getLogger("edgepack.schedules")


def _tensor_count(info: Any) -> int:
    """Tensors in a value's type: 1 for a tensor, the sum over a tuple's fields."""
    from tvm import relax

    if isinstance(info, relax.TupleType):
        return sum(_tensor_count(field) for field in info.fields)
    return 1 if isinstance(info, relax.TensorType) else 0


def buffers_of(func: Any) -> int:
    """Storage buffers a fused group's kernel binds: its tensor parameters and outputs."""
    return sum(_tensor_count(p.ty) for p in func.params) + _tensor_count(func.body.ty)


def limit_kernel_buffers(limit: int):
    """A Relax module pass for right after ``FuseOps``: every fused group (a function marked
    ``Primitive``) of more than ``limit`` buffers is inlined back into its caller, unfused. TVM's
    ``InlinePrivateFunctions`` inlines every private function, so the groups kept are made public while
    it runs, and private again after."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="EdgepackLimitKernelBuffers")
    def _pass(mod, _ctx):
        groups = {gvar: func for gvar, func in mod.functions_items()
                  if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs}
        over = {gvar for gvar, func in groups.items() if buffers_of(func) > limit}
        if not over:
            return mod
        logger.info("%d fused group(s) of more than %d buffers run as their operators' kernels", len(over), limit)
        public = {gvar: func for gvar, func in mod.functions_items()
                  if isinstance(func, relax.Function) and (func.attrs is None or "global_symbol" not in func.attrs)
                  and gvar not in over}
        for gvar in over:
            mod[gvar] = mod[gvar].without_attr("Primitive")
        for gvar, func in public.items():
            mod[gvar] = func.with_attr("global_symbol", gvar.name_hint)
        mod = relax.transform.InlinePrivateFunctions()(mod)
        for gvar in public:
            if gvar in mod:
                mod[gvar] = mod[gvar].without_attr("global_symbol")
        return mod

    return _pass


def split_wide_operators(limit: int):
    """A Relax module pass: each ``R.concat`` or ``R.stack`` of more than ``limit - 1`` tensors (its output
    is a buffer too) as a concatenation of concatenations (stacks) of at most ``limit - 1`` each."""
    import tvm
    from tvm import relax

    concat, stack = tvm.ir.Op.get("relax.concat"), tvm.ir.Op.get("relax.stack")
    width = max(2, limit - 1)

    def rewrite(call, builder):
        if not (call.op.same_as(concat) or call.op.same_as(stack)) or not isinstance(call.args[0], relax.Tuple):
            return None
        parts = list(call.args[0].fields)
        if len(parts) <= width:
            return None
        axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
        make = relax.op.stack if call.op.same_as(stack) else relax.op.concat
        parts = [builder.emit(make(parts[k:k + width], axis)) for k in range(0, len(parts), width)]
        while len(parts) > width:  # then concatenations: the stacks' new axis is there already
            parts = [builder.emit(relax.op.concat(parts[k:k + width], axis)) for k in range(0, len(parts), width)]
        return relax.op.concat(parts, axis)

    return call_rewrite_pass("EdgepackSplitWideOperators", rewrite)
