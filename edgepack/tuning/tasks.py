"""A model's tuning tasks: its fused kernels as MetaSchedule extracts them, in a stable order."""

from __future__ import annotations

from typing import Any

from edgepack.backends import Backend, KernelForm
from edgepack.frontends import ImportedModel
from edgepack.profiles import GpuLimits
from edgepack.tuning.records import TuningTask


def fused_module(imported: ImportedModel, backend: Backend, target: Any, form: KernelForm,
                 limits: GpuLimits | None = None):
    """The model after the backend's passes up to fused, unscheduled TIR kernels (within the profile's
    GPU ``limits``, as a build's)."""
    import tvm

    with target:
        return tvm.transform.Sequential(backend.tuning_passes(target, form, limits))(imported.mod)


def extract_tasks(imported: ImportedModel, backend: Backend, target: Any,
                  form: KernelForm, limits: GpuLimits | None = None) -> tuple[list[TuningTask], list[Any]]:
    """The model's tuning tasks and MetaSchedule's ExtractedTask objects, in a stable order."""
    import tvm_ffi
    from tvm.s_tir.analysis import estimate_tir_flops
    from tvm.s_tir.meta_schedule.relax_integration import extract_tasks as ms_extract

    extracted = [t for t in ms_extract(fused_module(imported, backend, target, form, limits), target)
                 if not t.mod.attrs or not t.mod.attrs.get("tirx.is_scheduled", False)]
    tasks = []
    for task in extracted:
        mod = task.dispatched[0]
        try:
            flop = float(estimate_tir_flops(mod))
        except Exception:  # noqa: BLE001 - flop counts are for display only
            flop = 0.0
        tasks.append(TuningTask(str(task.task_name), str(tvm_ffi.structural_hash(mod)), int(task.weight), flop))
    order = sorted(range(len(tasks)), key=lambda i: tasks[i].name)
    return [tasks[i] for i in order], [extracted[i] for i in order]
