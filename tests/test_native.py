"""The no-Python C runtime: real builds, real qemu runs, outputs compared with onnxruntime.

Fast tests use the installed x86 wheel's runtime. Slow ones build the device runtimes (about two
minutes each on two cores) into ``$EDGEPACK_CACHE_DIR`` when set, else a session temp dir.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgepack.errors import EdgepackError, ToolchainError
from edgepack.packaging.c import write_c_bundle
from edgepack.toolchain import tvm_runtime
from edgepack.toolchain.c_programs import build_c_program
from edgepack.toolchain.compilers import DEFAULT_TARGET_FLAGS
from edgepack.toolchain.model_library import (
    TensorMeta,
    export_model_shared,
    export_model_static,
    model_meta_text,
    parse_model_meta,
    write_model_meta,
)
from edgepack.toolchain.sources import C_API, TVM_COMPAT, source_dir
from edgepack.toolchain.tvm_runtime import (
    OFFICIAL_RUNTIME_WHEELS,
    TargetRuntime,
    ensure_target_runtime,
    host_runtime,
    tvm_source_dirs,
)
from edgepack.versions import TVM_VERSION

AARCH64 = "aarch64-linux-gnu"
ARMHF = "arm-linux-gnueabihf"
HOST = "x86_64-linux-gnu"

TARGETS = {
    HOST: {"kind": "llvm"},
    AARCH64: {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
    ARMHF: {"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mcpu": "cortex-a7",
            "mattr": ["+neon", "+vfp4", "+thumb2"], "mfloat-abi": "hard"},
}
COMPILERS = {
    HOST: ("gcc", "g++"),
    AARCH64: ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++"),
    ARMHF: ("arm-linux-gnueabihf-gcc", "arm-linux-gnueabihf-g++"),
}
EMULATOR = {
    HOST: [],
    AARCH64: ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"],
    ARMHF: ["qemu-arm", "-L", "/usr/arm-linux-gnueabihf"],
}


def _needs(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _run(cmd, *, cwd=None, check=True, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600,
                            env=env, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


# ---------------------------------------------------------------------------------------------
# fixtures: one small ONNX model with two float inputs, one int64 input and three outputs


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    d = tmp_path_factory.mktemp("native-model")
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
        helper.make_node("ReduceMean", ["y"], ["m"], axes=[2, 3], keepdims=0),
        helper.make_node("Add", ["m", "b"], ["z"]),
        helper.make_node("Gather", ["z", "idx"], ["g"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 2])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(d / "tiny.onnx"))

    inputs = {
        "x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
        "b": rng.standard_normal((1, 4)).astype(np.float32),
        "idx": np.array([3, 1], dtype=np.int64),
    }
    for name, value in inputs.items():
        np.save(d / f"{name}.npy", value)
    import onnxruntime as ort

    ref = ort.InferenceSession(str(d / "tiny.onnx"), providers=["CPUExecutionProvider"]).run(None, inputs)
    for name, value in zip(["y", "z", "g"], ref):
        np.save(d / f"ref_{name}.npy", value)
    specs_in = [(n, str(v.dtype), v.shape) for n, v in inputs.items()]
    specs_out = [(n, str(v.dtype), v.shape) for n, v in zip(["y", "z", "g"], ref)]
    (d / "meta.txt").write_text(model_meta_text(specs_in, specs_out))
    return d


@pytest.fixture(scope="session")
def executables(model_dir):
    """Per triple: ``get(triple)`` for the shared library (tvm.compile) and
    ``get(triple, system_lib=True)`` for the static archive (relax.build(..., system_lib=True))."""
    import onnx
    import tvm
    import tvm.relax.frontend.onnx
    from tvm import relax

    mod = relax.frontend.onnx.from_onnx(onnx.load(str(model_dir / "tiny.onnx")))
    built = {}

    def get(triple: str, system_lib: bool = False):
        key = (triple, system_lib)
        if key not in built:
            target = tvm.target.Target(TARGETS[triple])
            built[key] = relax.build(mod, target, system_lib=True) if system_lib else tvm.compile(mod, target)
        return built[key]

    return get


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    # The same version-keyed cache edgepack itself uses: runtimes are built once per machine.
    from edgepack.paths import cache_root

    return cache_root()


@pytest.fixture(scope="session")
def runtimes(cache_dir):
    made = {}

    def get(triple: str) -> TargetRuntime:
        if triple not in made:
            cc, cxx = COMPILERS[triple]
            _needs(cc, cxx, "cmake")
            made[triple] = ensure_target_runtime(triple, cc, cxx, cache_dir=cache_dir, need_static=True)
        return made[triple]

    return get


def _shared_model(executables, model_dir, triple: str, out: Path, *, embed_meta: bool) -> Path:
    cxx = COMPILERS[triple][1]
    flags = list(DEFAULT_TARGET_FLAGS.get(triple, ()))
    meta = (model_dir / "meta.txt").read_text()
    lib = export_model_shared(executables(triple), out / "model.so", cxx,
                              meta_text=meta if embed_meta else None, options=flags)
    if not embed_meta:
        (out / "model.meta").write_text(meta)  # the sidecar next to the library
    return lib


def _input_args(model_dir: Path) -> list[str]:
    return [a for n in ("x", "b", "idx") for a in ("--input", f"{n}={model_dir / (n + '.npy')}")]


def _check_outputs(out_dir: Path, model_dir: Path) -> None:
    for i, name in enumerate(["y", "z", "g"]):
        got = np.load(out_dir / f"{i}_{name}.npy")
        want = np.load(model_dir / f"ref_{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _needed_libs(binary: Path) -> set[str]:
    text = _run(["readelf", "-d", binary]).stdout
    return {line.split("[")[1].rstrip("]") for line in text.splitlines() if "(NEEDED)" in line}


# ---------------------------------------------------------------------------------------------
# fast


def test_model_meta_roundtrip(tmp_path):
    inputs = [("image input", "float32", (1, 3, 224, 224)), ("50%/x:0", "int64", ()), ("día", "uint8", (2,))]
    outputs = [("prob", "float16", (1, 1000))]
    text = model_meta_text(inputs, outputs)
    assert text.splitlines()[0] == "edgepack-model-meta 1"
    assert "input image%20input float32 1,3,224,224" in text
    assert "input 50%25/x:0 int64 -" in text
    parsed_in, parsed_out = parse_model_meta(text)
    assert [(t.name, t.dtype, t.shape) for t in parsed_in] == [(n, d, tuple(s)) for n, d, s in inputs]
    assert parsed_out[0] == TensorMeta("prob", "float16", (1, 1000))
    path = write_model_meta(tmp_path / "model.meta", inputs, outputs)
    assert path.read_text() == text
    with pytest.raises(EdgepackError, match="dynamic"):
        model_meta_text([("x", "float32", (1, "batch"))], outputs)
    with pytest.raises(EdgepackError, match="complex64"):
        model_meta_text([("x", "complex64", (1,))], outputs)


def test_compat_headers_selftest(tmp_path):
    """Serializer layout, base64, ring buffer, arena; fp16 conversions bit-exact against numpy."""
    _needs("g++")
    ffi_dir = tvm_source_dirs()[1]
    compat = source_dir(TVM_COMPAT)
    exe = tmp_path / "compat_test"
    _run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{compat / 'include'}",
          f"-I{compat / '3rdparty' / 'compiler-rt'}", f"-I{ffi_dir / 'include'}", compat / "tests" / "compat_test.cc",
          f"-L{ffi_dir / 'lib'}", "-ltvm_ffi", f"-Wl,-rpath,{ffi_dir / 'lib'}", "-o", exe])
    result = _run([exe, tmp_path / "fp16.bin"])
    assert result.stdout.strip().endswith(" passed, 0 failed"), result.stdout
    raw = np.fromfile(tmp_path / "fp16.bin", dtype=np.uint8)
    n = 1 << 20
    rec = raw[: n * 6].reshape(n, 6)
    x = rec[:, :4].copy().view(np.float32).ravel()
    half = rec[:, 4:].copy().view(np.uint16).ravel()
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(half[~nan], ref[~nan])
    assert np.isnan(half[nan].view(np.float16)).all()
    widened = raw[n * 6:].view(np.float32)
    ref_wide = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    ok = ~np.isnan(ref_wide)
    assert np.array_equal(widened[ok].view(np.uint32), ref_wide[ok].view(np.uint32))


def test_host_runner_matches_onnxruntime(tmp_path, model_dir, executables):
    """x86: the example runner over the installed wheel's runtime, shared library with a sidecar."""
    _needs("gcc", "g++")
    rt = ensure_target_runtime(HOST, "gcc", "g++", need_static=False)
    assert rt.origin == "official-wheel" and not rt.static_libs
    lib = _shared_model(executables, model_dir, HOST, tmp_path, embed_meta=False)
    runner = build_c_program(rt, tmp_path / "edgepack_run", cc="gcc", werror=True)
    result = _run([runner, lib, *_input_args(model_dir), "--output-dir", tmp_path / "out", "--repeat", "3"])
    _check_outputs(tmp_path / "out", model_dir)
    lines = result.stdout.splitlines()
    stats = json.loads(next(line for line in lines if line.startswith("{")))
    assert stats["runs"] == 3 and 0 < stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
    assert any(line.startswith("output 2 g float32 [1,2]") for line in lines)

    info = _run([runner, lib, "--info"]).stdout.splitlines()
    assert info == ["input 0 x float32 [1,3,8,8]", "input 1 b float32 [1,4]", "input 2 idx int64 [2]",
                    "output 0 y float32 [1,4,8,8]", "output 1 z float32 [1,4]", "output 2 g float32 [1,2]"]

    # readable failures, never a crash
    bad = np.zeros((1, 3, 8, 9), dtype=np.float32)
    np.save(tmp_path / "bad.npy", bad)
    result = _run([runner, lib, "--input", f"x={tmp_path / 'bad.npy'}"], check=False)
    assert result.returncode == 1 and "EP_ERR_SHAPE" in result.stderr and "[1,3,8,8]" in result.stderr
    np.save(tmp_path / "bad64.npy", np.zeros((1, 3, 8, 8), dtype=np.float64))
    result = _run([runner, lib, "--input", f"x={tmp_path / 'bad64.npy'}"], check=False)
    assert result.returncode == 1 and "EP_ERR_DTYPE" in result.stderr
    result = _run([runner, lib, "--input", f"nope={tmp_path / 'bad.npy'}"], check=False)
    assert result.returncode == 1 and "x b idx" in result.stderr
    result = _run([runner, tmp_path / "missing.so"], check=False)
    assert result.returncode == 1 and "EP_ERR_NOT_FOUND" in result.stderr
    result = _run([runner, "--repeat", "zero"], check=False)
    assert result.returncode == 2


def test_host_api_error_paths(tmp_path, model_dir, executables):
    """tests/test_api.c on x86 against the wheel's libtvm_runtime.so; an aarch64 .so is the wrong arch."""
    _needs("gcc", "g++", "aarch64-linux-gnu-g++")
    rt = host_runtime()
    lib = _shared_model(executables, model_dir, HOST, tmp_path, embed_meta=False)
    foreign = _shared_model(executables, model_dir, AARCH64, tmp_path / "a64", embed_meta=True)
    test = build_c_program(rt, tmp_path / "test_api", cc="gcc", werror=True,
                           source=source_dir(C_API) / "tests" / "test_api.c")
    (tmp_path / "work").mkdir()
    result = _run([test, lib, foreign, tmp_path / "work"], check=False)
    assert result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed"), result.stdout
    assert result.returncode == 0


def test_missing_cross_compiler_names_the_package(tmp_path):
    with pytest.raises(ToolchainError) as err:
        ensure_target_runtime("riscv64-linux-gnu", "riscv64-linux-gnu-gcc-missing",
                              "riscv64-linux-gnu-g++-missing", cache_dir=tmp_path)
    assert "g++-riscv64-linux-gnu" in err.value.hint


def test_failed_runtime_build_reports_the_log(tmp_path):
    _needs("cmake")
    with pytest.raises(ToolchainError) as err:
        # a "compiler" that fails every check: CMake's compiler test fails at configure time
        ensure_target_runtime("arm-linux-gnueabihf", shutil.which("false"), shutil.which("false"),
                              cache_dir=tmp_path)
    assert "Building the TVM runtime for arm-linux-gnueabihf" in err.value.message
    assert "CMake" in err.value.hint or "compiler" in err.value.hint.lower()
    assert not [p for p in (tmp_path / "runtime").rglob("*") if p.is_dir() and ".partial-" in p.name]


def test_static_and_shared_exports_need_the_right_build(tmp_path, executables):
    with pytest.raises(EdgepackError, match="system library"):
        export_model_static(executables(HOST), tmp_path / "libmodel.a", "gcc")
    with pytest.raises(EdgepackError, match="system library"):
        export_model_shared(executables(HOST, system_lib=True), tmp_path / "model.so", "g++")


# ---------------------------------------------------------------------------------------------
# slow: device runtimes, qemu


@pytest.mark.slow
def test_runtime_cache_is_not_rebuilt(runtimes, cache_dir, monkeypatch):
    first = runtimes(AARCH64)
    assert first.origin == "official-wheel"  # shared libs from the official aarch64 wheels
    assert [p.name for p in first.shared_libs] == ["libtvm_ffi.so", "libtvm_runtime.so"]
    assert [p.name for p in first.static_libs] == ["libtvm_runtime.a", "libtvm_ffi.a"]
    assert first.root.parent == cache_dir / "runtime" / TVM_VERSION
    manifest = json.loads((first.root / "manifest.json").read_text())
    wheel_sha = {w.wheel.filename: w.wheel.sha256 for w in OFFICIAL_RUNTIME_WHEELS[AARCH64]}
    assert manifest["libs"]["libtvm_runtime.so"]["wheel_sha256"] in wheel_sha.values()

    def forbidden(*args, **kwargs):
        raise AssertionError("the cached runtime was rebuilt")

    monkeypatch.setattr(tvm_runtime, "_cmake_build", forbidden)
    monkeypatch.setattr(tvm_runtime, "fetch_wheel", forbidden)
    again = ensure_target_runtime(AARCH64, *COMPILERS[AARCH64], cache_dir=cache_dir)
    assert again == first
    shared_only = ensure_target_runtime(AARCH64, *COMPILERS[AARCH64], cache_dir=cache_dir, need_static=False)
    assert shared_only.origin == "official-wheel" and not shared_only.static_libs


@pytest.mark.slow
@pytest.mark.parametrize("triple", [AARCH64, ARMHF])
def test_device_runner_shared_and_static(triple, tmp_path, runtimes, model_dir, executables):
    """Shared runner (+ .so model) and single static executable (+ system-lib archive) under qemu."""
    cc, cxx = COMPILERS[triple]
    _needs(cc, cxx, EMULATOR[triple][0])
    rt = runtimes(triple)
    assert rt.origin == ("official-wheel" if triple == AARCH64 else "built-from-source")
    qemu = EMULATOR[triple]

    # shared: aarch64 uses the sidecar model.meta, armv7 the metadata embedded in the library
    lib = _shared_model(executables, model_dir, triple, tmp_path, embed_meta=(triple == ARMHF))
    runner = build_c_program(rt, tmp_path / "edgepack_run", cc=cc, werror=True)
    _run([*qemu, runner, lib, *_input_args(model_dir), "--output-dir", tmp_path / "out"])
    _check_outputs(tmp_path / "out", model_dir)
    meta_args = [] if triple == ARMHF else ["--meta", tmp_path / "model.meta"]
    _run([*qemu, runner, lib, "--from-memory", *meta_args, *_input_args(model_dir), "--output-dir", tmp_path / "mem"])
    _check_outputs(tmp_path / "mem", model_dir)

    # static: one executable, model linked in, metadata embedded, only the C library dynamic
    archive = export_model_static(executables(triple, system_lib=True), tmp_path / "libmodel.a", cc,
                                  meta_text=(model_dir / "meta.txt").read_text(), cflags=rt.cflags)
    static_runner = build_c_program(rt, tmp_path / "edgepack_run_static", cc=cc, static=True,
                                    model_archive=archive, werror=True, strip=True)
    libc_parts = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2"}
    assert {n for n in _needed_libs(static_runner) if not n.startswith("ld-linux")} <= libc_parts
    result = _run([*qemu, static_runner, *_input_args(model_dir), "--output-dir", tmp_path / "static",
                   "--repeat", "2"])
    _check_outputs(tmp_path / "static", model_dir)
    assert json.loads(result.stdout.splitlines()[0])["runs"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("triple", [AARCH64, ARMHF])
def test_device_api_error_paths(triple, tmp_path, runtimes, model_dir, executables):
    """tests/test_api.c on the device (qemu); an x86 model plays the wrong-architecture library."""
    cc, cxx = COMPILERS[triple]
    _needs(cc, cxx, EMULATOR[triple][0], "g++")
    rt = runtimes(triple)
    lib = _shared_model(executables, model_dir, triple, tmp_path, embed_meta=False)
    foreign = _shared_model(executables, model_dir, HOST, tmp_path / "x86", embed_meta=True)
    test = build_c_program(rt, tmp_path / "test_api", cc=cc, werror=True,
                           source=source_dir(C_API) / "tests" / "test_api.c")
    (tmp_path / "work").mkdir()
    result = _run([*EMULATOR[triple], test, lib, foreign, tmp_path / "work"], check=False)
    assert result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed"), result.stdout
    assert result.returncode == 0


@pytest.mark.slow
def test_bundle_builds_with_cmake_and_make(tmp_path, runtimes, model_dir, executables):
    """The bundle's CMakeLists.txt and Makefile cross-build the runner, shared and static."""
    cc, cxx = COMPILERS[AARCH64]
    _needs(cc, cxx, "cmake", "make", "qemu-aarch64")
    rt = runtimes(AARCH64)
    meta = (model_dir / "meta.txt").read_text()
    built = tmp_path / "built"
    built.mkdir()
    shared = export_model_shared(executables(AARCH64), built / "model.so", cxx)
    static = export_model_static(executables(AARCH64, system_lib=True), built / "libmodel.a", cc,
                                 meta_text=meta)
    bundle = write_c_bundle(tmp_path / "bundle", rt, model_shared=shared, model_static=static, meta_text=meta)
    for rel in ("include/edgepack.h", "include/tvm/ffi/c_api.h", "include/dlpack/dlpack.h", "src/edgepack.c",
                "examples/main.c", "CMakeLists.txt", "Makefile", "lib/libtvm_runtime.so", "lib/libtvm_ffi.a",
                "lib/model.so", "lib/model.meta", "lib/libmodel.a"):
        assert (bundle / rel).is_file(), rel
    qemu = EMULATOR[AARCH64]

    builds = {}
    for static_flag in ("OFF", "ON"):
        build_dir = tmp_path / f"cmake-{static_flag}"
        _run(["cmake", "-S", bundle, "-B", build_dir, f"-DCMAKE_C_COMPILER={cc}", "-DCMAKE_SYSTEM_NAME=Linux",
              "-DCMAKE_SYSTEM_PROCESSOR=aarch64", f"-DEDGEPACK_STATIC={static_flag}"])
        result = _run(["cmake", "--build", build_dir])
        assert "warning" not in (result.stdout + result.stderr).lower(), result.stdout
        builds[f"cmake-{static_flag}"] = build_dir / "edgepack_run"
    for static_flag in ("0", "1"):
        # inside the bundle: the shared runner finds lib/ through $ORIGIN/../lib
        build_dir = f"build-make-{static_flag}"
        result = _run(["make", "-C", bundle, f"CC={cc}", f"EDGEPACK_STATIC={static_flag}", f"BUILD_DIR={build_dir}"])
        assert "warning" not in (result.stdout + result.stderr).lower(), result.stdout
        builds[f"make-{static_flag}"] = bundle / build_dir / "edgepack_run"

    for name, exe in builds.items():
        is_static = name.endswith(("ON", "1"))
        model_arg = [] if is_static else [bundle / "lib" / "model.so"]
        out = tmp_path / f"out-{name}"
        _run([*qemu, exe, *model_arg, *_input_args(model_dir), "--output-dir", out], cwd=bundle)
        _check_outputs(out, model_dir)
        if is_static:
            assert "libtvm_runtime.so" not in _needed_libs(exe)
