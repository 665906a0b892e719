"""``If`` nodes whose two arms are the same computation, replaced by that computation.

``static_if`` converts only the taken arm of an ``If`` that the static shapes decide, and gives the ``If`` that
arm twice (``relax.If(c, X, X)``); an arm that cannot be built for the compiled shapes is replaced by the
other the same way. Such an ``If`` still computes its condition and branches at run time, and it is a
boundary the passes that work on dataflow blocks stop at: TVM's ``ToMixedPrecision`` failed inside Silero
VAD's ten such ``If`` nodes ("type is not populated"), so ``--precision fp16``, the phone profiles' default,
refused the model. Here each one becomes its arm's bindings, in place; the condition, now unused, is dropped
with the rest of the dead code.
"""

from __future__ import annotations

from typing import Any


def inline_identical_arms(mod) -> Any:
    """``mod`` with every ``If`` whose arms are structurally equal replaced by its then-arm's bindings."""
    import tvm_ffi
    from tvm import relax

    changed = 0  # Ifs replaced so far

    def flatten(seq) -> Any:
        nonlocal changed
        blocks: list = []
        for block in seq.blocks:
            pending: list = []
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.If):
                    then, other = flatten(value.true_branch), flatten(value.false_branch)
                    if tvm_ffi.structural_equal(then, other):
                        changed += 1
                        if pending:
                            blocks.append(type(block)(pending))
                            pending = []
                        blocks.extend(then.blocks)
                        pending.append(relax.VarBinding(binding.var, then.body))
                        continue
                    if not (then.same_as(value.true_branch) and other.same_as(value.false_branch)):
                        binding = relax.VarBinding(binding.var, relax.If(value.cond, then, other))
                pending.append(binding)
            if pending:
                blocks.append(type(block)(pending))
        return relax.SeqExpr(blocks, seq.body)

    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        before = changed
        body = flatten(func.body)
        if changed != before:
            mod[gvar] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    if not changed:
        return mod
    return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
