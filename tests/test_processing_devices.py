"""Processing compiled into real models, end to end on every path a build runs on: BlazeFace (TFLite,
NHWC) with rgb8 and NV21 frames, MobileNetV2 (ONNX, NCHW) with bgr8 frames and top-5, and a detector
with NMS, validated against the independent reference on this machine, under qemu (rpi4, rpi3), on
PoCL (OpenCL) and lavapipe (Vulkan); the C runner reading a uint8 .npy frame; the Java API running a
frame (ByteBuffer and Bitmap) on the JVM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from gpu_common import opencl_driver_missing, vulkan_driver_missing
from model_factory import onnx_detector

from edgepack.backends import get_backend
from edgepack.compiling import compile_model
from edgepack.manifest import read_manifest
from edgepack.packaging.c import package_c, run_bundle
from edgepack.processing import manifest_plan, picture_frames, random_frames, run_processed_reference
from edgepack.profiles import get_profile
from edgepack.toolchain.compilers import emulator_command
from edgepack.validation import compare, validate

MNV2_PRE = "input=image:bgr8,size=480x640,resize=bilinear,mean=123.7/116.3/103.5,std=58.4/57.1/57.4"
CASES = {
    "mobilenetv2-bgr8-top5": ("mobilenetv2", [MNV2_PRE], ["logits=topk:5"]),
    "blazeface-rgb8": ("face_detection_short_range", ["input=image:rgb8,mean=127.5,std=127.5"],
                       ["classificators=sigmoid"]),
    "blazeface-nv21": ("face_detection_short_range", ["input=image:nv21,size=240x320,mean=127.5,std=127.5"], []),
    "detector-nms": ("detector", ["input=image:rgb8,size=96x128,mean=127.5,std=127.5"],
                     ["boxes,scores=nms:iou=0.45,score=0.5,max=100,boxes=cxcywh"]),
    # frames of any size in the ranges (a phone's camera, a photo), resized to BlazeFace's 128x128 at run time
    "blazeface-any-frame": ("face_detection_short_range", ["input=image:rgb8,size=FHxFW,mean=127.5,std=127.5"],
                            ["classificators=sigmoid"], ["FH=96..480:4", "FW=128..640:4"]),
}


@pytest.fixture(scope="session")
def processed(models, tmp_path_factory):
    """``get(case, profile)``: the case's model compiled with its processing, once per session."""
    root = tmp_path_factory.mktemp("processed")
    built: dict[tuple[str, str], Path] = {}

    def get(case: str, profile: str) -> Path:
        if (case, profile) not in built:
            name, pre, post, *dims = CASES[case]
            model = onnx_detector(root / "detector.onnx") if name == "detector" else models[name].path
            built[(case, profile)] = compile_model(model, profile, root / f"{case}-{profile}", preprocess=pre,
                                                   postprocess=post, dims=dims[0] if dims else None).output_dir
        return built[(case, profile)]

    return get


def _check(build: Path, on: str) -> None:
    report = validate(build, on)
    assert report.passed, report
    dynamic = bool(read_manifest(build).dims)  # frames of any size: both kinds at each of 5 sizes
    assert report.inputs == "random frames (seed 0) and a test picture" + (" at 5 sizes" if dynamic else "")
    assert report.reference.endswith("with the processing as ONNX (pre) and NumPy (post)")


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
@pytest.mark.parametrize("case", list(CASES))
def test_processed_models_validate_here_and_under_qemu(processed, case, profile):
    build = processed(case, profile)
    manifest = read_manifest(build)
    assert manifest.inputs[0].dtype == "uint8" and manifest.processing is not None
    _check(build, "host")
    _check(build, "emulator")


# ----------------------------------------------------------------------------------------------
# GPUs on this machine


def _gpu(name: str, missing) -> object:
    """The backend, its device ready; skips only where the system lists no such device (``missing``)."""
    why = missing()
    if why:
        pytest.skip(why)
    backend = get_backend(name)
    backend.require_device()  # edgepack's own plug-in: an error here fails the test
    return backend


@pytest.fixture(scope="session")
def opencl_device():
    return _gpu("opencl", opencl_driver_missing)


@pytest.fixture(scope="session")
def vulkan_device():
    return _gpu("vulkan", vulkan_driver_missing)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_processed_models_validate_on_opencl(processed, opencl_device, case):
    build = processed(case, "x86-64-opencl")
    gpu = read_manifest(build).extra["opencl"]
    assert gpu["cpu_fallback"] == []
    names = [f["name"] for f in gpu["functions"]]
    assert any(n.startswith("fused_frame_pixels") for n in names), names  # the pre-processing: one kernel
    _check(build, "host-opencl")
    if case == "detector-nms":  # the static C bundle compiles the processed program again: one binary here
        bundle = package_c(build, build.parent / f"{build.name}-c", force=True)
        frames = random_frames(manifest_plan(read_manifest(build)), seed=3)
        outputs = run_bundle(bundle.output_dir, frames, emulate=False, static=True).outputs
        _assert_matches(build, outputs, _reference(build, frames["input"]))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_processed_models_validate_on_vulkan(processed, vulkan_device, case):
    build = processed(case, "vulkan-generic")
    assert read_manifest(build).extra["vulkan"]["cpu_fallback"] == []
    _check(build, "host-vulkan")


# ----------------------------------------------------------------------------------------------
# the C runner and the Java API


def _reference(build: Path, frame: np.ndarray) -> list[np.ndarray]:
    manifest = read_manifest(build)
    plan = manifest_plan(manifest)
    return run_processed_reference(build / manifest.model_file, manifest.model_format, plan, {"input": frame}).outputs


def _assert_matches(build: Path, outputs, expected) -> None:
    for spec, a, e in zip(read_manifest(build).outputs, outputs, expected):
        result = compare(spec.name, np.asarray(a), e, 1e-4, 1e-3)
        assert result.passed, result


@pytest.mark.slow
def test_c_runner_reads_a_uint8_npy_frame(processed, tmp_path):
    build = processed("mobilenetv2-bgr8-top5", "rpi4")
    bundle = package_c(build, tmp_path / "c")
    header = (bundle.output_dir / "include" / "edgepack_model.h").read_text()
    assert "#define EDGEPACK_MODEL_INPUT_FRAME_HEIGHT 480" in header and "logits_indices  int32 [1, 5]" in header
    program = tmp_path / "uses_header.c"
    program.write_text('#include "edgepack.h"\n#include "edgepack_model.h"\n'
                       "int main(void) { return EDGEPACK_MODEL_INPUT_FRAME_BYTES == 480 * 640 * 3 "
                       "&& EDGEPACK_MODEL_OUTPUT_LOGITS_SCORES == 1 ? 0 : 1; }\n")
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{bundle.output_dir / 'include'}",
                    str(program)], check=True, capture_output=True)
    plan = manifest_plan(read_manifest(build))
    frame = picture_frames(plan)["input"]
    expected = _reference(build, frame)
    # the runner itself, as a user runs it on the device: a .npy frame in, .npy answers out
    np.save(tmp_path / "frame.npy", frame)
    out = tmp_path / "out"
    out.mkdir()
    for runner in ("edgepack_run", "edgepack_run_static"):
        argv = [*emulator_command(get_profile("rpi4")), str(bundle.output_dir / "bin" / runner)]
        argv += [str(bundle.output_dir / "lib" / "model.so")] if runner == "edgepack_run" else []
        result = subprocess.run([*argv, "--input", f"input={tmp_path / 'frame.npy'}", "--output-dir", str(out)],
                                capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, result.stderr
        assert "output 0 logits_indices int32" in result.stdout, result.stdout
        _assert_matches(build, [np.load(sorted(out.glob(f"{i}_*.npy"))[0]) for i in range(2)], expected)
    # edgepack.run_bundle and `edgepack run` with an .npz of frames
    _assert_matches(build, run_bundle(bundle.output_dir, {"input": frame}).outputs, expected)
    frames = random_frames(plan, seed=5)
    np.savez(tmp_path / "frames.npz", **frames)
    cli = run_cli("run", str(bundle.output_dir), "--inputs", str(tmp_path / "frames.npz"), "--json", check=True)
    data = json.loads(cli.stdout)
    assert [o["name"] for o in data["outputs"]] == ["logits_indices", "logits_scores"]
    want = _reference(build, frames["input"])
    assert data["outputs"][0]["values"] == want[0].ravel().tolist()


def _java_harness(manifest, cls: str, harness: dict[str, str], tmp_path: Path):
    """The generated class of ``manifest`` and ``harness`` compiled, and the JNI library built for this machine:
    (class path, java.library.path, LD_LIBRARY_PATH)."""
    from test_android import _needs, compile_api

    from edgepack.packaging.android.aar import JNI_LIBRARY, build_jni_library
    from edgepack.packaging.android.java import android_stub_sources
    from edgepack.packaging.android.javac import compile_java, jdk_include_dirs
    from edgepack.toolchain import tvm_runtime

    _needs("javac", "java", "gcc")
    stubs = compile_java(android_stub_sources(), tmp_path / "stubs", werror=True)
    runtime = tvm_runtime.host_runtime()
    libs = list(dict.fromkeys(str(p.parent) for p in runtime.shared_libs))
    jni = build_jni_library(runtime, tmp_path / "jni" / JNI_LIBRARY, "gcc", jdk_include_dirs(), werror=True, rpath=libs)
    classes = compile_api(manifest, cls, tmp_path, stubs, harness)
    return [tmp_path / "api", classes, stubs], [str(jni.parent), *libs], libs


JAVA_FRAME_HARNESS = """
import {package}.{cls};
import android.graphics.Bitmap;
import java.nio.*;
import java.nio.file.*;

public class RunFrame {{
  public static void main(String[] a) throws Exception {{
    byte[] rgb = Files.readAllBytes(Paths.get(a[1]));
    int h = {cls}.FRAME_HEIGHT, w = {cls}.FRAME_WIDTH;
    int[] colors = new int[h * w];
    for (int i = 0; i < h * w; i++) {{
      colors[i] = 0xff000000 | (rgb[3 * i] & 0xff) << 16 | (rgb[3 * i + 1] & 0xff) << 8 | (rgb[3 * i + 2] & 0xff);
    }}
    try ({cls} model = {cls}.load(new java.io.File(a[0]))) {{
      ByteBuffer frame = {cls}.newInputBuffer();
      frame.put(Files.readAllBytes(Paths.get(a[2])));
      frame.rewind();
      {cls}.Outputs fromFrame = model.run(frame);
      {cls}.Outputs fromBitmap = model.run(Bitmap.createBitmap(colors, w, h, Bitmap.Config.ARGB_8888));
      for ({cls}.Outputs out : new {cls}.Outputs[] {{fromFrame, fromBitmap}}) {{
        StringBuilder line = new StringBuilder();
        for (int k = 0; k < out.logitsIndices.limit(); k++) line.append(out.logitsIndices.get(k)).append(' ');
        for (int k = 0; k < out.logitsScores.limit(); k++) line.append(out.logitsScores.get(k)).append(' ');
        System.out.println(line.toString().trim());
      }}
      try {{
        model.run(Bitmap.createBitmap(colors, w - 1, h, Bitmap.Config.ARGB_8888));
      }} catch (ai.edgepack.EdgepackException e) {{
        System.out.println("refused: " + e.getMessage());
      }}
    }}
  }}
}}
"""


@pytest.mark.slow
def test_java_api_runs_a_frame_and_a_bitmap_on_the_jvm(processed, tmp_path):
    from test_android import PACKAGE, java

    from edgepack.packaging.android.java import generate_java_sources
    from edgepack.processing import synthetic_picture

    build = processed("mobilenetv2-bgr8-top5", "host")
    manifest = read_manifest(build)
    source = generate_java_sources(manifest, PACKAGE, "Classifier")[f"{PACKAGE.replace('.', '/')}/Classifier.java"]
    assert "public Outputs run(Bitmap bitmap)" in source and "FRAME_FORMAT = \"bgr8\"" in source
    assert "resized bilinear (half-pixel centres) to 224x224" in source
    classpath, library_path, libs = _java_harness(
        manifest, "Classifier", {"RunFrame.java": JAVA_FRAME_HARNESS.format(package=PACKAGE, cls="Classifier")}, tmp_path)
    rgb = synthetic_picture(480, 640)
    frame = np.ascontiguousarray(rgb[..., ::-1])  # bgr8, as Frames.fromBitmap makes it
    (tmp_path / "rgb.bin").write_bytes(rgb.tobytes())
    (tmp_path / "frame.bin").write_bytes(frame.tobytes())
    out = java(classpath, "RunFrame", build / manifest.artifacts["device_library"].path,
               tmp_path / "rgb.bin", tmp_path / "frame.bin", library_path=library_path, ld_path=libs)
    lines = out.stdout.strip().splitlines()
    expected = _reference(build, frame)
    for line in lines[:2]:  # run(ByteBuffer frame), then run(Bitmap)
        values = line.split()
        _assert_matches(build, [np.array([[int(v) for v in values[:5]]], np.int32),
                                np.array([[float(v) for v in values[5:]]], np.float32)], expected)
    assert lines[2].startswith("refused: the bitmap is 639x480 (width x height) but the model takes 640x480"), lines


JAVA_ANY_FRAME_HARNESS = """
import {package}.{cls};
import android.graphics.Bitmap;
import java.nio.file.*;

public class RunAnyFrame {{
  public static void main(String[] a) throws Exception {{
    try ({cls} model = {cls}.load(new java.io.File(a[0]))) {{
      for (int k = 1; k + 2 < a.length + 1; k += 3) {{
        int h = Integer.parseInt(a[k]), w = Integer.parseInt(a[k + 1]);
        byte[] rgb = Files.readAllBytes(Paths.get(a[k + 2]));
        int[] colors = new int[h * w];
        for (int i = 0; i < h * w; i++) {{
          colors[i] = 0xff000000 | (rgb[3 * i] & 0xff) << 16 | (rgb[3 * i + 1] & 0xff) << 8 | (rgb[3 * i + 2] & 0xff);
        }}
        try {{
          {cls}.Outputs out = model.run(Bitmap.createBitmap(colors, w, h, Bitmap.Config.ARGB_8888));
          StringBuilder line = new StringBuilder();
          for (int i = 0; i < out.classificators.limit(); i++) line.append(out.classificators.get(i)).append(' ');
          System.out.println(line.toString().trim());
        }} catch (ai.edgepack.EdgepackException e) {{
          System.out.println("refused: " + e.getMessage());
        }}
      }}
    }}
  }}
}}
"""


@pytest.mark.slow
def test_frames_of_any_size_through_the_c_runner_and_java(processed, tmp_path):
    """One build for frames of any size in FH x FW: the C runner on the device (rpi4, qemu) and the Java API's
    run(Bitmap) on the JVM take pictures of two sizes, each matching the reference made at its size, and refuse
    one outside the ranges by name."""
    from test_android import PACKAGE, java

    from edgepack.packaging.android.java import generate_java_sources
    from edgepack.processing import synthetic_picture

    sizes = [(120, 160), (476, 300)]
    pictures = {size: synthetic_picture(*size) for size in sizes}
    build = processed("blazeface-any-frame", "rpi4")
    bundle = package_c(build, tmp_path / "c")
    header = (bundle.output_dir / "include" / "edgepack_model.h").read_text()
    assert "EDGEPACK_MODEL_DIM_FH_MAX 480" in header and "FRAME_BYTES_MAX" in header
    runner = [*emulator_command(get_profile("rpi4")), str(bundle.output_dir / "bin" / "edgepack_run"),
              str(bundle.output_dir / "lib" / "model.so")]
    for size, rgb in pictures.items():
        np.save(tmp_path / "frame.npy", rgb)
        out = tmp_path / f"out{size[0]}"
        out.mkdir()
        result = subprocess.run([*runner, "--input", f"input={tmp_path / 'frame.npy'}", "--output-dir", str(out)],
                                capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, result.stderr
        outputs = [np.load(min(out.glob(f"{i}_*.npy"))) for i in range(2)]
        _assert_matches(build, outputs, _reference(build, rgb))
    np.save(tmp_path / "small.npy", synthetic_picture(92, 160))  # FH below its range
    result = subprocess.run([*runner, "--input", f"input={tmp_path / 'small.npy'}", "--output-dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode != 0 and "FH" in result.stderr and "96" in result.stderr, result.stderr

    host = processed("blazeface-any-frame", "host")
    manifest = read_manifest(host)
    source = generate_java_sources(manifest, PACKAGE, "FaceDetector")[f"{PACKAGE.replace('.', '/')}/FaceDetector.java"]
    assert "public Outputs run(Bitmap bitmap)" in source and "FRAME_HEIGHT" not in source
    classpath, library_path, libs = _java_harness(
        manifest, "FaceDetector", {"RunAnyFrame.java": JAVA_ANY_FRAME_HARNESS.format(package=PACKAGE, cls="FaceDetector")},
        tmp_path)
    args = []
    for (h, w), rgb in [*pictures.items(), ((92, 160), synthetic_picture(92, 160))]:
        (tmp_path / f"rgb{h}.bin").write_bytes(rgb.tobytes())
        args += [str(h), str(w), tmp_path / f"rgb{h}.bin"]
    out = java(classpath, "RunAnyFrame", host / manifest.artifacts["device_library"].path, *args,
               library_path=library_path, ld_path=libs)
    lines = out.stdout.strip().splitlines()
    index = [t.name for t in manifest.outputs].index("classificators")
    for line, rgb in zip(lines[:2], pictures.values()):
        scores = np.array([float(v) for v in line.split()], np.float32)
        expected = _reference(host, rgb)[index]
        assert compare("classificators", scores.reshape(expected.shape), expected, 1e-4, 1e-3).passed
    assert lines[2].startswith("refused:") and "FH" in lines[2], lines
