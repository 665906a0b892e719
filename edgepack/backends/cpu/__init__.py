"""CPUs (x86-64 hosts, ARM boards and phones): TVM's LLVM code generation through the Relax CPU pipeline,
with edgepack's default schedules (``schedules/``: parallel, vectorized, register-tiled kernels) for
every kernel without a tuning record.

Convolutions run channels-last (NHWC) and constant weights are rewritten once, at compile time, into
the layout each kernel's schedule reads (``pipeline.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from edgepack.backends.base import (
    BUILD_CONFIG,
    Backend,
    Build,
    KernelForm,
    ScheduledFunction,
    ScheduleReport,
    TuningLayout,
    TuningRecords,
    register,
)
from edgepack.backends.cpu.pipeline import UNTUNED_FORM, cpu_pipeline, describe_pipeline, prepare_passes
from edgepack.backends.cpu.schedules import default_rules
from edgepack.backends.cpu.stack import tir_pipeline
from edgepack.errors import CompileError, EdgepackError, first_line
from edgepack.frontends.types import ImportedModel
from edgepack.manifest import BuildManifest
from edgepack.profiles import GpuLimits, Profile, host_cpu_target


class CpuBackend(Backend):
    name = "cpu"
    label = "CPU"
    host_place = "host"
    tunable = True
    no_symbolic_shapes = None

    def build(self, imported: ImportedModel, target: Any, *, system_lib: bool = False,
              records: TuningRecords | None = None, limits: GpuLimits | None = None, gpu_only: bool = False) -> Build:
        import tvm
        from tvm import relax

        record: dict[str, str] = {}
        recomputed: dict[str, float] = {}
        measured: dict = {}
        pipeline, rules = cpu_pipeline(target, record, records, recomputed, measured)
        try:
            with tvm.transform.PassContext(config=BUILD_CONFIG):
                if system_lib:
                    executable = relax.build(imported.mod, target=target, system_lib=True, relax_pipeline=pipeline,
                                             tir_pipeline=self.tir_pipeline())
                else:
                    executable = tvm.compile(imported.mod, target=target, relax_pipeline=pipeline,
                                             tir_pipeline=self.tir_pipeline())
        except Exception as exc:
            raise CompileError(
                f"TVM failed to compile {imported.info.path.name} for {target.kind.name}: {first_line(exc)}",
                "This is a gap in TVM's code generation for this model; please report it with the model attached.",
            ) from exc
        report = ScheduleReport(target=str(target), pipeline=describe_pipeline(records), rules=rules,
                                functions=[ScheduledFunction(n, rule) for n, rule in sorted(record.items())],
                                recomputed=recomputed)
        return Build(executable, report, measured.get("constants"), measured.get("run_memory"))

    def tir_pipeline(self) -> str:
        return tir_pipeline()

    def host_target(self, profile: Profile) -> Any:
        import tvm

        return tvm.target.Target(host_cpu_target())

    def manifest_extra(self, build: Build) -> dict[str, Any]:
        return {self.name: build.report.to_dict()} if build.report is not None else {}

    def summary_lines(self, manifest: BuildManifest) -> list[str]:
        """The schedules of the build's kernels; kernels without one are named (never a silent slow path)."""
        extra = manifest.extra.get(self.name) or {}
        if not extra:
            return []
        schedules = ", ".join(f"{n} {rule}" for rule, n in sorted(extra.get("schedules", {}).items()))
        unscheduled = extra.get("unscheduled") or []
        recomputed = extra.get("recomputed") or {}
        return [
            f"{extra.get('num_functions', 0)} fused functions ({extra.get('pipeline')}): {schedules or 'none'}",
            "unscheduled: none" if not unscheduled else
            f"unscheduled: {len(unscheduled)} function(s) run TVM's plain loop nest (no rule applies): "
            + ", ".join(unscheduled),
            *([f"recomputed: {len(recomputed)} kernel(s) do more arithmetic than their operators apart "
               "(a producer computed again for every read): "
               + ", ".join(f"{n} (x{f:.1f})" for n, f in sorted(recomputed.items()))] if recomputed else []),
        ]

    def host_device(self, *, log=None) -> Any:
        import tvm

        return tvm.cpu(0)

    def remote_device(self, session: Any) -> Any:
        return session.cpu()

    def run_error(self, exc: Exception, build_dir: Path, where: str) -> EdgepackError:
        return EdgepackError(f"Running {build_dir} on {where} failed: {first_line(exc)}",
                             "Check that the build was made for this machine's profile (`edgepack inspect`).")

    # --- tuning

    def tuning_layout(self) -> TuningLayout:
        return TuningLayout(UNTUNED_FORM, cold_weights=True)

    def tuning_place(self, profile: Profile) -> str | None:
        return self.host_place if profile.is_host else None

    def tuning_target(self, profile: Profile, *, num_cores: int | None, here: bool) -> Any:
        import tvm

        spec = profile.target_spec
        if num_cores:
            spec["num-cores"] = int(num_cores)
        elif "num-cores" not in spec:
            spec["num-cores"] = (os.cpu_count() or 1) if profile.is_host else 4
        host = profile.host_target
        return tvm.target.Target(spec, host=host) if host else tvm.target.Target(spec)

    def tuning_passes(self, target: Any, form: KernelForm, limits: GpuLimits | None = None) -> list[Any]:
        return prepare_passes(target, form)

    def default_schedule(self, mod: Any, target: Any) -> tuple[str, Any] | None:
        for rule in default_rules():
            try:
                sch = rule.apply(mod["main"], target)
            except Exception:  # noqa: BLE001 - as in a build: the next rule
                sch = None
            if sch is not None:
                return rule.rule_name, sch
        return None

    def search_spaces(self, target: Any) -> list[tuple[str, Any]]:
        """MetaSchedule's default search space, then fallbacks for kernels it fails on.

        TVM 0.27's multi-level tiling fails on some fused epilogues (e.g. BlazeFace's residual ``pad`` +
        ``add`` after a convolution: "requires all the producer(s) ... under the target loop") when it
        tries to compute the epilogue inside the tiles. With a cache write the epilogue stays after the
        tiled loop nest and it works; without tiling at all, parallel/vectorize/unroll still apply.
        """
        from tvm.s_tir.meta_schedule import schedule_rule as rules
        from tvm.s_tir.meta_schedule.space_generator import PostOrderApply

        def tiling_with_cache_write():
            return rules.MultiLevelTiling(structure="SSRSRS", tile_binds=None, max_innermost_factor=64,
                                          vector_load_lens=None, reuse_read=None,
                                          reuse_write=rules.ReuseType(req="must", levels=[1, 2], scope="global"))

        base = rules.ScheduleRule.create("llvm")
        return [
            ("default", "post-order-apply"),
            ("cache-write tiling", PostOrderApply(
                sch_rules=[tiling_with_cache_write() if type(r).__name__ == "MultiLevelTiling" else r for r in base],
                postprocs="llvm", mutator_probs="llvm")),
            ("untiled", PostOrderApply(sch_rules=[r for r in rules.ScheduleRule.create("llvm")
                                                  if "MultiLevelTiling" not in type(r).__name__],
                                       postprocs="llvm", mutator_probs="llvm")),
        ]


register(CpuBackend())
