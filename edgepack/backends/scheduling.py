"""Default schedules rule by rule, with what scheduled each fused function written down.

TVM's ``dlight.ApplyDefaultSchedule`` applies the first rule that takes a function and forgets which;
edgepack's copy records it (``{function: "cpu.Conv2D"}``, ``"tuned"``, ``"none"``) so that a build's
schedule report names every function and a kernel no rule took is never a silent slow path.
Both the CPU and the GPU backends build their reports from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from edgepack.frontends.types import is_serial_kernel

logger = logging.getLogger("edgepack.schedules")


def rule_name(rule) -> str:
    """``gpu.Matmul`` for dlight's rules, ``cpu.Conv2D`` for edgepack's: the family and the class."""
    explicit = getattr(rule, "rule_name", None)
    if explicit:
        return explicit
    module = type(rule).__module__
    family = module.split(".dlight.")[-1].split(".")[0] if ".dlight." in module else module
    return f"{family}.{type(rule).__name__}"


def is_scheduled(func) -> bool:
    return func.attrs is not None and "tirx.is_scheduled" in func.attrs and func.attrs["tirx.is_scheduled"] == 1


def has_symbolic_extents(func) -> bool:
    """Whether a loop of the kernel has an extent that changes at run time (an input's ``--dim``)."""
    import tvm_ffi
    from tvm import tirx

    found: list[bool] = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, lambda loop: found.append(not isinstance(loop.extent, tirx.IntImm)))],
                            order="pre")
    return any(found)


def lowers(func, target) -> bool:
    """Whether TVM's TIR lowering takes the scheduled ``func``: a rule's schedule of symbolic extents may
    ask for what only constant ones allow (a split it cannot prove divides, an unrolled loop of run-time
    length), which TVM finds only when lowering, where it would fail the whole build; such a kernel is
    left to the next rule. Kernels of static shapes are not checked (the rules are tested on them).
    The passes are the first part of TVM's ``default_s_tir_pipeline``, through the loop unrolling."""
    import tvm
    from tvm import s_tir, tirx

    lower = tvm.transform.Sequential([
        s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(), s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(), s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(), s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32), s_tir.transform.LoopPartition(), tirx.transform.VectorizeLoop(True),
        tirx.transform.StorageRewrite(), tirx.transform.UnrollLoop(),
    ])
    try:
        with target:
            lower(tvm.IRModule({"main": func.with_attrs({"target": target, "global_symbol": "main"})}))
    except Exception:  # noqa: BLE001 - TVM's check failures
        return False
    return True


#: a kernel whose schedule does this many times the arithmetic of its operators apart recomputes a producer
#: (an activation read twice and inlined twice, as a hard-swish, stays under it: cheaper than a pass to memory)
RECOMPUTE_FACTOR = 1.5


def recomputation(before, after) -> float | None:
    """How many times the arithmetic of the unscheduled kernel ``before`` the scheduled ``after`` does
    (TVM's FLOP estimate: a producer inlined into a reduction counts once per read), where that is over
    ``RECOMPUTE_FACTOR``; None otherwise or where it cannot be estimated."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        plain = float(estimate_tir_flops(tvm.IRModule({"main": before})))
        scheduled = float(estimate_tir_flops(tvm.IRModule({"main": after})))
    except Exception:  # noqa: BLE001 - symbolic extents, opaque blocks: no estimate
        return None
    return scheduled / plain if plain > 0 and scheduled > RECOMPUTE_FACTOR * plain else None


def recording_schedule_pass(rules: Sequence, record: dict[str, str],
                            unscheduled: Callable[[object], str] = lambda _func: "none",
                            recomputed: dict[str, float] | None = None,
                            over_limits: Callable[[object, object], str | None] | None = None,
                            passed_over: dict[str, str] | None = None):
    """``ApplyDefaultSchedule(*rules)`` that writes into ``record`` which rule took each function.

    Functions already scheduled (tuning records, TVM's own) are recorded as ``pre-scheduled`` unless
    ``record`` already names them; a function no rule takes is recorded as ``unscheduled(func)``.
    ``recomputed`` receives the functions whose schedule does more arithmetic than their operators
    apart (``recomputation``): a rule that computes a producer again for every read. A schedule for which
    ``over_limits(scheduled, target)`` gives a reason (a GPU's workgroup limits: ``schedule_limits.py``) is
    left for the next rule; ``passed_over`` receives ``{function: "rule: reason"}`` of each."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="ApplyDefaultSchedule")
    class RecordingApplyDefaultSchedule:
        def transform_module(self, mod, _ctx):
            updated = {}
            for gvar, func in mod.functions_items():
                if not isinstance(func, tirx.PrimFunc):
                    continue
                name = gvar.name_hint
                if is_scheduled(func):
                    record.setdefault(name, "pre-scheduled")
                    continue
                if is_serial_kernel(func):
                    record[name] = unscheduled(func)  # one serial loop: no rule's form (a GPU's CPU runs it)
                    continue
                target = func.attrs.get("target") or tvm.target.Target.current(allow_none=False)
                first_over = None  # (rule, schedule) of the first schedule over the limits
                for rule in rules:
                    try:
                        space = rule.apply(func, target, False)
                    except Exception as exc:  # noqa: BLE001  a rule that cannot handle the function's form
                        logger.debug("%s failed on %s: %s", rule_name(rule), name, exc)
                        space = None
                    if space is None:
                        continue
                    sch = space if not isinstance(space, list) else space[0]
                    scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                    if has_symbolic_extents(func) and not lowers(scheduled, target):
                        logger.debug("%s's schedule of %s does not lower", rule_name(rule), name)
                        continue
                    if over_limits is not None and (why := over_limits(scheduled, target)) is not None:
                        logger.info("%s's schedule of %s asks for %s: the next rule schedules it", rule_name(rule),
                                    name, why)
                        if passed_over is not None:
                            passed_over[name] = f"{rule_name(rule)}: {why}"
                        first_over = first_over or (rule, scheduled)
                        continue
                    updated[gvar] = scheduled
                    record[name] = rule_name(rule)
                    if recomputed is not None and (factor := recomputation(func, updated[gvar])) is not None:
                        recomputed[name] = factor
                    break
                else:
                    if first_over is not None:  # no rule fits: the build's limit check names the kernel
                        updated[gvar], record[name] = first_over[1], rule_name(first_over[0])
                        if passed_over is not None:
                            passed_over.pop(name, None)
                    else:
                        record[name] = unscheduled(func)
            for gvar, func in updated.items():
                mod[gvar] = func
            return mod

    return RecordingApplyDefaultSchedule()


def note_tuned_pass(record: dict[str, str]):
    """A pair of passes around MetaSchedule's ``ApplyDatabase``: functions it scheduled are "tuned"."""
    import tvm
    from tvm import tirx

    before: set[str] = set()

    @tvm.transform.module_pass(opt_level=0, name="edgepack_note_scheduled")
    def note_before(mod, _ctx):
        before.update(g.name_hint for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and is_scheduled(f))
        return mod

    @tvm.transform.module_pass(opt_level=0, name="edgepack_note_tuned")
    def note_after(mod, _ctx):
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and gvar.name_hint not in before and is_scheduled(func):
                record[gvar.name_hint] = "tuned"
        return mod

    return note_before, note_after
