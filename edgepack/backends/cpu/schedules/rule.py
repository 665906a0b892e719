"""The base of edgepack's CPU schedule rules, in the form of ``tvm.s_tir.dlight`` rules.

A rule is one small class: ``apply(func, target, tunable)`` (dlight's signature, so TVM's
``dlight.ApplyDefaultSchedule`` can apply them too) returns a scheduled ``tvm.s_tir.Schedule``
for a kernel it recognises, or None for any other (the next rule is tried). Rules never tune: the
schedule is a function of the kernel's shapes and the target's SIMD width and registers.
"""

from __future__ import annotations

from typing import Any, ClassVar

from edgepack.backends.cpu.schedules.machine import CpuInfo


class CpuRule:
    #: The name schedule reports show ("cpu.Conv2D").
    rule_name: ClassVar[str]

    def is_target_available(self, target: Any) -> bool:
        return target.kind.name == "llvm"

    def apply(self, func, target, tunable: bool = False):
        from tvm import s_tir, tirx

        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        return sch if self.schedule(sch, CpuInfo.of(target)) else None

    def schedule(self, sch, cpu: CpuInfo) -> bool:
        """Schedule ``sch`` in place; False (and ``sch`` is dropped) when the kernel is not this rule's."""
        raise NotImplementedError
