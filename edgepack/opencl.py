"""OpenCL (Mali / Adreno GPUs): compile through TVM's GPU pipeline, run through edgepack's runtime.

The pinned TVM wheel generates OpenCL C but has no OpenCL runtime, so edgepack carries one:
``runtimes/opencl`` (C++ over the tvm-ffi and TVM runtime headers) builds a plug-in,
``libtvm_opencl.so``, that registers ``device_api.opencl`` and ``ffi.Module.load_from_bytes.opencl``
when it is loaded into a process that already has the TVM runtime. It dlopen()s the OpenCL ICD
loader (``libOpenCL.so.1``) at run time, so one plug-in works with any vendor's driver. Memory is
OpenCL buffers only (no image/texture memory).

What lives here:

* ``build_gpu(imported, target)``: TVM's default GPU pipeline for the target (``gpu_generic`` for
  Mali, ``adreno`` for Adreno: the dlight schedule rules) with the schedule decisions recorded,
  and the kernels' launch sizes taken from the lowered code. Returns the executable and a
  :class:`GpuReport` (which dlight rule scheduled each fused function, what has no GPU schedule).
* ``host_plugin()`` / ``target_plugin(triple, cc, cxx)``: the plug-in built for this machine (against
  the installed wheel's runtime) or cross-built for a device triple (against that triple's runtime
  from ``native.ensure_target_runtime``); cached under ``<cache>/opencl/<tvm-version>/``.
* ``load_plugin()``: load it into this Python process (``ctypes.CDLL(path, RTLD_GLOBAL)``: its
  static initialisers register the functions with tvm-ffi). ``runtime_info()`` lists the devices.
* ``run_on_host_opencl``: a ``validation.BuildRunner`` that runs ``host/model.so`` (x86 host code +
  the OpenCL kernels) on ``tvm.opencl(0)`` through the Relax VM.
* ``kernels(build_dir)``: the generated kernels with their launch sizes (``inspect --kernels``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgepack import gpu_plugins
from edgepack.errors import CompileError, EdgepackError, ToolchainError, ValidationError
from edgepack.fileutil import file_lock, file_sha256
from edgepack.paths import cache_root

Log = Callable[[str], None]

PLUGIN_SHARED = "libtvm_opencl.so"
PLUGIN_STATIC = "libtvm_opencl.a"
KERNELS_SOURCE = "device/kernels.cl"
KERNELS_INDEX = "device/kernels.json"
_HOST_TRIPLE = gpu_plugins.HOST_TRIPLE
_KERNEL_MARKER = "// Function: "
_PLUGIN_VERSION = "0.1.0"


# ----------------------------------------------------------------------------------------------
# compiling: the GPU pipeline with its decisions recorded


@dataclass(frozen=True)
class Kernel:
    """One generated OpenCL kernel and how TVM's host code launches it."""

    name: str
    function: str  # the fused Relax-level function (TIR PrimFunc) it was generated from
    arg_types: tuple[str, ...]  # "handle" for buffers, else the scalar dtype
    launch_params: tuple[str, ...]  # e.g. ("blockIdx.x", "threadIdx.x")
    grid: tuple[int | str, ...]  # work groups per dimension (x, y, z); str when shape-dependent
    block: tuple[int | str, ...]  # work-group size per dimension (x, y, z)
    source: str = ""

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


@dataclass(frozen=True)
class ScheduledFunction:
    name: str
    # the dlight rule that scheduled it (e.g. "gpu.Matmul"); "pre-scheduled" (TVM's GPU sort/scan
    # dispatch); "own thread bindings" (a TOPI GPU implementation); "none": no GPU schedule at all
    schedule: str
    kernels: tuple[str, ...] = ()


@dataclass
class GpuReport:
    """What the GPU pipeline did with a model; goes into manifest.extra["opencl"]."""

    target: str
    pipeline: str  # "gpu_generic" or "adreno"
    rules: tuple[str, ...]
    functions: list[ScheduledFunction] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    memory: str = "buffers"  # no image/texture memory

    @property
    def unscheduled(self) -> list[str]:
        """Fused functions that no GPU schedule rule took: they would have to run on the CPU."""
        return [f.name for f in self.functions if f.schedule == "none"]

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for f in self.functions:
            counts[f.schedule] = counts.get(f.schedule, 0) + 1
        return {
            "target": self.target,
            "pipeline": self.pipeline,
            "rules": list(self.rules),
            "memory": self.memory,
            "num_kernels": len(self.kernels),
            "num_functions": len(self.functions),
            "schedules": counts,
            "cpu_fallback": self.unscheduled,
            "functions": [{"name": f.name, "schedule": f.schedule, "kernels": list(f.kernels)}
                          for f in self.functions],
        }


def _rule_name(rule) -> str:
    module = type(rule).__module__
    family = module.split(".dlight.")[-1].split(".")[0] if ".dlight." in module else module
    return f"{family}.{type(rule).__name__}"


def _recording_schedule_pass(rules: Sequence, record: dict[str, str]):
    """TVM's dlight ``ApplyDefaultSchedule`` with the same rules, remembering which rule took what."""
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
                if "tirx.is_scheduled" in func.attrs and func.attrs["tirx.is_scheduled"] == 1:
                    record.setdefault(name, "pre-scheduled")
                    continue
                target = func.attrs.get("target") or tvm.target.Target.current(allow_none=False)
                for rule in rules:
                    try:
                        space = rule.apply(func, target, False)
                    except Exception:  # noqa: BLE001  a rule that cannot handle the function's form
                        space = None
                    if space is None:
                        continue
                    sch = space if not isinstance(space, list) else space[0]
                    updated[gvar] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                    record[name] = _rule_name(rule)
                    break
                else:
                    record[name] = "own thread bindings" if _binds_threads(func) else "none"
            for gvar, func in updated.items():
                mod[gvar] = func
            return mod

    return RecordingApplyDefaultSchedule()


def _is_dlight_pass(p) -> bool:
    inner = getattr(p, "_inst", None)
    return inner is not None and type(inner).__name__ == "ApplyDefaultSchedule"


def tuning_passes(target) -> list:
    """The GPU pipeline's passes up to fused, unscheduled TIR kernels: dispatch and legalisation
    without dlight's default schedules. MetaSchedule extracts its tuning tasks after these, and a
    tuned build applies the records at the same point (``TuningDatabase``), so the kernels match."""
    from tvm.relax import pipeline as rp

    with target:  # the adreno passes read Target.current()
        return [*rp.library_dispatch_passes(target), *(p for p in rp.legalize_passes(target) if not _is_dlight_pass(p))]


@dataclass(frozen=True)
class TuningDatabase:
    """Tuning records for a GPU build (``edgepack.tuning.tuned_pipeline`` makes it): a MetaSchedule
    database whose best schedules replace dlight's for the kernels it has; the rest keep dlight's."""

    database: Any  # tvm.s_tir.meta_schedule.database.Database


def _gpu_pipeline(target, record: dict[str, str], tuning: TuningDatabase | None = None):
    """TVM's default Relax pipeline for ``target`` (the same passes ``tvm.compile`` would use),
    with every dlight ``ApplyDefaultSchedule`` replaced by a recording copy with the same rules.

    With ``tuning``, MetaSchedule's ``ApplyDatabase`` runs right before the first dlight pass: the
    kernels with records get their tuned schedule (recorded as "tuned"), dlight schedules the rest."""
    import tvm
    from tvm import relax, tirx
    from tvm.relax import pipeline as rp

    scheduled_before: set[str] = set()

    @tvm.transform.module_pass(opt_level=0, name="edgepack_note_scheduled")
    def _note_scheduled(mod, _ctx):
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and \
                    "tirx.is_scheduled" in func.attrs and func.attrs["tirx.is_scheduled"] == 1:
                scheduled_before.add(gvar.name_hint)
        return mod

    @tvm.transform.module_pass(opt_level=0, name="edgepack_note_tuned")
    def _note_tuned(mod, _ctx):
        for gvar, func in mod.functions_items():
            name = gvar.name_hint
            if isinstance(func, tirx.PrimFunc) and name not in scheduled_before and func.attrs is not None and \
                    "tirx.is_scheduled" in func.attrs and func.attrs["tirx.is_scheduled"] == 1:
                record[name] = "tuned"
        return mod

    legalize = []
    rules: list = []
    with target:  # the adreno passes read Target.current()
        for p in rp.legalize_passes(target):
            if _is_dlight_pass(p):
                if tuning is not None and not rules:
                    legalize += [_note_scheduled, relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
                                 _note_tuned]
                rules.extend(p._inst.rules)
                legalize.append(_recording_schedule_pass(list(p._inst.rules), record))
            else:
                legalize.append(p)

    @tvm.transform.module_pass(opt_level=0, name="edgepack_gpu_pipeline")
    def _pipeline(mod, _ctx):
        with target, (tuning.database if tuning is not None else contextlib.nullcontext()):
            seq = tvm.transform.Sequential(
                rp.library_dispatch_passes(target) + legalize + rp.dataflow_lower_passes(target)
                + rp.finalize_passes(target)
            )
            return seq(mod)

    names = tuple(_rule_name(r) for r in rules)
    return _pipeline, (("tuned", *names) if tuning is not None else names)


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
        }


def _param_type(var) -> str:
    """"handle" for a buffer pointer, else the scalar dtype of a kernel parameter."""
    import tvm

    ty = var.ty
    if isinstance(ty, tvm.ir.PointerType):
        return "handle"
    return str(getattr(ty, "dtype", ty))


def _thread_extents(stmt, extents: dict[str, int | str]) -> None:
    """``launch_thread`` extents (AttrStmt "thread_extent") of a lowered kernel body."""
    import tvm_ffi
    from tvm import tirx

    def visit(node):
        if node.attr_key == "thread_extent":
            extents.setdefault(str(node.node.thread_tag), _extent(node.value))

    tvm_ffi.structural_walk(stmt, [(tirx.AttrStmt, visit)], order="pre")


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


def _kind_of(target) -> str:
    return str(target.kind.name)


def build_gpu(imported, target, *, relax_pipeline=None, system_lib: bool = False):
    """Compile for an OpenCL target (with its host); returns ``(executable, GpuReport)``.

    Raises ``CompileError`` naming the fused functions that no dlight rule could schedule for
    the GPU (TVM would compile them as CPU code handed the GPU's buffers; see
    ``_refuse_unscheduled``), and for any other TVM failure. ``relax_pipeline``: tuning records
    (a :class:`TuningDatabase`: those kernels are reported "tuned") or another pipeline.
    ``system_lib``: build a TVM system library (``native.export_model_static``), for static programs.
    """
    import tvm

    record: dict[str, str] = {}
    if relax_pipeline is None or isinstance(relax_pipeline, TuningDatabase):
        pipeline, rules = _gpu_pipeline(target, record, relax_pipeline)
    else:
        pipeline, rules = relax_pipeline, ("tuned",)
    found: dict[str, dict[str, Any]] = {}

    @tvm.instrument.pass_instrument
    class _KernelSnapshot:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.SplitHostDevice":
                _collect_kernels(mod, found)

    name = imported.info.path.name
    try:
        with tvm.transform.PassContext(instruments=[_KernelSnapshot()]):
            if system_lib:  # for static programs: host code + the kernels (devc.o) in TVM's system library
                from tvm import relax

                executable = relax.build(imported.mod, target=target, system_lib=True, relax_pipeline=pipeline)
            else:
                executable = tvm.compile(imported.mod, target=target, relax_pipeline=pipeline)
    except Exception as exc:
        _refuse_unscheduled(name, record, rules, exc)
        first = str(exc).strip().splitlines()
        raise CompileError(
            f"TVM failed to compile {name} for {_kind_of(target)}: {first[-1] if first else exc}",
            "This is a gap in TVM's GPU code generation for this model; please report it with the model attached.",
        ) from exc
    _refuse_unscheduled(name, record, rules, None)

    source = opencl_source(executable)
    sections = split_kernel_source(source)
    kernels = []
    for kname, info in sorted(found.items()):
        ext = info["extents"]
        grid = tuple(ext.get(f"blockIdx.{a}", 1) for a in "xyz")
        block = tuple(ext.get(f"threadIdx.{a}", 1) for a in "xyz")
        kernels.append(Kernel(kname, _function_of(kname, record), info["args"], info["params"], grid, block,
                              sections.get(kname, "")))
    by_function: dict[str, list[str]] = {}
    for k in kernels:
        by_function.setdefault(k.function, []).append(k.name)
    if relax_pipeline is not None and not isinstance(relax_pipeline, TuningDatabase):
        record = {k.function: "tuned" for k in kernels}  # an opaque pipeline: nothing recorded
    functions = [ScheduledFunction(n, rule, tuple(by_function.get(n, ()))) for n, rule in sorted(record.items())]
    pipeline_name = "adreno" if "adreno" in [str(k) for k in target.keys] else "gpu_generic"
    if relax_pipeline is not None:
        pipeline_name += " (tuned)"
    report = GpuReport(target=json.dumps(_plain(target.export()), sort_keys=True), pipeline=pipeline_name,
                       rules=rules, functions=functions, kernels=kernels)
    return executable, report


def _refuse_unscheduled(name: str, record: dict[str, str], rules: Sequence[str], cause) -> None:
    """Fail, naming them, when fused functions got no GPU schedule.

    TVM 0.27 does not reject such a function: it compiles it as host (CPU) code that is handed the
    device's buffers (cl_mem handles) as if they were host memory, which corrupts memory at run
    time. edgepack has no CPU fallback that moves the data, so it refuses the build instead."""
    unscheduled = sorted(n for n, rule in record.items() if rule == "none")
    if not unscheduled:
        return
    raise CompileError(
        f"No GPU schedule for {len(unscheduled)} fused function(s) of {name}: "
        f"{', '.join(unscheduled[:8])}{' ...' if len(unscheduled) > 8 else ''}. None of the dlight rules "
        f"({', '.join(rules)}) applies; TVM would run them on the CPU with the GPU's buffers, so edgepack "
        "refuses the build rather than fall back to the CPU silently.",
        "Compile for a CPU profile (e.g. rpi4), or report the model: the operators in these functions "
        "need a GPU schedule in TVM.",
    ) from cause


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return str(value)


def _function_of(kernel: str, functions: dict[str, str]) -> str:
    """The fused function a kernel came from: TVM names kernels ``<function>_kernel[_N]``."""
    base = re.sub(r"_kernel(_\d+)?$", "", kernel)
    if base in functions:
        return base
    candidates = [f for f in functions if kernel.startswith(f + "_")]
    return max(candidates, key=len) if candidates else base


def opencl_source(executable) -> str:
    """The OpenCL C source of a compiled (or loaded) executable: its ``opencl`` module's text."""
    stack, found = [executable.mod if hasattr(executable, "mod") else executable], []
    while stack:
        m = stack.pop()
        if m.kind == "opencl":
            found.append(m.inspect_source())
        stack.extend(m.imports)
    return "\n".join(found)


def split_kernel_source(source: str) -> dict[str, str]:
    """Per-kernel sections of TVM's OpenCL source (each starts with ``// Function: <name>``)."""
    sections: dict[str, str] = {}
    starts = [m.start() for m in re.finditer(r"(?m)^// Function: ", source)]
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(source)
        text = source[start:end]
        name = text[len(_KERNEL_MARKER):].split("\n", 1)[0].strip()
        sections[name] = text.rstrip() + "\n"
    return sections


def write_kernel_files(root: Path, executable, report: GpuReport) -> dict[str, str]:
    """``device/kernels.cl`` (the OpenCL source) and ``device/kernels.json`` (launch sizes, schedules)
    into a build directory; returns {artifact name: relative path}."""
    source = opencl_source(executable)
    (root / KERNELS_SOURCE).parent.mkdir(parents=True, exist_ok=True)
    (root / KERNELS_SOURCE).write_text(source)
    index = report.to_dict() | {"kernels": [k.to_dict(with_source=False) for k in report.kernels]}
    (root / KERNELS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return {"opencl_kernels": KERNELS_SOURCE, "opencl_kernel_index": KERNELS_INDEX}


def kernels(build_dir: Path | str) -> list[Kernel]:
    """The OpenCL kernels of a build, with their launch sizes and source (``inspect --kernels``)."""
    build_dir = Path(build_dir)
    index_path, source_path = build_dir / KERNELS_INDEX, build_dir / KERNELS_SOURCE
    if not index_path.is_file() or not source_path.is_file():
        from edgepack.manifest import read_manifest

        manifest = read_manifest(build_dir)  # a clear error if this is no build at all
        backend = manifest.profile.get("backend", "cpu")
        raise EdgepackError(
            f"{build_dir} has no OpenCL kernels: it was compiled for {manifest.profile_name} ({backend}).",
            "Kernels exist for GPU profiles: compile with --profile mali-g610 or --profile adreno-6xx.",
        )
    index = json.loads(index_path.read_text())
    sections = split_kernel_source(source_path.read_text())
    found = []
    for k in index["kernels"]:
        found.append(Kernel(k["name"], k["function"], tuple(k["arg_types"]), tuple(k["launch_params"]),
                            tuple(k["grid"]), tuple(k["block"]), sections.get(k["name"], "")))
    return found


def gpu_summary(build_dir: Path | str) -> dict[str, Any] | None:
    """The GPU report of a build (manifest.extra["opencl"]), or None for a CPU build."""
    from edgepack.manifest import read_manifest

    return read_manifest(Path(build_dir)).extra.get("opencl")


def render_kernels(found: Sequence[Kernel], *, with_source: bool = True) -> str:
    """Plain text for ``inspect BUILD --kernels``: one header line per kernel, then its source."""
    lines = [f"{len(found)} OpenCL kernel(s)"]
    width = max((len(k.name) for k in found), default=10)
    size = gpu_plugins.format_size
    for k in found:
        lines.append(f"{k.name:<{width}}  global {size(k.global_size):<14} local {size(k.block):<10}"
                     f" (grid {size(k.grid)})  from {k.function}  args: {', '.join(k.arg_types)}")
        if with_source and k.source:
            lines.append(k.source.rstrip())
            lines.append("")
    return "\n".join(lines)


def summary_lines(opencl_extra: dict[str, Any]) -> list[str]:
    """Lines for the compile summary: kernels, schedules, and the CPU fallback (always stated)."""
    return gpu_plugins.summary_lines(
        opencl_extra, f"GPU: {opencl_extra.get('num_kernels', 0)} OpenCL kernels from "
                      f"{opencl_extra.get('num_functions', 0)} fused functions ({opencl_extra.get('pipeline')} "
                      f"pipeline; {opencl_extra.get('memory', 'buffers')})")


# ----------------------------------------------------------------------------------------------
# the plug-in: build (host or cross), cache, load


@dataclass(frozen=True)
class OpenCLPlugin:
    """edgepack's OpenCL runtime built for one triple."""

    triple: str
    root: Path
    shared: Path  # lib/libtvm_opencl.so
    static: Path | None  # lib/libtvm_opencl.a (link with --whole-archive)
    runtime_origin: str  # the TVM runtime it was linked against


_RECIPE = gpu_plugins.PluginRecipe("opencl", "OpenCL", PLUGIN_SHARED, _PLUGIN_VERSION)


def _plugin_from_dir(root: Path) -> OpenCLPlugin:
    data = json.loads((root / "manifest.json").read_text())
    static = root / "lib" / PLUGIN_STATIC
    return OpenCLPlugin(data["triple"], root, root / "lib" / PLUGIN_SHARED, static if static.is_file() else None,
                        data.get("runtime_origin", ""))


def build_plugin(
    triple: str,
    cc: str,
    cxx: str,
    runtime,
    *,
    flags: Sequence[str] = (),
    cache_dir: Path | None = None,
    log: Log | None = None,
) -> OpenCLPlugin:
    """Build ``runtimes/opencl`` for ``triple`` with ``cxx``, linked against ``runtime`` (a
    ``native.TargetRuntime``); cached by (TVM version, triple, compiler, flags, sources, runtime)."""
    return _plugin_from_dir(gpu_plugins.build(_RECIPE, triple, cxx, runtime, flags=flags, cache_dir=cache_dir,
                                              log=log))


def host_plugin(*, cache_dir: Path | None = None, log: Log | None = None) -> OpenCLPlugin:
    """The plug-in for this machine, linked against the installed wheels' runtime."""
    from edgepack import native

    cc, cxx = gpu_plugins.host_compilers()
    return build_plugin(_HOST_TRIPLE, cc, cxx, native.host_runtime(), cache_dir=cache_dir, log=log)


def target_plugin(triple: str, cc: str, cxx: str, *, cache_dir: Path | None = None,
                  log: Log | None = None) -> tuple[OpenCLPlugin, Any]:
    """The plug-in cross-built for ``triple`` and the TVM runtime it links against (shared and
    static: ``native.ensure_target_runtime(..., need_static=True)``, the runtime a C bundle ships)."""
    from edgepack import native

    runtime = native.ensure_target_runtime(triple, cc, cxx, need_static=True, cache_dir=cache_dir, log=log)
    flags = runtime.cflags or native.DEFAULT_TARGET_FLAGS.get(triple, ())
    return build_plugin(triple, cc, cxx, runtime, flags=flags, cache_dir=cache_dir, log=log), runtime


def bundle_files(triple: str, cc: str, cxx: str, *, log: Log | None = None) -> dict[str, Path]:
    """For ``package_c`` of an OpenCL build: {bundle-relative path: file} to add to the bundle
    (``lib/libtvm_opencl.so`` next to the runtime, ``lib/libtvm_opencl.a`` for static programs)."""
    plugin, _runtime = target_plugin(triple, cc, cxx, log=log)
    files = {f"lib/{PLUGIN_SHARED}": plugin.shared}
    if plugin.static is not None:
        files[f"lib/{PLUGIN_STATIC}"] = plugin.static
    return files


# ----------------------------------------------------------------------------------------------
# an RPC server for this machine's OpenCL device (tuning with --on host-opencl)


RPC_SERVER_PROGRAM = "edgepack_rpc_server"
HOST_RPC_KEY = "host-opencl"


def host_rpc_server_program(*, cache_dir: Path | None = None, log: Log | None = None) -> Path:
    """edgepack's C RPC server (runtimes/rpc-server) built for this machine against the installed
    wheels' runtime, with the host plug-in copied next to it: the server loads it at start-up, the
    same way it does on a device with ``libtvm_opencl.so`` installed beside it. Cached."""
    from edgepack import native

    plugin = host_plugin(cache_dir=cache_dir, log=log)
    runtime = native.host_runtime()
    source = native.runtimes_dir() / "rpc-server" / "edgepack_rpc_server.c"
    cc, _cxx = gpu_plugins.host_compilers()
    key_data = {"source": file_sha256(source), "plugin": file_sha256(plugin.shared), "cc": native._compiler_identity(cc),
                "runtime": {p.name: file_sha256(p) for p in runtime.shared_libs}}
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(cache_dir if cache_dir is not None else cache_root()) / "opencl" / native.TVM_VERSION
    root = base / f"rpc-server-{_HOST_TRIPLE}-{key}"
    program = root / RPC_SERVER_PROGRAM
    if program.is_file():
        return program
    with file_lock(base / f".{root.name}.lock"):
        if program.is_file():
            return program
        if log:
            log("Building edgepack's RPC server for this machine (with the OpenCL runtime)")
        with native._staging(root) as tmp:
            lib_dirs = list(dict.fromkeys(str(p.parent) for p in runtime.shared_libs))
            cmd = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", *[f"-I{d}" for d in runtime.include_dirs],
                   "-o", str(tmp / RPC_SERVER_PROGRAM), str(source), *[f"-L{d}" for d in lib_dirs],
                   "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,--as-needed", "-ldl",
                   "-Wl,-rpath," + ":".join(["$ORIGIN", *lib_dirs])]
            result = native._run(cmd, log=None)
            if result.returncode != 0:
                raise ToolchainError("Building edgepack's RPC server for this machine failed.",
                                     "The last lines of the compiler output:\n" + native._tail(result.stderr))
            shutil.copy2(plugin.shared, tmp / PLUGIN_SHARED)
    return program


_WORKDIR_PREFIX = "edgepack-rpc-opencl-"


def _remove_stale_workdirs() -> None:
    """Work directories of servers whose edgepack was killed (the server then exits by itself)."""
    for directory in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*"):
        try:
            os.kill(int((directory / "pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):  # no pid yet (being started), or not ours to signal
            continue


@dataclass
class HostRPCServer:
    """A running ``edgepack_rpc_server`` on 127.0.0.1 that serves this machine's OpenCL device."""

    process: Any  # subprocess.Popen, in its own process group
    port: int
    key: str
    workdir: Path
    log_path: Path

    @classmethod
    def start(cls, *, timeout: float = 30.0, log: Log | None = None) -> HostRPCServer:
        import subprocess

        program = host_rpc_server_program(log=log)
        _remove_stale_workdirs()
        workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        port_file, log_path = workdir / "port", workdir / "server.log"
        with open(log_path, "wb") as log_handle:
            # own session: stop() ends the server and every session process it forked;
            # --exit-with-parent: it also ends when this process is killed (nothing else would stop it)
            process = subprocess.Popen(
                [str(program), "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--key",
                 HOST_RPC_KEY, "--workdir", str(workdir), "--exit-with-parent"],
                stdin=subprocess.DEVNULL, stdout=log_handle, stderr=subprocess.STDOUT, start_new_session=True)
        (workdir / "pid").write_text(str(process.pid))
        server = cls(process, 0, HOST_RPC_KEY, workdir, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = port_file.read_text().strip() if port_file.is_file() else ""
            if text.isdigit():
                server.port = int(text)
                return server
            if process.poll() is not None:
                break
            time.sleep(0.05)
        output = log_path.read_text(errors="replace")
        server.stop()
        raise ToolchainError(f"edgepack's RPC server for this machine's OpenCL device did not start: "
                             f"{output.strip().splitlines()[-1] if output.strip() else 'no output'}.",
                             "Check `edgepack doctor` (OpenCL) and rebuild: remove ~/.cache/edgepack/opencl.")

    def stop(self) -> None:
        import signal

        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except Exception:  # noqa: BLE001  a session stuck in the driver
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


_loaded_plugin: ctypes.CDLL | None = None


def load_plugin(path: Path | str | None = None, *, log: Log | None = None) -> dict[str, Any]:
    """Load the plug-in into this process (once) and return ``runtime_info()``.

    ``path`` defaults to the host build from ``host_plugin()`` (made now if needed). A process that
    runs TVM's RPC server can load it the same way (``python -m tvm.exec.rpc_server
    --load-library PATH`` does ``ctypes.CDLL(PATH, RTLD_GLOBAL)``).
    """
    global _loaded_plugin
    import tvm  # noqa: F401  (the runtime must be loaded, RTLD_GLOBAL, before the plug-in)
    import tvm_ffi

    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.opencl", allow_missing=True) is None:
        lib = Path(path) if path is not None else host_plugin(log=log).shared
        try:
            _loaded_plugin = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise ToolchainError(f"Cannot load edgepack's OpenCL runtime {lib}: {exc}.",
                                 "Rebuild it: delete the directory and run again.") from exc
        if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.opencl", allow_missing=True) is None:
            raise ToolchainError(f"{lib} loaded but registered no OpenCL module loader.",
                                 "It is not edgepack's OpenCL runtime for this TVM version; rebuild it.")
    return runtime_info()


def runtime_info() -> dict[str, Any]:
    """The OpenCL library the plug-in found and the devices ``tvm.opencl(i)`` maps to."""
    import tvm_ffi

    f = tvm_ffi.get_global_func("edgepack.opencl.runtime_info", allow_missing=True)
    if f is None:
        return {"runtime": None, "available": False, "error": "edgepack's OpenCL runtime is not loaded",
                "devices": []}
    return json.loads(str(f()))


def require_device(log: Log | None = None) -> dict[str, Any]:
    """Load the plug-in and make sure there is an OpenCL device; returns ``runtime_info()``."""
    info = load_plugin(log=log)
    if not info.get("available") or not info.get("devices"):
        raise EdgepackError(
            f"No OpenCL device on this machine: {info.get('error') or 'none found'}.",
            "Install an OpenCL driver; on Debian/Ubuntu the CPU one is enough: "
            "`apt-get install pocl-opencl-icd ocl-icd-libopencl1` (check with `clinfo -l`).",
        )
    return info


def host_opencl_status() -> tuple[bool, str, str]:
    """(ok, what was found, how to fix) for ``edgepack doctor``: an OpenCL device on this machine,
    asked directly through libOpenCL (no TVM, no plug-in build)."""
    hint = "apt-get install ocl-icd-libopencl1 pocl-opencl-icd   (PoCL: OpenCL on this CPU)"
    try:
        lib = ctypes.CDLL("libOpenCL.so.1")
    except OSError:
        return False, "no libOpenCL.so.1", hint
    count = ctypes.c_uint(0)
    if lib.clGetPlatformIDs(0, None, ctypes.byref(count)) != 0 or count.value == 0:
        return False, "no OpenCL platform (driver)", hint
    platforms = (ctypes.c_void_p * count.value)()
    lib.clGetPlatformIDs(count.value, platforms, None)
    names = []
    for platform in platforms:
        n = ctypes.c_uint(0)
        if lib.clGetDeviceIDs(ctypes.c_void_p(platform), ctypes.c_uint64(0xFFFFFFFF), 0, None, ctypes.byref(n)) != 0:
            continue
        devices = (ctypes.c_void_p * n.value)()
        lib.clGetDeviceIDs(ctypes.c_void_p(platform), ctypes.c_uint64(0xFFFFFFFF), n.value, devices, None)
        for device in devices:
            buf = ctypes.create_string_buffer(256)
            lib.clGetDeviceInfo(ctypes.c_void_p(device), ctypes.c_uint(0x102B), ctypes.c_size_t(256), buf, None)
            names.append(buf.value.decode(errors="replace"))
    if not names:
        return False, "no OpenCL device", hint
    return True, f"{len(names)} device(s): {', '.join(names)}", ""


# ----------------------------------------------------------------------------------------------
# running: validate --on host-opencl


def refuse_emulator(build_dir: Path, manifest) -> None:
    """``validate --on emulator`` of an OpenCL build: a clear error instead of a run that cannot work.

    qemu-user runs the aarch64 C runner, but the OpenCL driver it would need is aarch64 too: the
    only one reachable is Debian's arm64 PoCL, which compiles every kernel with LLVM under
    emulation (about 1.1 GB unpacked, root for a chroot with /proc, /sys and /dev, and 4 to 15
    minutes for a small model on 2 cores). That is a manual check (runtimes/opencl/tests/aarch64_pocl.py),
    not a validation step."""
    raise EdgepackError(
        f"{build_dir} is an OpenCL build ({manifest.profile_name}); --on emulator cannot run it: qemu-user runs "
        "the device's CPU code, but no emulated OpenCL GPU exists (an aarch64 OpenCL driver under qemu, Debian's "
        "arm64 PoCL, needs a 1.1 GB root file system, root, and minutes per kernel set).",
        "Validate the same kernels on this machine with --on host-opencl (any OpenCL driver, e.g. PoCL: "
        "`apt-get install pocl-opencl-icd`), or on the device itself with --on DEVICE "
        "(`edgepack device add ... --profile " + str(manifest.profile_name) + "`).",
    )



def run_on_host_opencl(build_dir: Path, manifest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A BuildRunner: ``host/model.so`` (x86 host code + the build's OpenCL kernels) on
    ``tvm.opencl(0)`` through TVM's Relax VM, with edgepack's OpenCL runtime."""
    import tvm

    from edgepack.validation import run_host_library

    if manifest.profile.get("backend") != "opencl":
        raise EdgepackError(
            f"{build_dir} was compiled for {manifest.profile_name} ({manifest.profile.get('backend')}), "
            "not for an OpenCL GPU.",
            "Validate it with --on host, or compile for mali-g610 / adreno-6xx.",
        )
    require_device()
    device = tvm.opencl(0)
    try:
        return run_host_library(build_dir, manifest, inputs, device)
    except EdgepackError:
        raise
    except Exception as exc:  # TVM raises RuntimeError/ValueError/... with the runtime's message
        text = str(exc).strip()
        match = re.search(r"OpenCL kernel '([^']+)' failed to build", text)
        if match:
            raise ValidationError(
                f"{build_dir}: " + text[text.find("OpenCL kernel"):],
                "The kernel source is in device/kernels.cl; compile again to regenerate it, or report the "
                "driver's message with the model attached.",
            ) from exc
        raise ValidationError(f"Running {build_dir} through OpenCL on {device.device_name} failed: {text}",
                              "Run with EDGEPACK_OPENCL_SYNC=1 to find the failing kernel.") from exc
