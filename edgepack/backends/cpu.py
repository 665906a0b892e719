"""CPUs (x86-64 hosts, ARM boards and phones): TVM's LLVM code generation through the Relax CPU pipeline.

A tuned build applies MetaSchedule's best records after fusion: convolutions channels-last (NHWC) and
their constant weights rewritten once, at compile time, into the layout each tuned kernel chose.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from edgepack.backends.base import Backend, Build, TuningLayout, TuningRecords, register
from edgepack.errors import CompileError, EdgepackError, first_line
from edgepack.frontends.types import ImportedModel
from edgepack.profiles import Profile


def _cpu_pipeline():
    # the module, not the package: tvm.relax.backend.cpu_generic does not export dataflow_lower_passes
    from tvm.relax.backend.cpu_generic import pipeline

    return pipeline


def prepare_passes(target, weight_prepack: bool = False, channels_last: bool = False) -> list:
    """Relax passes up to fused TIR kernels: the same for task extraction and for applying records.

    ``weight_prepack``: the weights are constants, so the CPU kernels mark them layout-free;
    MetaSchedule may then pick a weight layout that suits its loop nest (``RewriteLayout``), and
    the rewrite is done once at compile time (``_weight_prepack_passes``), not on every inference.
    ``channels_last``: convolutions (and the elementwise and pooling operators between them) work on
    NHWC activations, the model's NCHW input and output transposed once at its ends. Channels are
    the axis SIMD lanes fill best: a depthwise or strided convolution in NCHW vectorizes along a row
    of 7-112 pixels (strided loads for stride 2), in NHWC along 16-1280 contiguous channels
    (MobileNetV2's stride-2 depthwise convolution on 112x112: 0.28 ms after 64 trials in NHWC,
    0.40 ms in NCHW).
    """
    from tvm import relax

    cpu = _cpu_pipeline()
    prepack = [relax.transform.AttachAttrLayoutFreeBuffers()] if weight_prepack else []
    layout = [relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})] if channels_last else []
    return [*layout, *cpu.library_dispatch_passes(target), *cpu.legalize_passes(target), *prepack]


def _weight_prepack_passes() -> list:
    """After the records are applied: split each kernel's weight-layout rewrite into its own
    function and fold it into the constant weights (so it never runs on the device)."""
    from tvm import relax

    return [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant(),
            relax.transform.DeadCodeElimination()]


def tuned_pipeline(target, records: TuningRecords):
    """The default Relax pipeline for a CPU target, with the best record of each kernel applied.

    Same passes as TVM's CPU default pipeline (dispatch, legalize + fuse, lower, finalize) with
    ``MetaScheduleApplyDatabase`` after fusion, so kernels without records stay as they are untuned.
    """
    import tvm
    from tvm import relax

    cpu = _cpu_pipeline()

    @tvm.transform.module_pass(opt_level=0, name="EdgepackTunedPipeline")
    def _pipeline(mod, _ctx):
        with target, records.database:
            seq = tvm.transform.Sequential([
                *prepare_passes(target, records.weight_prepack, records.channels_last),
                relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
                *(_weight_prepack_passes() if records.weight_prepack else []),
                *cpu.dataflow_lower_passes(target),
                *cpu.finalize_passes(target),
            ])
            return seq(mod)

    return _pipeline


class CpuBackend(Backend):
    name = "cpu"
    label = "CPU"
    host_place = "host"
    tunable = True

    def build(self, imported: ImportedModel, target: Any, *, system_lib: bool = False,
              records: TuningRecords | None = None) -> Build:
        import tvm
        from tvm import relax

        pipeline = tuned_pipeline(target, records) if records is not None else "default"
        try:
            if system_lib:
                executable = relax.build(imported.mod, target=target, system_lib=True, relax_pipeline=pipeline)
            else:
                executable = tvm.compile(imported.mod, target=target, relax_pipeline=pipeline)
        except Exception as exc:
            raise CompileError(
                f"TVM failed to compile {imported.info.path.name} for {target.kind.name}: {first_line(exc)}",
                "This is a gap in TVM's code generation for this model; please report it with the model attached.",
            ) from exc
        return Build(executable)

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
        return TuningLayout(weight_prepack=True, channels_last=True, cold_weights=True)

    def tuning_place(self, profile: Profile) -> str | None:
        return self.host_place if profile.is_host else None

    def tuning_target(self, profile: Profile, *, num_cores: int | None, here: bool) -> Any:
        import tvm

        spec = dict(profile.target)
        if num_cores:
            spec["num-cores"] = int(num_cores)
        elif "num-cores" not in spec:
            spec["num-cores"] = (os.cpu_count() or 1) if profile.is_host else 4
        host = profile.host_target
        return tvm.target.Target(spec, host=host) if host else tvm.target.Target(spec)

    def tuning_passes(self, target: Any, layout: TuningRecords | TuningLayout) -> list[Any]:
        return prepare_passes(target, layout.weight_prepack, layout.channels_last)

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
