"""Half precision (``compile --precision fp16``, issue 42): GPU builds that store and compute their float
tensors in float16, validated on lavapipe (which has shader-f16) against ONNX Runtime / LiteRT within the
tolerance stated for fp16; OpenCL fp16 kernels need cl_khr_fp16, which PoCL 3.1 lacks: there the build
is refused before it runs, by name."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_clean_error, run_cli, validate_real_model
from gpu_common import plugin_with_a_device
from mutation import wrong_build

from edgepack.compiling import compile_model
from edgepack.errors import CompileError, EdgepackError, ProfileError
from edgepack.manifest import read_manifest
from edgepack.profiles import Precision, get_profile, parse_precision, profile_from_dict
from edgepack.validation import DEFAULT_ATOL, FP16_ATOL, FP16_RTOL, scaled_atol, validate


@pytest.fixture(scope="session")
def lavapipe():
    return plugin_with_a_device("vulkan")


def _float32_weight_bytes(model: Path) -> int:
    """Bytes of an ONNX model's float32 weights: its initializers and Constant nodes."""
    graph = onnx.load(str(model)).graph
    tensors = [*graph.initializer, *(a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                     if a.name == "value")]
    return sum(int(np.prod(t.dims)) * 4 for t in tensors if t.data_type == onnx.TensorProto.FLOAT)


# ----------------------------------------------------------------------------------------------
# profiles and refusals (fast)


def test_profiles_state_their_precision():
    """Phones' GPU profiles default to fp16, as LiteRT's GPU delegate does; the rest to fp32. A build records
    its profile whole, the [precision] table included."""
    assert get_profile("android-mali").precision == Precision("fp16", "fp32")
    assert get_profile("adreno-6xx").precision == Precision("fp16", "fp32")
    for name in ("mali-g610", "vulkan-generic", "rpi4", "host"):
        assert get_profile(name).precision.default == "fp32", name
    phone = get_profile("android-mali")
    assert profile_from_dict(phone.to_dict()).precision == phone.precision
    with pytest.raises(ProfileError, match=r"\[precision\] table has values that are no precision: default = 'fp8'"):
        parse_precision({"default": "fp8"})
    with pytest.raises(ProfileError, match="unknown keys accumulator"):
        parse_precision({"accumulator": "fp16"})


def test_cpu_profiles_refuse_fp16_before_any_work(models, tmp_path):
    cls = models["ppocr_cls"]
    with pytest.raises(CompileError, match="rpi4 builds cannot compute in fp16") as err:
        compile_model(cls.path, "rpi4", tmp_path / "b", input_shapes=cls.input_shapes, precision="fp16")
    assert "--precision fp32" in err.value.hint and not (tmp_path / "b").exists()
    with pytest.raises(CompileError, match="Unknown precision 'half'"):
        compile_model(cls.path, "vulkan-generic", tmp_path / "b", precision="half")
    result = run_cli("compile", str(cls.path), "-p", "host", "--precision", "fp16", "-o", str(tmp_path / "c"))
    assert_clean_error(result, "host builds cannot compute in fp16", "--precision fp32")


# ----------------------------------------------------------------------------------------------
# Vulkan (lavapipe has shader-f16)


@pytest.fixture(scope="module")
def cls_fp16(models, lavapipe, tmp_path_factory):
    """PP-OCR's classifier compiled for vulkan-generic in fp16 through the CLI."""
    cls = models["ppocr_cls"]
    out = tmp_path_factory.mktemp("fp16") / "cls"
    shape = [a for n, d in cls.input_shapes.items() for a in ("--input-shape", f"{n}:{','.join(map(str, d))}")]
    result = run_cli("compile", str(cls.path), "-p", "vulkan-generic", "--precision", "fp16", "-o", str(out), *shape,
                     check=True)
    assert "precision" in result.stdout and "fp16 (weights and activations in half precision" in \
        " ".join(result.stdout.split())
    return out


@pytest.mark.slow
def test_an_fp16_build_on_lavapipe_matches_onnxruntime_within_fp16s_tolerance(cls_fp16, models):
    """Random and natural inputs pass at fp16's tolerance; the weights are float16 constants (half the model's
    float32 weights), the shaders compute in f16, and the build is not a float32 one in disguise: at the
    float32 tolerance it fails."""
    cls = models["ppocr_cls"]
    manifest = read_manifest(cls_fp16)
    assert manifest.precision == "fp16"
    assert [t.dtype for t in (*manifest.inputs, *manifest.outputs)] == ["float32", "float32"]
    constants = manifest.extra["constants"]
    assert {c["dtype"] for c in constants["largest"]} == {"float16"}
    assert constants["bytes"] <= 0.55 * _float32_weight_bytes(cls.path), constants
    shaders = (cls_fp16 / "device" / "kernels.wgsl").read_text()
    assert "enable f16;" in shaders and re.search(r"array<f16", shaders)

    for report in validate_real_model(cls_fp16, "host-vulkan", cls):
        assert report.atol_scaled and (report.atol, report.rtol) == (FP16_ATOL, FP16_RTOL)
    strict = validate(cls_fp16, "host-vulkan", atol=1e-4, rtol=1e-3)
    assert not strict.passed and strict.outputs[0].max_abs_error > 1e-4, strict.to_dict()

    shown = json.loads(run_cli("inspect", str(cls_fp16), "--json", check=True).stdout)
    assert shown["build"]["precision"] == "fp16"
    text = run_cli("validate", str(cls_fp16), "--on", "host-vulkan", check=True).stdout
    assert "atol 0.01 of each output's largest value, rtol 0.01" in " ".join(text.split())


@pytest.mark.slow
@pytest.mark.parametrize("mutation", ["loop_bound", "scale_weights"])
def test_a_wrong_fp16_build_fails_on_lavapipe(lavapipe, models, cls_fp16, tmp_path, mutation):
    """fp16's wider tolerance still sees a wrong build: a reduction one iteration short, or one convolution's
    weights scaled by 1.1, fails; the right fp16 build passes the same check."""
    cls = models["ppocr_cls"]
    assert validate(cls_fp16, "host-vulkan").passed
    build = wrong_build(cls.path, "vulkan-generic", tmp_path / mutation, mutation, input_shapes=cls.input_shapes,
                        precision="fp16")
    assert read_manifest(build).precision == "fp16"
    report = validate(build, "host-vulkan")
    assert not report.passed and report.outputs[0].mismatched > 0 and not report.degenerate, report.to_dict()


@pytest.mark.slow
def test_a_float16_tflite_model_keeps_float16_weights_on_lavapipe(lavapipe, models, tmp_path):
    """MediaPipe's face detector stores float16 weights behind DEQUANTIZE; the importer widens them, fp16 builds
    store them as float16 again (the fp32 build's constants are twice the size) and match LiteRT."""
    face = models["face_detection_short_range"]
    half = compile_model(face.path, "vulkan-generic", tmp_path / "half", input_shapes=face.input_shapes,
                         precision="fp16")
    full = compile_model(face.path, "vulkan-generic", tmp_path / "full", input_shapes=face.input_shapes)
    half_bytes = half.manifest.extra["constants"]["bytes"]
    assert half_bytes <= 0.55 * full.manifest.extra["constants"]["bytes"]
    assert half.device_library.stat().st_size < full.device_library.stat().st_size
    validate_real_model(half.output_dir, "host-vulkan", face)


@pytest.mark.slow
def test_an_audio_model_keeps_its_1d_convolutions_in_fp32_and_matches_on_lavapipe(lavapipe, models, tmp_path,
                                                                                 monkeypatch):
    """Silero VAD in fp16 (the phone profiles' default): its 1-D convolutions (the STFT over raw samples) stay
    float32 kernels and the rest is half precision; on its speech it matches ONNX Runtime within fp16's
    tolerance. A wrong build fails: the same model with those convolutions in fp16 too (1.9 off)."""
    from edgepack.backends import half_precision as half

    silero = models["silero_vad"]
    build = compile_model(silero.path, "vulkan-generic", tmp_path / "half", input_shapes=silero.input_shapes,
                          precision="fp16")
    assert build.manifest.extra["constants"]["bytes"] < 0.6 * silero.path.stat().st_size  # the rest is fp16
    assert any(f["name"].startswith("conv1d") for f in build.manifest.extra["vulkan"]["functions"])
    validate_real_model(build.output_dir, "host-vulkan", silero)

    monkeypatch.setattr(half, "_conv1d_in_fp32", lambda call, builder: None)
    wrong = compile_model(silero.path, "vulkan-generic", tmp_path / "wrong", input_shapes=silero.input_shapes,
                          precision="fp16")
    report = validate(wrong.output_dir, "host-vulkan", inputs=silero.natural)
    assert not report.passed, report.to_dict()


# ----------------------------------------------------------------------------------------------
# OpenCL (cl_khr_fp16)


def _clinfo_has_fp16() -> bool | None:
    """The driver's own account (clinfo), not edgepack's: whether the first device lists cl_khr_fp16."""
    try:
        listed = subprocess.run(["clinfo"], capture_output=True, text=True, check=False, timeout=60).stdout
    except FileNotFoundError:
        return None
    extensions = re.search(r"Device Extensions\s+(.*)", listed)
    return None if extensions is None else "cl_khr_fp16" in extensions.group(1).split()


@pytest.mark.slow
def test_an_fp16_opencl_build_runs_only_where_the_driver_has_cl_khr_fp16(models, tmp_path):
    """The kernels compute in ``half`` under cl_khr_fp16; on a device without it (PoCL 3.1) validation is
    refused before any kernel is built, naming the extension and the fix (exit 2 from the CLI); with it, the
    build matches ONNX Runtime at fp16's tolerance."""
    info = plugin_with_a_device("opencl")
    cls = models["ppocr_cls"]
    build = compile_model(cls.path, "mali-g610", tmp_path / "b", input_shapes=cls.input_shapes,
                          precision="fp16").output_dir
    source = (build / "device" / "kernels.cl").read_text()
    assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in source and "__global half*" in source
    has_fp16 = info["devices"][0]["fp16"]
    listed = _clinfo_has_fp16()
    if listed is not None:
        assert has_fp16 == listed, "clinfo and edgepack's runtime disagree on cl_khr_fp16"
    if has_fp16:
        validate_real_model(build, "host-opencl", cls)
        return
    with pytest.raises(EdgepackError, match="computes in fp16, and this machine's OpenCL device .* has no cl_khr_fp16"):
        validate(build, "host-opencl")
    assert_clean_error(run_cli("validate", str(build), "--on", "host-opencl"), "has no cl_khr_fp16",
                       "--precision fp32")


def test_fp16s_absolute_tolerance_follows_each_output_and_is_never_below_fp32s():
    """1e-2 of each output's largest |reference| value, but not below DEFAULT_ATOL: a detector's map of a page
    without text (values of 6e-8) is held to no less than an fp32 build."""
    atol = scaled_atol(FP16_ATOL, {"map": np.full(4, 6e-8, np.float32), "logits": np.array([-300.0, 100.0]),
                                   "all_nan": np.array([np.nan])})
    assert atol == {"map": DEFAULT_ATOL, "logits": pytest.approx(3.0), "all_nan": DEFAULT_ATOL}
