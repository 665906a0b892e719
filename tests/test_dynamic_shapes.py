"""Issue 43: inputs whose size changes at run time. One build (``--input-shape x:1,3,48,W --dim W=32..1280``)
runs at every size in range, on the host and on the device path (the device library under qemu), each size
compared with ONNX Runtime; wrong builds and sizes out of range fail."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from gpu_common import plugin_with_a_device
from mutation import wrong_build

from edgepack.compiling import compile_model
from edgepack.dims import DimRange, check_sizes, parse_dims, parse_sizes
from edgepack.errors import ShapeError
from edgepack.frontends import parse_input_shapes
from edgepack.manifest import read_manifest
from edgepack.validation import validate

REC_DIMS = ["W=32..1280"]
REC_SHAPE = {"x": (1, 3, 48, "W")}


def test_dims_parse_and_the_sizes_checked():
    dims = parse_dims(["W=32..1280", "H=320..640:32"])
    assert dims["W"] == DimRange("W", 32, 1280, 1) and dims["H"] == DimRange("H", 320, 640, 32)
    sizes = check_sizes(dims)
    assert len(sizes) == 5
    assert {s["W"] for s in sizes} >= {32, 1280} and {s["H"] for s in sizes} >= {320, 640}
    assert all(dims[k].takes(v) for s in sizes for k, v in s.items())
    assert sum(s["W"] % 2 for s in sizes) >= 2  # odd widths: sizes no tile divides
    assert parse_input_shapes(["x:1,3,48,W"]) == {"x": (1, 3, 48, "W")}
    assert parse_sizes(["W=417", "H=352"], dims) == {"W": 417, "H": 352}
    for bad, needle in ((["W=32"], "NAME=MIN..MAX"), (["W=64..32"], "1 <= MIN <= MAX"),
                        (["H=320..650:32"], "not a multiple of 32"), (["W=1..2", "W=3..4"], "twice")):
        with pytest.raises(ShapeError, match=needle):
            parse_dims(bad)
    with pytest.raises(ShapeError, match="outside the build's range H=320..640:32"):
        parse_sizes(["W=40", "H=330"], dims)
    with pytest.raises(ShapeError, match="no value for H"):
        parse_sizes(["W=40"], dims)


@pytest.fixture(scope="module")
def rec_build(models, tmp_path_factory):
    """PP-OCRv4's recognizer for rpi4 with W = 32..1280: the device library (aarch64) and the host library of
    one compile."""
    out = tmp_path_factory.mktemp("dyn") / "rec-rpi4"
    return compile_model(models["ppocr_rec"].path, "rpi4", out, input_shapes=REC_SHAPE, dims=REC_DIMS).output_dir


def test_an_ocr_recognizer_runs_at_every_width_on_the_host(rec_build, models):
    """PP-OCRv4's SVTR recognizer (attention over the text line's columns): one build, five widths from 32 to
    1280 and the natural text line (W=160), each within validate's tolerance of ONNX Runtime."""
    manifest = read_manifest(rec_build)
    assert manifest.dims == {"W": {"min": 32, "max": 1280, "step": 1}}
    assert manifest.inputs[0].shape == (1, 3, 48, "W") and manifest.outputs[0].shape == (1, "?", 6625)
    assert "dim W 32 1280 1" in (rec_build / "device/model.meta").read_text()
    # memory planned at the largest width: at least the output of W=1280 (160 columns x 6625 classes)
    assert manifest.extra["run_memory"] >= 160 * 6625 * 4, manifest.extra["run_memory"]
    # the kernels are formed as at a fixed size: each hard-swish (scaled per channel) is read in place by the
    # 1x1 convolution after it, and the 6625-class projection has its columns padded to whole vectors
    functions = {f["name"]: f["schedule"] for f in manifest.extra["cpu"]["functions"]}
    merged = [n for n, rule in functions.items() if "maximum" in n and "conv2d" in n and rule == "cpu.Conv2D"]
    assert len(merged) >= 8, functions
    assert any("matmul" in n and "strided_slice" in n and rule == "cpu.Matmul" for n, rule in functions.items())
    report = validate(rec_build)
    assert report.passed, report.to_dict()
    assert len(report.sizes) == 5 and {s["W"] for s in report.sizes} >= {32, 1280}
    natural = validate(rec_build, inputs=models["ppocr_rec"].natural)
    assert natural.passed and not natural.degenerate, natural.to_dict()
    one = validate(rec_build, sizes=["W=417"])
    assert one.passed and one.sizes == ({"W": 417},) and one.outputs[0].shape == (1, 52, 6625)


def test_an_ocr_recognizer_runs_at_every_width_on_the_device_path(rec_build):
    """The device library (another compile: aarch64) run by the C runner under qemu at the five widths, each
    against ONNX Runtime; the C API takes each width from the .npy and returns the output's own shape."""
    report = validate(rec_build, "emulator")
    assert report.passed, report.to_dict()
    assert len(report.sizes) == 5 and "qemu" in report.ran_on


def test_sizes_outside_the_range_are_refused(rec_build, tmp_path):
    result = run_cli("validate", str(rec_build), "--size", "W=20")
    assert_clean_error(result, "W=20 is outside the build's range W=32..1280")
    np.savez(tmp_path / "wide.npz", x=np.zeros((1, 3, 48, 2000), np.float32))
    result = run_cli("validate", str(rec_build), "--inputs", str(tmp_path / "wide.npz"))
    assert_clean_error(result, "W=2000 is outside the build's range")
    result = run_cli("validate", str(rec_build), "--size", "H=20")
    assert_clean_error(result, "--size names H, which is not a dimension of this build")


def test_bad_dims_at_compile_are_refused(models, tmp_path):
    model = str(models["ppocr_rec"].path)
    result = run_cli("compile", model, "-p", "host", "-o", str(tmp_path / "a"), "--input-shape", "x:1,3,48,W")
    assert_clean_error(result, "names the dimension W, which has no range", "--dim W=")
    result = run_cli("compile", model, "-p", "host", "-o", str(tmp_path / "b"), "--input-shape", "x:1,3,48,160",
                     "--dim", "W=32..64")
    assert_clean_error(result, "--dim W is not used by any --input-shape")
    result = run_cli("compile", model, "-p", "host", "-o", str(tmp_path / "c"), "--input-shape", "x:1,3,48,W",
                     "--dim", "W=64..32")
    assert_clean_error(result, "is not a range of sizes")
    assert not any((tmp_path / d).exists() for d in "abc")


def test_a_wrong_dynamic_build_fails_validation(models, tmp_path):
    """A reduction loop of one convolution one iteration short, in a dynamic build of PP-OCR's text direction
    classifier (W = 32..256; its right build passes at the same sizes, 2e-6): validate fails."""
    build = wrong_build(models["ppocr_cls"].path, "host", tmp_path / "wrong", "loop_bound",
                        input_shapes={"x": (1, 3, 48, "W")}, dims=["W=32..256"])
    report = validate(build)
    assert not report.passed and len(report.sizes) == 5


def test_a_text_detector_runs_at_sizes_on_its_grid(models, tmp_path):
    """PP-OCRv3's DBNet detector (strided convolutions, 2x upsampling, transposed convolutions) at frame sizes
    on its 32-pixel grid (H = 32n in the program): host and the rpi3 library (armv7) under qemu."""
    build = compile_model(models["ppocr_det"].path, "rpi3", tmp_path / "det", input_shapes={"x": (1, 3, "H", "W")},
                          dims=["H=64..256:32", "W=64..320:32"]).output_dir
    # its transposed convolutions are ordinary convolutions and a pixel shuffle, as at a fixed size
    functions = [f["name"] for f in read_manifest(build).extra["cpu"]["functions"]]
    assert not any("conv2d_transpose" in n for n in functions), functions
    for on in ("host", "emulator"):
        report = validate(build, on)
        assert report.passed, report.to_dict()
        assert len(report.sizes) == 5


# ----------------------------------------------------------------------------------------------
# GPU builds (OpenCL on PoCL, Vulkan on lavapipe)

CLS_SHAPE = {"x": (1, 3, 48, "W")}


def test_a_dynamic_opencl_build_runs_at_every_width_on_pocl(models, tmp_path):
    """PP-OCR's direction classifier for mali-g610 with W = 32..256:32: one OpenCL build, validated on PoCL at
    five widths (32 and 256 among them), each against ONNX Runtime. Its reductions end with barriers that
    every work-item reaches (``uniform_barriers.py``); without that, its first kernel had not returned on PoCL
    after 10 minutes."""
    plugin_with_a_device("opencl")
    build = compile_model(models["ppocr_cls"].path, "mali-g610", tmp_path / "mali", input_shapes=CLS_SHAPE,
                          dims=["W=32..256:32"]).output_dir
    manifest = read_manifest(build)
    assert manifest.dims == {"W": {"min": 32, "max": 256, "step": 32}}
    source = (build / "device/kernels.cl").read_text()
    assert "long cse_v1" in source  # kernels take the run-time size
    report = validate(build, "host-opencl")
    assert report.passed, report.to_dict()
    assert len(report.sizes) == 5 and {s["W"] for s in report.sizes} >= {32, 256}
    one = validate(build, "host-opencl", sizes=["W=96"])
    assert one.passed and one.sizes == ({"W": 96},)


def test_a_wrong_dynamic_opencl_build_fails_validation(models, tmp_path):
    """The same build with one convolution's weights scaled by 1.1: validate on PoCL fails."""
    plugin_with_a_device("opencl")
    build = wrong_build(models["ppocr_cls"].path, "mali-g610", tmp_path / "wrong", "scale_weights",
                        input_shapes=CLS_SHAPE, dims=["W=32..256:32"])
    report = validate(build, "host-opencl", sizes=["W=96"])  # one size: the right build passes at it
    assert not report.passed and report.sizes == ({"W": 96},)


@pytest.mark.parametrize("dim", ["W=32..256", "W=32..256:32"])
def test_a_dynamic_vulkan_build_runs_at_every_width_on_lavapipe(models, tmp_path, dim):
    """PP-OCR's direction classifier for vulkan-generic with W = 32..256, without a step (odd widths among the
    five validated) and with one (W = 32 * W_32: WGSL's int64 narrowing keeps the match_cast that binds W_32,
    though nothing reads its variable), each against ONNX Runtime on lavapipe."""
    plugin_with_a_device("vulkan")
    build = compile_model(models["ppocr_cls"].path, "vulkan-generic", tmp_path / "vk", input_shapes=CLS_SHAPE,
                          dims=[dim]).output_dir
    report = validate(build, "host-vulkan")
    assert report.passed, report.to_dict()
    assert len(report.sizes) == 5 and {s["W"] for s in report.sizes} >= {32, 256}
    if ":" in dim:
        assert all(s["W"] % 32 == 0 for s in report.sizes)
    else:
        assert sum(s["W"] % 2 for s in report.sizes) >= 2


def test_a_wrong_dynamic_vulkan_build_fails_validation(models, tmp_path):
    """That Vulkan build with one convolution's weights scaled by 1.1: validate on lavapipe fails."""
    plugin_with_a_device("vulkan")
    build = wrong_build(models["ppocr_cls"].path, "vulkan-generic", tmp_path / "wrong", "scale_weights",
                        input_shapes=CLS_SHAPE, dims=["W=32..256"])
    report = validate(build, "host-vulkan", sizes=["W=97"])  # an odd width the right build passes at
    assert not report.passed and report.sizes == ({"W": 97},)
