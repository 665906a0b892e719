"""Mobile GPUs (OpenCL): edgepack's OpenCL runtime for TVM, run on PoCL (a real OpenCL
implementation on this CPU), with the real test models compiled for mali-g610 and adreno-6xx.

Without an Android NDK, Adreno is compiled through ``adreno-6xx-linux``: the adreno-6xx profile's
GPU target (same keys, same dlight rules, so the same kernels) with an aarch64 Linux host toolchain
instead of the NDK. With an NDK (ANDROID_NDK_HOME / TVM_NDK_CC) the real profile is used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli, skip_outside_setup
from gpu_common import (
    builds_once,
    check_gpu_build,
    edit_kernel_text,
    plugin_with_a_device,
    tiny_module,
    unscheduled_module,
)
from mutation import wrong_build

import edgepack
from edgepack.backends import get_backend
from edgepack.backends.gpu import module_source
from edgepack.backends.opencl import KERNEL_DECLARATION, driver_status
from edgepack.compiling import compile_model
from edgepack.errors import CompileError, EdgepackError, ValidationError
from edgepack.frontends import run_reference
from edgepack.manifest import read_manifest
from edgepack.profiles import get_profile
from edgepack.tensors import random_inputs
from edgepack.toolchain.compilers import HOST_TRIPLE
from edgepack.validation import compare, validate

ROOT = Path(__file__).resolve().parent.parent
OPENCL_SRC = ROOT / "runtimes" / "plugins" / "opencl"
# one real model per family and each OpenCL pipeline (Mali's generic one, Adreno's); every model of the zoo is
# swept by `scripts/zoo.py --profiles mali-g610` and, on a machine without the NDK, with the aarch64-Linux
# stand-in of gpu_profiles below as adreno-6xx (docs/conformance.md)
REAL_MODELS = [("mobilenetv2", "mali-g610"), ("mobilenetv2", "adreno-6xx"), ("face_detection_short_range", "mali-g610"),
               ("ppocr_cls", "mali-g610")]
OPENCL = get_backend("opencl")


# ----------------------------------------------------------------------------------------------
# fixtures


def _has_ndk() -> bool:
    return any(os.environ.get(v) for v in ("TVM_NDK_CC", "ANDROID_NDK_HOME", "ANDROID_NDK_ROOT"))


@pytest.fixture(scope="session")
def pocl():
    """The plug-in loaded into this process and an OpenCL device (PoCL) behind tvm.opencl(0). Skips only
    where the system itself lists no OpenCL device; a plug-in that fails to load or to see it fails."""
    plugin_with_a_device("opencl")
    return OPENCL.runtime_info()


@pytest.fixture(scope="session")
def gpu_profiles(tmp_path_factory) -> dict[str, str]:
    """Profile name or TOML path to compile with, per GPU profile (see the module docstring)."""
    chosen = {"mali-g610": "mali-g610", "adreno-6xx": "adreno-6xx"}
    if not _has_ndk():
        adreno = get_profile("adreno-6xx")
        target = "\n".join(f"{k} = {json.dumps(v)}" for k, v in adreno.target.items())
        path = tmp_path_factory.mktemp("profiles") / "adreno-6xx-linux.toml"
        path.write_text(f"""name = "adreno-6xx-linux"
description = "adreno-6xx's GPU target with an aarch64 Linux host (tests without an NDK)"
status = "supported"
backend = "opencl"
triple = "aarch64-linux-gnu"

[target]
{target}

[host_target]
kind = "llvm"
mtriple = "aarch64-linux-gnu"
mattr = ["+neon"]

[toolchain]
cc = "aarch64-linux-gnu-gcc"
cxx = "aarch64-linux-gnu-g++"
apt_package = "g++-aarch64-linux-gnu"
""")
        chosen["adreno-6xx"] = str(path)
    return chosen


@pytest.fixture(scope="session")
def gpu_build(models, gpu_profiles, tmp_path_factory):
    """Compile each (model, GPU profile) once per session."""
    return builds_once(models, tmp_path_factory.mktemp("gpu-builds"), gpu_profiles.__getitem__)


@pytest.fixture(scope="session")
def plain_build(models, gpu_profiles, tmp_path_factory):
    """As ``gpu_build``, the libraries' kernel text plain, for the tests that edit it."""
    return builds_once(models, tmp_path_factory.mktemp("plain-builds"), gpu_profiles.__getitem__, plain_kernels=True)


def _mali_target(host=None):
    import tvm

    return tvm.target.Target(get_profile("mali-g610").target, host=host or {"kind": "llvm"})


# ----------------------------------------------------------------------------------------------
# the plug-in itself


def test_cl_api_header_matches_khronos():
    """src/cl_api.h (no OpenCL SDK needed to build) agrees with CL/cl.h: constants, types, signatures."""
    if not Path("/usr/include/CL/cl.h").is_file():
        pytest.skip("opencl-headers is not installed (apt-get install opencl-headers)")
    result = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                             "-I", str(OPENCL_SRC / "src"), str(OPENCL_SRC / "tests" / "check_cl_api.cc")],
                            check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_plugin_builds_warning_free_without_linking_opencl(tmp_path):
    """-Wall -Wextra -Werror on our sources; libtvm_opencl.so does not depend on libOpenCL."""
    from edgepack.toolchain.tvm_runtime import host_runtime, tvm_source_dirs

    rt = host_runtime()
    tvm_dir, ffi_dir = tvm_source_dirs()
    libs = {p.name: p for p in rt.shared_libs}
    build = tmp_path / "b"
    configure = ["cmake", "-S", str(OPENCL_SRC), "-B", str(build), f"-DTVM_SOURCE_DIR={tvm_dir}",
                 f"-DTVM_FFI_SOURCE_DIR={ffi_dir}", f"-DTVM_RUNTIME_LIBRARY={libs['libtvm_runtime.so']}",
                 f"-DTVM_FFI_LIBRARY={libs['libtvm_ffi.so']}", "-DEDGEPACK_OPENCL_WERROR=ON"]
    subprocess.run(configure, check=True, capture_output=True)
    result = subprocess.run(["cmake", "--build", str(build), "-j2"], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning" not in (result.stdout + result.stderr).lower()
    dynamic = subprocess.run(["readelf", "-d", str(build / "lib" / "libtvm_opencl.so")], capture_output=True,
                             text=True, check=True).stdout
    needed = {line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line}
    assert {"libtvm_runtime.so", "libtvm_ffi.so"} <= needed
    assert not any("OpenCL" in n for n in needed), needed
    assert (build / "lib" / "libtvm_opencl.a").is_file()


def test_plugin_registers_device_api_and_lists_pocl(pocl):
    import tvm
    import tvm_ffi

    assert tvm_ffi.get_global_func("device_api.opencl", allow_missing=True) is not None
    assert tvm_ffi.get_global_func("ffi.Module.load_from_bytes.opencl", allow_missing=True) is not None
    assert pocl["library"].startswith("libOpenCL") and pocl["devices"][0]["platform"]
    dev = tvm.opencl(0)
    assert dev.exist and dev.max_threads_per_block >= 1 and dev.device_name == pocl["devices"][0]["name"]
    assert dev.warp_size == 1 and dev.max_shared_memory_per_block > 0 and dev.total_global_memory > 0
    assert not tvm.opencl(len(pocl["devices"])).exist
    assert OPENCL.load_plugin() == pocl  # loading again is a no-op


def test_doctor_status_sees_the_device(pocl):
    ok, found, hint = driver_status()
    assert ok and pocl["devices"][0]["name"] in found and hint == ""


def test_tensors_copy_to_and_from_the_device(pocl):
    import tvm

    dev = tvm.opencl(0)
    host = np.random.default_rng(0).random((3, 5, 7), dtype=np.float32)
    a = tvm.runtime.tensor(host, device=dev)
    assert str(a.device) == str(dev)
    np.testing.assert_array_equal(a.numpy(), host)
    b = tvm.runtime.empty(host.shape, "float32", dev)
    a.copyto(b)  # device -> device
    np.testing.assert_array_equal(b.numpy(), host)
    empty = tvm.runtime.tensor(np.zeros((0, 4), np.float32), device=dev)
    assert empty.numpy().shape == (0, 4)


def test_compiled_module_runs_and_reports_its_kernels(pocl, tmp_path):
    """A small Relax program (add, softmax, sum) through the GPU pipeline and the runtime module."""
    import tvm
    from tvm import relax

    tiny = tiny_module(lambda x: relax.op.sum(relax.op.nn.softmax(relax.op.add(x, x)), axis=[1]),
                        [((4, 64), "float32")])
    built = OPENCL.build(tiny, _mali_target())
    executable, report = built.executable, built.report
    assert report.pipeline == "gpu_generic" and report.unscheduled == []
    assert {k.name for k in report.kernels} >= {"add_kernel", "softmax_kernel"}
    softmax = next(k for k in report.kernels if k.name == "softmax_kernel")
    assert softmax.launch_params == ("blockIdx.x", "threadIdx.x") and softmax.grid[0] == 4
    assert softmax.source.startswith("// Function: softmax_kernel") and "barrier(" in softmax.source

    executable.export_library(str(tmp_path / "tiny.so"))
    loaded = tvm.runtime.load_module(str(tmp_path / "tiny.so"))
    ocl = [m for m in loaded.imports[0].imports if m.kind == "opencl"]
    assert ocl and "__kernel void softmax_kernel" in ocl[0].inspect_source()
    dev = tvm.opencl(0)
    x = np.random.default_rng(1).random((4, 64), dtype=np.float32)
    out = relax.VirtualMachine(loaded, dev)["main"](tvm.runtime.tensor(x, device=dev)).numpy()
    np.testing.assert_allclose(out, np.ones(4, np.float32), rtol=1e-5)


def test_functions_without_a_gpu_schedule_are_refused_by_name_with_gpu_only():
    """TVM would compile them as CPU code handed GPU buffers; with --gpu-only edgepack refuses and names them
    (without, they run on the device's CPU: tests/test_cpu_fallback.py)."""
    with pytest.raises(CompileError, match="No GPU schedule for 1 fused function.*plain_loop") as err:
        OPENCL.build(unscheduled_module(), _mali_target(), gpu_only=True)
    assert "--gpu-only" in err.value.message and "rpi4" in err.value.hint


def test_topi_gpu_implementations_and_scalar_kernel_arguments(pocl, tmp_path):
    """scatter_elements comes with its own thread bindings and int64 scalar kernel arguments."""
    import tvm
    from tvm import relax

    tiny = tiny_module(lambda x, i, u: relax.op.scatter_elements(x, i, u, axis=0),
                        [((8, 4), "float32"), ((2, 4), "int64"), ((2, 4), "float32")])
    built = OPENCL.build(tiny, _mali_target())
    executable, report = built.executable, built.report
    assert [f.schedule for f in report.functions] == ["own thread bindings"]
    assert any("int64" in k.arg_types for k in report.kernels)
    executable.export_library(str(tmp_path / "scatter.so"))
    dev = tvm.opencl(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "scatter.so")), dev)
    x = np.random.default_rng(2).random((8, 4), dtype=np.float32)
    idx = np.array([[1, 2, 3, 4], [5, 6, 7, 0]], np.int64)
    upd = np.full((2, 4), 7.0, np.float32)
    out = vm["main"](*(tvm.runtime.tensor(a, device=dev) for a in (x, idx, upd))).numpy()
    expected = x.copy()
    for r in range(2):
        for c in range(4):
            expected[idx[r, c], c] = upd[r, c]
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(("op", "dtype", "exclusive"), [("CumSum", np.float32, False), ("CumSum", np.int32, True),
                                                       ("CumProd", np.int32, False)])
def test_scans_match_onnxruntime_on_pocl(pocl, tmp_path, op, dtype, exclusive):
    """TVM's own kernel for an inclusive sum (``gpu_2d_continuous_cumsum``) was 9.8 off along 20 elements on
    PoCL; ``gpu_scans`` makes it topi's exclusive scan plus the input, right here. Rows of 37 elements:
    TVM's ONNX conformance cases have 5, which the broken kernel got right."""
    from model_factory import onnx_cumulative

    model = onnx_cumulative(tmp_path / f"{op}.onnx", op, dtype, exclusive)
    build = compile_model(model, "mali-g610", tmp_path / "b").output_dir
    assert "continuous_cumsum" not in (build / OPENCL.kernels_source).read_text()
    for seed in (0, 1):
        report = validate(build, "host-opencl", seed=seed)
        assert report.passed and not report.degenerate and report.outputs[0].max_abs_error < 1e-4, report.to_dict()


# ----------------------------------------------------------------------------------------------
# real models, compiled for the GPU profiles, validated on PoCL


@pytest.mark.slow
@pytest.mark.parametrize(("name", "profile"), REAL_MODELS)
def test_real_models_on_opencl_match_the_reference(pocl, models, gpu_build, name, profile):
    gpu = check_gpu_build(gpu_build(name, profile), "opencl", "host-opencl", models[name])
    assert gpu["memory"] == "buffers"
    assert gpu["pipeline"] == ("adreno" if profile == "adreno-6xx" else "gpu_generic")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet8_int8", "vww_int8", "mobilenetv2_int8"])
def test_8_bit_models_on_opencl_match_the_reference(pocl, models, gpu_build, name):
    """Exact int32 convolutions on the GPU too (``backends/integer.py``): computed in float, ResNet-8 missed
    LiteRT by 0.12 on random inputs on PoCL. QDQ MobileNetV2 missed ONNX Runtime by 2 steps on a photo
    while TVM printed float constants with 7 digits (``float_literals.py``)."""
    check_gpu_build(gpu_build(name, "mali-g610"), "opencl", "host-opencl", models[name])


@pytest.mark.slow
def test_a_dynamically_quantized_recognizer_on_opencl_matches_onnxruntime(pocl, models, tmp_path):
    """PP-OCRv2's CRNN through ``quantize_dynamic``: each activation quantized at run time by its own range,
    so a last-bit difference at a rounding tie is a step, then many. It missed ONNX Runtime by 0.0077 (233
    values) on PoCL while OpenCL C contracted each scaled int32 sum and its bias into one multiply-add;
    each such product is now a statement of its own (``separate_products.py``)."""
    model = models["ppocr_rec_lstm_dyn8"]
    build = compile_model(model.path, "mali-g610", tmp_path / "b", input_shapes={"x": (1, 3, 32, 320)}).output_dir
    assert read_manifest(build).extra["opencl"]["cpu_fallback"] == []
    report = validate(build, "host-opencl", seed=0)  # inputs whose activations meet such a tie
    assert report.passed and report.outputs[0].max_abs_error < 1e-3, report.to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("mutation", ["loop_bound", "zero_channel"])
def test_a_wrong_build_of_a_real_model_fails_on_pocl(pocl, models, gpu_build, tmp_path, mutation):
    """The mutation harness (tests/mutation.py) on the OpenCL path: PP-OCR's classifier with a reduction
    loop of one kernel one iteration short, or a convolution's output channel zeroed, fails on PoCL;
    the unmodified build passes."""
    cls = models["ppocr_cls"]
    assert validate(gpu_build("ppocr_cls", "mali-g610"), "host-opencl").passed
    build = wrong_build(cls.path, "mali-g610", tmp_path / mutation, mutation, input_shapes=cls.input_shapes)
    report = validate(build, "host-opencl")
    assert report.ran_on == "this machine: opencl(0)"
    assert not report.passed and report.outputs[0].mismatched > 0 and not report.degenerate, report.to_dict()


@pytest.mark.slow
def test_cli_compile_validate_and_kernels(pocl, models, tmp_path):
    out = tmp_path / "mali"
    result = run_cli("compile", str(models["ppocr_cls"].path), "-p", "mali-g610", "-o", str(out),
                     "--input-shape", "x:1,3,48,192", "--json", check=True)
    assert json.loads(result.stdout)["extra"]["opencl"]["cpu_fallback"] == []
    report = json.loads(run_cli("validate", str(out), "--on", "host-opencl", "--json", check=True).stdout)
    assert report["passed"] and report["on"] == "host-opencl" and not report["degenerate"]

    found = edgepack.kernels(out).kernels
    assert found and all(k.source.startswith(f"// Function: {k.name}") for k in found)
    for k in found:
        assert f"__kernel void {k.name}(" in k.source
        assert all(isinstance(v, int) and v >= 1 for v in (*k.grid, *k.block))
        assert k.global_size == tuple(g * b for g, b in zip(k.grid, k.block))
    text = OPENCL.render_kernels(found)
    assert f"{len(found)} OpenCL kernel(s)" in text and found[0].name in text and "global " in text
    lines = OPENCL.summary_lines(read_manifest(out))
    assert any("CPU fallback: none" in line for line in lines)

    # no emulated OpenCL GPU: --on emulator says so and what to use instead (before running anything)
    from conftest import assert_clean_error

    assert_clean_error(run_cli("validate", str(out), "--on", "emulator"), "is an OpenCL build", "--on emulator cannot run it",
                       "--on host-opencl", "--on DEVICE")


def test_adreno_without_an_ndk_says_how_to_provide_one(models, tmp_path):
    """adreno-6xx's host code is Android (bionic) code: without an NDK, compile stops at once and names
    the three ways to provide one (the GPU kernels themselves are covered by adreno-6xx-linux above)."""
    from conftest import assert_clean_error

    if _has_ndk():
        skip_outside_setup("an Android NDK is configured here (this test is for machines without one)")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NDK_CC", "ANDROID_NDK_HOME", "ANDROID_NDK_ROOT")}
    command = [sys.executable, "-m", "edgepack", "compile", str(models["ppocr_cls"].path), "--profile", "adreno-6xx",
               "--input-shape", "x:1,3,48,192", "-o", str(tmp_path / "adreno")]
    result = subprocess.run(command, check=False, capture_output=True, text=True, env=dict(env, COLUMNS="200"),
                            timeout=300)
    assert_clean_error(result, "builds with the Android NDK", "aarch64-linux-android24-clang++", "--ndk",
                       "ANDROID_NDK_HOME", "TVM_NDK_CC")
    result = subprocess.run([*command, "--ndk", str(tmp_path / "no-ndk")], check=False, capture_output=True, text=True,
                            env=dict(env, COLUMNS="200"), timeout=300)
    assert_clean_error(result, "was not found in", "no-ndk")
    assert not (tmp_path / "adreno").exists()


def test_kernels_of_a_cpu_build_is_a_clear_error(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(EdgepackError):
        edgepack.kernels(tmp_path)


# ----------------------------------------------------------------------------------------------
# negative controls: a broken kernel must fail validation


def _copy_with_patched_kernel(build: Path, dest: Path, kernel: str, patch) -> Path:
    """Copy a build and edit one kernel's definition in the kernel text host/model.so carries (same length;
    ``gpu_common.edit_kernel_text``). ``patch(definition_bytes) -> bytes``."""
    shutil.copytree(build, dest)

    def edit(text: bytes) -> bytes:
        signature = f"__kernel void {kernel}(".encode()
        start = 0
        while True:
            start = text.index(signature, start)
            end_of_line = text.index(b"\n", start)
            if text[end_of_line - 3:end_of_line] == b") {":  # the definition, not a declaration
                break
            start = end_of_line
        body_end = text.index(b"\n}\n", start)
        return text[:start] + patch(text[start:body_end]) + text[body_end:]

    edit_kernel_text(dest / "host" / "model.so", "opencl", edit)
    return dest


def _last_conv_kernel(build: Path) -> str:
    names = [k.name for k in edgepack.kernels(build).kernels]
    return next(n for n in names if n.startswith("fused_conv2d_add"))


@pytest.mark.slow
def test_a_kernel_that_does_not_compile_fails_with_the_driver_log(pocl, plain_build, tmp_path):
    build = plain_build("ppocr_cls", "mali-g610")
    kernel = _last_conv_kernel(build)
    broken = _copy_with_patched_kernel(build, tmp_path / "broken", kernel,
                                       lambda d: d.replace(b") {\n", b") @\n", 1))
    with pytest.raises(ValidationError) as err:
        validate(broken, "host-opencl")
    message = err.value.message
    assert f"OpenCL kernel '{kernel}' failed to build" in message
    assert "Driver build log" in message and "error:" in message  # PoCL's (clang's) own diagnostics
    assert "device/kernels.cl" in err.value.hint

    result = run_cli("validate", str(broken), "--on", "host-opencl")
    assert result.returncode == 1, result.stdout + result.stderr
    flat = " ".join((result.stdout + result.stderr).split())
    assert kernel in flat and "Traceback" not in flat


@pytest.mark.slow
def test_a_kernel_that_computes_the_wrong_thing_fails_validation(pocl, plain_build, tmp_path):
    build = plain_build("ppocr_cls", "mali-g610")
    kernel = _last_conv_kernel(build)
    wrong = _copy_with_patched_kernel(build, tmp_path / "wrong", kernel,
                                      lambda d: d.replace(b"= 0.000000e+00f;", b"= 1.000000e+00f;", 1))
    report = validate(wrong, "host-opencl", seed=1)
    assert not report.passed and report.outputs[0].mismatched > 0


@pytest.mark.slow
def test_host_opencl_refuses_a_cpu_build(pocl, models, build_cache):
    build = build_cache(models["ppocr_cls"], "host")
    with pytest.raises(EdgepackError, match="not for an OpenCL GPU"):
        validate(build, "host-opencl")


# ----------------------------------------------------------------------------------------------
# C programs: the C API with the plug-in (x86 here on PoCL; aarch64 cross build under qemu)


@pytest.mark.slow
def test_c_api_runs_a_gpu_model_with_the_plugin_next_to_it(pocl, gpu_build, tmp_path):
    from edgepack.run.c_runner import run_c_runner
    from edgepack.toolchain.c_programs import build_c_program
    from edgepack.toolchain.tvm_runtime import host_runtime

    build = gpu_build("mobilenetv2", "mali-g610")
    manifest = read_manifest(build)
    runner = build_c_program(host_runtime(), tmp_path / "edgepack_run", cc="gcc", werror=True)
    model_dir = tmp_path / "lib"
    model_dir.mkdir()
    shutil.copy(build / "host" / "model.so", model_dir / "model.so")
    shutil.copy(build / "device" / "model.meta", model_dir / "model.meta")
    inputs = random_inputs(manifest.inputs, seed=11)

    # without the plug-in: a clear error that says what is missing
    with pytest.raises(EdgepackError, match="libtvm_opencl.so"):
        run_c_runner([], runner, model_dir / "model.so", inputs, manifest.inputs, manifest.outputs)

    # with it next to the model (as in a C bundle's lib/), ep_model_open loads it by itself
    shutil.copy(OPENCL.plugin(HOST_TRIPLE).shared, model_dir / "libtvm_opencl.so")
    started = time.perf_counter()
    result = run_c_runner([], runner, model_dir / "model.so", inputs, manifest.inputs, manifest.outputs)
    assert time.perf_counter() - started < 300
    expected = run_reference(build / manifest.model_file, manifest.model_format, inputs, manifest.outputs)
    for spec, actual, want in zip(manifest.outputs, result.outputs, expected):
        assert compare(spec.name, actual, want, 1e-4, 1e-3).passed


@pytest.mark.slow
def test_aarch64_plugin_cross_builds_and_loads_on_arm(gpu_build, tmp_path):
    """The plug-in for the device triple: ELF aarch64 linked against the official aarch64 runtime,
    no libOpenCL dependency; under qemu the C runner loads it, opens the GPU model and, as there is
    no aarch64 OpenCL driver here, stops with the runtime's clear 'no OpenCL library' error."""
    from edgepack.run.c_runner import run_c_runner
    from edgepack.toolchain.c_programs import build_c_program
    from edgepack.toolchain.compilers import find_compilers
    from edgepack.toolchain.plugins import target_plugin

    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-user is not installed")
    plugin, runtime = target_plugin(OPENCL.recipe, "aarch64-linux-gnu", "aarch64-linux-gnu-gcc",
                                    "aarch64-linux-gnu-g++")
    head = plugin.shared.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 0xB7
    dynamic = subprocess.run(["aarch64-linux-gnu-readelf", "-d", str(plugin.shared)], capture_output=True,
                             text=True, check=True).stdout
    assert "libtvm_runtime.so" in dynamic and "OpenCL" not in dynamic
    files = OPENCL.runtime_files("aarch64-linux-gnu", find_compilers(get_profile("mali-g610")))
    assert set(files) == {"lib/libtvm_opencl.so", "lib/libtvm_opencl.a"}

    build = gpu_build("ppocr_cls", "mali-g610")
    manifest = read_manifest(build)
    runner = build_c_program(runtime, tmp_path / "edgepack_run", cc="aarch64-linux-gnu-gcc")
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(build / "device" / "model.so", lib / "model.so")
    shutil.copy(plugin.shared, lib / "libtvm_opencl.so")
    inputs = random_inputs(manifest.inputs, seed=2)
    qemu = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
    try:
        result = run_c_runner(qemu, runner, lib / "model.so", inputs, manifest.inputs, manifest.outputs)
    except EdgepackError as err:
        assert "no usable OpenCL library was found" in err.message, err.message
    else:  # an aarch64 OpenCL driver is installed in the sysroot: then it must compute the right thing
        expected = run_reference(build / manifest.model_file, manifest.model_format, inputs, manifest.outputs)
        assert compare("out", result.outputs[0], expected[0], 1e-4, 1e-3).passed


@pytest.mark.slow
def test_static_single_binary_opencl_bundle_runs_on_pocl(pocl, models, tmp_path):
    """The static variant of an OpenCL C bundle, for this machine's triple so that it runs on PoCL here:
    the model as a system library (host code + kernels), edgepack's OpenCL runtime (libtvm_opencl.a)
    and the static TVM runtime in one executable; no plug-in file, no libtvm_*.so. The same through
    the bundle's Makefile (EDGEPACK_STATIC=1). Matches ONNX Runtime."""
    from edgepack.packaging.c import package_c
    from edgepack.run.c_runner import run_c_runner

    mali = get_profile("mali-g610")
    target = "\n".join(f"{k} = {json.dumps(v)}" for k, v in mali.target.items())
    profile = tmp_path / "mali-g610-x86.toml"
    profile.write_text(f"""name = "mali-g610-x86"
description = "mali-g610's GPU target with this machine as the host (static bundle test)"
backend = "opencl"
triple = "x86_64-linux-gnu"

[target]
{target}

[host_target]
kind = "llvm"

[toolchain]
cc = "gcc"
cxx = "g++"
""")
    model = models["ppocr_cls"]
    build = compile_model(model.path, str(profile), tmp_path / "build", input_shapes=model.input_shapes).output_dir
    bundle = package_c(build, tmp_path / "bundle")
    roles = {f.path: f.role for f in bundle.files}
    assert {"bin/edgepack_run_static", "lib/libmodel.a", "lib/libtvm_opencl.a", "lib/libtvm_opencl.so"} <= set(roles)

    def needed(path: Path) -> set[str]:
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
        return {line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line}

    manifest = read_manifest(build)
    inputs = random_inputs(manifest.inputs, seed=5)
    expected = run_reference(build / manifest.model_file, manifest.model_format, inputs, manifest.outputs)
    subprocess.run(["make", "-C", str(bundle.output_dir), "CC=gcc", "EDGEPACK_STATIC=1", f"BUILD_DIR={tmp_path / 'mk'}"],
                   check=True, capture_output=True)
    for program in (bundle.static_runner, tmp_path / "mk" / "edgepack_run"):
        libs = needed(program)
        assert not any(n.startswith(("libtvm", "libOpenCL")) for n in libs), libs  # libOpenCL: dlopen'd at run time
        env_before = os.environ.pop("EDGEPACK_OPENCL_PLUGIN", None)
        try:
            result = run_c_runner([], program, None, inputs, manifest.inputs, manifest.outputs)
        finally:
            if env_before is not None:
                os.environ["EDGEPACK_OPENCL_PLUGIN"] = env_before
        for spec, actual, want in zip(manifest.outputs, result.outputs, expected):
            assert compare(spec.name, actual, want, 1e-4, 1e-3).passed, spec.name


# ----------------------------------------------------------------------------------------------
# RPC: a TVM RPC server process with the plug-in loaded serves the OpenCL device (for tuning)


@pytest.mark.slow
@pytest.mark.parametrize("server_kind", ["python", "edgepack"])
def test_rpc_server_with_the_plugin_serves_opencl(pocl, tmp_path, server_kind):
    """TVM's Python server with --load-library, and edgepack's C server (runtimes/rpc-server), which
    loads libtvm_opencl.so from its own directory by itself (as on a device)."""
    import socket

    import tvm
    from tvm import relax, rpc

    key = ""
    if server_kind == "python":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port",
                                   str(port), "--port-end", str(port + 1), "--load-library",
                                   str(OPENCL.plugin(HOST_TRIPLE).shared)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    else:
        # as `tune --on host-opencl` runs it: the server built for this machine, the plug-in beside it
        from edgepack.devices.local_server import LocalRPCServer
        from edgepack.toolchain.compilers import Compilers, host_compilers
        from edgepack.toolchain.rpc_server import server_bundle
        from edgepack.toolchain.tvm_runtime import host_runtime

        cc, cxx = host_compilers()
        bundle = server_bundle(HOST_TRIPLE, cc, host_runtime(),
                               OPENCL.rpc_server_files(HOST_TRIPLE, Compilers(cc, cxx, "")))
        started = LocalRPCServer.start(bundle, "host-opencl")
        server, port, key = started.process, started.port, started.key
        assert (bundle.program.parent / "libtvm_opencl.so").is_file()
    try:
        session = None
        for _ in range(60):
            try:
                session = rpc.connect("127.0.0.1", port, key=key, session_timeout=120)
                break
            except Exception:  # noqa: BLE001  not listening yet
                time.sleep(0.5)
        assert session is not None, "the RPC server did not start"
        dev = session.device(4, 0)  # kDLOpenCL
        assert dev.exist

        tiny = tiny_module(lambda x: relax.op.nn.softmax(x), [((2, 32), "float32")])
        executable = OPENCL.build(tiny, _mali_target()).executable
        executable.export_library(str(tmp_path / "tiny.so"))
        session.upload(str(tmp_path / "tiny.so"))
        vm = relax.VirtualMachine(session.load_module("tiny.so"), dev)
        x = np.random.default_rng(3).random((2, 32), dtype=np.float32)
        out = vm["main"](tvm.runtime.tensor(x, device=dev)).numpy()
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    if server_kind == "edgepack":
        assert "loaded the GPU runtime plug-in" in started.log_path.read_text()
        started.stop()
        assert not started.workdir.exists()


@pytest.mark.slow
def test_device_rpc_server_install_for_mali_carries_and_loads_the_plugin(tmp_path):
    """What `edgepack device ...` installs on a mali-g610 device: the aarch64 RPC server with
    libtvm_opencl.so beside it, which the server loads at start-up (here under qemu-user; no
    aarch64 OpenCL driver, so the device reports no OpenCL GPU, but the module loader is there)."""
    from tvm import rpc

    from edgepack.devices.deploy import ensure_server_bundle

    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-user is not installed")
    bundle = ensure_server_bundle(get_profile("mali-g610"))
    assert "libtvm_opencl.so" in bundle.manifest["files"]
    assert "libtvm_opencl.so" not in ensure_server_bundle(get_profile("rpi4")).manifest["files"]
    port_file, log = tmp_path / "port", tmp_path / "server.log"
    with open(log, "wb") as handle:
        server = subprocess.Popen(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(bundle.directory / "edgepack_rpc_server"),
                                   "--port", "0", "--port-file", str(port_file), "--key", "mali-g610", "--workdir",
                                   str(tmp_path), "--exit-with-parent"],
                                  stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not port_file.is_file():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        session = rpc.connect("127.0.0.1", int(port_file.read_text()), key="mali-g610", session_timeout=60)
        assert session.get_function("ffi.Module.load_from_bytes.opencl") is not None
        assert not session.device(4, 0).exist  # no OpenCL driver for aarch64 here
        assert "loaded the GPU runtime plug-in" in log.read_text()
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


# ----------------------------------------------------------------------------------------------
# tuning (MetaSchedule) with this machine's OpenCL device measuring over RPC


def test_tune_refuses_the_wrong_place_to_measure_a_gpu(models, tmp_path):
    from conftest import assert_clean_error

    model = str(models["ppocr_cls"].path)
    assert_clean_error(run_cli("tune", model, "--profile", "mali-g610", "--on", "host", "-o", str(tmp_path / "a")),
                       "runs on an OpenCL GPU", "--on host-opencl")
    assert_clean_error(run_cli("tune", model, "--profile", "host", "--on", "host-opencl", "-o", str(tmp_path / "b")),
                       "measures OpenCL kernels", "--on host")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_tune_mali_on_host_opencl_resume_compile_and_validate(pocl, models, tmp_path):
    """mali-g610 kernels tuned by MetaSchedule, measured on PoCL through edgepack's C RPC server (with
    the plug-in next to it, as on a device); killed after the first batch and resumed; compiled with
    the records (tuned kernels in the device and the host library alike) and validated vs ONNX Runtime."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    from edgepack.tuning import load_tuning
    from edgepack.tuning.records import RECORD_FILE, WORKLOAD_FILE

    model = models["ppocr_cls"]
    out = tmp_path / "tuning"
    command = ["tune", str(model.path), "--input-shape", "x:1,3,48,192", "--profile", "mali-g610", "--on",
               "host-opencl", "-o", str(out), "--trials", "8", "--batch", "4",
               "--task", "fused_conv2d36_", "--task", "fused_conv2d40_"]
    records = out / RECORD_FILE

    def lines() -> int:
        return records.read_bytes().count(b"\n") if records.exists() else 0

    proc = subprocess.Popen([sys.executable, "-m", "edgepack", *command], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 600
    while lines() < 4:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no batch recorded in 10 minutes"
        time.sleep(0.2)
    proc.kill()  # SIGKILL: its RPC server dies with it (the server's session ends when the client does)
    proc.wait(timeout=60)
    proc.stdout.close()
    first = records.read_bytes()
    n1 = lines()
    assert 4 <= n1 < 8

    result = json.loads(run_cli(*command, "--json", check=True).stdout)
    assert result["on"] == "host-opencl" and result["trials_before"] == n1
    assert result["trials"] == 8 and result["trials_run"] == 8 - n1 and result["stopped"] == "trials"
    assert records.read_bytes().startswith(first)
    summary = load_tuning(out)
    tuned = [t for t in summary.tasks if t.trials]
    assert len(tuned) == 2 and all(t.best_seconds and t.best_seconds < 1.0 for t in tuned)  # real PoCL timings
    assert summary.meta.target["kind"] == "opencl" and summary.meta.tuning_target["host"]["kind"] == "llvm"
    database = JSONDatabase(path_workload=str(out / WORKLOAD_FILE), path_tuning_record=str(records))
    assert all(str(r.target.kind.name) == "opencl" for r in database.get_all_tuning_records())

    build = compile_model(model.path, "mali-g610", tmp_path / "build", input_shapes=model.input_shapes, tuning=out)
    gpu = build.manifest.extra["opencl"]
    assert gpu["pipeline"] == "gpu_generic (tuned)" and gpu["schedules"].get("tuned") == 2, gpu["schedules"]
    assert gpu["cpu_fallback"] == []
    tuned_functions = {f["name"] for f in gpu["functions"] if f["schedule"] == "tuned"}
    assert {n.split("_")[1] for n in tuned_functions} == {"conv2d36", "conv2d40"}
    # host-opencl runs the kernels the device library ships: the tuned ones
    import tvm

    host_source = module_source(tvm.runtime.load_module(str(build.host_library)), "opencl")
    # (the library's text without the declarations TVM repeats in every section: toolchain/packed_kernels.py)
    assert host_source == KERNEL_DECLARATION.sub("", (build.output_dir / "device" / "kernels.cl").read_text())
    report = validate(build.output_dir, "host-opencl", seed=3)
    assert report.passed, report.to_dict()


def test_inverse_trigonometric_functions_are_called_by_their_overloaded_names(pocl, tmp_path):
    """TVM called C's ``asinhf`` & co., which the kernel language lacks (the driver refused the kernel)."""
    from gpu_common import check_inverse_trig

    check_inverse_trig("mali-g610", "host-opencl", tmp_path)
