"""C bundles: the directory a user copies into a firmware or app build. No Python on the device.

    dist/rpi4-c/
      include/edgepack.h      the C API (plus tvm/ffi/c_api.h and dlpack.h it builds on)
      include/edgepack_model.h  this model: its inputs and outputs (indices, what compiled-in processing does)
      src/edgepack.c          its implementation, compiled into the user's program
      lib/                    model.so + model.meta, libmodel.a (static), the TVM runtime for the
                              triple (libtvm_runtime/libtvm_ffi, .so and .a)
      examples/main.c         a runner: loads the model, runs it on .npy inputs, writes .npy outputs
      bin/edgepack_run        that runner built against the shared libraries (RUNPATH $ORIGIN/../lib)
      bin/edgepack_run_static the runner with model and runtime linked in: one self-contained file
                              (when the backend links statically: CPU and OpenCL); GPU bundles add the
                              backend's runtime plug-in (lib/libtvm_opencl.{so,a}, or lib/libtvm_vulkan.{so,a}
                              + lib/libwgpu_native.so), linked into the static runner where there is one
      CMakeLists.txt, Makefile
      manifest.json           every file with its size and sha256, the model's inputs and outputs

The same runner, run under qemu-user, is how ``validate --on emulator`` checks a build.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.backends import backend_for
from edgepack.errors import EdgepackError
from edgepack.files import atomic_directory, check_output_dir, file_sha256
from edgepack.frontends import import_model
from edgepack.manifest import BUILD_TUNING, read_manifest
from edgepack.packaging.c_header import HEADER, model_header
from edgepack.processing import build_program, model_dims, model_input_shapes
from edgepack.profiles import get_profile, profile_from_dict
from edgepack.progress import Progress, reporter
from edgepack.run.c_runner import RunResult, run_c_runner
from edgepack.tensors import TensorSpec, check_inputs, load_inputs, random_inputs
from edgepack.toolchain.c_programs import build_c_program
from edgepack.toolchain.compilers import emulator_command, find_compilers
from edgepack.toolchain.model_library import export_model_static
from edgepack.toolchain.sources import C_API, C_API_PRIVATE_HEADERS, c_api_sources, source_dir
from edgepack.toolchain.tvm_runtime import TargetRuntime, ensure_target_runtime
from edgepack.tuning.records import apply_tuning
from edgepack.versions import __version__

BUNDLE_MANIFEST = "manifest.json"
RUNNER = "bin/edgepack_run"
STATIC_RUNNER = "bin/edgepack_run_static"


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


def package_c(
    build_dir: Path | str,
    output_dir: Path | str,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> CBundle:
    """Make the C bundle of a build (see the module docstring)."""
    say = reporter(progress)
    build_dir, output_dir = Path(build_dir), Path(output_dir)
    manifest = read_manifest(build_dir)
    profile = profile_from_dict(manifest.profile)
    backend = backend_for(profile)
    backend.preflight(profile, log=say)  # e.g. no wgpu-native for the triple: say so before any build
    check_output_dir(output_dir, force)
    compilers = find_compilers(profile)
    say(f"Preparing the TVM runtime for {profile.triple}")
    runtime = ensure_target_runtime(profile.triple, compilers.cc, compilers.cxx, need_static=backend.static_bundle,
                                    log=say)
    meta = (build_dir / manifest.artifacts["device_meta"].path).read_text()

    with atomic_directory(output_dir, force=force) as staging, tempfile.TemporaryDirectory() as tmp:
        static_lib = None
        if backend.static_bundle:
            say("Building the static model library (system library)")
            imported = import_model(build_dir / manifest.model_file, model_input_shapes(manifest),
                                    model_dims(manifest))
            records = None
            if (build_dir / BUILD_TUNING).is_dir():  # the same kernels as the shared library
                say("Applying the build's tuning records")
                records = apply_tuning(imported, profile, profile.tvm_target(), build_dir / BUILD_TUNING).records
            program = build_program(imported, manifest, backend.no_byte_tensors)
            system = backend.build(program, profile.tvm_target(), system_lib=True, records=records,
                                   limits=profile.limits)
            static_lib = export_model_static(system.executable, Path(tmp) / "libmodel.a", compilers.cc,
                                             meta_text=meta, packed=backend.packed_modules())

        say("Writing the bundle")
        write_c_bundle(staging, runtime, model_shared=build_dir / manifest.artifacts["device_library"].path,
                       model_static=static_lib, meta_text=meta)
        (staging / "include" / HEADER).write_text(model_header(manifest))
        # the plug-in's static archive too, also where there is no static runner (the user's program may link it)
        extra = backend.runtime_files(profile.triple, compilers, log=say)
        if extra:
            say(f"Adding the {backend.label} runtime")
        for rel, source in extra.items():
            shutil.copy2(source, staging / rel)
        say("Building the example runner")
        build_c_program(runtime, staging / RUNNER, cc=compilers.cc, rpath=["$ORIGIN/../lib"], strip=True)
        if static_lib is not None:
            # a GPU bundle's static runner has the plug-in linked in (no dlopen of it)
            plugin_archives = [staging / rel for rel in extra if rel.endswith(".a")]
            build_c_program(runtime, staging / STATIC_RUNNER, cc=compilers.cc, static=True,
                            model_archive=staging / "lib" / "libmodel.a", extra_archives=plugin_archives, strip=True)
        files = tuple(_describe(staging, p) for p in sorted(staging.rglob("*")) if p.is_file())
        bundle = CBundle(output_dir, profile.name, profile.triple, runtime.origin, manifest.inputs,
                         manifest.outputs, files)
        (staging / BUNDLE_MANIFEST).write_text(json.dumps(bundle.to_dict(), indent=2) + "\n")
    return bundle


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


def write_c_bundle(
    dest: Path,
    runtime: TargetRuntime,
    *,
    model_shared: Path | None = None,
    model_static: Path | None = None,
    meta_text: str | None = None,
) -> Path:
    """Lay out the C bundle in ``dest``: what a user copies to build a program for the device.

    ``include/`` (edgepack.h, tvm/ffi/c_api.h, dlpack/dlpack.h), ``src/`` (edgepack.c, ep_parallel.c/.h, ep_program.c/.h),
    ``examples/main.c``, ``CMakeLists.txt``, ``Makefile`` and ``lib/``: the runtime's shared
    libraries and static archives, ``model.so`` (+ ``model.meta``) and ``libmodel.a``.
    """
    dest = Path(dest)
    c_dir = source_dir(C_API)
    (dest / "include" / "tvm" / "ffi").mkdir(parents=True, exist_ok=True)
    (dest / "include" / "dlpack").mkdir(parents=True, exist_ok=True)
    for sub in ("src", "examples", "lib"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(c_dir / "include" / "edgepack.h", dest / "include" / "edgepack.h")
    c_api = next(p for d in runtime.include_dirs if (p := d / "tvm" / "ffi" / "c_api.h").is_file())
    dlpack = next(p for d in runtime.include_dirs if (p := d / "dlpack" / "dlpack.h").is_file())
    shutil.copy2(c_api, dest / "include" / "tvm" / "ffi" / "c_api.h")
    shutil.copy2(dlpack, dest / "include" / "dlpack" / "dlpack.h")
    for path in (*c_api_sources(), *(c_dir / "src" / h for h in C_API_PRIVATE_HEADERS)):
        shutil.copy2(path, dest / "src" / path.name)
    shutil.copy2(c_dir / "examples" / "main.c", dest / "examples" / "main.c")
    shutil.copy2(c_dir / "CMakeLists.txt", dest / "CMakeLists.txt")
    shutil.copy2(c_dir / "Makefile", dest / "Makefile")
    for lib in (*runtime.shared_libs, *runtime.static_libs):
        shutil.copy2(lib, dest / "lib" / lib.name)
    if model_shared is not None:
        shutil.copy2(model_shared, dest / "lib" / "model.so")
    if model_static is not None:
        shutil.copy2(model_static, dest / "lib" / "libmodel.a")
    if meta_text is not None:
        (dest / "lib" / "model.meta").write_text(meta_text)
    return dest


def run_bundle(bundle_dir: Path | str, inputs: Path | str | dict[str, np.ndarray] | None = None, *, seed: int = 0,
               emulate: bool = True, static: bool = False, save_to: Path | str | None = None) -> RunResult:
    """Run a bundle's own runner (``bin/``), under qemu-user when ``emulate``, on ``inputs`` (an ``.npz``,
    arrays by name, or seeded random ones); ``save_to`` writes the outputs as an ``.npz`` by name."""
    bundle = read_bundle(bundle_dir)
    if inputs is None:
        feeds = random_inputs(bundle.inputs, seed)
    elif isinstance(inputs, dict):
        feeds = check_inputs(inputs, bundle.inputs)
    else:
        feeds = load_inputs(Path(inputs), bundle.inputs)
    prefix = emulator_command(get_profile(bundle.profile)) if emulate else []  # (a profile file's name is not known)
    runner = bundle.static_runner if static else bundle.runner
    library = None if static else bundle.output_dir / "lib" / "model.so"
    result = run_c_runner(prefix, runner, library, feeds, bundle.inputs, bundle.outputs)
    if save_to is not None:
        save_to = Path(save_to)
        save_to.parent.mkdir(parents=True, exist_ok=True)
        np.savez(save_to, **{spec.name: array for spec, array in zip(bundle.outputs, result.outputs)})
    return result
