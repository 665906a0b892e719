"""Tuning records made at one size, applied to the kernels of a build whose sizes change at run time.

``edgepack tune --tune-size W=192`` tunes a model at one size; ``compile --dim W=32..256:32 --tuning DIR``
applies those records across the whole range. MetaSchedule finds a record by the kernel it was made for, and a
kernel over a symbolic ``W`` is another kernel than the one over 192, so ``records_at_size`` matches them itself:

1. each unscheduled kernel with run-time extents is specialised at the tuned size (``sizes``: every symbolic
   variable's value there) and simplified; where that equals a tuned kernel (structurally, also simplified), its
   record is the kernel's;
2. the record's trace is replayed on the symbolic kernel, not on the specialised one: each ``sample_perfect_tile``
   becomes its decision as constant factors with the outermost left free (``None``: the split computes it from
   the run-time extent, with a predicate where the tiles do not divide it), and the blocks are found by the
   symbolic kernel's names, in the same order;
3. a kernel whose replayed schedule TVM cannot lower keeps its default schedule.

On PP-OCR's classifier, 40 of the 44 kernels with a symbolic width match a kernel of the fixed build.
"""

from __future__ import annotations

import logging
from typing import Any

from edgepack.backends.scheduling import is_scheduled, lowers

logger = logging.getLogger("edgepack.schedules")


def _without_symbol(func):
    return func.without_attr("global_symbol") if func.attrs is not None and "global_symbol" in func.attrs else func


def _key(func) -> int:
    """A structural hash of ``func`` simplified (a kernel specialised at a size and the kernel built at that
    size differ only in expressions the simplifier folds)."""
    import tvm
    import tvm_ffi
    from tvm import s_tir

    mod = tvm.IRModule({"main": _without_symbol(func)})
    try:
        mod = s_tir.transform.StmtSimplify()(mod)
    except Exception as exc:  # noqa: BLE001 - an unsimplified kernel still hashes
        logger.debug("no simplification of a kernel for its key: %s", exc)
    return tvm_ffi.structural_hash(mod["main"])


def _symbolic_vars(func) -> dict[str, Any]:
    """The symbolic variables of ``func``'s buffer shapes, by name."""
    import tvm_ffi
    from tvm import tirx

    found: dict[str, Any] = {}

    def visit(var):
        found.setdefault(var.name, var)

    for param in func.params:
        for extent in getattr(param.ty, "shape", None) or []:
            tvm_ffi.structural_walk(extent, [(tirx.Var, visit)], order="pre")
    return found


def _block_names(func) -> list[str]:
    import tvm_ffi
    from tvm import s_tir

    names: list[str] = []
    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda block: names.append(str(block.name_hint)))],
                            order="pre")
    return names


def symbolic_trace(trace, renamed: dict[str, str]):
    """``trace`` replayable on a kernel with run-time extents: every ``sample_perfect_tile`` replaced by its
    decision (the outermost factor free), every block looked up by its name there (``renamed``)."""
    from tvm import tirx
    from tvm.s_tir.schedule import Instruction, Trace

    factors: dict = {}
    insts, decisions = [], {}
    for inst in trace.insts:
        if inst.kind.name == "SamplePerfectTile":
            decision = [int(v) for v in trace.get_decision(inst)]
            for i, out in enumerate(inst.outputs):
                factors[out] = None if i == 0 else tirx.IntImm("int32", decision[i])
            continue
        inputs = [factors[x] if _is_rv(x) and x in factors else x for x in inst.inputs]
        attrs = list(inst.attrs)
        if inst.kind.name == "GetSBlock" and attrs and str(attrs[0]) in renamed:
            attrs[0] = renamed[str(attrs[0])]
        new = Instruction(inst.kind, inputs, attrs, list(inst.outputs))
        insts.append(new)
        decision = trace.get_decision(inst)
        if decision is not None:
            decisions[new] = decision
    return Trace(insts, decisions)


def _is_rv(value) -> bool:
    return value is not None and not isinstance(value, (bool, int, float, str))


def records_at_size(database, sizes: dict[str, int], record: dict[str, str]):
    """A pass after MetaSchedule's ``ApplyDatabase``: the kernels with run-time extents get the records made at
    ``sizes`` (``{symbolic variable: value}``), as the module docstring says; ``record`` says "tuned" for each."""
    import tvm
    from tvm import s_tir, tirx

    index = {}
    for tuned in database.get_all_tuning_records():
        index.setdefault(_key(tuned.workload.mod["main"]), tuned)

    @tvm.transform.module_pass(opt_level=0, name="edgepack_records_at_size")
    def _pass(mod, _ctx):
        target = tvm.target.Target.current(allow_none=False)
        for gvar, func in list(mod.functions_items()):
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            variables = _symbolic_vars(func)
            if not variables or not set(variables) <= set(sizes):
                continue
            specialised = func.specialize({v: tirx.IntImm("int64", sizes[n]) for n, v in variables.items()})
            tuned = index.get(_key(specialised))
            if tuned is None:
                continue
            theirs, ours = _block_names(tuned.workload.mod["main"]), _block_names(func)
            if len(theirs) != len(ours):
                continue
            sch = s_tir.Schedule(tvm.IRModule({"main": _without_symbol(func)}))
            try:
                symbolic_trace(tuned.trace, dict(zip(theirs, ours))).apply_to_schedule(sch, remove_postproc=False)
            except Exception as exc:  # noqa: BLE001 - a trace that does not replay: the default schedule
                logger.info("the record of %s does not replay on its run-time sizes: %s", gvar.name_hint, exc)
                continue
            scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            if func.attrs is not None and "global_symbol" in func.attrs:
                scheduled = scheduled.with_attr("global_symbol", func.attrs["global_symbol"])
            if not lowers(scheduled, target):
                continue
            mod[gvar] = scheduled
            record[gvar.name_hint] = "tuned"
        return mod

    return _pass
