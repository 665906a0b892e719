"""The Android package without an NDK or a phone: the same Java API and JNI code, compiled for this
machine (real javac, real JVM, JNI library built against the host TVM runtime), run on real models
and compared with the reference; the AAR assembled from host libraries and checked structurally;
the CLI refusing to work without an NDK.

What this cannot check: code built by the NDK, the bionic linker, Gradle, a device (see
runtimes/api/android/README.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error
from model_factory import onnx_with_scalar_input

from edgepack.compiling import compile_model
from edgepack.errors import EdgepackError, ToolchainError
from edgepack.frontends import run_reference
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.packaging.android import package_android
from edgepack.packaging.android.aar import (
    JNI_LIBRARY,
    AbiLibraries,
    assemble_aar,
    build_jni_library,
    manifest_xml_text,
    write_android_package,
)
from edgepack.packaging.android.elf import read_elf
from edgepack.packaging.android.java import (
    android_sources_dir,
    android_stub_sources,
    default_class_name,
    generate_java_sources,
    java_tensors,
)
from edgepack.packaging.android.javac import compile_java, compile_java_api, jdk_include_dirs, make_jar
from edgepack.tensors import TensorSpec, random_inputs
from edgepack.toolchain import tvm_runtime
from edgepack.toolchain.android_ndk import ABI_MACHINES, ABIS, EM_X86_64
from edgepack.toolchain.model_library import export_model_shared, model_meta_text
from edgepack.toolchain.sources import C_API, c_api_sources, source_dir
from edgepack.validation import compare

PACKAGE = "com.example.vision"
NDK_VARS = ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "TVM_NDK_CC")


def _needs(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _run(cmd, *, env=None, cwd=None, check=True, timeout=600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                            timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def _fake_manifest(inputs, outputs, source="weird-model.onnx") -> BuildManifest:
    return BuildManifest(
        model_file="model.onnx", model_format="onnx", model_sha256="ab" * 32, model_source=f"/models/{source}",
        inputs=tuple(TensorSpec(n, d, s) for n, d, s in inputs), outputs=tuple(TensorSpec(n, d, s) for n, d, s in outputs),
        profile={"name": "android-arm64"}, target={}, host_target={}, tvm_version="x", tvm_ffi_version="x",
        edgepack_version="x", toolchain={}, artifacts={}, compile_seconds=0.0)


# ---------------------------------------------------------------------------------------------
# fixtures: the Java stand-ins for android.*, the host JNI library, a tiny real model


@pytest.fixture(scope="session")
def stubs(tmp_path_factory) -> Path:
    _needs("javac", "java")
    return compile_java(android_stub_sources(), tmp_path_factory.mktemp("android-stubs"), werror=True)


@pytest.fixture(scope="session")
def host_runtime():
    return tvm_runtime.host_runtime()


@pytest.fixture(scope="session")
def wheel_lib_dirs(host_runtime) -> list[str]:
    return list(dict.fromkeys(str(p.parent) for p in host_runtime.shared_libs))


@pytest.fixture(scope="session")
def host_jni(tmp_path_factory, host_runtime, wheel_lib_dirs) -> Path:
    """libedgepack_jni.so for this machine, against the x86 wheel's runtime; warnings are errors."""
    _needs("gcc", "javac")
    out = tmp_path_factory.mktemp("jni") / JNI_LIBRARY
    return build_jni_library(host_runtime, out, "gcc", jdk_include_dirs(), werror=True,
                                     rpath=wheel_lib_dirs)


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory) -> Path:
    """A small real ONNX model (two inputs, two outputs) compiled for the host profile."""
    import onnx
    from onnx import TensorProto, helper

    from edgepack.compiling import compile_model

    d = tmp_path_factory.mktemp("tiny")
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "r"], ["y"]),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Add", ["m", "b"], ["z"])]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(d / "tiny.onnx"))
    return compile_model(d / "tiny.onnx", "host", d / "build").output_dir


# ---------------------------------------------------------------------------------------------
# Java helpers: compile the API + a harness, run it on a real JVM


HARNESS_IO = """
  static ByteBuffer readAll(String path) throws IOException {
    return ByteBuffer.wrap(Files.readAllBytes(Paths.get(path)));
  }

  static void fill(Buffer dst, String path) throws IOException {
    ByteBuffer raw = readAll(path).order(ByteOrder.nativeOrder());
    if (dst instanceof FloatBuffer) ((FloatBuffer) dst).duplicate().put(raw.asFloatBuffer());
    else if (dst instanceof IntBuffer) ((IntBuffer) dst).duplicate().put(raw.asIntBuffer());
    else if (dst instanceof LongBuffer) ((LongBuffer) dst).duplicate().put(raw.asLongBuffer());
    else if (dst instanceof ShortBuffer) ((ShortBuffer) dst).duplicate().put(raw.asShortBuffer());
    else if (dst instanceof DoubleBuffer) ((DoubleBuffer) dst).duplicate().put(raw.asDoubleBuffer());
    else ((ByteBuffer) dst).duplicate().put(raw);
  }

  static void dump(Buffer src, String path) throws IOException {
    int elem = src instanceof ByteBuffer ? 1 : src instanceof ShortBuffer ? 2
        : (src instanceof FloatBuffer || src instanceof IntBuffer) ? 4 : 8;
    ByteBuffer raw = ByteBuffer.allocate(src.remaining() * elem).order(ByteOrder.nativeOrder());
    if (src instanceof FloatBuffer) raw.asFloatBuffer().put(((FloatBuffer) src).duplicate());
    else if (src instanceof IntBuffer) raw.asIntBuffer().put(((IntBuffer) src).duplicate());
    else if (src instanceof LongBuffer) raw.asLongBuffer().put(((LongBuffer) src).duplicate());
    else if (src instanceof ShortBuffer) raw.asShortBuffer().put(((ShortBuffer) src).duplicate());
    else if (src instanceof DoubleBuffer) raw.asDoubleBuffer().put(((DoubleBuffer) src).duplicate());
    else raw.put(((ByteBuffer) src).duplicate());
    Files.write(Paths.get(path), raw.array());
  }
"""

FAKE_CONTEXT = """
import android.content.Context;
import android.content.pm.ApplicationInfo;
import java.io.File;

/** A host stand-in for an app's Context: where its native libraries and APK are. */
public class FakeContext extends Context {
  private final ApplicationInfo info = new ApplicationInfo();
  private final File cache;

  public FakeContext(String nativeLibraryDir, String apk, String cacheDir) {
    info.nativeLibraryDir = nativeLibraryDir;
    info.sourceDir = apk;
    cache = new File(cacheDir);
  }

  @Override
  public ApplicationInfo getApplicationInfo() {
    return info;
  }

  @Override
  public File getCodeCacheDir() {
    return cache;
  }
}
"""


def run_model_harness(manifest: BuildManifest, cls: str) -> str:
    """RunModel <file|bytes|context> <library|libdir> <dir> [apk cache]: reads dir/in<i>.bin, writes
    dir/out<i>.bin (run into given buffers) and dir/alt<i>.bin (run returning Outputs)."""
    inputs, outputs = java_tensors(manifest)
    lines = [f"    {t.buffer_type} {t.ident} = {cls}.{t.allocator}();\n"
             f"    fill({t.ident}, a[2] + \"/in{t.index}.bin\");" for t in inputs]
    lines += [f"    {t.buffer_type} {t.ident} = {cls}.{t.allocator}();" for t in outputs]
    args_in = ", ".join(t.ident for t in inputs)
    args_all = ", ".join(t.ident for t in (*inputs, *outputs))
    dumps = "\n".join(f"      dump({t.ident}, a[2] + \"/out{t.index}.bin\");\n"
                      f"      dump(alt.{t.ident}, a[2] + \"/alt{t.index}.bin\");" for t in outputs)
    body = "\n".join(lines)
    return f"""
import {PACKAGE}.{cls};
import ai.edgepack.*;
import java.io.*;
import java.nio.*;
import java.nio.file.*;

public class RunModel {{
{HARNESS_IO}
  public static void main(String[] a) throws Exception {{
    {cls} opened;
    if (a[0].equals("file")) opened = {cls}.load(new File(a[1]));
    else if (a[0].equals("bytes")) opened = {cls}.load(readAll(a[1]));
    else opened = {cls}.load(new FakeContext(a[1], a[3], a[4]));
{body}
    try ({cls} model = opened) {{
      model.run({args_all});
      {cls}.Outputs alt = model.run({args_in});
{dumps}
      System.out.println("OK " + model.nativeModel());
    }}
  }}
}}
"""


def compile_api(manifest: BuildManifest, cls: str, out: Path, stubs: Path, extra: dict[str, str] | None = None) -> Path:
    sources = generate_java_sources(manifest, PACKAGE, cls)
    compile_java(sources, out / "api", [stubs], werror=True)
    harness = {"FakeContext.java": FAKE_CONTEXT, **(extra or {})}
    return compile_java(harness, out / "harness", [out / "api", stubs])


def java(classpath: list[Path], main: str, *args, library_path: list[str], extra_props=(), check=True,
         ld_path: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if ld_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*ld_path, env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    env.setdefault("TVM_NUM_THREADS", "2")
    cmd = ["java", "-Xss4m", f"-Djava.library.path={os.pathsep.join(library_path)}", *extra_props,
           "-cp", os.pathsep.join(str(p) for p in classpath), main, *args]
    return _run(cmd, env=env, check=check, timeout=300)


def write_inputs(manifest: BuildManifest, d: Path, seed: int,
                 inputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """``inputs`` (default: seeded random ones) as raw files ``d/in<i>.bin`` for the harness."""
    inputs = random_inputs(manifest.inputs, seed=seed) if inputs is None else inputs
    d.mkdir(parents=True, exist_ok=True)
    for i, spec in enumerate(manifest.inputs):
        (d / f"in{i}.bin").write_bytes(np.asarray(inputs[spec.name], dtype=spec.dtype).tobytes())
    return inputs


def read_outputs(manifest: BuildManifest, d: Path, prefix: str) -> list[np.ndarray]:
    return [np.fromfile(d / f"{prefix}{i}.bin", dtype=np.dtype(spec.dtype)).reshape(spec.shape)
            for i, spec in enumerate(manifest.outputs)]


def check_against_reference(build: Path, manifest: BuildManifest, inputs, d: Path) -> None:
    expected = run_reference(build / manifest.model_file, manifest.model_format, inputs, manifest.outputs)
    for prefix in ("out", "alt"):
        for spec, a, e in zip(manifest.outputs, read_outputs(manifest, d, prefix), expected):
            result = compare(spec.name, a, e, 1e-4, 1e-3)
            assert result.passed, (prefix, result)


# ---------------------------------------------------------------------------------------------
# the generated Java API


def _assert_javadoc_clean(sources: dict, stubs, tmp_path: Path) -> None:
    """The generated ``sources`` pass javadoc's full lint with no warning."""
    _needs("javadoc")
    src = tmp_path / "src"
    for rel, body in sources.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(body)
    doc = _run(["javadoc", "-Xdoclint:all", "-quiet", "-d", tmp_path / "doc", "-cp", stubs,
                *sorted(src.rglob("*.java"))], check=False)
    assert doc.returncode == 0 and "warning" not in doc.stdout + doc.stderr, doc.stdout + doc.stderr


def test_generated_class_names_types_and_javadoc(stubs, tmp_path):
    manifest = _fake_manifest(
        [("input:0", "float32", (1, 3, 8, 8)), ("class", "int64", (2,)), ("1st mask", "uint8", (4,)),
         ("input_0", "float16", ())],
        [("scores", "float32", (1, 10)), ("out", "int32", (1,)), ("scores!", "float64", (2, 2))])
    inputs, outputs = java_tensors(manifest)
    assert [t.ident for t in inputs] == ["input0", "classTensor", "t1stMask", "input02"]
    assert [t.ident for t in outputs] == ["scores", "out2", "scores2"]  # `out` is a local of the generated code
    assert [t.constant for t in inputs] == ["INPUT_INPUT_0", "INPUT_CLASS", "INPUT_1ST_MASK", "INPUT_INPUT_02"]
    assert [t.buffer_type for t in (*inputs, *outputs)] == ["FloatBuffer", "LongBuffer", "ByteBuffer", "ShortBuffer",
                                                          "FloatBuffer", "IntBuffer", "DoubleBuffer"]
    assert default_class_name(manifest) == "WeirdModel"
    sources = generate_java_sources(manifest, PACKAGE, "WeirdModel")
    text = sources["com/example/vision/WeirdModel.java"]
    assert 'new TensorInfo("input:0", DType.FLOAT32, new long[] {1L, 3L, 8L, 8L})' in text
    assert "public void run(FloatBuffer input0, LongBuffer classTensor, ByteBuffer t1stMask, ShortBuffer input02," in text
    assert set(sources) >= {"ai/edgepack/NativeModel.java", "ai/edgepack/EdgepackException.java",
                            "ai/edgepack/AndroidLibraries.java", "ai/edgepack/TensorInfo.java", "ai/edgepack/DType.java"}

    classes = compile_java(sources, tmp_path / "classes", [stubs], werror=True)  # -Xlint:all -Werror
    assert (classes / "com/example/vision/WeirdModel$Outputs.class").is_file()
    major = int.from_bytes((classes / "ai/edgepack/NativeModel.class").read_bytes()[6:8], "big")
    assert major == 52  # Java 8 bytecode: what every Android toolchain accepts

    _assert_javadoc_clean(sources, stubs, tmp_path)


def test_bad_java_names_and_dtypes_are_refused():
    manifest = _fake_manifest([("x", "float32", (1,))], [("y", "float32", (1,))])
    for bad in ("com.example.class", "1com.example", "", "ai.edgepack.models"):
        with pytest.raises(EdgepackError):
            generate_java_sources(manifest, bad, "Model")
    with pytest.raises(EdgepackError, match="class name"):
        generate_java_sources(manifest, PACKAGE, "my-model")
    with pytest.raises(EdgepackError, match="does not support"):
        java_tensors(_fake_manifest([("x", "complex64", (1,))], [("y", "float32", (1,))]))
    with pytest.raises(EdgepackError, match="decides at run time") as err:  # NonZero, Unique ...
        java_tensors(_fake_manifest([("x", "float32", (4,))], [("y", "int64", (1, "?"))]))
    assert "package c" in err.value.hint


# ---------------------------------------------------------------------------------------------
# the JNI layer


def test_jni_layer_is_warning_free_for_host_and_arm(host_jni, host_runtime, tmp_path):
    info = read_elf(host_jni)  # built with -Wall -Wextra -Werror by the fixture
    assert info.machine == EM_X86_64 and info.soname == JNI_LIBRARY
    assert {"libtvm_runtime.so", "libtvm_ffi.so"} <= set(info.needed)
    exported = _run(["nm", "-D", "--defined-only", host_jni]).stdout
    assert "JNI_OnLoad" in exported and "ep_model_open" in exported and "native_run" not in exported
    # the same sources for 64- and 32-bit ARM (the Android ABIs), with GCC and with clang (the NDK's
    # compiler), compile only: jni.h is portable
    c_dir = source_dir(C_API)
    clang = next((c for c in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))) if shutil.which(c)), None)
    compilers = [["aarch64-linux-gnu-gcc"], ["arm-linux-gnueabihf-gcc"]]
    if clang:
        compilers += [[clang], [clang, "--target=aarch64-linux-gnu"], [clang, "--target=arm-linux-gnueabihf"]]
    includes = [f"-I{d}" for d in (c_dir / "include", *host_runtime.include_dirs, *jdk_include_dirs())]
    for n, cc in enumerate(compilers):
        if shutil.which(cc[0]) is None or (len(cc) > 1 and shutil.which(cc[1].split("=")[1] + "-gcc") is None):
            continue
        for src in (android_sources_dir() / "jni" / "edgepack_jni.c", *c_api_sources()):
            _run([*cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", *includes, "-c", src,
                  "-o", tmp_path / f"{n}-{src.stem}.o"])


# ---------------------------------------------------------------------------------------------
# Java on the host JVM: errors, then real models against the reference


ERRORS_HARNESS = f"""
import {PACKAGE}.Tiny;
import ai.edgepack.*;
import java.io.File;
import java.nio.*;

public class Errors {{
  interface Call {{ void run() throws Exception; }}

  static void expect(String key, Call call) throws Exception {{
    try {{
      call.run();
      System.out.println(key + "|NONE|no exception");
    }} catch (EdgepackException e) {{
      System.out.println(key + "|" + e.getStatusName() + "|" + e.getMessage());
    }}
  }}

  public static void main(String[] a) throws Exception {{
    final Tiny model = Tiny.load(new File(a[0]));
    final FloatBuffer x = Tiny.newXBuffer(), b = Tiny.newBBuffer(), y = Tiny.newYBuffer(), z = Tiny.newZBuffer();
    model.run(x, b, y, z);
    // heap buffers work too (copied)
    model.run(FloatBuffer.wrap(new float[48]), FloatBuffer.wrap(new float[3]), FloatBuffer.wrap(new float[48]),
              FloatBuffer.wrap(new float[3]));
    System.out.println("ALIGNED|" + (NativeModel.allocate(100).isDirect()) + "|" + model.nativeModel().inputs());
    expect("small-input", () -> model.run(ByteBuffer.allocateDirect(40).order(ByteOrder.nativeOrder()).asFloatBuffer(), b, y, z));
    expect("heap-small-input", () -> model.run(FloatBuffer.wrap(new float[5]), b));
    expect("small-output", () -> model.run(x, b, y, FloatBuffer.allocate(2)));
    expect("wrong-type", () -> model.nativeModel().run(IntBuffer.allocate(48), b));
    expect("byte-order", () -> model.nativeModel().run(
        ByteBuffer.allocateDirect(192).order(ByteOrder.BIG_ENDIAN).asFloatBuffer(), b));
    expect("unknown-input", () -> model.nativeModel().inputIndex("nope"));
    expect("bad-index", () -> model.nativeModel().setInput(7, x));
    expect("missing-file", () -> Tiny.load(new File("/nonexistent/model.so")));
    expect("not-a-library", () -> Tiny.load(ByteBuffer.wrap(new byte[64])));
    expect("wrong-model", () -> Tiny.load(new File(a[1])));
    model.close();
    model.close(); // idempotent
    expect("closed-run", () -> model.run(x, b, y, z));
    expect("closed-output", () -> model.nativeModel().getOutput(0, y));
    expect("closed-find", () -> model.nativeModel().outputIndex("y"));
    System.out.println("CLOSED|" + model.nativeModel().isClosed() + "|" + model.nativeModel());
  }}
}}
"""


def test_java_errors_carry_the_native_message(tiny_build, stubs, host_jni, wheel_lib_dirs, tmp_path):
    manifest = read_manifest(tiny_build)
    classes = compile_api(manifest, "Tiny", tmp_path, stubs, {"Errors.java": ERRORS_HARNESS})
    result = java([tmp_path / "api", classes, stubs], "Errors", tiny_build / "device" / "model.so",
                  _library_with_other_names(tiny_build, tmp_path), library_path=[str(host_jni.parent), *wheel_lib_dirs],
                  ld_path=wheel_lib_dirs)
    lines = {line.split("|", 1)[0]: line.split("|", 2)[1:] for line in result.stdout.splitlines() if "|" in line}
    print(result.stdout)
    assert lines["ALIGNED"][0] == "true"
    # messages are the C API's own (runtimes/api/c/src/edgepack.c), status names are its ep_status
    assert lines["small-input"] == ["EP_ERR_SHAPE", "input 0 'x' needs 192 bytes (float32 [1,3,4,4]), got 40"]
    assert lines["heap-small-input"] == ["EP_ERR_SHAPE", "input 0 'x' needs 192 bytes (float32 [1,3,4,4]), got 20"]
    assert lines["small-output"] == ["EP_ERR_INVALID_ARGUMENT", "output 1 'z' needs a 12-byte buffer, got 8"]
    assert lines["closed-run"] == ["EP_ERR_INVALID_ARGUMENT", "ep_model_set_input: model is NULL, closed or not a model"]
    assert lines["closed-output"][0] == "EP_ERR_INVALID_ARGUMENT" and "closed" in lines["closed-output"][1]
    assert lines["closed-find"][0] == "EP_ERR_INVALID_ARGUMENT" and "closed" in lines["closed-find"][1]
    assert lines["unknown-input"] == ["EP_ERR_NOT_FOUND", "the model has no input named 'nope'"]
    assert lines["bad-index"] == ["EP_ERR_INDEX", "input index 7 out of range: the model has 2 inputs"]
    assert lines["missing-file"][0] == "EP_ERR_NOT_FOUND" and "/nonexistent/model.so" in lines["missing-file"][1]
    assert lines["not-a-library"] == ["EP_ERR_LOAD", "the model library is not an ELF shared library"]
    assert lines["wrong-model"][0] == "EP_ERR_METADATA" and "does not match Tiny" in lines["wrong-model"][1]
    # checks made in Java, before any native call, use the same exception type
    assert lines["wrong-type"][0] == "EP_ERR_DTYPE" and "needs a FloatBuffer" in lines["wrong-type"][1]
    assert lines["byte-order"][0] == "EP_ERR_INVALID_ARGUMENT" and "BIG_ENDIAN" in lines["byte-order"][1]
    assert lines["CLOSED"][0] == "true"


def _library_with_other_names(tiny_build: Path, tmp_path: Path) -> Path:
    """The tiny model library with metadata naming its tensors differently (a different model for Tiny)."""
    import tvm

    from edgepack.backends import get_backend
    from edgepack.frontends import import_model

    manifest = read_manifest(tiny_build)
    imported = import_model(tiny_build / manifest.model_file, None)
    exe = get_backend("cpu").build(imported, tvm.target.Target({"kind": "llvm"})).executable
    meta = model_meta_text([("x", "float32", (1, 3, 4, 4)), ("bias", "float32", (1, 3))],
                                  [("y", "float32", (1, 3, 4, 4)), ("z", "float32", (1, 3))])
    return export_model_shared(exe, tmp_path / "renamed" / "model.so", "g++", meta_text=meta, cc="gcc")


@pytest.mark.slow
@pytest.mark.parametrize("name,cls", [("mobilenetv2", "MobileNetV2"), ("face_detection_short_range", "FaceDetection")])
def test_real_models_through_java_match_the_reference(models, build_cache, stubs, host_jni, wheel_lib_dirs, tmp_path,
                                                      name, cls):
    build = build_cache(models[name], "host")
    manifest = read_manifest(build)
    classes = compile_api(manifest, cls, tmp_path, stubs, {"RunModel.java": run_model_harness(manifest, cls)})
    library = build / manifest.artifacts["device_library"].path  # host profile: C API metadata embedded
    for mode, seed in (("file", 1), ("bytes", 2)):
        d = tmp_path / mode
        inputs = write_inputs(manifest, d, seed)
        out = java([tmp_path / "api", classes, stubs], "RunModel", mode, library, d,
                   library_path=[str(host_jni.parent), *wheel_lib_dirs], ld_path=wheel_lib_dirs)
        assert out.stdout.startswith("OK NativeModel[inputs=["), out.stdout
        check_against_reference(build, manifest, inputs, d)


def _java_round_trip(build: Path, cls: str, feeds: list[dict[str, np.ndarray]], stubs, host_jni, wheel_lib_dirs,
                     tmp_path: Path) -> None:
    """Run ``build`` through its generated Java class on the JVM for each of ``feeds``; compare with the reference."""
    manifest = read_manifest(build)
    classes = compile_api(manifest, cls, tmp_path, stubs, {"RunModel.java": run_model_harness(manifest, cls)})
    library = build / manifest.artifacts["device_library"].path  # host profile: C API metadata embedded
    for n, inputs in enumerate(feeds):
        d = tmp_path / f"run{n}"
        write_inputs(manifest, d, n, inputs)
        out = java([tmp_path / "api", classes, stubs], "RunModel", "file", library, d,
                   library_path=[str(host_jni.parent), *wheel_lib_dirs], ld_path=wheel_lib_dirs)
        assert out.stdout.startswith("OK NativeModel[inputs=["), out.stdout
        check_against_reference(build, manifest, inputs, d)


def test_scalar_input_and_output_through_java(stubs, host_jni, wheel_lib_dirs, tmp_path):
    """A 0-d int64 input (a sample rate in arithmetic and an If) and a 0-d int64 output: the generated
    class describes them with an empty shape and one-element LongBuffers, and both If arms match."""
    build = compile_model(onnx_with_scalar_input(tmp_path / "scalar_sr.onnx"), "host", tmp_path / "build").output_dir
    manifest = read_manifest(build)
    inputs, outputs = java_tensors(manifest)
    assert [(t.name, t.shape, t.buffer_type, t.element_count) for t in (inputs[1], outputs[1])] == [
        ("sr", (), "LongBuffer", 1), ("sr_next", (), "LongBuffer", 1)]
    text = generate_java_sources(manifest, PACKAGE, "ScalarSr")["com/example/vision/ScalarSr.java"]
    assert 'new TensorInfo("sr", DType.INT64, new long[] {})' in text
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    _java_round_trip(build, "ScalarSr", [{"x": x, "sr": np.array(sr, np.int64)} for sr in (16000, 8000)],
                     stubs, host_jni, wheel_lib_dirs, tmp_path)


@pytest.mark.slow
def test_silero_vad_through_java(models, stubs, host_jni, wheel_lib_dirs, tmp_path):
    """A real model with a scalar int64 input: Silero VAD (LSTM, If on the sample rate ``sr``)."""
    model = models["silero_vad"]
    build = compile_model(model.path, "host", tmp_path / "build", input_shapes=model.input_shapes).output_dir
    rng = np.random.default_rng(4)
    feeds = [{"input": (rng.standard_normal((1, 576)) * 0.1).astype(np.float32),
              "state": (rng.standard_normal((2, 1, 128)) * 0.5).astype(np.float32),
              "sr": np.array(16000, np.int64)} for _ in range(2)]
    _java_round_trip(build, "SileroVad", feeds, stubs, host_jni, wheel_lib_dirs, tmp_path)


# ---------------------------------------------------------------------------------------------
# dynamic input dimensions (--dim) through Java: shapes in, each run's shapes out


def run_dynamic_harness(manifest: BuildManifest, cls: str) -> str:
    """RunDyn <library> <case dir>...: for each case dir (in<i>.bin, shape<i>.txt per input) runs the model
    twice and writes what each run gave: through the generated class (``new<X>Buffer()`` at the largest size,
    ``run(x, xShape, ...)``): out<i>.bin / outshape<i>.txt, or error_gen.txt; through ``NativeModel`` with heap
    buffers of exactly the file's values (``run(inputs, shapes)``, ``outputShape``, ``getOutput`` into a heap
    buffer larger than the output): alt<i>.bin / altshape<i>.txt, or error_nat.txt."""
    inputs, outputs = java_tensors(manifest)
    gen = []
    for t in inputs:
        gen.append(f"        {t.buffer_type} {t.ident} = {cls}.{t.allocator}();")
        gen.append(f"        fillSome({t.ident}, d + \"/in{t.index}.bin\");")
    args = ", ".join(t.ident + (f", shape(d + \"/shape{t.index}.txt\")" if t.is_dynamic else "") for t in inputs)
    gen.append(f"        {cls}.Outputs out = model.run({args});")
    for t in outputs:
        shape_field = f"out.{t.ident}Shape"
        gen.append(f"        dump(out.{t.ident}, d + \"/out{t.index}.bin\");")
        gen.append(f"        write(d + \"/outshape{t.index}.txt\", join({shape_field}));")
    buffers = ", ".join(f"heap(m.input({t.index}).dtype(), d + \"/in{t.index}.bin\")" for t in inputs)
    shapes = ", ".join(f"shape(d + \"/shape{t.index}.txt\")" if t.is_dynamic else "null" for t in inputs)
    nat = [f"        m.run(new Buffer[] {{{buffers}}}, new long[][] {{{shapes}}});"]
    nat.append("        for (int i = 0; i < m.outputCount(); i++) {")
    nat.append("          long[] s = m.outputShape(i);")
    nat.append("          int bytes = (int) m.output(i).byteSize(s);")
    nat.append("          ByteBuffer dst = ByteBuffer.allocate(bytes + 16);  // room to spare: filled as far as the run's")
    nat.append("          m.getOutput(i, dst);")
    nat.append("          dst.limit(bytes);")
    nat.append("          dump(dst, d + \"/alt\" + i + \".bin\");")
    nat.append("          write(d + \"/altshape\" + i + \".txt\", join(s));")
    nat.append("        }")
    first = next(t for t in inputs if t.is_dynamic)
    return f"""
import {PACKAGE}.{cls};
import ai.edgepack.*;
import java.io.*;
import java.nio.*;
import java.nio.file.*;

public class RunDyn {{
{HARNESS_IO}
  static void fillSome(Buffer dst, String path) throws IOException {{  // as much of the file as fits
    ByteBuffer raw = readAll(path).order(ByteOrder.nativeOrder());
    int elem = dst instanceof FloatBuffer || dst instanceof IntBuffer ? 4 : dst instanceof ByteBuffer ? 1
        : dst instanceof ShortBuffer ? 2 : 8;
    raw.limit(Math.min(raw.limit(), dst.remaining() * elem));
    fill(dst, raw);
  }}

  static void fill(Buffer dst, ByteBuffer raw) {{
    if (dst instanceof FloatBuffer) ((FloatBuffer) dst).duplicate().put(raw.asFloatBuffer());
    else if (dst instanceof IntBuffer) ((IntBuffer) dst).duplicate().put(raw.asIntBuffer());
    else if (dst instanceof LongBuffer) ((LongBuffer) dst).duplicate().put(raw.asLongBuffer());
    else if (dst instanceof ShortBuffer) ((ShortBuffer) dst).duplicate().put(raw.asShortBuffer());
    else if (dst instanceof DoubleBuffer) ((DoubleBuffer) dst).duplicate().put(raw.asDoubleBuffer());
    else ((ByteBuffer) dst).duplicate().put(raw);
  }}

  static Buffer heap(DType dtype, String path) throws IOException {{  // a heap buffer of the file's values
    ByteBuffer raw = readAll(path).order(ByteOrder.nativeOrder());
    int n = raw.remaining() / dtype.byteSize();
    Buffer out = dtype.bufferClass() == FloatBuffer.class ? FloatBuffer.allocate(n)
        : dtype.bufferClass() == IntBuffer.class ? IntBuffer.allocate(n)
        : dtype.bufferClass() == LongBuffer.class ? LongBuffer.allocate(n)
        : dtype.bufferClass() == ShortBuffer.class ? ShortBuffer.allocate(n)
        : dtype.bufferClass() == DoubleBuffer.class ? DoubleBuffer.allocate(n) : ByteBuffer.allocate(n);
    fill(out, raw);
    return out;
  }}

  static long[] shape(String path) throws IOException {{
    String text = new String(Files.readAllBytes(Paths.get(path)), "UTF-8").trim();
    String[] parts = text.isEmpty() ? new String[0] : text.split(",");
    long[] out = new long[parts.length];
    for (int i = 0; i < parts.length; i++) out[i] = Long.parseLong(parts[i].trim());
    return out;
  }}

  static String join(long[] s) {{
    StringBuilder b = new StringBuilder();
    for (int i = 0; i < s.length; i++) b.append(i > 0 ? "," : "").append(s[i]);
    return b.toString();
  }}

  static void write(String path, String text) throws IOException {{
    Files.write(Paths.get(path), text.getBytes("UTF-8"));
  }}

  public static void main(String[] a) throws Exception {{
    try ({cls} model = {cls}.load(new File(a[0]))) {{
      NativeModel m = model.nativeModel();
      System.out.println("INPUTS|" + m.inputs());
      System.out.println("OUTPUTS|" + m.outputs());
      TensorInfo.Dim dim = m.input({first.index}).dim({first.shape.index(next(d for d in first.shape if isinstance(d, str)))});
      System.out.println("DIM|" + dim.name() + "|" + dim.min() + "|" + dim.max() + "|" + dim.step() + "|"
          + m.input({first.index}).byteSize());
      try {{
        m.setInput({first.index}, {cls}.{first.allocator}());
        System.out.println("UNTYPED|NONE|");
      }} catch (EdgepackException e) {{
        System.out.println("UNTYPED|" + e.getStatusName() + "|" + e.getMessage());
      }}
      for (int c = 1; c < a.length; c++) {{
        String d = a[c];
        try {{
{chr(10).join(gen)}
        }} catch (EdgepackException e) {{
          write(d + "/error_gen.txt", e.getStatusName() + "|" + e.getMessage());
        }}
        try {{
{chr(10).join(nat)}
        }} catch (EdgepackException e) {{
          write(d + "/error_nat.txt", e.getStatusName() + "|" + e.getMessage());
        }}
      }}
      System.out.println("OK");
    }}
  }}
}}
"""


def _dynamic_case(d: Path, arrays: list[np.ndarray], shapes: list[tuple[int, ...]] | None = None) -> Path:
    """A case directory for RunDyn: each input's values and the shape the harness states for them."""
    d.mkdir(parents=True, exist_ok=True)
    for i, x in enumerate(arrays):
        (d / f"in{i}.bin").write_bytes(np.ascontiguousarray(x).tobytes())
        shape = x.shape if shapes is None else shapes[i]
        (d / f"shape{i}.txt").write_text(",".join(str(n) for n in shape))
    return d


def _dynamic_results(d: Path, manifest: BuildManifest, prefix: str) -> list[np.ndarray]:
    """The outputs a RunDyn run wrote (``out`` or ``alt``), each with the shape the run reported for it; the
    values must be exactly as many as that shape has (read at another size, they would not be)."""
    results = []
    for i, spec in enumerate(manifest.outputs):
        shape = tuple(int(n) for n in (d / f"{prefix}shape{i}.txt").read_text().split(","))
        values = np.fromfile(d / f"{prefix}{i}.bin", dtype=np.dtype(spec.dtype))
        assert values.size == int(np.prod(shape)), (d.name, prefix, spec.name, values.size, shape)
        results.append(values.reshape(shape))
    return results


def _errors(d: Path) -> dict[str, list[str]]:
    return {path.stem: path.read_text().split("|", 1) for path in d.glob("error_*.txt")}


def _run_dynamic(manifest: BuildManifest, cls: str, library: Path, cases: list[Path], stubs, host_jni,
                 wheel_lib_dirs, tmp_path: Path) -> dict[str, list[str]]:
    classes = compile_api(manifest, cls, tmp_path, stubs, {"RunDyn.java": run_dynamic_harness(manifest, cls)})
    result = java([tmp_path / "api", classes, stubs], "RunDyn", library, *cases,
                  library_path=[str(host_jni.parent), *wheel_lib_dirs], ld_path=wheel_lib_dirs)
    assert result.stdout.rstrip().endswith("OK"), result.stdout + result.stderr
    return {line.split("|", 1)[0]: line.split("|")[1:] for line in result.stdout.splitlines() if "|" in line}


TINY_DIMS = {"W": (8, 64, 4)}


def _tiny_dynamic_library(out: Path) -> Path:
    """``main(x: (2, W), y: (2, W)) -> (a = 2x + y: (2, W), b = concat([x, y], 1): (2, 2W))``, W = 8..64 step 4,
    built with TVM for this machine, metadata (version 2) embedded."""
    import tvm
    from model_factory import relax_tiny_dynamic

    executable = tvm.compile(relax_tiny_dynamic(), target=tvm.target.Target({"kind": "llvm"}))
    meta = model_meta_text([("x", "float32", (2, "W")), ("y", "float32", (2, "W"))],
                           [("a", "float32", (2, "?")), ("b", "float32", (2, "?"))], TINY_DIMS)
    return export_model_shared(executable, out / "model.so", "g++", cc="gcc", meta_text=meta)


def test_generated_class_of_a_dynamic_build(stubs, tmp_path):
    """A build with --dim: the generated class describes the dynamic dimension (its range as a TensorInfo.Dim,
    -1 in the shape, "W = 8..64, step 4" in the Javadoc), has a setter taking the shape, run(x, xShape, ...)
    and outputs with their shapes; it compiles with -Werror and passes javadoc's lint. A static build's class
    is unchanged (test_generated_class_names_types_and_javadoc), and a dimension without a range is refused."""
    manifest = replace(_fake_manifest([("x", "float32", (2, "W")), ("y", "float32", (2, "W")), ("n", "int64", (1,))],
                                      [("a", "float32", (2, "?")), ("count", "int32", (1,))], source="tiny_dyn.onnx"),
                       dims={"W": {"min": 8, "max": 64, "step": 4}})
    inputs, outputs = java_tensors(manifest)
    assert [(t.shape, t.is_dynamic, t.element_count) for t in inputs] == [
        ((2, "W"), True, 128), ((2, "W"), True, 128), ((1,), False, 1)]
    assert [(t.shape, t.is_dynamic) for t in outputs] == [((2, "?"), True), ((1,), False)]
    sources = generate_java_sources(manifest, PACKAGE, "TinyDyn")
    text = sources["com/example/vision/TinyDyn.java"]
    for needle in ('public static final TensorInfo.Dim DIM_W =\n      new TensorInfo.Dim("W", 8L, 64L, 4L);',
                   'new TensorInfo("x", DType.FLOAT32, new long[] {2L, -1L}, new TensorInfo.Dim[] {null, DIM_W});',
                   'new TensorInfo("a", DType.FLOAT32, new long[] {2L, -1L});',
                   "<li>W = 8..64, step 4 ({@link #DIM_W})</li>",
                   "public void setX(FloatBuffer x, long[] shape)", "public void setN(LongBuffer n)",
                   "public Outputs run(FloatBuffer x, long[] xShape, FloatBuffer y, long[] yShape, LongBuffer n)",
                   "public Outputs run()", "public static FloatBuffer newXBuffer(long[] shape)",
                   "public final long[] aShape;", "public static IntBuffer newCountBuffer()"):
        assert needle in text, needle
    assert "newABuffer" not in text  # its size is each run's
    classes = compile_java(sources, tmp_path / "classes", [stubs], werror=True)
    assert (classes / "com/example/vision/TinyDyn$Outputs.class").is_file()
    _assert_javadoc_clean(sources, stubs, tmp_path)
    with pytest.raises(EdgepackError, match="dynamic shape"):  # a name the build has no range for
        java_tensors(replace(manifest, dims={"H": {"min": 8, "max": 64, "step": 4}}))


def test_dynamic_sizes_through_java(stubs, host_jni, wheel_lib_dirs, tmp_path):
    """A model whose outputs follow the dynamic width (a: (2, W), b: (2, 2W)), run through its generated class
    and through NativeModel with heap buffers at W = 8 (min), 28 and 64 (max): every output has the run's shape
    and exactly its values; sizes off the range or the step, inputs that disagree on W and a buffer smaller
    than its shape are refused with EdgepackException carrying the native message."""
    library = _tiny_dynamic_library(tmp_path / "lib")
    manifest = replace(_fake_manifest([("x", "float32", (2, "W")), ("y", "float32", (2, "W"))],
                                      [("a", "float32", (2, "?")), ("b", "float32", (2, "?"))], source="tiny_dyn.onnx"),
                       dims={"W": {"min": 8, "max": 64, "step": 4}})
    rng = np.random.default_rng(7)
    feeds = {w: [rng.standard_normal((2, w)).astype(np.float32) for _ in "xy"] for w in (8, 28, 64, 68, 22, 4)}
    cases = {f"w{w}": _dynamic_case(tmp_path / f"w{w}", xy) for w, xy in feeds.items()}
    cases["disagree"] = _dynamic_case(tmp_path / "disagree", [feeds[8][0], feeds[28][1]])
    cases["small"] = _dynamic_case(tmp_path / "small", [feeds[8][0], np.zeros((2, 16), np.float32)],
                                   shapes=[(2, 16), (2, 16)])
    info = _run_dynamic(manifest, "TinyDyn", library, list(cases.values()), stubs, host_jni, wheel_lib_dirs, tmp_path)

    assert info["INPUTS"] == ["['x' float32 [2, W=8..64:4], 'y' float32 [2, W=8..64:4]]"]
    assert info["OUTPUTS"] == ["['a' float32 [2, ?], 'b' float32 [2, ?]]"]
    assert info["DIM"] == ["W", "8", "64", "4", str(2 * 64 * 4)]  # byteSize: the largest input
    assert info["UNTYPED"][0] == "EP_ERR_SHAPE" and "setInput(index, data, shape)" in info["UNTYPED"][1]
    for w in (8, 28, 64):
        x, y = feeds[w]
        d = cases[f"w{w}"]
        assert not _errors(d), _errors(d)
        for prefix in ("out", "alt"):
            a, b = _dynamic_results(d, manifest, prefix)
            assert a.shape == (2, w) and b.shape == (2, 2 * w), (prefix, a.shape, b.shape)
            np.testing.assert_allclose(a, x * 2 + y, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(b, np.concatenate([x, y], axis=1))
    for w in (68, 22, 4):  # the generated class's buffer holds 64 columns: W=68 is judged by the C API first
        expected = ["EP_ERR_SHAPE", f"input 0 'x' dimension 1 (W) is {w}; the model takes W from 8 to 64 in steps of 4"]
        assert _errors(cases[f"w{w}"]) == {"error_gen": expected, "error_nat": expected}, w
    for message in _errors(cases["disagree"]).values():
        assert message[0] == "EP_ERR_SHAPE" and "dimension W is 8 in input 0 'x'" in message[1], message
        assert "28 in input 1 'y'" in message[1], message
    assert _errors(cases["small"]) == {  # heap buffer of 16 values for [2, 16]; the generated one holds 128
        "error_nat": ["EP_ERR_SHAPE", "input 0 'x': shape [2,16] needs 128 bytes, the buffer holds 64"]}


@pytest.mark.slow
def test_a_dynamic_ocr_classifier_through_java(models, stubs, host_jni, wheel_lib_dirs, tmp_path):
    """PP-OCR's text direction classifier compiled for W = 32..256:32, run through its generated Java class and
    NativeModel at W = 32 (min), 96 and 256 (max), each compared with ONNX Runtime at that width (the
    comparison tells the widths apart: W=32 against the reference of W=256 fails); W=288 (out of range) and
    W=40 (off the step) are refused with the native message naming W and its range."""
    model = models["ppocr_cls"]
    build = compile_model(model.path, "host", tmp_path / "build", input_shapes={"x": (1, 3, 48, "W")},
                          dims=["W=32..256:32"]).output_dir
    manifest = read_manifest(build)
    rng = np.random.default_rng(11)
    feeds = {w: rng.uniform(-1, 1, (1, 3, 48, w)).astype(np.float32) for w in (32, 96, 256, 288, 40)}
    cases = {w: _dynamic_case(tmp_path / f"w{w}", [x]) for w, x in feeds.items()}
    library = build / manifest.artifacts["device_library"].path
    info = _run_dynamic(manifest, "PpocrCls", library, list(cases.values()), stubs, host_jni, wheel_lib_dirs,
                        tmp_path)
    assert info["INPUTS"] == ["['x' float32 [1, 3, 48, W=32..256:32]]"]
    expected = {w: run_reference(build / manifest.model_file, manifest.model_format, {"x": feeds[w]},
                                 manifest.outputs) for w in (32, 96, 256)}
    spec = manifest.outputs[0]
    for w in (32, 96, 256):
        assert not _errors(cases[w]), _errors(cases[w])
        for prefix in ("out", "alt"):
            [actual] = _dynamic_results(cases[w], manifest, prefix)
            result = compare(spec.name, actual, expected[w][0], 1e-4, 1e-3)
            assert result.passed, (w, prefix, result)
    [at_32] = _dynamic_results(cases[32], manifest, "out")
    assert not compare(spec.name, at_32, expected[256][0], 1e-4, 1e-3).passed  # the check can fail
    for w in (288, 40):
        message = ["EP_ERR_SHAPE", f"input 0 'x' dimension 3 (W) is {w}; the model takes W from 32 to 256 in steps of 32"]
        assert _errors(cases[w]) == {"error_gen": message, "error_nat": message}, w


# ---------------------------------------------------------------------------------------------
# the AAR, assembled from libraries built here


@pytest.fixture(scope="session")
def aarch64_jni(tmp_path_factory, host_runtime) -> Path | None:
    """libedgepack_jni.so for AArch64 (glibc cross compiler; TVM symbols left undefined): a real
    AArch64 shared library to put under arm64-v8a."""
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        return None
    out = tmp_path_factory.mktemp("jni-aarch64") / JNI_LIBRARY
    c_dir = source_dir(C_API)
    includes = [f"-I{d}" for d in (c_dir / "include", *host_runtime.include_dirs, *jdk_include_dirs())]
    _run(["aarch64-linux-gnu-gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", *includes,
          android_sources_dir() / "jni" / "edgepack_jni.c", *c_api_sources(), "-o", out])
    return out


def test_assemble_aar_checks_the_machine_of_every_library(host_runtime, aarch64_jni, stubs, tmp_path):
    jar = make_jar(stubs, tmp_path / "classes.jar")
    xml = manifest_xml_text(PACKAGE, "tiny")
    host_lib = host_runtime.shared_libs[0]  # x86-64
    with pytest.raises(EdgepackError, match=r"x86-64 \(EM_X86_64\), 64-bit; jni/arm64-v8a/ needs AArch64"):
        assemble_aar(tmp_path / "a.aar", classes_jar=jar, manifest_xml=xml, native_libs={"arm64-v8a": [host_lib]})
    with pytest.raises(EdgepackError, match="jni/armeabi-v7a/ needs 32-bit ARM"):
        assemble_aar(tmp_path / "a.aar", classes_jar=jar, manifest_xml=xml, native_libs={"armeabi-v7a": [host_lib]})
    not_elf = tmp_path / "libnot.so"
    not_elf.write_text("hello")
    with pytest.raises(EdgepackError, match="not an ELF file"):
        assemble_aar(tmp_path / "a.aar", classes_jar=jar, manifest_xml=xml, native_libs={"x86_64": [not_elf]})
    with pytest.raises(EdgepackError, match="lib\\*.so"):
        assemble_aar(tmp_path / "a.aar", classes_jar=jar, manifest_xml=xml,
                             native_libs={"x86_64": [tmp_path / "classes.jar"]})
    with pytest.raises(EdgepackError, match="Unknown Android ABI"):
        assemble_aar(tmp_path / "a.aar", classes_jar=jar, manifest_xml=xml, native_libs={"mips": [host_lib]})
    assert not (tmp_path / "a.aar").exists()

    libs = {"x86_64": list(host_runtime.shared_libs)}
    if aarch64_jni is not None:
        with pytest.raises(EdgepackError, match="AArch64 \\(EM_AARCH64\\), 64-bit; jni/x86_64/ needs x86-64"):
            assemble_aar(tmp_path / "a.aar", classes_jar=jar, manifest_xml=xml, native_libs={"x86_64": [aarch64_jni]})
        libs["arm64-v8a"] = [aarch64_jni]
    aar = assemble_aar(tmp_path / "ok.aar", classes_jar=jar, manifest_xml=xml, native_libs=libs)
    again = assemble_aar(tmp_path / "again.aar", classes_jar=jar, manifest_xml=xml, native_libs=libs)
    assert aar.read_bytes() == again.read_bytes()  # reproducible
    with zipfile.ZipFile(aar) as z:
        names = set(z.namelist())
        for name in names:
            if name.startswith("jni/"):
                abi = name.split("/")[1]
                data = z.read(name)
                assert int.from_bytes(data[18:20], "little") == ABI_MACHINES[abi][0], name


@pytest.mark.slow
def test_android_package_layout_from_host_libraries(tiny_build, host_runtime, stubs, tmp_path):
    """The package writer (AAR + Gradle module + README + manifest) fed with host libraries under x86_64
    (the only place the AAR code accepts them); the classes and libraries of the AAR then run the
    model on the JVM, found through a Context like on a device (extracted, and inside an APK)."""
    manifest = read_manifest(tiny_build)
    sources = generate_java_sources(manifest, PACKAGE, "Tiny")
    classes, _ = compile_java_api(sources, tmp_path / "java")
    jar = make_jar(classes, tmp_path / "classes.jar")
    # a JNI library like the Android one: no RUNPATH, the Java class preloads the runtime libraries
    jni = build_jni_library(host_runtime, tmp_path / "jni" / JNI_LIBRARY, "gcc",
                                    jdk_include_dirs(), werror=True, strip=True)
    libraries = {"x86_64": AbiLibraries(jni=jni, runtime=host_runtime.shared_libs,
                                                model=tiny_build / "device" / "model.so")}
    out = tmp_path / "dist"
    out.mkdir()
    aar, module, files = write_android_package(
        out, manifest=manifest, java_package=PACKAGE, class_name="Tiny", libraries=libraries, classes_jar=jar,
        sources=sources, runtime_include_dirs=host_runtime.include_dirs)

    # -- the AAR
    assert aar.name == "edgepack-tiny.aar"
    with zipfile.ZipFile(aar) as z:
        names = set(z.namelist())
        assert {"AndroidManifest.xml", "classes.jar", "R.txt", "proguard.txt", "jni/x86_64/libedgepack_jni.so",
                "jni/x86_64/libtvm_runtime.so", "jni/x86_64/libtvm_ffi.so",
                "jni/x86_64/libedgepack_model_tiny.so"} == names
        xml = z.read("AndroidManifest.xml").decode()
        assert f'package="{PACKAGE}"' in xml and 'android:minSdkVersion="24"' in xml
        assert "-keep class ai.edgepack.** { *; }" in z.read("proguard.txt").decode()
        assert f"-keep class {PACKAGE}.Tiny$* {{ *; }}" in z.read("proguard.txt").decode()
        for name in names:
            if name.startswith("jni/"):
                assert int.from_bytes(z.read(name)[18:20], "little") == EM_X86_64, name
        extracted = tmp_path / "aar"
        z.extractall(extracted)
    with zipfile.ZipFile(extracted / "classes.jar") as jarfile:
        entries = set(jarfile.namelist())
    assert "META-INF/MANIFEST.MF" in entries and "com/example/vision/Tiny.class" in entries
    assert "ai/edgepack/NativeModel.class" in entries and not any(e.startswith("android/") for e in entries)

    # -- the Gradle module
    for rel in ("build.gradle", "consumer-rules.pro", "src/main/AndroidManifest.xml",
                "src/main/java/ai/edgepack/NativeModel.java", "src/main/java/com/example/vision/Tiny.java",
                "src/main/cpp/CMakeLists.txt", "src/main/cpp/edgepack_jni.c", "src/main/cpp/edgepack.c",
                "src/main/cpp/include/edgepack.h", "src/main/cpp/include/tvm/ffi/c_api.h",
                "src/main/cpp/include/dlpack/dlpack.h", "src/main/cpp/prebuilt/x86_64/libtvm_runtime.so",
                "src/main/jniLibs/x86_64/libedgepack_model_tiny.so"):
        assert (module / rel).is_file(), rel
    gradle = (module / "build.gradle").read_text()
    assert f"namespace '{PACKAGE}'" in gradle and "abiFilters 'x86_64'" in gradle and "minSdk 24" in gradle
    assert not (module / "src/main/jniLibs/x86_64/libtvm_runtime.so").exists()  # packaged via CMake IMPORTED
    # the module's CMakeLists builds the JNI library (here for x86_64 with the host compiler)
    _needs("cmake")
    jdk = jdk_include_dirs()
    _run(["cmake", "-S", module / "src/main/cpp", "-B", tmp_path / "cmake", "-DANDROID_ABI=x86_64",
          "-DCMAKE_C_COMPILER=gcc", f"-DCMAKE_C_FLAGS=-I{jdk[0]} -I{jdk[1]} -Werror"])
    _run(["cmake", "--build", tmp_path / "cmake"])
    assert (tmp_path / "cmake" / JNI_LIBRARY).is_file()

    readme = (out / "README.md").read_text()
    assert "implementation files('libs/edgepack-tiny.aar')" in readme and "Tiny.load(context)" in readme
    listed = {f.path: f for f in files}
    assert "edgepack-tiny.aar" in listed and hashlib.sha256(aar.read_bytes()).hexdigest() == listed[
        "edgepack-tiny.aar"].sha256

    # -- run the model from what the AAR holds: classes.jar + jni/x86_64, found through a Context
    harness = compile_java({"FakeContext.java": FAKE_CONTEXT,
                                    "RunModel.java": run_model_harness(manifest, "Tiny")},
                                   tmp_path / "harness", [extracted / "classes.jar", stubs])
    libdir = extracted / "jni" / "x86_64"
    classpath = [extracted / "classes.jar", harness, stubs]
    d = tmp_path / "io"
    inputs = write_inputs(manifest, d, seed=4)
    # 1. installer extracted the libraries: nativeLibraryDir holds them
    java(classpath, "RunModel", "context", libdir, d, "/nonexistent.apk", tmp_path / "cache1",
         library_path=[str(libdir)])
    check_against_reference(tiny_build, manifest, inputs, d)
    # 2. libraries left inside the APK (lib/<abi>/, as AGP packages an AAR's jni/<abi>/): extracted once
    apk = tmp_path / "app.apk"
    with zipfile.ZipFile(apk, "w") as z:
        for lib in libdir.iterdir():
            z.write(lib, f"lib/x86_64/{lib.name}")
    (tmp_path / "empty").mkdir()
    for d_run in (tmp_path / "io", tmp_path / "io"):  # the second run reuses the extracted copy
        java(classpath, "RunModel", "context", tmp_path / "empty", d_run, apk, tmp_path / "cache2",
             library_path=[str(libdir)], extra_props=["-Dedgepack.stub.abis=arm64-v8a,x86_64"])
    copies = list((tmp_path / "cache2" / "edgepack").rglob("libedgepack_model_tiny.so"))
    assert len(copies) == 1
    check_against_reference(tiny_build, manifest, inputs, d)
    # 3. not in the app at all: a clear error
    missing = java(classpath, "RunModel", "context", tmp_path / "empty", d, tmp_path / "classes.jar",
                   tmp_path / "cache3", library_path=[str(libdir)], check=False)
    assert missing.returncode != 0
    assert "EP_ERR_NOT_FOUND" in missing.stderr and "libedgepack_model_tiny.so is neither in" in missing.stderr


# ---------------------------------------------------------------------------------------------
# no NDK: refuse, clearly


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`edgepack package android ...` through the real entry point (cli.main.main), with the command mounted
    as cli/main.py mounts it."""
    code = ("import sys\n"
            "from edgepack.cli import main as cli\n"
            "from edgepack.cli.android import package_android_command\n"
            "names = [c.name for c in cli.package_app.registered_commands]\n"
            "if 'android' not in names:\n"
            "    cli.package_app.command('android')(package_android_command)\n"
            "sys.argv = ['edgepack', *sys.argv[1:]]\n"
            "cli.main()\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300,
                          check=False)


def _env_without_ndk(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NDK_VARS}
    return {**env, "COLUMNS": "1000", **extra}


def test_cli_refuses_without_an_ndk(tiny_build, tmp_path):
    out = tmp_path / "dist"
    result = _cli("package", "android", str(tiny_build), "-o", str(out), "--package", PACKAGE, env=_env_without_ndk())
    assert_clean_error(result, "needs the Android NDK", "--ndk is missing", "ANDROID_NDK_HOME", "TVM_NDK_CC",
                       "never puts a non-Android library into an AAR", "--ndk /path/to/android-ndk")
    assert not out.exists()

    result = _cli("package", "android", str(tiny_build), "-o", str(out), "--package", PACKAGE,
                  "--ndk", str(tmp_path / "no-ndk"), env=_env_without_ndk())
    assert_clean_error(result, "No NDK clang (aarch64-linux-android24-clang++) was found under", "no-ndk")

    # an "NDK" whose clang exists cannot make a host build Android: refused before any build
    bin_dir = tmp_path / "fake-ndk" / "toolchains" / "llvm" / "prebuilt" / "linux-x86_64" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("aarch64-linux-android24-clang", "aarch64-linux-android24-clang++"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    result = _cli("package", "android", str(tiny_build), "-o", str(out), "--package", PACKAGE,
                  env=_env_without_ndk(ANDROID_NDK_HOME=str(tmp_path / "fake-ndk")))
    assert_clean_error(result, "was compiled for host (x86_64-linux-gnu), not for Android", "--profile android-arm64")
    assert not out.exists()

    result = _cli("package", "android", str(tiny_build), "-o", str(out), "--package", "com.example.class",
                  env=_env_without_ndk())
    assert_clean_error(result, "not a valid Java package name")


def test_library_refuses_without_an_ndk(tiny_build, tmp_path, monkeypatch):
    for var in NDK_VARS:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ToolchainError) as info:
        package_android(tiny_build, tmp_path / "dist", java_package=PACKAGE)
    assert "needs the Android NDK" in info.value.message and "ANDROID_NDK_HOME" in info.value.hint
    with pytest.raises(EdgepackError, match="Unknown or missing Android ABI"):
        package_android(tiny_build, tmp_path / "dist", java_package=PACKAGE, abis=("mips",))
    assert not (tmp_path / "dist").exists()
    json.dumps(ABIS["arm64-v8a"].tvm_target)  # plain data
