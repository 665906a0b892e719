"""Compile a model for a device profile: import, the profile's backend (pipeline and code generation),
cross-link, and a build directory that says how it was made.

A build directory holds::

    manifest.json        how it was made (written last)
    model.onnx|.tflite   the source model, the reference for validation
    device/model.so      for the device, linked with the profile's cross compiler, with its tensor
                         metadata embedded (the C API reads it)
    device/model.meta    that metadata as text
    device/kernels.*     GPU builds: the kernels and their launch sizes
    host/model.so        the same model built for this machine, used by host validation
    tuning/              with --tuning: the best records applied (``package c`` rebuilds with them)

The directory is written atomically: a temporary directory that is renamed only when complete.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from edgepack.backends import backend_for, target_dict
from edgepack.backends.half_precision import half_precision
from edgepack.dims import Dims, parse_dims
from edgepack.errors import CompileError, ShapeError, ToolchainError, first_line
from edgepack.files import atomic_directory, check_output_dir
from edgepack.frontends import ImportedModel, import_model
from edgepack.manifest import BUILD_TUNING, DEVICE_LIBRARY, DEVICE_META, HOST_LIBRARY, Artifact, BuildManifest
from edgepack.processing import (
    PostprocessLike,
    PreprocessLike,
    parse_postprocess,
    parse_preprocess,
    plan_processing,
    processed_model,
)
from edgepack.profiles import PRECISIONS, Profile, get_profile, require_supported
from edgepack.progress import Progress, reporter
from edgepack.tensors import Dim, TensorSpec
from edgepack.toolchain.compilers import Compilers, find_compilers
from edgepack.toolchain.model_library import RUNTIME_DIM, export_model_shared, model_meta_text
from edgepack.toolchain.packed_kernels import Packed, packing
from edgepack.tuning.records import apply_tuning, write_best_records
from edgepack.versions import __version__, installed_tvm


@dataclass(frozen=True)
class CompileResult:
    """A build directory and its manifest."""

    output_dir: Path
    manifest: BuildManifest

    @property
    def device_library(self) -> Path:
        return self.output_dir / self.manifest.artifacts["device_library"].path

    @property
    def host_library(self) -> Path:
        return self.output_dir / self.manifest.artifacts["host_library"].path

    def to_dict(self) -> dict:
        return {"output_dir": str(self.output_dir)} | self.manifest.to_dict()


def compile_model(
    model: Path | str,
    profile: Profile | str,
    output_dir: Path | str,
    *,
    input_shapes: dict[str, tuple[Dim, ...]] | None = None,
    dims: Dims | list[str] | None = None,
    force: bool = False,
    ndk: str | None = None,
    tuning: Path | str | None = None,
    preprocess: PreprocessLike | list[PreprocessLike] | None = None,
    postprocess: PostprocessLike | list[PostprocessLike] | None = None,
    precision: str | None = None,
    gpu_only: bool = False,
    progress: Progress | None = None,
) -> CompileResult:
    """Compile ``model`` (.onnx or .tflite) for ``profile`` into the build directory ``output_dir``.

    ``input_shapes`` fixes dynamic input dimensions (``{"x": (1, 3, 224, 224)}``), or names those that change
    at run time (``{"x": (1, 3, 48, "W")}``) whose ranges ``dims`` gives (``["W=32..1280:8"]`` as on the
    command line, or ``edgepack.dims.DimRange`` by name): one build then runs at every size in range; ``tuning`` is a
    tuning directory (``edgepack.tune``) made for this model, input shapes and target, whose best
    records are applied; ``ndk`` locates the Android NDK for Android profiles.

    ``precision``: "fp32", or "fp16" (GPU profiles: float tensors stored and computed in half precision,
    products accumulated as the profile's ``[precision] accumulate`` says; inputs and outputs stay float32);
    None: the profile's ``[precision] default``.

    GPU profiles run the operators their GPU cannot compute exactly (64-bit integers in WGSL, scans TVM's GPU
    kernels get wrong) on the device's CPU, in the same program; the manifest's ``cpu_operators`` lists them.
    ``gpu_only`` refuses such a model instead, naming them.

    ``preprocess`` / ``postprocess`` compile processing into the same program (``edgepack.processing``):
    strings as on the command line (``"input=image:bgr8,size=480x640,mean=123.7/116.3/103.5"``,
    ``"logits=topk:5"``, ``"boxes,scores=nms:iou=0.45"``), TOML files, or ``ImagePreprocess`` /
    ``OutputPostprocess`` / ``NmsPostprocess`` objects; the build's inputs and outputs are then the
    processed ones (uint8 frames in; top-K, detections out). Raises an
    :class:`~edgepack.errors.EdgepackError` that names the problem and its fix.
    """
    say = reporter(progress)
    started = time.perf_counter()
    model, output_dir = Path(model), Path(output_dir)
    profile = get_profile(profile) if isinstance(profile, str) else profile
    require_supported(profile)
    backend = backend_for(profile)
    check_output_dir(output_dir, force)  # fail before minutes of work, not after
    pre, post = parse_preprocess(preprocess), parse_postprocess(postprocess)
    compilers = find_compilers(profile, ndk=ndk)
    backend.preflight(profile, log=say)
    precision = check_precision(precision or profile.precision.default, profile, backend)
    if precision == "fp16" and tuning is not None:
        raise CompileError("Tuning records apply to fp32 builds only: `edgepack tune` times the fp32 kernels.",
                           "Compile with --precision fp32 and --tuning, or with --precision fp16 without it.")

    dims = parse_dims(dims) if isinstance(dims, list) else dict(dims or {})
    if dims and backend.no_symbolic_shapes:
        raise ShapeError(f"{profile.name} builds cannot take --dim yet: {backend.no_symbolic_shapes}.",
                         "Compile one build per size with --input-shape, or use a CPU profile.")
    frame_dims = frame_sizes(pre, dims)  # frames of any size in range (size=FHxFW), resized to the model's
    say(f"Importing {model.name}")
    imported = import_model(model, input_shapes, {n: r for n, r in dims.items() if n not in frame_dims})
    model_outputs = output_specs(imported)
    if imported.dims and (pre or post):
        raise ShapeError("Compiled-in processing (--preprocess/--postprocess) takes fixed model shapes so far; this"
                         " build has model dimensions that change at run time (--dim).",
                         "Compile without --dim on the model's inputs (frames may still change size: "
                         "--preprocess NAME=image:rgb8,size=FHxFW with --dim FH=... --dim FW=...), or without the "
                         "processing.")
    plan = plan_processing(pre, post, imported.inputs, model_outputs) if pre or post else None
    device_target = profile.tvm_target()
    applied = None
    if tuning is not None:  # checked before any build, applied to the device build
        say(f"Reading the tuning records in {tuning}")
        applied = apply_tuning(imported, profile, device_target, tuning)
        if applied.stale_tasks:
            say(f"{len(applied.stale_tasks)} tuned kernel(s) keep their default schedule, which this edgepack makes "
                f"differently than when they were tuned ({', '.join(applied.stale_tasks)}): `edgepack tune` on "
                f"{tuning} times the new defaults (no new trials needed) and applies records that still beat them")
    records = applied.records if applied else None
    # the processing around the model: one program, fused by the backend's pipeline like the model
    program = processed_model(imported, plan, word_reads=backend.no_byte_tensors, dims=frame_dims) if plan else imported
    outputs = plan.results if plan else model_outputs
    if precision == "fp16":
        say(f"Converting to half precision (products accumulate in {profile.precision.accumulate})")
        program = dataclasses.replace(program, mod=half_precision(program.mod, profile.precision.accumulate_dtype,
                                                                  model.name))

    with atomic_directory(output_dir, force=force) as staging:
        say(f"Building for {profile.name} ({profile.triple}, {backend.label})"
            + (f" with tuned kernels ({applied.tuned_tasks}/{applied.total_tasks})" if applied else ""))
        device_build = backend.build(program, device_target, records=records, limits=profile.limits,
                                     gpu_only=gpu_only)
        if records is not None and records.sizes:
            _say_unreplayed(say, applied.tuned_tasks, device_build.report.counts().get("tuned", 0),
                            {n: v for n, v in records.sizes.items() if n in dims})
        say(f"Linking the device library with {Path(compilers.cxx).name}")
        artifacts = export_device_library(device_build.executable, staging, program.inputs, outputs, compilers, dims,
                                          backend.packed_modules())
        artifacts.update({name: Artifact.of(staging, rel)
                          for name, rel in backend.write_artifacts(staging, device_build).items()})

        if profile.is_host:
            host_library, host_target = DEVICE_LIBRARY, device_target
        else:
            say(f"Building for this machine (validate --on {backend.host_place})")
            host_target = backend.host_target(profile)
            host_build = backend.build(program, host_target, records=backend.host_records(records),
                                       limits=profile.limits, gpu_only=gpu_only)
            export_library(host_build.executable, staging / HOST_LIBRARY, backend.packed_modules())
            host_library = HOST_LIBRARY

        model_copy = f"model.{imported.info.format}"
        shutil.copyfile(model, staging / model_copy)
        if tuning is not None:
            write_best_records(tuning, staging / BUILD_TUNING)
        tvm_version, ffi_version = installed_tvm()
        manifest = BuildManifest(
            model_file=model_copy,
            model_format=imported.info.format,
            model_sha256=imported.info.sha256,
            model_source=str(model.resolve()),
            inputs=program.inputs,
            outputs=outputs,
            profile=profile.to_dict(),
            target=target_dict(device_target),
            host_target=target_dict(host_target),
            tvm_version=tvm_version,
            tvm_ffi_version=ffi_version,
            edgepack_version=__version__,
            toolchain={"cc": compilers.cc, "cxx": compilers.cxx, "version": compilers.version},
            artifacts={
                **artifacts,
                "host_library": Artifact.of(staging, host_library),
                "model": Artifact.of(staging, model_copy),
            },
            compile_seconds=round(time.perf_counter() - started, 2),
            tuning=str(Path(tuning).resolve()) if tuning is not None else None,
            extra={**backend.manifest_extra(device_build),
                   **({"constants": device_build.constants.to_dict()} if device_build.constants else {}),
                   **({"run_memory": device_build.run_memory} if device_build.run_memory is not None else {})},
            processing=plan.to_dict() if plan else None,
            dims={name: r.to_dict() for name, r in dims.items()} or None,
            precision=precision,
        )
        manifest.write(staging)
    return CompileResult(output_dir=output_dir, manifest=manifest)


def frame_sizes(pre, dims: Dims) -> Dims:
    """The ``dims`` that frames' sizes name (``--preprocess NAME=image:rgb8,size=FHxFW``); a ShapeError for a name
    no ``--dim`` gives a range for."""
    named = [d for s in pre for d in (s.size or ()) if isinstance(d, str)]
    missing = sorted(set(named) - set(dims))
    if missing:
        raise ShapeError(f"--preprocess size= names {', '.join(missing)}, which no --dim gives a range for.",
                         f"Add --dim {missing[0]}=MIN..MAX (e.g. --dim {missing[0]}=240..1080), or give the size in "
                         "pixels (size=480x640).")
    return {n: dims[n] for n in dict.fromkeys(named)}


def check_precision(precision: str, profile: Profile, backend) -> str:
    """``precision`` when it is one of ``PRECISIONS`` that ``backend`` computes in, else a CompileError."""
    if precision not in PRECISIONS:
        raise CompileError(f"Unknown precision {precision!r}.", f"Use one of {', '.join(PRECISIONS)}.")
    if precision == "fp16" and backend.no_half_precision:
        raise CompileError(f"{profile.name} builds cannot compute in fp16: {backend.no_half_precision}.",
                           "Compile with --precision fp32 (the default for CPU profiles), or for a GPU profile "
                           "(mali-g610, vulkan-generic).")
    return precision


def export_device_library(executable, root: Path, inputs, outputs, compilers: Compilers,
                          dims: Dims | None = None, packed: Packed | None = None) -> dict[str, Artifact]:
    """Write device/model.so with the C API's tensor metadata embedded (and device/model.meta)."""
    ranges = {name: (r.min, r.max, r.step) for name, r in (dims or {}).items()}
    meta = model_meta_text(inputs, outputs, dims=ranges)  # version 1, as before, without dims
    (root / DEVICE_LIBRARY).parent.mkdir(parents=True, exist_ok=True)
    (root / DEVICE_META).write_text(meta)
    # -s: the symbol table and debug info are ~40% of the file and the device never needs them.
    # -z norelro: read-only relocations end on a page of the largest size the target allows (aarch64's
    # 64 KiB), and the linker pads the file to it: up to 64 KiB more, 198 -> 142 KB for MLPerf Tiny's
    # ResNet-8 on Vulkan. The library has a few dozen GOT entries; it still loads on every page size
    # (-z max-page-size=16384 would save as much but not load where pages are 64 KiB).
    export_model_shared(executable, root / DEVICE_LIBRARY, compilers.cxx, meta_text=meta, cc=compilers.cc,
                        options=["-s", "-Wl,-z,norelro"], packed=packed)
    return {"device_library": Artifact.of(root, DEVICE_LIBRARY), "device_meta": Artifact.of(root, DEVICE_META)}


def export_library(executable, path: Path, packed: Packed | None = None) -> None:
    """Link the compiled model into a shared library for this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # GPU kernels stored compressed, as in the device library, so that host validation loads them the same way
    try:
        executable.export_library(str(path), **packing(os.environ.get("CXX", "g++"), None, packed or {}))
    except Exception as exc:
        raise ToolchainError(f"Linking {path.name} failed: {first_line(exc)}",
                             "Check this machine's C++ compiler with `edgepack doctor`.") from exc


def output_specs(imported: ImportedModel) -> tuple[TensorSpec, ...]:
    """The compiled model's outputs: names from the model, static shapes from the Relax function."""
    from tvm import relax

    def flat(ty) -> list:  # nested tuples (ONNX sequences) come out flat, as every runner returns them
        return [f for field in ty.fields for f in flat(field)] if isinstance(ty, relax.TupleType) else [ty]

    fields = flat(imported.mod["main"].ret_ty)
    names = [t.name for t in imported.info.outputs]
    if len(names) != len(fields):
        names = [f"output_{i}" for i in range(len(fields))]
    specs = []
    for name, tensor_type in zip(names, fields):
        specs.append(TensorSpec(name, str(tensor_type.dtype), _static_dims(tensor_type)))
    return tuple(specs)


def _static_dims(tensor_type) -> tuple:
    """The output's dimensions; those the model decides at run time (NonZero, Unique ...) are "?"."""
    from tvm import tirx

    if tensor_type.shape is None:
        return (RUNTIME_DIM,) * max(int(tensor_type.ndim), 0)
    return tuple(int(v) if isinstance(v, tirx.IntImm) else RUNTIME_DIM for v in tensor_type.shape.values)


def fusion_ir(imported: ImportedModel, target=None) -> tuple[str, str]:
    """The Relax program as imported, and after operator fusion (TVM's "zero" pipeline front half)."""
    import tvm
    from tvm import relax

    target = target or tvm.target.Target({"kind": "llvm"})
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


def _say_unreplayed(say, tuned: int, scheduled: int, sizes: dict[str, int]) -> None:
    """A dynamic build applies records tuned at one size (``sizes``: its dims') by replaying them on its
    symbolic kernels (``backends/sized_records.py``); say so where fewer kernels took one than were tuned."""
    if scheduled >= tuned:
        return
    at = ", ".join(f"{name}={value}" for name, value in sizes.items())
    say(f"{tuned - scheduled} of the {tuned} tuned kernel(s) keep their default schedule: their records (tuned at "
        f"{at}) do not replay on this build's kernels of run-time sizes (on GPUs, a tile of shared memory over a "
        "run-time extent); the build's report lists the kernels that took one as 'tuned'")
