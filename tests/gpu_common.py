"""What the OpenCL (test_opencl.py) and Vulkan (test_vulkan.py) tests share: installing the CPU driver,
tiny Relax modules, compiling each test model once per session, and checking a real GPU build."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from edgepack.manifest import read_manifest
from edgepack.validation import validate


def apt_install(packages: list[str], missing: str) -> str | None:
    """Install ``packages`` with apt when we may (root, Debian/Ubuntu); returns why not, or None."""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"{missing}, and it cannot be installed here (needs root and apt-get)"
    cmd = ["apt-get", "install", "-y", "-q", *packages]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True,
                            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if result.returncode != 0:
        return f"`{' '.join(cmd)}` failed: {result.stderr.strip().splitlines()[-1:]}"
    return None


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

    @T.prim_func(private=True)
    def plain_loop(a: T.handle, b: T.handle):
        A = T.match_buffer(a, (64,), "float32")
        B = T.match_buffer(b, (64,), "float32")
        for i in range(64):
            B[i] = A[i] + T.float32(1)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64,), "float32"))
    with bb.function("main", [x]):
        gv = bb.add_func(plain_loop, "plain_loop")
        with bb.dataflow():
            y = bb.emit_output(relax.call_tir(gv, [x], relax.TensorType((64,), "float32")))
        bb.emit_func_output(y)
    return SimpleNamespace(mod=bb.get(), info=SimpleNamespace(path=Path("plain.onnx")))


def builds_once(models, root: Path, profile_path: Callable[[str], str] = str) -> Callable[[str, str], Path]:
    """``get(model, profile)``: the model compiled for the profile, once per session."""
    from edgepack.compiling import compile_model

    built: dict[tuple[str, str], Path] = {}

    def get(name: str, profile: str) -> Path:
        if (name, profile) not in built:
            model = models[name]
            out = root / f"{name}-{profile}"
            compile_model(model.path, profile_path(profile), out, input_shapes=model.input_shapes)
            built[(name, profile)] = out
        return built[(name, profile)]

    return get


def check_gpu_build(build: Path, backend: str, on: str, model: str) -> dict:
    """A real model's GPU build: every fused function on the GPU, with a schedule, kernels recorded;
    validated on this machine's device against the model's reference runtime. Returns the GPU report."""
    manifest = read_manifest(build)
    gpu = manifest.extra[backend]
    assert gpu["cpu_fallback"] == [] and gpu["num_kernels"] > 0, gpu
    assert "none" not in gpu["schedules"]
    assert {f"{backend}_kernels", f"{backend}_kernel_index"} <= set(manifest.artifacts)
    report = validate(build, on, seed=7)
    assert report.passed, report
    assert report.reference == ("litert" if model == "face_detection_short_range" else "onnxruntime")
    return gpu
