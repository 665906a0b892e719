"""C bundles: the directory a user copies into a firmware or app build. No Python on the device.

    dist/rpi4-c/
      include/edgepack.h      the C API (plus tvm/ffi/c_api.h and dlpack.h it builds on)
      src/edgepack.c          its implementation, compiled into the user's program
      lib/                    model.so + model.meta, libmodel.a (static), the TVM runtime for the
                              triple (libtvm_runtime/libtvm_ffi, .so and .a)
      examples/main.c         a runner: loads the model, runs it on .npy inputs, writes .npy outputs
      bin/edgepack_run        that runner built against the shared libraries (RUNPATH $ORIGIN/../lib)
      bin/edgepack_run_static the runner with model and runtime linked in: one self-contained file
                              (CPU and OpenCL profiles; OpenCL bundles add lib/libtvm_opencl.so and
                              lib/libtvm_opencl.a, linked into it; Vulkan bundles add lib/libtvm_vulkan.so +
                              lib/libwgpu_native.so, shared only so far)
      CMakeLists.txt, Makefile
      manifest.json           every file with its size and sha256, the model's inputs and outputs

The same runner, run under qemu-user, is how ``validate --on emulator`` checks a build.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack import __version__
from edgepack.atomic import atomic_directory, check_output_dir
from edgepack.errors import EdgepackError, ToolchainError
from edgepack.importers import TensorSpec, file_sha256, import_model
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.paths import cache_root
from edgepack.profiles import Profile, get_profile, profile_from_dict
from edgepack.toolchain import Compilers, emulator_command, find_compilers

Progress = Callable[[str], None]
BUNDLE_MANIFEST = "manifest.json"
RUNNER = "bin/edgepack_run"
STATIC_RUNNER = "bin/edgepack_run_static"
RUN_TIMEOUT_S = 900  # qemu is slow; a stuck run must still end


@dataclass(frozen=True)
class BundleFile:
    path: str
    size: int
    sha256: str
    role: str  # model | runtime | program | source | build


@dataclass(frozen=True)
class CBundle:
    output_dir: Path
    profile: str
    triple: str
    runtime_origin: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    files: tuple[BundleFile, ...]

    def bytes_by_role(self, role: str) -> int:
        return sum(f.size for f in self.files if f.role == role)

    @property
    def runner(self) -> Path:
        return self.output_dir / RUNNER

    @property
    def static_runner(self) -> Path:
        return self.output_dir / STATIC_RUNNER

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": 1,
            "edgepack_version": __version__,
            "profile": self.profile,
            "triple": self.triple,
            "runtime_origin": self.runtime_origin,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "sizes": {role: self.bytes_by_role(role) for role in ("model", "runtime", "program", "source", "build")},
            "files": [asdict(f) for f in self.files],
        }


def target_runtime(profile: Profile, compilers: Compilers, *, need_static: bool, progress: Progress | None = None):
    from edgepack import native

    return native.ensure_target_runtime(profile.triple, compilers.cc, compilers.cxx, need_static=need_static,
                                        log=progress)


def package_c(
    build_dir: Path | str,
    output_dir: Path | str,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> CBundle:
    """Make the C bundle of a build (see the module docstring)."""
    from edgepack import compiler, native

    say = progress or (lambda _msg: None)
    build_dir, output_dir = Path(build_dir), Path(output_dir)
    manifest = read_manifest(build_dir)
    profile = profile_from_dict(manifest.profile)
    if profile.backend not in ("cpu", "opencl", "vulkan"):
        raise EdgepackError(f"C bundles for {profile.backend} profiles are not supported yet.",
                            "Package a build for a CPU, OpenCL or Vulkan profile (rpi4, mali-g610, vulkan-generic).")
    gpu = profile.backend in ("opencl", "vulkan")
    if profile.backend == "vulkan":  # no wgpu-native for the triple (Android): say so before any build
        from edgepack import vulkan

        vulkan.wgpu_native(profile.triple, log=say)
    check_output_dir(output_dir, force)
    compilers = find_compilers(profile)
    say(f"Preparing the TVM runtime for {profile.triple}")
    static_variant = profile.backend in ("cpu", "opencl")  # not yet for Vulkan (wgpu-native is shared only)
    runtime = target_runtime(profile, compilers, need_static=static_variant, progress=say)
    meta = (build_dir / manifest.artifacts["device_meta"].path).read_text()

    with atomic_directory(output_dir, force=force) as staging, tempfile.TemporaryDirectory() as tmp:
        static_lib = None
        if static_variant:
            say("Building the static model library (system library)")
            imported = import_model(build_dir / manifest.model_file,
                                    {t.name: tuple(t.shape) for t in manifest.inputs})
            tuned = _build_tuning(build_dir, imported, profile, say)
            if profile.backend == "opencl":  # host code + the OpenCL kernels (devc.o) in the system library
                from edgepack import opencl

                system_exe, _report = opencl.build_gpu(imported, profile.tvm_target(), system_lib=True,
                                                       relax_pipeline=tuned)
            else:
                system_exe = compiler.build(imported, profile.tvm_target(), system_lib=True, relax_pipeline=tuned)
            static_lib = native.export_model_static(system_exe, Path(tmp) / "libmodel.a", compilers.cc,
                                                    meta_text=meta)

        say("Writing the bundle")
        native.write_c_bundle(staging, runtime, model_shared=build_dir / manifest.artifacts["device_library"].path,
                              model_static=static_lib, meta_text=meta)
        if gpu:
            from edgepack import opencl, vulkan

            gpu_runtime = vulkan if profile.backend == "vulkan" else opencl
            say(f"Adding the {'Vulkan (wgpu-native)' if gpu_runtime is vulkan else 'OpenCL'} runtime module")
            for rel, source in gpu_runtime.bundle_files(profile.triple, compilers.cc, compilers.cxx, log=say).items():
                shutil.copy2(source, staging / rel)
        say("Building the example runner")
        native.build_c_program(runtime, staging / RUNNER, cc=compilers.cc, rpath=["$ORIGIN/../lib"], strip=True)
        if static_lib is not None:
            # an OpenCL bundle's static runner has the OpenCL runtime linked in (no dlopen of the plug-in)
            plugin_archives = [p for p in [staging / "lib" / "libtvm_opencl.a"] if p.is_file()]
            native.build_c_program(runtime, staging / STATIC_RUNNER, cc=compilers.cc, static=True,
                                   model_archive=staging / "lib" / "libmodel.a", extra_archives=plugin_archives,
                                   strip=True)
        files = tuple(_describe(staging, p) for p in sorted(staging.rglob("*")) if p.is_file())
        bundle = CBundle(output_dir, profile.name, profile.triple, runtime.origin, manifest.inputs,
                         manifest.outputs, files)
        (staging / BUNDLE_MANIFEST).write_text(json.dumps(bundle.to_dict(), indent=2) + "\n")
    return bundle


def _build_tuning(build_dir: Path, imported, profile: Profile, say: Progress):
    """The pipeline applying a tuned build's records (kept in the build), so the static library
    has the same kernels as the shared one; None for an untuned build."""
    from edgepack.compiler import BUILD_TUNING

    records = build_dir / BUILD_TUNING
    if not records.is_dir():
        return None
    from edgepack.tuning import apply_tuning

    say("Applying the build's tuning records")
    return apply_tuning(imported, profile.tvm_target(), records).relax_pipeline


def _describe(root: Path, path: Path) -> BundleFile:
    rel = path.relative_to(root).as_posix()
    name = path.name
    if name in ("model.so", "model.meta", "libmodel.a"):
        role = "model"
    elif name.startswith(("libtvm", "libwgpu")):  # libtvm_runtime, libtvm_ffi, libtvm_opencl/vulkan, wgpu-native
        role = "runtime"
    elif rel.startswith("bin/"):
        role = "program"
    elif rel.startswith(("include/", "src/", "examples/")):
        role = "source"
    else:
        role = "build"
    return BundleFile(rel, path.stat().st_size, file_sha256(path), role)


def read_bundle(bundle_dir: Path | str) -> CBundle:
    bundle_dir = Path(bundle_dir)
    try:
        data = json.loads((bundle_dir / BUNDLE_MANIFEST).read_text())
        return CBundle(bundle_dir, data["profile"], data["triple"], data["runtime_origin"],
                       tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
                       tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
                       tuple(BundleFile(**f) for f in data["files"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgepackError(f"{bundle_dir} is not an edgepack C bundle ({exc}).",
                            "Make one with `edgepack package c BUILD_DIR -o DIR`.") from exc


# --- running the C runner (under qemu-user for ARM profiles) -----------------------------------


@dataclass(frozen=True)
class RunResult:
    outputs: list[np.ndarray]
    seconds: float
    command: list[str]


def run_c_runner(
    command_prefix: list[str],
    runner: Path,
    model_library: Path | None,
    inputs: dict[str, np.ndarray],
    input_specs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
) -> RunResult:
    """Run ``runner`` (the example program) on ``inputs`` and read back its ``.npy`` outputs."""
    with tempfile.TemporaryDirectory(prefix="edgepack-run-") as tmp:
        tmp_path = Path(tmp)
        argv = [*command_prefix, str(runner)]
        if model_library is not None:
            argv.append(str(model_library))
        for i, spec in enumerate(input_specs):
            path = tmp_path / f"input{i}.npy"
            np.save(path, np.ascontiguousarray(inputs[spec.name]))
            argv += ["--input", f"{spec.name}={path}"]
        out_dir = tmp_path / "out"
        out_dir.mkdir()
        argv += ["--output-dir", str(out_dir)]
        started = time.perf_counter()
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ToolchainError(f"{runner.name} did not finish within {RUN_TIMEOUT_S} s.",
                                 "The model may be too large for emulation; try a real device.") from exc
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise EdgepackError(
                f"{runner.name} failed (exit {result.returncode}): {message[-1] if message else 'no output'}",
                "Check the model library matches the runner's architecture (`file` shows it).",
            )
        arrays = []
        for i in range(len(outputs)):
            found = sorted(out_dir.glob(f"{i}_*.npy"))
            if not found:
                raise EdgepackError(f"{runner.name} wrote no output {i}.", "This is a bug; please report it.")
            arrays.append(np.load(found[0]))
        return RunResult(arrays, seconds, argv)


def _runner_for_profile(profile: Profile, progress: Progress | None = None) -> Path:
    """The example runner for a profile's triple, built once and cached (it loads any model.so)."""
    from edgepack import native

    compilers = find_compilers(profile)
    runtime = target_runtime(profile, compilers, need_static=False, progress=progress)
    c_dir = native.runtimes_dir() / "c"
    key = hashlib.sha256("\n".join([
        str(runtime.root), compilers.version, file_sha256(c_dir / "examples" / "main.c"),
        file_sha256(c_dir / "src" / "edgepack.c"), file_sha256(c_dir / "include" / "edgepack.h"),
    ]).encode()).hexdigest()[:12]
    runner = cache_root() / "runners" / f"{profile.triple}-{key}" / "edgepack_run"
    if not runner.exists():
        if progress:
            progress(f"Building the example runner for {profile.triple}")
        with tempfile.TemporaryDirectory(dir=_ensure_dir(runner.parent.parent)) as tmp:
            built = native.build_c_program(runtime, Path(tmp) / "edgepack_run", cc=compilers.cc)
            runner.parent.mkdir(parents=True, exist_ok=True)
            built.replace(runner)
    return runner


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_on_emulator(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A BuildRunner: the device library, run by the C runner under qemu-user (no Python involved)."""
    profile = profile_from_dict(manifest.profile)
    if profile.backend == "opencl":  # no emulated OpenCL GPU: say so, and what to use instead
        from edgepack.opencl import refuse_emulator

        refuse_emulator(build_dir, manifest)
    if profile.backend == "vulkan":  # no emulated Vulkan GPU either
        from edgepack import vulkan

        vulkan.refuse_emulator(build_dir, manifest)
    prefix = emulator_command(profile)
    runner = _runner_for_profile(profile)
    library = build_dir / manifest.artifacts["device_library"].path
    return run_c_runner(prefix, runner, library, inputs, manifest.inputs, manifest.outputs).outputs


def run_bundle(bundle_dir: Path | str, inputs: dict[str, np.ndarray], *, emulate: bool = True,
               static: bool = False) -> RunResult:
    """Run a bundle's own runner (``bin/``) on inputs, under qemu-user when ``emulate``."""
    bundle = read_bundle(bundle_dir)
    profile = get_profile(bundle.profile)
    prefix = emulator_command(profile) if emulate else []
    runner = bundle.static_runner if static else bundle.runner
    library = None if static else bundle.output_dir / "lib" / "model.so"
    return run_c_runner(prefix, runner, library, inputs, bundle.inputs, bundle.outputs)
