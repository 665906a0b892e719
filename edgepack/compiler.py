"""Compile a model for a device profile: import, Relax pipeline, build, cross-export.

A build directory holds::

    manifest.json        how it was made (written last)
    model.onnx|.tflite   the source model, the reference for validation
    device/model.so      the model library for the device, cross-compiled with the profile's toolchain,
                         with its tensor metadata embedded (the C API reads it)
    device/model.meta    that metadata as text
    host/model.so        the same model built for this machine, used by host validation
    tuning/              with --tuning: the best records applied (``package c`` rebuilds with them)

The directory is written atomically: a temp directory that is renamed only when complete.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgepack import __version__
from edgepack.atomic import atomic_directory, check_output_dir
from edgepack.errors import CompileError, ToolchainError
from edgepack.importers import ImportedModel, Shape, TensorSpec, _first_line, import_model
from edgepack.manifest import Artifact, BuildManifest
from edgepack.profiles import Profile, get_profile, require_supported
from edgepack.toolchain import Compilers, find_compilers

DEVICE_LIBRARY = "device/model.so"
DEVICE_META = "device/model.meta"
HOST_LIBRARY = "host/model.so"
BUILD_TUNING = "tuning"  # the best records a tuned build was made with (later rebuilds reuse them)
HOST_TARGET = {"kind": "llvm"}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CompileResult:
    output_dir: Path
    manifest: BuildManifest

    @property
    def device_library(self) -> Path:
        return self.output_dir / self.manifest.artifacts["device_library"].path

    @property
    def host_library(self) -> Path:
        return self.output_dir / self.manifest.artifacts["host_library"].path


def compile_model(
    model: Path | str,
    profile: Profile | str,
    output_dir: Path | str,
    *,
    input_shapes: dict[str, Shape] | None = None,
    force: bool = False,
    ndk: str | None = None,
    progress: Progress | None = None,
    tuning: Path | str | None = None,
) -> CompileResult:
    """Compile ``model`` for ``profile`` into ``output_dir`` (see the module docstring).

    ``tuning``: a tuning directory (``edgepack tune``) whose best records are applied to the device
    build; it must have been made for this model, input shapes and target.
    """
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    model, output_dir = Path(model), Path(output_dir)
    profile = get_profile(profile) if isinstance(profile, str) else profile
    require_supported(profile)
    check_output_dir(output_dir, force)  # fail before minutes of work, not after
    compilers = find_compilers(profile, ndk=ndk)

    say(f"Importing {model.name}")
    imported = import_model(model, input_shapes)
    outputs = output_specs(imported)
    # --- tuning (edgepack.tuning): checked before any build, applied to the device build only ---
    tuned = None
    if tuning is not None:
        from edgepack.tuning import apply_tuning

        say(f"Reading the tuning records in {tuning}")
        tuned = apply_tuning(imported, profile.tvm_target(), tuning)
    # ---

    with atomic_directory(output_dir, force=force) as staging:
        say(f"Building for {profile.name} ({profile.triple})"
            + (f" with tuned kernels ({tuned.tuned_tasks}/{tuned.total_tasks})" if tuned else ""))
        device_target = profile.tvm_target()
        gpu_report = None
        if profile.backend in ("opencl", "vulkan"):
            device_exe, gpu_report = build_gpu(imported, device_target,
                                               relax_pipeline=tuned.relax_pipeline if tuned else None)
        else:
            device_exe = build(imported, device_target, relax_pipeline=tuned.relax_pipeline if tuned else None)
        say(f"Linking the device library with {Path(compilers.cxx).name}")
        artifacts = export_device_library(device_exe, staging, imported.inputs, outputs, compilers)

        if profile.is_host:
            host_library = DEVICE_LIBRARY
            host_target = device_target
        elif gpu_report is not None:
            shaders = "WGSL shaders" if profile.backend == "vulkan" else "OpenCL kernels"
            say(f"Building for this machine: x86 host code + the same {shaders} (validate --on host-{profile.backend})")
            host_target = gpu_host_target(profile)
            # the same kernels as the device library (tuned ones too): what host-opencl validates ships
            host_exe, _ = build_gpu(imported, host_target, relax_pipeline=tuned.relax_pipeline if tuned else None)
            export_library(host_exe, staging / HOST_LIBRARY, None)
            host_library = HOST_LIBRARY
            artifacts.update(_gpu_artifacts(staging, device_exe, gpu_report, profile.backend))
        else:
            say("Building for this machine (host validation)")
            host_target = _tvm_target(HOST_TARGET)
            host_exe = build(imported, host_target)
            export_library(host_exe, staging / HOST_LIBRARY, None)
            host_library = HOST_LIBRARY

        model_copy = f"model.{imported.info.format}"
        shutil.copyfile(model, staging / model_copy)
        if tuned is not None:
            from edgepack.tuning import write_best_records

            write_best_records(tuning, staging / BUILD_TUNING)
        manifest = BuildManifest(
            model_file=model_copy,
            model_format=imported.info.format,
            model_sha256=imported.info.sha256,
            model_source=str(model.resolve()),
            inputs=imported.inputs,
            outputs=outputs,
            profile=profile.to_dict(),
            target=_target_dict(device_target),
            host_target=_target_dict(host_target),
            tvm_version=_tvm_version(),
            tvm_ffi_version=_tvm_ffi_version(),
            edgepack_version=__version__,
            toolchain={"cc": compilers.cc, "cxx": compilers.cxx, "version": compilers.version},
            artifacts={
                **artifacts,
                "host_library": Artifact.of(staging, host_library),
                "model": Artifact.of(staging, model_copy),
            },
            compile_seconds=round(time.perf_counter() - started, 2),
            tuning=str(Path(tuning).resolve()) if tuning is not None else None,
            extra=_gpu_extra(profile.backend, gpu_report) if gpu_report is not None else {},
        )
        manifest.write(staging)
    return CompileResult(output_dir=output_dir, manifest=manifest)


def build(imported: ImportedModel, target, *, system_lib: bool = False, relax_pipeline=None):
    """Run the Relax pipeline (fusion, legalisation, memory planning) and code generation.

    ``relax_pipeline``: another Relax pipeline than TVM's default (e.g. one applying tuning records).
    """
    import tvm
    from tvm import relax

    pipeline = relax_pipeline if relax_pipeline is not None else "default"
    try:
        if system_lib:
            return relax.build(imported.mod, target=target, system_lib=True, relax_pipeline=pipeline)
        return tvm.compile(imported.mod, target=target, relax_pipeline=pipeline)
    except Exception as exc:
        raise CompileError(
            f"TVM failed to compile {imported.info.path.name} for {target.kind.name}: {_first_line(exc)}",
            "This is a gap in TVM's code generation for this model; please report it with the model attached.",
        ) from exc


# --- OpenCL (mobile GPU) profiles: the work is in edgepack.opencl --------------------------------


def build_gpu(imported: ImportedModel, target, *, relax_pipeline=None):
    """``build`` for an OpenCL or webgpu (Vulkan) target: TVM's default GPU pipeline (the target's dlight
    rules), returning ``(executable, opencl.GpuReport)``; CompileError names functions without a GPU schedule."""
    from edgepack import opencl

    if str(target.kind.name) == "webgpu":  # Vulkan profiles: WGSL for wgpu-native (edgepack.vulkan)
        from edgepack import vulkan

        return vulkan.build_gpu(imported, target, relax_pipeline=relax_pipeline)

    return opencl.build_gpu(imported, target, relax_pipeline=relax_pipeline)


def gpu_host_target(profile: Profile):
    """The profile's OpenCL target with this machine as its host (host/model.so, for host-opencl)."""
    import tvm

    return tvm.target.Target(profile.target, host=HOST_TARGET)


def _gpu_artifacts(root: Path, executable, report, backend: str = "opencl") -> dict[str, Artifact]:
    from edgepack import opencl, vulkan

    written = (vulkan if backend == "vulkan" else opencl).write_kernel_files(root, executable, report)
    return {name: Artifact.of(root, rel) for name, rel in written.items()}


def _gpu_extra(backend: str, report) -> dict:
    """manifest.extra of a GPU build: the schedule report under the backend's name."""
    if backend == "vulkan":
        from edgepack import vulkan

        return {vulkan.EXTRA_KEY: vulkan.report_dict(report)}
    return {"opencl": report.to_dict()}


def export_device_library(executable, root: Path, inputs, outputs, compilers: Compilers) -> dict[str, Artifact]:
    """Write device/model.so with the C API's tensor metadata embedded (and device/model.meta)."""
    from edgepack import native

    meta = native.model_meta_text(inputs, outputs)
    (root / DEVICE_LIBRARY).parent.mkdir(parents=True, exist_ok=True)
    (root / DEVICE_META).write_text(meta)
    # -s: the symbol table and debug info are ~40% of the file and the device never needs them
    native.export_model_shared(executable, root / DEVICE_LIBRARY, compilers.cxx, meta_text=meta, cc=compilers.cc,
                               options=["-s"])
    return {"device_library": Artifact.of(root, DEVICE_LIBRARY), "device_meta": Artifact.of(root, DEVICE_META)}


def export_library(executable, path: Path, compilers: Compilers | None) -> None:
    """Link the compiled model into a shared library, with the cross compiler when one is given."""
    from tvm.support import cc

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if compilers is None:
            executable.export_library(str(path))
        else:
            executable.export_library(str(path), fcompile=cc.cross_compiler(compilers.cxx))
    except Exception as exc:
        raise ToolchainError(
            f"Linking {path.name} failed: {_first_line(exc)}",
            "Check the cross compiler with `edgepack doctor`.",
        ) from exc


def output_specs(imported: ImportedModel) -> tuple[TensorSpec, ...]:
    """The compiled model's outputs: names from the model, static shapes from the Relax function."""
    from tvm import relax

    ret = imported.mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    names = [t.name for t in imported.info.outputs]
    if len(names) != len(fields):
        names = [f"output_{i}" for i in range(len(fields))]
    specs = []
    for name, tensor_type in zip(names, fields):
        shape = tuple(int(v) for v in tensor_type.shape.values) if tensor_type.shape is not None else ()
        specs.append(TensorSpec(name, str(tensor_type.dtype), shape))
    return tuple(specs)


def _tvm_target(spec: dict):
    import tvm

    return tvm.target.Target(spec)


def _target_dict(target) -> dict:
    return _jsonable(target.export())


def _jsonable(value):
    """TVM containers (Array, Map, nested Target) as plain JSON values."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "export"):
        return _jsonable(value.export())
    if hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_jsonable(v) for v in value]
    return str(value)


def _tvm_version() -> str:
    from importlib.metadata import version

    return version("apache-tvm")


def _tvm_ffi_version() -> str:
    from importlib.metadata import version

    return version("apache-tvm-ffi")


def fusion_ir(imported: ImportedModel, target=None) -> tuple[str, str]:
    """The Relax program as imported, and after operator fusion (TVM's "zero" pipeline front half)."""
    import tvm
    from tvm import relax

    target = target or _tvm_target(HOST_TARGET)
    fuse = tvm.transform.Sequential([
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ])
    with target:
        fused = fuse(imported.mod)
    return _relax_script(imported.mod), _relax_script(fused)


def _relax_script(mod) -> str:
    """The Relax functions of ``mod``, without the (long) TIR kernels and weights."""
    from tvm import relax

    parts = []
    kernels = 0
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            parts.append(f"# {gv.name_hint}\n{func.script(show_meta=False)}")
        else:
            kernels += 1
    parts.append(f"# ... and {kernels} TIR kernel functions")
    return "\n".join(parts)
