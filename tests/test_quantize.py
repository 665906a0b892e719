"""8-bit models: `edgepack quantize` (ONNX Runtime's quantizer fed by edgepack, its cost measured), and
quantized models compiled onto integer arithmetic (exact 32-bit sums, one requantization), matching ONNX
Runtime / LiteRT within one quantization step here and where the device's code runs (qemu, rpi4 and rpi3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli

import edgepack
from edgepack.compiling import compile_model
from edgepack.errors import EdgepackError
from edgepack.validation import validate

MNV2_PRE = "input=image:rgb8,mean=123.7/116.3/103.5,std=58.4/57.1/57.4"
#: x86 profiles other than this machine's run here natively where this CPU has what they use: AVX2
#: (vpmaddwd) on every CPU the suite runs on, AVX-VNNI (Alder Lake, Sapphire Rapids and later) not everywhere
X86_AVX2 = ("x86-64-avx2", "host")
#: Armv9 with the 8-bit matrix multiply (smmla), under qemu's "max" CPU, which has it
ORION = ("orion-o6", "emulator")
X86_AVXVNNI = pytest.param("x86-64-avxvnni", "host", marks=pytest.mark.skipif(
    "avx_vnni" not in Path("/proc/cpuinfo").read_text().split(),
    reason="this machine's CPU has no AVX-VNNI: an x86-64-avxvnni build cannot run here"))


@pytest.fixture(scope="module")
def calibration(tmp_path_factory, models) -> dict:
    """A folder of pictures (real photos from the zoo's natural inputs, and drawn ones) and an .npz."""
    from PIL import Image

    from edgepack.processing import synthetic_picture

    root = tmp_path_factory.mktemp("calibration")
    folder = root / "pictures"
    folder.mkdir()
    for i, (h, w) in enumerate([(240, 320), (300, 300), (480, 640), (200, 260), (224, 224), (360, 270)]):
        Image.fromarray(np.roll(synthetic_picture(h, w), 17 * i, axis=1)).save(folder / f"drawn{i}.png")
    with np.load(models["mobilenetv2"].natural) as natural:
        photo = natural["input"][0].transpose(1, 2, 0) * np.array([58.4, 57.1, 57.4]) + np.array([123.7, 116.3, 103.5])
    Image.fromarray(np.clip(photo, 0, 255).astype(np.uint8)).save(folder / "photo.jpg")
    rng = np.random.default_rng(3)
    npz = root / "inputs.npz"
    np.savez(npz, input=rng.standard_normal((8, 1, 3, 224, 224)).astype(np.float32))
    return {"folder": folder, "npz": npz, "root": root}


@pytest.fixture(scope="module")
def quantized(models, calibration, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("quantized") / "mobilenetv2_int8.onnx"
    result = edgepack.quantize(models["mobilenetv2"].path, out, calibration=calibration["folder"],
                               preprocess=[MNV2_PRE], method="percentile", held_out=0.3)
    return {"path": out, "result": result}


def test_quantize_from_pictures_writes_a_qdq_model_and_its_cost(quantized):
    result = quantized["result"]
    assert result.calibration_samples == 5 and result.held_out_samples == 2 and result.method == "percentile"
    (logits,) = result.outputs
    assert logits.name == "logits" and 0 < logits.mean_abs_error < 1 and logits.top1_agreement is not None
    ops = edgepack.inspect(quantized["path"]).info.operator_counts
    assert ops["QuantizeLinear"] > 40 and ops["DequantizeLinear"] > 100 and ops["Conv"] == 52


def test_quantize_cli_from_an_npz_with_json_and_a_float_operator(models, calibration, tmp_path):
    out = tmp_path / "q.onnx"
    data = json.loads(run_cli("quantize", str(models["mobilenetv2"].path), "-o", str(out), "-c",
                              str(calibration["npz"]), "--keep-float", "Gemm", "--per-tensor", "--json",
                              check=True).stdout)
    assert data["calibration_samples"] == 6 and data["held_out_samples"] == 2 and not data["per_channel"]
    assert data["kept_float"] == ["Gemm"] and data["outputs"][0]["max_abs_error"] >= 0
    text = run_cli("quantize", str(models["mobilenetv2"].path), "-o", str(out), "-c", str(calibration["npz"]),
                   "--force", check=True).stdout
    assert "top-1 agreement" in text and "edgepack compile" in " ".join(text.split())


@pytest.mark.parametrize("profile,on", [("host", "host"), ("rpi5", "emulator"), ("rpi4", "emulator"),
                                        ("rpi3", "emulator"), ORION])
@pytest.mark.slow
def test_a_quantized_model_runs_on_integer_kernels_and_matches_onnxruntime(quantized, models, profile, on,
                                                                          tmp_path):
    """Computed in float it missed ONNX Runtime by 5 quantization steps on 680 of 1000 logits; on integer
    sums it matches within one step, and its weights stay 8-bit (a quarter of the float library)."""
    build = compile_model(quantized["path"], profile, tmp_path / profile).output_dir
    for inputs in (None, models["mobilenetv2"].natural):
        report = validate(build, on, inputs=inputs)
        (logits,) = report.outputs
        assert report.passed and not report.degenerate and logits.step is not None, report.to_dict()
        assert logits.max_abs_error <= logits.step * 1.0001  # one step at most
    if profile == "host":
        size = (build / "device" / "model.so").stat().st_size
        float_size = compile_model(models["mobilenetv2"].path, "host", tmp_path / "float").device_library.stat().st_size
        assert size < 0.4 * float_size, (size, float_size)


@pytest.mark.parametrize("profile,on", [("host", "host"), X86_AVX2, ("rpi5", "emulator"), ("rpi4", "emulator"),
                                        ("rpi3", "emulator"), ORION])
@pytest.mark.slow
def test_a_tflite_int8_model_matches_litert(models, build_cache, profile, on):
    """MLPerf Tiny's ResNet-8: int8 in, int8 out, per-channel weights (it missed LiteRT by 15 steps: its
    average pool truncated, its convolutions summed in float)."""
    model = models["resnet8_int8"]
    build = build_cache(model, profile)
    for report in (validate(build, on, seed=2), validate(build, on, inputs=model.natural)):
        assert report.passed and report.outputs[0].step == 1.0, report.to_dict()
        assert report.outputs[0].max_abs_error <= 1


def _dot_product_kernels(build) -> int:
    manifest = json.loads((build / "manifest.json").read_text())
    return manifest["extra"]["cpu"]["schedules"].get("cpu.DotProductConv", 0)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("profile,on", [("host", "host"), X86_AVX2, X86_AVXVNNI, ("rpi5", "emulator"),
                                        ("rpi4", "emulator"), ("rpi3", "emulator"), ORION])
def test_convolutions_of_every_form_on_dot_products_match_onnxruntime(dtype, profile, on, tmp_path):
    """5 input channels (padded to 8 for 4-byte groups), asymmetric padding, stride 2, dilation 2, 1x1;
    activations with a zero point away from 0 (the padding's share subtracted), int8 (VNNI's unsigned
    operand: +128) and uint8 (sdot's signed one: -128). rpi5 (Cortex-A76, emulated as one) runs sdot;
    rpi4 (Cortex-A72, no dot product, emulated as one: an sdot there would not run) and rpi3 (armv7) the
    widening sequences (smull/addp/sadalp, vmull/vpadd/vpadal); x86-64-avx2 vpmaddwd on 16-bit inputs and
    weights stored by channel pairs, x86-64-avxvnni 256-bit vpdpbusd; orion-o6 (Armv9, +i8mm) smmla, 2
    pixels x 2 channels at a time, and sdot for the strided convolution. With smmla's operands swapped (the
    2 x 2 block transposed) the orion-o6 cases miss by 255 steps."""
    from model_factory import onnx_qdq_convs

    from edgepack.backends.cpu.schedules.machine import CpuInfo
    from edgepack.profiles import get_profile

    build = compile_model(onnx_qdq_convs(tmp_path / "q.onnx", dtype=dtype), profile, tmp_path / "b").output_dir
    cpu = CpuInfo.of(get_profile(profile).tvm_target())
    assert _dot_product_kernels(build) == (4 if cpu.dot_product else 0), cpu
    for seed in (0, 1):
        report = validate(build, on, seed=seed)
        (out,) = report.outputs
        assert report.passed and out.step is not None and out.max_abs_error <= out.step * 1.0001, report.to_dict()


@pytest.mark.parametrize("profile,on", [("host", "host"), X86_AVX2, ("rpi5", "emulator"), ("rpi4", "emulator"),
                                        ("rpi3", "emulator"), ORION])
def test_products_with_a_zero_point_known_at_run_time_run_on_dot_products(profile, on, tmp_path):
    """``quantize_dynamic``'s form: DynamicQuantizeLinear's uint8 and its run-time zero point into a
    ConvInteger, or a MatMulInteger (a 1x1 convolution of its rows). The dot-product kernels, and the
    depthwise kernel that reads 8 bits, read the 8-bit input with that zero point as the padding value and
    its share subtracted per channel (before: int32 multiply-adds on an int32 copy of the input): exact
    against ONNX Runtime, here and on each ARM profile's code under qemu. Padding with 0 instead is 3-15 off."""
    from model_factory import onnx_dynamic_convs, onnx_dynamic_matmul

    for make, shape in ((onnx_dynamic_convs, (1, 5, 15, 13)), (onnx_dynamic_matmul, (1, 7, 38))):
        build = compile_model(make(tmp_path / f"{make.__name__}.onnx"), profile, tmp_path / make.__name__).output_dir
        assert _dot_product_kernels(build) == (2 if make is onnx_dynamic_convs else 1)
        if make is onnx_dynamic_convs:
            assert b"depthwise_conv2d_8bit" in (build / "device" / "model.so").read_bytes()
        shifted = {"input": (np.random.default_rng(0).random(shape) * 3 - 0.5).astype(np.float32)}
        for inputs in (shifted, None):  # a zero point of about 42; the seeded inputs' own
            report = validate(build, on, inputs=inputs)
            assert report.passed and report.outputs[0].max_abs_error < 1e-5, (make.__name__, report.to_dict())


@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_the_widening_sequences_sum_the_largest_products_exactly(profile, tmp_path):
    """The widening sequences add two 8-bit products in 16 bits: exact for weights from -127 up (2 x 128 x 127
    fits), so weights of +-127 against inputs of -128 run on them and match ONNX Runtime exactly, and a
    convolution with a -128 weight (2 x 128 x 128 would wrap) stays on int32 multiply-adds, also exact.
    Rewriting the second model too gives errors of 39 steps."""
    from model_factory import onnx_qdq_convs

    inputs = {"input": np.full((1, 5, 15, 13), -128, np.int8)}
    for weights, rewritten in (((-127, 127), 1), ((-128, 127), 0)):  # one convolution: its kernel or none
        model = onnx_qdq_convs(tmp_path / f"q{weights[0]}.onnx", weights=weights, depth=1)
        build = compile_model(model, profile, tmp_path / f"b{weights[0]}").output_dir
        assert _dot_product_kernels(build) == rewritten, weights
        report = validate(build, "emulator", inputs=inputs)
        (out,) = report.outputs
        assert report.passed and out.max_abs_error == 0, (weights, report.to_dict())


def _instructions(library, objdump: str) -> dict[str, int]:
    """Mnemonics in ``library``'s code, counted. (Its kernels' parallel bodies have no symbols of their
    own, so the count is the library's; only the dot-product kernels emit these instructions.)"""
    import subprocess
    from collections import Counter

    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)], check=True, capture_output=True,
                          text=True).stdout
    # a prefix such as "{vex}" (AVX-VNNI's encoding of vpdpbusd) is part of the mnemonic
    return dict(Counter(" ".join(words[:2]) if words[0].startswith("{") else words[0]
                        for words in (line.split("\t")[1].split() for line in text.splitlines()
                                      if line.startswith(" ") and len(line.split("\t")) > 1
                                      and line.split("\t")[1].strip())))


def test_the_dot_product_instructions_are_in_the_convolution_kernels(models, build_cache):
    """The rpi5 build (Cortex-A76: +dotprod) computes ResNet-8's convolutions with sdot; the rpi4 build
    (Cortex-A72) has none and widens instead (smull, addp, sadalp), as the rpi3 build does in armv7's
    (vmull.s8, vpadd.i16, vpadal.s16); the host build uses AVX-512 VNNI where this CPU has it, the
    x86-64-avx2 build vpmaddwd and the x86-64-avxvnni build VEX-encoded vpdpbusd; the orion-o6 build (+i8mm)
    smmla, and sdot for its strided convolutions."""
    import shutil

    from edgepack.backends.cpu.schedules.machine import CpuInfo
    from edgepack.profiles import get_profile

    model = models["resnet8_int8"]
    rpi5 = _instructions(build_cache(model, "rpi5") / "device" / "model.so", "aarch64-linux-gnu-objdump")
    assert rpi5.get("sdot", 0) >= 100 and rpi5.get("smmla", 0) == 0, rpi5
    orion = _instructions(build_cache(model, "orion-o6") / "device" / "model.so", "aarch64-linux-gnu-objdump")
    assert orion.get("smmla", 0) >= 100 and orion.get("sdot", 0) >= 10, orion
    rpi4 = _instructions(build_cache(model, "rpi4") / "device" / "model.so", "aarch64-linux-gnu-objdump")
    assert rpi4.get("sdot", 0) == 0, rpi4
    assert min(rpi4.get("smull", 0) + rpi4.get("smull2", 0), rpi4.get("addp", 0), rpi4.get("sadalp", 0)) >= 100, rpi4
    rpi3 = _instructions(build_cache(model, "rpi3") / "device" / "model.so", "arm-linux-gnueabihf-objdump")
    assert min(rpi3.get("vmull.s8", 0), rpi3.get("vpadd.i16", 0), rpi3.get("vpadal.s16", 0)) >= 50, rpi3
    if CpuInfo.of(get_profile("host").tvm_target()).dot_product == "vnni" and shutil.which("objdump"):
        host = _instructions(build_cache(model, "host") / "device" / "model.so", "objdump")
        assert host.get("vpdpbusd", 0) >= 50, host
    # AVX2 (no VNNI) multiplies 16-bit pairs; AVX-VNNI has vpdpbusd in its 256-bit VEX form
    avx2 = _instructions(build_cache(model, "x86-64-avx2") / "device" / "model.so", "objdump")
    assert avx2.get("vpmaddwd", 0) >= 100 and not any("vpdpbusd" in k for k in avx2), avx2
    avxvnni = _instructions(build_cache(model, "x86-64-avxvnni") / "device" / "model.so", "objdump")
    assert avxvnni.get("{vex} vpdpbusd", 0) >= 50, avxvnni


@pytest.fixture(scope="module")
def qoperator(models, tmp_path_factory):
    """MobileNetV2 quantized by ONNX Runtime in its QOperator format (QLinearConv, com.microsoft QLinearAdd,
    QLinearGlobalAveragePool and QGemm), calibrated on the real photo shifted and flipped."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    root = tmp_path_factory.mktemp("qoperator")
    with np.load(models["mobilenetv2"].natural) as natural:
        photo = natural["input"]
    samples = iter([{"input": np.roll(photo[..., ::(-1) ** k], 20 * k, axis=-1)} for k in range(6)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(samples, None)

    quant_pre_process(str(models["mobilenetv2"].path), str(root / "pre.onnx"), skip_symbolic_shape=True)
    quantize_static(str(root / "pre.onnx"), str(root / "qop.onnx"), Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=True, calibrate_method=CalibrationMethod.Percentile, activation_type=QuantType.QUInt8)
    return root / "qop.onnx"


@pytest.mark.parametrize("profile,on", [("host", "host"), ("rpi5", "emulator"), ("rpi4", "emulator")])
def test_a_qoperator_model_matches_onnxruntime(qoperator, models, profile, on, tmp_path):
    """QLinearConv on the 8-bit kernels (dot products where the CPU has them), ONNX Runtime's contrib
    operators as dequantize / operator / quantize: within one step of ONNX Runtime, here and emulated."""
    import onnx

    ops = {(n.domain, n.op_type) for n in onnx.load(str(qoperator)).graph.node}
    assert {("", "QLinearConv"), ("com.microsoft", "QLinearAdd"), ("com.microsoft", "QGemm")} <= ops, ops
    build = compile_model(qoperator, profile, tmp_path / "b").output_dir
    for inputs in (models["mobilenetv2"].natural, None):
        report = validate(build, on, inputs=inputs)
        (logits,) = report.outputs
        assert report.passed and logits.step is not None and logits.max_abs_error <= logits.step * 1.0001, \
            report.to_dict()
    if profile != "rpi4":
        assert _dot_product_kernels(build) >= 20  # kernels of the same shape are one function


@pytest.mark.parametrize("profile,on", [("host", "host"), ("rpi4", "emulator")])
def test_onnxruntime_contrib_quantized_operators_match_onnxruntime(profile, on, tmp_path):
    """QLinearSigmoid/LeakyRelu/Mul/Add/Concat/AveragePool/GlobalAveragePool (uint8) and DynamicQuantizeMatMul,
    MatMulIntegerToFloat (float out): within one step, or float tolerance, of ONNX Runtime's kernels."""
    from model_factory import onnx_qlinear_contrib

    build = compile_model(onnx_qlinear_contrib(tmp_path / "q.onnx"), profile, tmp_path / "b").output_dir
    for seed in (0, 1):
        report = validate(build, on, seed=seed)
        assert report.passed and [o.name for o in report.outputs] == ["pooled", "gap", "g", "h"], report.to_dict()
        for out in report.outputs[:2]:
            assert out.step is not None and out.max_abs_error <= out.step * 1.0001


@pytest.mark.slow
def test_a_dynamically_quantized_lstm_recognizer_matches_onnxruntime(models, tmp_path):
    """PP-OCRv2's CRNN through ONNX Runtime's ``quantize_dynamic`` (ConvInteger, DynamicQuantizeLinear,
    MatMulInteger, com.microsoft.DynamicQuantizeLSTM): activations quantized at run time by their own range,
    as ONNX Runtime does, so its 8-bit roundings are reproduced: the LSTM's input equals ONNX Runtime's on
    random inputs after 31 dynamically quantized convolutions (0.06 off where the scaling of an int32 sum
    and the bias were one fused multiply-add), and the recognizer's output on a real text line is within
    validate's float tolerance. One rpi4 build, run under qemu and, as its copy for this machine, here
    (rpi3: ``scripts/zoo.py``)."""
    import onnx

    model = models["ppocr_rec_lstm_dyn8"]
    graph = onnx.load(str(model.path))
    ops = {(n.domain, n.op_type) for n in graph.graph.node}
    assert {("", "ConvInteger"), ("", "MatMulInteger"), ("com.microsoft", "DynamicQuantizeLSTM")} <= ops, ops
    lstm_input = next(n.input[0] for n in graph.graph.node if n.op_type == "DynamicQuantizeLSTM")
    graph.graph.output.append(onnx.helper.make_value_info(lstm_input, onnx.helper.TypeProto()))
    onnx.save(graph, str(tmp_path / "m.onnx"))
    build = compile_model(tmp_path / "m.onnx", "rpi4", tmp_path / "b", input_shapes=model.input_shapes).output_dir
    for on, ran_on in (("emulator", "qemu-aarch64"), ("host", "this machine")):
        natural = validate(build, on, inputs=model.natural)
        assert natural.passed and ran_on in natural.ran_on, natural.to_dict()
        at_random = validate(build, on, seed=0)
        assert at_random.outputs[1].max_abs_error < 1e-5, at_random.to_dict()


def test_a_mutated_quantized_build_fails(quantized, tmp_path):
    """Within one step, not within anything: a quantized build with a reduction loop one short fails."""
    from mutation import wrong_build

    build = wrong_build(quantized["path"], "host", tmp_path / "wrong", "loop_bound")
    report = validate(build, "host")
    assert not report.passed and report.outputs[0].max_abs_error > 2 * report.outputs[0].step, report.to_dict()


def test_bad_calibration_data_is_refused_and_nothing_is_written(models, calibration, tmp_path):
    model = str(models["mobilenetv2"].path)
    out = tmp_path / "never.onnx"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_clean_error(run_cli("quantize", model, "-o", str(out), "-c", str(empty), "--preprocess", MNV2_PRE),
                       "holds no pictures")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "not_a_picture.png").write_bytes(b"this is not a PNG")
    assert_clean_error(run_cli("quantize", model, "-o", str(out), "-c", str(broken), "--preprocess", MNV2_PRE),
                       "Cannot read the picture", "not_a_picture.png")
    np.savez(tmp_path / "wrong.npz", input=np.zeros((4, 3, 224, 224), np.float32))
    assert_clean_error(run_cli("quantize", model, "-o", str(out), "-c", str(tmp_path / "wrong.npz")),
                       "is float32 [4, 3, 224, 224]", "[N, 1, 3, 224, 224]")
    np.savez(tmp_path / "ints.npz", input=np.zeros((4, 1, 3, 224, 224), np.int32))
    assert_clean_error(run_cli("quantize", model, "-o", str(out), "-c", str(tmp_path / "ints.npz")), "int32")
    assert_clean_error(run_cli("quantize", model, "-o", str(out), "-c", str(calibration["folder"])),
                       "one --preprocess setting")
    assert_clean_error(run_cli("quantize", model, "-o", str(out), "-c", str(calibration["npz"]), "--method", "best"),
                       "Unknown calibration method")
    assert not out.exists()


def test_models_that_cannot_be_quantized_here_say_why(models, quantized, calibration, tmp_path):
    out = tmp_path / "never.onnx"
    assert_clean_error(run_cli("quantize", str(quantized["path"]), "-o", str(out), "-c", str(calibration["npz"])),
                       "quantized already", "QuantizeLinear")
    assert_clean_error(run_cli("quantize", str(models["face_detection_short_range"].path), "-o", str(out), "-c",
                               str(calibration["npz"])), "TFLite model", "LiteRT's converter")
    with pytest.raises(EdgepackError, match="already exists"):
        edgepack.quantize(models["mobilenetv2"].path, quantized["path"], calibration=calibration["npz"])
    assert not out.exists()
