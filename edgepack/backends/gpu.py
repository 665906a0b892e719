"""What the GPU backends (OpenCL, Vulkan) share: TVM's default GPU pipeline with every dlight schedule
decision recorded and no silent CPU fallback, the kernels' launch sizes, the kernel files a build keeps,
and loading a runtime plug-in (``runtimes/plugins/<name>``) into this process.

A GPU backend subclasses :class:`GpuBackend` and says what is its own: the code generator's module kind,
how its source splits into kernels, its plug-in, its devices, and how it phrases errors.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import json
import math
import re
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from edgepack.backends.base import (
    BUILD_CONFIG,
    Backend,
    Build,
    DoctorCheck,
    ScheduledFunction,
    ScheduleReport,
    TuningRecords,
)
from edgepack.backends.float_literals import tir_pipeline
from edgepack.backends.folding import fold_constant_calls
from edgepack.backends.gpu_scans import SCAN_REFUSAL, gpu_scans, scan_bindings
from edgepack.backends.integer import elementwise_quantization, integer_products
from edgepack.backends.kernel_buffers import limit_kernel_buffers, split_wide_operators
from edgepack.backends.placed_kernels import cpu_functions, legalized_on_cpu, unscheduled_to_cpu
from edgepack.backends.placement import (
    DATA_DEPENDENT,
    cpu_bindings,
    dtype_bindings,
    operator_bindings,
    place_on_cpu,
)
from edgepack.backends.program_sizes import measuring
from edgepack.backends.relax_exprs import is_cpu_target, names_of
from edgepack.backends.schedule_limits import buffer_bytes, over_limits, workgroup_memory
from edgepack.backends.scheduling import note_tuned_pass, recording_schedule_pass, rule_name
from edgepack.backends.sized_records import records_at_size
from edgepack.errors import CompileError, EdgepackError, ToolchainError, first_line
from edgepack.frontends.types import ImportedModel
from edgepack.manifest import BuildManifest
from edgepack.profiles import LIMIT_KEYS, GpuLimits, Profile
from edgepack.progress import Progress
from edgepack.toolchain.compilers import HOST_TRIPLE, Compilers
from edgepack.toolchain.plugins import Plugin, PluginRecipe, host_plugin, target_plugin

HOST_TARGET = {"kind": "llvm"}
CPU_RULE = "cpu"  # what the schedule record says of a function placed on the device's CPU
NO_RULE_CPU = "cpu (no GPU schedule)"  # ... and of one there because no GPU rule scheduled it
SERIAL_CPU = "cpu (serial loop)"  # ... and of a kernel whose work is one serial loop (is_serial_kernel)
DATA_DEPENDENT_ON_CPU = "its output's shape depends on the values: TVM's runtime computes it on the CPU"


@dataclass(frozen=True)
class Kernel:
    """One generated GPU kernel and how TVM's host code launches it."""

    name: str
    function: str  # the fused Relax-level function (TIR PrimFunc) it was generated from
    arg_types: tuple[str, ...]  # "handle" for buffers, else the scalar dtype
    launch_params: tuple[str, ...]  # e.g. ("blockIdx.x", "threadIdx.x")
    grid: tuple[int | str, ...]  # work groups per dimension (x, y, z); str when shape-dependent
    block: tuple[int | str, ...]  # work-group size per dimension (x, y, z)
    source: str = ""
    usage: dict[str, int] = field(default_factory=dict)  # what it asks of the GPU, by [limits] key (kernel_usage)

    @property
    def global_size(self) -> tuple[int | str, ...]:
        return tuple(g * b if isinstance(g, int) and isinstance(b, int) else f"{g}*{b}"
                     for g, b in zip(self.grid, self.block))

    def to_dict(self, with_source: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data["global_size"] = list(self.global_size)
        for key in ("arg_types", "launch_params", "grid", "block"):
            data[key] = list(data[key])
        if not with_source:
            data.pop("source")
        return data


@dataclass
class GpuReport(ScheduleReport):
    """What the GPU pipeline did with a model: schedules per fused function, and the kernels."""

    kernels: list[Kernel] = field(default_factory=list)
    memory: str = "buffers"  # no image/texture memory
    details: dict[str, Any] = field(default_factory=dict)  # what else the backend records
    #: the model's operators placed on the device's CPU (``placement.py``): {operator: why}
    cpu_operators: dict[str, str] = field(default_factory=dict)

    @property
    def cpu_functions(self) -> list[str]:
        """Fused functions that run on the device's CPU."""
        return [f.name for f in self.functions if f.schedule in (CPU_RULE, NO_RULE_CPU, SERIAL_CPU)]

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.pop("unscheduled")
        return data | {"memory": self.memory, "num_kernels": len(self.kernels),
                       "cpu_fallback": self.cpu_functions, "cpu_operators": self.cpu_operators} | self.details


def kernel_usage(kernels: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """What each kernel (``_collect_kernels``) asks of the GPU, by ``[limits]`` key: storage buffers it binds,
    workgroup memory it allocates, invocations per workgroup (its launch block), its largest buffer."""
    usage = {}
    for kname, info in kernels.items():
        block = [info["extents"].get(f"threadIdx.{a}", 1) for a in "xyz"]
        usage[kname] = {
            "storage_buffers": sum(a == "handle" for a in info["args"]),
            "workgroup_memory": int(info.get("workgroup_memory", 0)),
            "invocations": math.prod(b for b in block if isinstance(b, int)),
            "buffer_size": int(info.get("buffer_size", 0)),
        }
    return usage


_LIMIT_FIXES = {
    "storage_buffers": "Fused kernels are kept within it already: this is one operator with that many operands; "
                       "split it in the model (a concatenation of fewer tensors at a time), or compile for a CPU "
                       "profile.",
    "workgroup_memory": "The schedule tiles the kernel through workgroup memory larger than the GPU has; "
                        "compile for a CPU profile, or with smaller input shapes (--input-shape), and report the "
                        "model: the schedule should respect the target's max_shared_memory_per_block.",
    "invocations": "The kernel launches more threads per workgroup than the GPU allows; compile for a CPU "
                   "profile and report the model: the schedule should respect the target's max_num_threads.",
    "buffer_size": "One tensor is larger than a buffer the GPU can bind; compile with smaller input shapes "
                   "(--input-shape), or for a CPU profile.",
}


def with_module(imported: ImportedModel, mod: Any) -> ImportedModel:
    """``imported`` (an ImportedModel, or a stand-in with .mod and .info) with another Relax module."""
    clone = copy.copy(imported)
    object.__setattr__(clone, "mod", mod)  # ImportedModel is a frozen dataclass
    return clone


def unwrapped_refusal(exc: CompileError, model: str, marker: str, start: str) -> CompileError | None:
    """The CompileError an edgepack Relax pass raised (its message holds ``marker`` and begins with
    ``model`` + ``start``), out of the "TVM failed to compile" error TVM's pass machinery wrapped it in; None
    where ``exc`` is not that refusal."""
    text = f"{exc.__cause__ or ''} {exc.message}"
    if marker not in text or model + start not in text:
        return None
    return CompileError(text[text.index(model + start):].split(" Compile it")[0].strip(),
                        "Compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4).")


def format_size(values: Sequence[int | str]) -> str:
    """``(64, 1, 1)`` -> ``64x1x1``: launch sizes in ``inspect --kernels``."""
    return "x".join(str(v) for v in values)


# ----------------------------------------------------------------------------------------------
# the GPU pipeline with its decisions recorded


def _is_dlight_pass(p) -> bool:
    inner = getattr(p, "_inst", None)
    return inner is not None and type(inner).__name__ == "ApplyDefaultSchedule"


def _legalize_passes(target, max_buffers: int | None) -> list:
    """TVM's legalisation passes for ``target`` (its constant folding edgepack's, ``folding.py``), kernels kept
    within ``max_buffers`` storage buffers
    (``kernel_buffers.py``: wide concatenations split, larger fused groups dissolved) where the backend
    has such a limit."""
    from tvm.relax import pipeline as rp

    passes = [split_wide_operators(max_buffers)] if max_buffers is not None else []
    with target:  # the adreno passes read Target.current()
        for p in rp.legalize_passes(target):
            passes.append(fold_constant_calls() if p.info.name == "FoldConstant" else p)
            if p.info.name == "LegalizeOps":  # constants and operand-less kernels of operators placed on the CPU
                passes.append(legalized_on_cpu())
            if max_buffers is not None and p.info.name == "FuseOps":
                passes.append(limit_kernel_buffers(max_buffers))
            if p.info.name == "FuseTIR":  # the kernels of operators placed on the CPU (placement.py)
                passes.append(cpu_functions())
    return passes


def gpu_tuning_passes(target, max_buffers: int | None = None) -> list:
    """The GPU pipeline's passes up to fused, unscheduled TIR kernels: dispatch and legalisation
    without dlight's default schedules. MetaSchedule extracts its tuning tasks after these, and a
    tuned build applies the records at the same point, so the kernels match."""
    from tvm.relax import pipeline as rp

    with target:  # the adreno passes read Target.current()
        return [*rp.library_dispatch_passes(target),
                *(p for p in _legalize_passes(target, max_buffers) if not _is_dlight_pass(p))]


def _gpu_pipeline(target, record: dict[str, str], records: TuningRecords | None, max_buffers: int | None = None,
                  backend_passes: Sequence[Any] = (), measured: dict | None = None,
                  passed_over: dict[str, str] | None = None, gpu_only: bool = False):
    """TVM's default Relax pipeline for ``target`` (the same passes ``tvm.compile`` would use),
    with every dlight ``ApplyDefaultSchedule`` replaced by a recording copy with the same rules.

    With ``records``, MetaSchedule's ``ApplyDatabase`` runs right before the first dlight pass: the
    kernels with records get their tuned schedule (recorded as "tuned"), dlight schedules the rest. A rule's
    schedule over the target's workgroup limits is left for the next rule (``schedule_limits.py``; each in
    ``passed_over``). Unless ``gpu_only``, a kernel no rule schedules runs on the device's CPU
    (``placed_kernels.unscheduled_to_cpu``)."""
    import tvm
    from tvm import relax
    from tvm.relax import pipeline as rp

    note_before, note_after = note_tuned_pass(record)

    legalize = []
    rules: list = []
    with target:  # the adreno passes read Target.current()
        for p in _legalize_passes(target, max_buffers):
            if _is_dlight_pass(p):
                if not rules:
                    legalize.append(_short_kernel_names())
                if records is not None and not rules:
                    legalize += [note_before, relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
                                 note_after]
                    if records.sizes:  # records tuned at one size, on the kernels of a dynamic build
                        legalize.append(records_at_size(records.database, records.sizes, record))
                rules.extend(p._inst.rules)
                legalize.append(recording_schedule_pass(list(p._inst.rules), record, _unscheduled_label,
                                                        over_limits=over_limits, passed_over=passed_over))
                last_schedule = len(legalize)
            else:
                legalize.append(p)
        if not gpu_only and rules:  # after the last schedule pass (adreno has two: its own rules, then dlight's)
            legalize.insert(last_schedule, unscheduled_to_cpu(record, target, NO_RULE_CPU, SERIAL_CPU))

    @tvm.transform.module_pass(opt_level=0, name="edgepack_gpu_pipeline")
    def _pipeline(mod, _ctx):
        with target, (records.database if records is not None else contextlib.nullcontext()):
            seq = tvm.transform.Sequential(measuring(
                [integer_products(), elementwise_quantization(), *backend_passes]
                + rp.library_dispatch_passes(target) + legalize + rp.dataflow_lower_passes(target)
                + rp.finalize_passes(target), measured if measured is not None else {}))
            return seq(mod)

    names = tuple(rule_name(r) for r in rules)
    return _pipeline, (("tuned", *names) if records is not None else names)


MAX_FUNCTION_NAME = 120  # PoCL keeps each kernel in a cache directory named after it: longer names fail there


def _short_kernel_names():
    """Rename fused functions whose names (operator names joined by TVM's fusion) are too long to be
    kernel names everywhere: the first characters and a digest of the whole name."""
    import hashlib

    import tvm
    from tvm import relax, tirx

    @tvm.transform.module_pass(opt_level=0, name="edgepack_short_kernel_names")
    def _rename(mod, _ctx):
        renamed = False
        for gvar, func in list(mod.functions_items()):
            name = gvar.name_hint
            if isinstance(func, tirx.PrimFunc) and len(name) > MAX_FUNCTION_NAME:
                digest = hashlib.sha256(name.encode()).hexdigest()[:8]
                mod[gvar] = func.with_attr("global_symbol", f"{name[:MAX_FUNCTION_NAME - 9]}_{digest}")
                renamed = True
        return relax.transform.NormalizeGlobalVar()(mod) if renamed else mod

    return _rename


def _extent(value) -> int | str:
    from tvm import tirx

    return int(value.value) if isinstance(value, tirx.IntImm) else str(value)


def _collect_kernels(mod, kernels: dict[str, dict[str, Any]]) -> None:
    """Device kernels of a module after ``tirx.SplitHostDevice``, with their thread extents."""
    from tvm import tirx

    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None:
            continue
        if "calling_conv" not in func.attrs or int(func.attrs["calling_conv"]) != 2:  # kDeviceKernelLaunch
            continue
        extents: dict[str, int | str] = {}
        _thread_extents(func.body, extents)
        params = func.attrs.get("tirx.kernel_launch_params") or []
        kernels[gvar.name_hint] = {
            "params": tuple(str(p) for p in params),
            "extents": extents,
            "args": tuple(_param_type(p) for p in func.params),
            "buffer_types": tuple(_param_type(p, element=True) for p in func.params if _param_type(p) == "handle"),
            "workgroup_memory": workgroup_memory(func.body),
        }


def _largest_buffers(mod, sizes: dict[str, int]) -> None:
    """Per PrimFunc (before ``SplitHostDevice``: its kernels are named after it), the largest global buffer
    it declares (its tensors), in bytes."""
    import tvm_ffi
    from tvm import tirx

    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        found = [0]

        def visit(node, found=found):
            if str(node.buffer.scope()) in ("global", ""):
                found[0] = max(found[0], buffer_bytes(node.buffer))

        tvm_ffi.structural_walk(func.body, [(tirx.DeclBuffer, visit)], order="pre")
        if found[0]:
            sizes[gvar.name_hint] = found[0]


def _param_type(var, element: bool = False) -> str:
    """"handle" for a buffer pointer (with ``element``: the dtype of its elements), else the scalar dtype
    of a kernel parameter."""
    import tvm

    ty = var.ty
    if isinstance(ty, tvm.ir.PointerType):
        return str(getattr(ty.element_type, "dtype", "handle")) if element else "handle"
    return str(getattr(ty, "dtype", ty))


def _thread_extents(stmt, extents: dict[str, int | str]) -> None:
    """``launch_thread`` extents (AttrStmt "thread_extent") of a lowered kernel body."""
    import tvm_ffi
    from tvm import tirx

    def visit(node):
        if node.attr_key == "thread_extent":
            extents.setdefault(str(node.node.thread_tag), _extent(node.value))

    tvm_ffi.structural_walk(stmt, [(tirx.AttrStmt, visit)], order="pre")


def _unscheduled_label(func) -> str:
    target = func.attrs.get("target") if func.attrs is not None else None
    if target is not None and is_cpu_target(target):
        return CPU_RULE  # placed on the device's CPU (placement.py): TVM's loops, compiled as host code
    return "own thread bindings" if _binds_threads(func) else "none"


def _binds_threads(func) -> bool:
    """Whether a PrimFunc already launches GPU threads itself (TOPI's GPU implementations written
    with thread bindings, e.g. scatter and sort): no dlight rule is needed for those."""
    import tvm_ffi
    from tvm import tirx

    found = []

    def visit_attr(node):
        if node.attr_key in ("thread_extent", "virtual_thread"):
            found.append(node)

    def visit_for(node):
        if node.kind == tirx.ForKind.THREAD_BINDING:
            found.append(node)

    tvm_ffi.structural_walk(func.body, [(tirx.AttrStmt, visit_attr), (tirx.For, visit_for)], order="post")
    return bool(found)


def _refuse_unscheduled(name: str, record: dict[str, str], rules: Sequence[str], cause) -> None:
    """Fail, naming them, when fused functions got no GPU schedule (with ``--gpu-only``; else they run on the
    device's CPU, ``placed_kernels.unscheduled_to_cpu``).

    TVM 0.27 does not reject such a function: it compiles it as host (CPU) code that is handed the
    device's buffers as if they were host memory, which corrupts memory at run time."""
    unscheduled = sorted(n for n, rule in record.items() if rule == "none")
    if not unscheduled:
        return
    raise CompileError(
        f"No GPU schedule for {len(unscheduled)} fused function(s) of {name}: "
        f"{', '.join(unscheduled[:8])}{' ...' if len(unscheduled) > 8 else ''}. None of the dlight rules "
        f"({', '.join(rules)}) applies, and --gpu-only keeps them off the device's CPU.",
        "Compile without --gpu-only (they then run on the device's CPU, their operands copied there), or for a "
        "CPU profile (e.g. rpi4), or report the model: the operators in these functions need a GPU schedule.",
    ) from cause


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return str(value)


def function_of(kernel: str, functions: dict[str, str]) -> str:
    """The fused function a kernel came from: TVM names kernels ``<function>_kernel[_N]``."""
    base = re.sub(r"_kernel(_\d+)?$", "", kernel)
    if base in functions:
        return base
    candidates = [f for f in functions if kernel.startswith(f + "_")]
    return max(candidates, key=len) if candidates else base


def module_source(executable, kind: str) -> str:
    """The text of every ``kind`` module (``"opencl"``, ``"webgpu"``) of a compiled or loaded executable."""
    stack, found = [executable.mod if hasattr(executable, "mod") else executable], []
    while stack:
        m = stack.pop()
        if m.kind == kind:
            found.append(m.inspect_source())
        stack.extend(m.imports)
    return "\n".join(found)


# ----------------------------------------------------------------------------------------------
# the backend


class GpuBackend(Backend):
    """A GPU reached through a TVM runtime plug-in of edgepack's (``runtimes/plugins/<name>``)."""

    #: dlight schedules symbolic extents (``compile --dim``); ``uniform_barriers.py`` keeps the reductions'
    #: barriers where every thread reaches them (a dynamic build's kernels hung on PoCL without it)
    no_symbolic_shapes = None
    no_half_precision = None  # the device must have half arithmetic (``half_arithmetic``), checked before a run
    #: The TVM target kind's code-generator module kind ("opencl", "webgpu").
    module_kind: ClassVar[str]
    #: The kernel language, for messages ("OpenCL", "WGSL").
    language: ClassVar[str]
    #: What its kernels are called, for messages ("kernels"; WGSL's are "shaders").
    kernel_noun: ClassVar[str] = "kernels"
    #: Where a build keeps its kernels (device/kernels.cl ...) and their index.
    kernels_source: ClassVar[str]
    kernels_index: ClassVar[str] = "device/kernels.json"
    isolated_runs = True  # a driver's abort ends a child process, not the caller's (``run/isolated.py``)
    #: The plug-in and the names it registers with tvm-ffi.
    recipe: ClassVar[PluginRecipe]
    loader_function: ClassVar[str]
    info_function: ClassVar[str]
    #: The driver hint when this machine has no device.
    driver_hint: ClassVar[str]
    #: The limits a build keeps its kernels within where neither its profile (``[limits]``,
    #: ``profiles.GpuLimits``) nor, for threads and workgroup memory, its TVM target states them.
    default_limits: ClassVar[GpuLimits] = GpuLimits()

    #: Whether topi's up-sweep / down-sweep scan kernels compute right in this backend's language
    #: (``gpu_scans.py``)
    topi_scans: ClassVar[bool] = True
    #: How the kernel language keeps a scaled integer sum from fusing with what is added to it
    #: (``separate_products.py``): "statement" where its compiler contracts only within an expression
    scaled_sums: ClassVar[str] = "statement"

    def tir_pipeline(self) -> str:
        # float constants exact, infinities expressible (``float_literals.py``), scaled sums kept apart
        return tir_pipeline(self.scaled_sums)

    # --- what a GPU backend says for itself

    @abstractmethod
    def split_source(self, source: str) -> dict[str, str]:
        """Per-kernel sections of the generated source."""

    @abstractmethod
    def tvm_device(self) -> Any:
        """This machine's device of this kind, once the plug-in is loaded."""

    def plugin_options(self, triple: str, *, log: Progress | None = None) -> dict[str, Any]:
        """Extra arguments of ``toolchain.plugins.build_plugin`` for this plug-in."""
        return {}

    def relax_passes(self, model: str) -> list[Any]:
        """Relax passes this backend's code generator needs, run after the 8-bit rewrites
        (``backends/integer.py``), before TVM's own passes: scans on the kernels that compute them right
        (``gpu_scans.py``)."""
        return [gpu_scans(model, self.topi_scans)]

    def translate_compile_error(self, exc: CompileError, imported: ImportedModel, target: Any) -> CompileError:
        """The error to raise when TVM fails to compile ``imported`` (as ``prepare`` left it) for ``target``:
        a refusal of one of edgepack's own passes (``gpu_scans``) as it was raised, not as TVM's pass machinery
        wrapped it."""
        return unwrapped_refusal(exc, imported.info.path.name, SCAN_REFUSAL, " has a") or exc

    def prepare(self, imported: ImportedModel, target: Any, limits: GpuLimits, *,
                gpu_only: bool = False) -> ImportedModel:
        """The model as this backend's code generator can take it for ``target``, before the pipeline
        (e.g. Vulkan: int64 tensors narrowed to int32); may refuse it with a CompileError. The operators the
        GPU cannot run (``cpu_operators``) are placed on the device's CPU (``placement.py``); with
        ``gpu_only`` they are refused by name."""
        if gpu_only:
            self.refuse_cpu_operators(imported.info.path.name, imported.mod, limits)
            return imported
        where = self.cpu_operators(imported.mod, limits)
        return with_module(imported, place_on_cpu(imported.mod, where, target)) if where else imported

    def cpu_operators(self, mod, limits: GpuLimits) -> dict[str, str]:
        """``{variable: why}`` of the bindings of ``mod``'s ``main`` this backend's GPU cannot run: the scans
        where TVM's scan kernels are wrong in its language (``gpu_scans.py``); float64 operators where the GPU
        has no 64-bit floats (``limits.fp64``); operators of a data-dependent shape (NonZero, Unique: TVM's
        runtime computes them on the CPU, reading their operand as host memory)."""
        return (({} if self.topi_scans else scan_bindings(mod)) | self._doubles(mod, limits)
                | operator_bindings(mod, DATA_DEPENDENT, DATA_DEPENDENT_ON_CPU))

    def _doubles(self, mod, limits: GpuLimits) -> dict[str, str]:
        """The float64 operators of ``mod``'s ``main`` where the GPU has no 64-bit floats (``limits.fp64``)."""
        return {} if limits.fp64 else dtype_bindings(mod, "float64", f"64-bit floats, which {self.no_doubles}")

    #: why a GPU without 64-bit floats has none, for messages
    no_doubles: ClassVar[str] = "this GPU does not have"

    def refuse_cpu_operators(self, name: str, mod, limits: GpuLimits) -> None:
        """With ``--gpu-only``: a CompileError naming the float64 operators of a GPU without 64-bit floats (the
        scans are refused by their own pass, ``gpu_scans.py``; 64-bit integers by the int64 pass or the code
        generator)."""
        names = names_of(mod["main"])

        def shown(found: dict[str, str]) -> str:
            listed = [f"{names[v]} ({v})" if v in names else v for v in list(found)[:6]]
            return ", ".join(listed) + (f" and {len(found) - 6} more" if len(found) > 6 else "")

        doubles = self._doubles(mod, limits)
        if doubles:
            raise CompileError(
                f"{name} computes in 64-bit floats, which {self.no_doubles}: {shown(doubles)}.",
                "Compile it without --gpu-only (these operators then run on the device's CPU), or for a CPU "
                "profile (rpi4), or export the model in float32.")
        dynamic = operator_bindings(mod, DATA_DEPENDENT, DATA_DEPENDENT_ON_CPU)
        if dynamic:
            raise CompileError(
                f"{name} has operators whose output shape depends on the values (NonZero, Unique), which TVM "
                f"computes on the CPU: {shown(dynamic)}.",
                "Compile it without --gpu-only (these operators then run on the device's CPU, the rest on the "
                "GPU), or for a CPU profile (rpi4).")

    # --- compiling

    def limits(self, limits: GpuLimits | None, target: Any = None) -> GpuLimits:
        """The limits a build keeps its kernels within: the profile's (``limits``) where it states them,
        else (threads, workgroup memory) the TVM target's, which the schedules use, else the backend's
        defaults."""
        stated = limits or GpuLimits()
        merged = {k: getattr(stated, k) for k in LIMIT_KEYS}
        for key, (_what, attr) in LIMIT_KEYS.items():
            if merged[key] is None and target is not None and attr is not None and attr in target.attrs:
                merged[key] = int(target.attrs[attr])
            if merged[key] is None:
                merged[key] = getattr(self.default_limits, key)
        fp64 = stated.fp64 if stated.fp64 is not None else self.default_limits.fp64
        return GpuLimits(**merged, fp64=fp64 is not False)

    def build(self, imported: ImportedModel, target: Any, *, system_lib: bool = False,
              records: TuningRecords | None = None, limits: GpuLimits | None = None, gpu_only: bool = False) -> Build:
        """Compile through TVM's default GPU pipeline (dlight), refusing any function without a GPU schedule
        and any kernel over the profile's ``limits`` (``check_limits``). What the GPU cannot run exactly runs on
        the device's CPU (``prepare``), unless ``gpu_only``."""
        limits = self.limits(limits, target)
        imported = self.prepare(imported, target, limits, gpu_only=gpu_only)
        try:
            return self._build(imported, target, system_lib=system_lib, records=records, limits=limits,
                               gpu_only=gpu_only)
        except CompileError as exc:
            raise self.translate_compile_error(exc, imported, target) from exc.__cause__

    def _build(self, imported: ImportedModel, target: Any, *, system_lib: bool,
               records: TuningRecords | None, limits: GpuLimits, gpu_only: bool) -> Build:
        import tvm
        from tvm import relax

        record: dict[str, str] = {}
        measured: dict = {}
        passed_over: dict[str, str] = {}
        pipeline, rules = _gpu_pipeline(target, record, records, limits.storage_buffers,
                                        self.relax_passes(imported.info.path.name), measured, passed_over, gpu_only)
        found: dict[str, dict[str, Any]] = {}
        buffer_sizes: dict[str, int] = {}

        @tvm.instrument.pass_instrument
        class _KernelSnapshot:
            def run_before_pass(self, mod, info):
                if info.name == "tirx.SplitHostDevice":
                    _largest_buffers(mod, buffer_sizes)

            def run_after_pass(self, mod, info):
                if info.name == "tirx.SplitHostDevice":
                    _collect_kernels(mod, found)

        name = imported.info.path.name
        try:
            with tvm.transform.PassContext(instruments=[_KernelSnapshot()], config=BUILD_CONFIG):
                if system_lib:  # for static programs: host code + the kernels (devc.o) in TVM's system library
                    executable = relax.build(imported.mod, target=target, system_lib=True, relax_pipeline=pipeline,
                                             tir_pipeline=self.tir_pipeline())
                else:
                    executable = tvm.compile(imported.mod, target=target, relax_pipeline=pipeline,
                                             tir_pipeline=self.tir_pipeline())
        except Exception as exc:
            _refuse_unscheduled(name, record, rules, exc)
            raise CompileError(
                f"TVM failed to compile {name} for {target.kind.name}: {first_line(exc)}",
                "This is a gap in TVM's GPU code generation for this model; please report it with the model "
                "attached.",
            ) from exc
        _refuse_unscheduled(name, record, rules, None)
        for kname, info in found.items():
            info["buffer_size"] = buffer_sizes.get(function_of(kname, buffer_sizes), 0)
        self.check_limits(name, found, limits, record)

        sections = self.split_source(module_source(executable, self.module_kind))
        kernels = []
        usage = kernel_usage(found)
        for kname, info in sorted(found.items()):
            ext = info["extents"]
            grid = tuple(ext.get(f"blockIdx.{a}", 1) for a in "xyz")
            block = tuple(ext.get(f"threadIdx.{a}", 1) for a in "xyz")
            kernels.append(Kernel(kname, function_of(kname, record), info["args"], info["params"], grid, block,
                                  sections.get(kname, ""), usage[kname]))
        by_function: dict[str, list[str]] = {}
        for k in kernels:
            by_function.setdefault(k.function, []).append(k.name)
        functions = [ScheduledFunction(n, rule, tuple(by_function.get(n, ()))) for n, rule in sorted(record.items())]
        pipeline_name = "adreno" if "adreno" in [str(k) for k in target.keys] else "gpu_generic"
        if records is not None:
            pipeline_name += " (tuned)"
        names = names_of(imported.mod["main"])
        operators = {(f"{names[var]} ({var})" if var in names else var): why
                     for var, why in cpu_bindings(imported.mod).items()}
        report = GpuReport(target=json.dumps(_plain(target.export()), sort_keys=True), pipeline=pipeline_name,
                           rules=rules, functions=functions, kernels=kernels, cpu_operators=operators,
                           details=self.report_details() | ({"over_limits": passed_over} if passed_over else {}))
        return Build(executable, report, measured.get("constants"), measured.get("run_memory"))

    def report_details(self) -> dict[str, Any]:
        return {}

    def check_limits(self, name: str, kernels: dict[str, dict[str, Any]], limits: GpuLimits,
                     record: dict[str, str]) -> None:
        """A CompileError naming the kernels over one of ``limits`` (``kernel_usage``'s values), one
        paragraph per limit met, with what to do about it."""
        usage = kernel_usage(kernels)
        problems = []
        for key, (what, _attr) in LIMIT_KEYS.items():
            limit = getattr(limits, key)
            over = {k: u[key] for k, u in usage.items() if limit is not None and u[key] > limit}
            if not over:
                continue
            worst = max(over, key=over.get)
            rule = record.get(function_of(worst, record), "")
            problems.append(
                f"{len(over)} {self.language} kernel(s) over the profile's {key} limit ({limit} {what}): "
                f"{worst} needs {over[worst]}" + (f" (scheduled by {rule})" if rule else "")
                + (f"; also {', '.join(sorted(k for k in over if k != worst)[:4])}" if len(over) > 1 else "")
                + f". {_LIMIT_FIXES[key]}")
        if problems:
            raise CompileError(f"{name} cannot run within the {self.label} limits of this profile: "
                               + " ".join(problems),
                               "The limits are the profile's [limits] table (docs/architecture.md, GPU limits); "
                               "a profile for a GPU that allows more may raise them.")

    def host_target(self, profile: Profile) -> Any:
        """The profile's GPU target with this machine as its host: the same kernels, x86 host code."""
        import tvm

        return tvm.target.Target(profile.target, host=HOST_TARGET)

    def host_records(self, records: TuningRecords | None) -> TuningRecords | None:
        return records  # the same kernels as the device build: what host validation runs ships

    def write_artifacts(self, root: Path, build: Build) -> dict[str, str]:
        """The kernel source and an index of launch sizes and schedules, beside the device library."""
        report = build.report
        assert isinstance(report, GpuReport)
        source = module_source(build.executable, self.module_kind)
        (root / self.kernels_source).parent.mkdir(parents=True, exist_ok=True)
        (root / self.kernels_source).write_text(source)
        index = report.to_dict() | {"kernels": [k.to_dict(with_source=False) for k in report.kernels]}
        (root / self.kernels_index).write_text(json.dumps(index, indent=2) + "\n")
        return {f"{self.name}_kernels": self.kernels_source, f"{self.name}_kernel_index": self.kernels_index}

    def manifest_extra(self, build: Build) -> dict[str, Any]:
        return {self.name: build.report.to_dict()} if build.report is not None else {}

    def summary_lines(self, manifest: BuildManifest) -> list[str]:
        """Kernels, their schedules, and the CPU fallback (always stated, never silent)."""
        extra = manifest.extra.get(self.name) or {}
        schedules = ", ".join(f"{n} {rule}" for rule, n in sorted(extra.get("schedules", {}).items()))
        fallback = extra.get("cpu_fallback") or []
        operators = extra.get("cpu_operators") or {}
        lines = [
            f"GPU: {extra.get('num_kernels', 0)} {self.language} {self.kernel_noun} from "
            f"{extra.get('num_functions', 0)} fused functions ({extra.get('pipeline')} pipeline; "
            f"{extra.get('memory', 'buffers')}"
            + (f"; {extra['runtime']}" if extra.get("runtime") else "") + ")",
            f"schedules: {schedules or 'none'}",
        ]
        if not fallback and not operators:
            return [*lines, "CPU fallback: none (every fused function runs on the GPU)"]
        lines.append(f"CPU fallback: {len(fallback)} function(s) of the same program run on the device's CPU "
                     "(--gpu-only refuses them instead):")
        by_reason: dict[str, list[str]] = {}
        for op, why in operators.items():
            by_reason.setdefault(why, []).append(op)
        for rule, why in ((NO_RULE_CPU, "no GPU schedule rule takes them"),
                          (SERIAL_CPU, "serial loops (a recurrence's steps), which one GPU thread would run far slower")):
            moved = [f["name"] for f in extra.get("functions", []) if f["schedule"] == rule]
            if moved:
                by_reason[why] = moved
        for why, ops in by_reason.items():
            lines.append(f"  {', '.join(ops[:6])}{f' and {len(ops) - 6} more' if len(ops) > 6 else ''}: {why}")
        return lines

    def kernels(self, build_dir: Path, manifest: BuildManifest) -> list[Kernel]:
        index_path, source_path = build_dir / self.kernels_index, build_dir / self.kernels_source
        if not index_path.is_file() or not source_path.is_file():
            raise EdgepackError(f"{build_dir} has no {self.language} kernels ({self.kernels_source} is missing).",
                                "Compile the model again with `edgepack compile ... --force`.")
        index = json.loads(index_path.read_text())
        sections = self.split_source(source_path.read_text())
        return [Kernel(k["name"], k["function"], tuple(k["arg_types"]), tuple(k["launch_params"]), tuple(k["grid"]),
                       tuple(k["block"]), sections.get(k["name"], ""), k.get("usage", {})) for k in index["kernels"]]

    # --- running

    def plugin(self, triple: str, compilers: Compilers | None = None, *, log: Progress | None = None) -> Plugin:
        """The plug-in for ``triple``: this machine's (``compilers`` None) or cross-built with ``compilers``."""
        options = self.plugin_options(triple, log=log)
        if triple == HOST_TRIPLE:  # linked against the installed wheels' runtime, which an x86 device gets too
            return host_plugin(self.recipe, log=log, **options)
        if compilers is None:
            raise ToolchainError(f"Building edgepack's {self.recipe.label} runtime for {triple} needs its compilers.")
        return target_plugin(self.recipe, triple, compilers.cc, compilers.cxx, log=log, **options)[0]

    def load_plugin(self, *, log: Progress | None = None) -> dict[str, Any]:
        """Load this machine's plug-in into this process (once) and return ``runtime_info()``.

        ``ctypes.CDLL(path, RTLD_GLOBAL)``: its static initialisers register the device API and the
        module loader with tvm-ffi; the TVM runtime must be loaded before it."""
        import tvm  # noqa: F401  (the runtime must be loaded, RTLD_GLOBAL, before the plug-in)
        import tvm_ffi

        self.prepare_process()
        if tvm_ffi.get_global_func(self.loader_function, allow_missing=True) is None:
            lib = self.plugin(HOST_TRIPLE, log=log).shared
            try:
                _LOADED.append(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL))
            except OSError as exc:
                raise ToolchainError(f"Cannot load edgepack's {self.recipe.label} runtime {lib}: {exc}.",
                                     "Rebuild it: delete the directory and run again.") from exc
            if tvm_ffi.get_global_func(self.loader_function, allow_missing=True) is None:
                raise ToolchainError(f"{lib} loaded but registered no {self.language} module loader.",
                                     f"It is not edgepack's {self.recipe.label} runtime for this TVM version; "
                                     "rebuild it.")
        return self.runtime_info()

    def ready_here(self, *, log: Progress | None = None) -> None:
        self.plugin(HOST_TRIPLE, log=log)

    def driver_loaded(self) -> bool:
        import tvm_ffi

        return tvm_ffi.get_global_func(self.loader_function, allow_missing=True) is not None

    def prepare_process(self) -> None:
        """Anything this process needs before the plug-in is loaded."""

    def runtime_info(self) -> dict[str, Any]:
        """What the loaded plug-in found: its driver library and the devices it maps to."""
        import tvm_ffi

        f = tvm_ffi.get_global_func(self.info_function, allow_missing=True)
        if f is None:
            return {"runtime": None, "available": False,
                    "error": f"edgepack's {self.recipe.label} runtime is not loaded", "devices": []}
        return json.loads(str(f()))

    def require_device(self, *, log: Progress | None = None) -> dict[str, Any]:
        """Load the plug-in and make sure this machine has a device; returns ``runtime_info()``."""
        info = self.load_plugin(log=log)
        if not info.get("available") or not info.get("devices"):
            raise EdgepackError(f"No {self.recipe.label} device on this machine: {info.get('error') or 'none found'}.",
                                self.driver_hint)
        return info

    def host_device(self, *, log: Progress | None = None) -> Any:
        self.require_device(log=log)
        return self.tvm_device()

    def packed_modules(self) -> dict[str, Callable[[bytes], bytes]]:
        return {self.module_kind: self.before_packing}

    def before_packing(self, module: bytes) -> bytes:
        """What the device module's bytes lose before a library stores them compressed (nothing here)."""
        return module

    #: The device capability fp16 builds' kernels need, as the driver names it ("cl_khr_fp16", "shader-f16").
    half_feature: ClassVar[str]

    @abstractmethod
    def half_arithmetic(self, device: dict[str, Any]) -> bool:
        """Whether a device of ``runtime_info()`` computes in half precision (fp16 builds run there)."""

    def check_runs_here(self, build_dir: Path, manifest: BuildManifest) -> None:
        if manifest.precision != "fp16":
            return
        device = self.runtime_info()["devices"][0]
        if not self.half_arithmetic(device):
            raise EdgepackError(
                f"{build_dir} computes in fp16, and this machine's {self.recipe.label} device ({device['name']}, "
                f"driver {device.get('driver', '?')}) has no {self.half_feature}: its kernels would not compile.",
                "Validate it on the device it was made for (--on NAME), or compile with --precision fp32 to "
                "validate here.")

    # --- shipping

    def runtime_files(self, triple: str, compilers: Compilers, *, static: bool = True,
                      log: Progress | None = None) -> dict[str, Path]:
        plugin, _runtime = target_plugin(self.recipe, triple, compilers.cc, compilers.cxx, log=log,
                                         **self.plugin_options(triple, log=log))
        return plugin.files(static=static)

    def rpc_server_files(self, triple: str, compilers: Compilers, *, log: Progress | None = None) -> dict[str, Path]:
        plugin = self.plugin(triple, compilers, log=log)
        return {Path(rel).name: path for rel, path in plugin.files(static=False).items()}

    def android_files(self, triple: str, cc: str, cxx: str, *, log: Progress | None = None) -> list[Path]:
        plugin, _runtime = target_plugin(self.recipe, triple, cc, cxx, log=log, **self.plugin_options(triple, log=log))
        return list(plugin.files(static=False).values())

    def doctor_check(self) -> DoctorCheck | None:
        ok, found, hint = self.driver_status()
        return DoctorCheck(f"{self.recipe.label} device" if self.name == "opencl" else f"{self.recipe.label} driver",
                           ok, found, f"validate --on {self.host_place} ({self.recipe.label} profiles)",
                           "" if ok else hint)

    @abstractmethod
    def driver_status(self) -> tuple[bool, str, str]:
        """(ok, what was found, how to fix) of this machine's driver, asked without TVM."""


_LOADED: list[ctypes.CDLL] = []  # loaded plug-ins stay loaded for the life of the process
