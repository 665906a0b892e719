"""What the OpenCL (test_opencl.py) and Vulkan (test_vulkan.py) tests share: installing the CPU driver,
tiny Relax modules, compiling each test model once per session, and checking a real GPU build."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import validate_real_model

from edgepack.manifest import read_manifest


def apt_install(packages: list[str], missing: str) -> str | None:
    """Install ``packages`` with apt when we may (root, Debian/Ubuntu); returns why not, or None."""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"{missing}, and it cannot be installed here (needs root and apt-get)"
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True,
                            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if result.returncode != 0:
        return f"`{' '.join(cmd)}` failed: {result.stderr.strip().splitlines()[-1:]}"
    return None


def opencl_driver_missing() -> str | None:
    """Why this machine has no OpenCL device, asked of the system's own tools (``clinfo``), never of
    edgepack's plug-in: a plug-in that fails to load or finds no device must fail the tests, not skip them.
    None where a device is listed; installs PoCL first where it may."""
    def probe() -> str | None:
        if shutil.which("clinfo") is None:
            return "clinfo is not installed (apt-get install clinfo)"
        listed = subprocess.run(["clinfo", "-l"], capture_output=True, text=True, check=False).stdout
        return None if "Device #" in listed else f"clinfo lists no OpenCL device: {listed.strip() or 'nothing'}"

    why = probe()
    if why and apt_install(["clinfo", "pocl-opencl-icd", "ocl-icd-libopencl1"], why) is None:
        why = probe()
    return why


def vulkan_driver_missing() -> str | None:
    """Why this machine has no Vulkan device, asked of ``vulkaninfo`` (not of edgepack); installs lavapipe
    first where it may. None where a device is listed."""
    def probe() -> str | None:
        if shutil.which("vulkaninfo") is None:
            return "vulkaninfo is not installed (apt-get install vulkan-tools)"
        summary = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, check=False,
                                 env=dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp")))
        return None if "deviceName" in summary.stdout else \
            f"vulkaninfo lists no Vulkan device: {(summary.stderr or summary.stdout).strip()[-300:]}"

    why = probe()
    if why and apt_install(["vulkan-tools", "mesa-vulkan-drivers", "libvulkan1"], why) is None:
        why = probe()
    return why


def need_cross_compiler(profile_name: str) -> None:
    """Skip (only where apt cannot install it) unless the profile's cross compiler is here."""
    from edgepack.profiles import get_profile

    toolchain = get_profile(profile_name).toolchain
    if shutil.which(toolchain.cxx) is None:
        why = apt_install([toolchain.apt_package], f"no {toolchain.cxx}")
        if why:
            pytest.skip(why)


def plugin_with_a_device(backend_name: str) -> dict:
    """The backend's runtime plug-in loaded into this process with a device behind it. Skips only where the
    system's own tools list no such device (``*_driver_missing``); a plug-in that fails to load or to see
    the device fails the test."""
    import pytest

    from edgepack.backends import get_backend

    why = {"opencl": opencl_driver_missing, "vulkan": vulkan_driver_missing}[backend_name]()
    if why:
        pytest.skip(why)
    backend = get_backend(backend_name)
    info = backend.load_plugin()
    assert info["available"] and info["devices"], f"edgepack's {backend.label} runtime sees no device: {info}"
    return info


def tiny_module(fn, shapes, name: str = "tiny"):
    """An imported-model stand-in whose ``main`` is ``fn`` over inputs of ``shapes`` ([(shape, dtype)])."""
    import tvm  # noqa: F401
    from tvm import relax

    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(fn(*xs))
        bb.emit_func_output(out)
    return SimpleNamespace(mod=bb.get(), info=SimpleNamespace(path=Path(name)))


def unscheduled_module():
    """A module whose one kernel (``plain_loop``) no GPU schedule rule binds to threads."""
    from tvm import relax
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def plain_loop(a: T.handle, b: T.handle):
        A = T.match_buffer(a, (64,), "float32")
        B = T.match_buffer(b, (64,), "float32")
        for i in range(64):
            with T.sblock("add"):  # an opaque block: no rule binds its loop to threads
                vi = T.axis.opaque(64, i)
                B[vi] = A[vi] + T.float32(1)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64,), "float32"))
    with bb.function("main", [x]):
        gv = bb.add_func(plain_loop, "plain_loop")
        with bb.dataflow():
            y = bb.emit_output(relax.call_tir(gv, [x], relax.TensorType((64,), "float32")))
        bb.emit_func_output(y)
    return SimpleNamespace(mod=bb.get(), info=SimpleNamespace(path=Path("plain.onnx")))


def builds_once(models, root: Path, profile_path: Callable[[str], str] = str,
                plain_kernels: bool = False) -> Callable[[str, str], Path]:
    """``get(model, profile)``: the model compiled for the profile, once per session; with ``plain_kernels``,
    its libraries keep the kernel text plain (``$EDGEPACK_PLAIN_KERNELS``), for tests that edit it."""
    import os

    from edgepack.compiling import compile_model
    from edgepack.toolchain.packed_kernels import PLAIN_ENV

    built: dict[tuple[str, str], Path] = {}

    def get(name: str, profile: str) -> Path:
        if (name, profile) not in built:
            model = models[name]
            out = root / f"{name}-{profile}"
            before = os.environ.get(PLAIN_ENV)
            if plain_kernels:
                os.environ[PLAIN_ENV] = "1"
            try:
                compile_model(model.path, profile_path(profile), out, input_shapes=model.input_shapes)
            finally:
                if plain_kernels and before is None:
                    del os.environ[PLAIN_ENV]
                elif plain_kernels:
                    os.environ[PLAIN_ENV] = before
            built[(name, profile)] = out
        return built[(name, profile)]

    return get


def check_gpu_build(build: Path, backend: str, on: str, model) -> dict:
    """A real model's GPU build: every fused function on the GPU, with a schedule, kernels recorded;
    validated on this machine's device against the model's reference runtime, on random and natural
    inputs (``conftest.validate_real_model``). Returns the GPU report."""
    manifest = read_manifest(build)
    gpu = manifest.extra[backend]
    assert gpu["cpu_fallback"] == [] and gpu["num_kernels"] > 0, gpu
    assert "none" not in gpu["schedules"]
    assert {f"{backend}_kernels", f"{backend}_kernel_index"} <= set(manifest.artifacts)
    reports = validate_real_model(build, on, model, seed=7)
    assert {r.reference for r in reports} == {"litert" if model.path.suffix == ".tflite" else "onnxruntime"}
    return gpu


def check_inverse_trig(profile: str, place: str, tmp_path: Path) -> None:
    """``model_factory.onnx_inverse_trig`` compiled for ``profile`` and validated at ``place`` against ONNX Runtime
    on values in every operator's domain (TVM called C's ``asinhf`` & co.: ``backends/gpu_math.py``)."""
    import numpy as np
    from model_factory import INVERSE_TRIG, onnx_inverse_trig

    import edgepack
    from edgepack.validation import validate

    build = edgepack.compile(onnx_inverse_trig(tmp_path / "trig.onnx"), profile, tmp_path / "b").output_dir
    x = np.random.default_rng(7).uniform(-0.95, 0.95, (4, 33)).astype(np.float32)
    report = validate(build, place, inputs={"x": x})
    assert report.passed and len(report.outputs) == len(INVERSE_TRIG), report.to_dict()



def edit_kernel_text(library: Path, kind: str, edit) -> None:
    """Edit the kernel text a GPU library of a build compiled with plain kernels carries
    (``builds_once(..., plain_kernels=True)``; edgepack stores it compressed otherwise:
    ``toolchain/packed_kernels.py``): ``edit(text_bytes) -> bytes`` of the same length, applied to the
    module's text in place, so the library keeps its layout."""
    from edgepack.toolchain.packed_kernels import SUFFIX

    data = library.read_bytes()
    assert (kind + SUFFIX).encode() not in data, f"{library} stores its kernels compressed: build it plain"
    marker = b"// Function: "
    start, end = data.index(marker), data.rindex(b"\n}\n") + 3
    text = data[start:end]
    edited = edit(text)
    assert len(edited) == len(text) and edited != text, "the edit must change the text and keep its length"
    library.write_bytes(data[:start] + edited + data[end:])


def vulkan_c_runner_and_lib(build: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The C runner built for this machine, and a lib/ holding the build's host/model.so and metadata, as
    a C bundle's lib/ does (``add_vulkan_plugin`` puts the plug-in and wgpu-native beside them)."""
    from edgepack.toolchain.c_programs import build_c_program
    from edgepack.toolchain.tvm_runtime import host_runtime

    runner = build_c_program(host_runtime(), tmp_path / "edgepack_run", cc="gcc", werror=True)
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(build / "host" / "model.so", lib / "model.so")
    shutil.copy(build / "device" / "model.meta", lib / "model.meta")
    return runner, lib


def add_vulkan_plugin(lib: Path) -> None:
    from edgepack.backends import get_backend
    from edgepack.toolchain.compilers import HOST_TRIPLE
    from edgepack.toolchain.wgpu_native import WGPU_LIBRARY

    vulkan = get_backend("vulkan")
    plugin = vulkan.plugin(HOST_TRIPLE)
    shutil.copy(plugin.shared, lib / vulkan.recipe.shared)
    shutil.copy(plugin.files(static=False)[f"lib/{WGPU_LIBRARY}"], lib / WGPU_LIBRARY)


def vulkan_c_runner_outputs(build: Path, tmp_path: Path, inputs: dict) -> list:
    """The build run by the C runner on this machine (host/model.so, the plug-in and wgpu-native side by
    side, as in a C bundle's lib/), on lavapipe."""
    from edgepack.run.c_runner import run_c_runner

    manifest = read_manifest(build)
    runner, lib = vulkan_c_runner_and_lib(build, tmp_path)
    add_vulkan_plugin(lib)
    return run_c_runner([], runner, lib / "model.so", inputs, manifest.inputs, manifest.outputs).outputs
