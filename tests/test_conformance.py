"""Representative slices of the conformance sweeps (scripts/onnx_conformance.py, scripts/tflite_conformance.py).

The same runner as the full runs (worker processes, edgepack's import + build, outputs compared with the
ones shipped in the onnx wheel or LiteRT's): on the host (Relax VM), and a smaller slice on the device
path (cross-compiled for rpi4 and rpi3, the device library run by the C runner under qemu-user). The
full sweeps stay scripts: ``python scripts/onnx_conformance.py [--profile rpi4 --on emulator]
--markdown docs/conformance.md``.
"""

import numpy as np
import onnx_conformance as oc
import pytest
import tflite_conformance as tc
from conformance import Place, nest_like, write_section

CASES = [
    # convolution
    "test_conv_with_strides_padding", "test_conv_with_autopad_same", "test_conv_with_strides_and_asymmetric_padding",
    "test_convtranspose", "test_convtranspose_output_shape", "test_convtranspose_pads", "test_convtranspose_1d",
    "test_basic_conv_with_padding",
    # pooling
    "test_maxpool_2d_pads", "test_maxpool_2d_ceil", "test_maxpool_2d_dilations", "test_maxpool_with_argmax_2d_precomputed_pads",
    "test_averagepool_2d_pads_count_include_pad", "test_averagepool_2d_same_upper", "test_globalaveragepool",
    "test_globalmaxpool", "test_lppool_2d_default",
    # normalisation
    "test_batchnorm_example", "test_batchnorm_epsilon_training_mode", "test_instancenorm_example",
    "test_layer_normalization_4d_axis1", "test_group_normalization_example", "test_rms_normalization_3d_axis0_epsilon",
    "test_lrn", "test_l2normalization_axis_0",
    # activations
    "test_relu", "test_leakyrelu", "test_prelu_broadcast", "test_elu", "test_selu", "test_celu", "test_sigmoid",
    "test_hardsigmoid", "test_hardswish", "test_softplus", "test_mish", "test_gelu_tanh_2", "test_softmax_axis_1",
    "test_clip_default_min",
    # GEMM
    "test_gemm_default_scalar_bias", "test_gemm_transposeA", "test_matmul_4d",
    # resize
    "test_resize_upsample_scales_nearest", "test_resize_downsample_scales_linear", "test_resize_upsample_sizes_cubic",
    "test_resize_downsample_sizes_linear_antialias", "test_resize_tf_crop_and_resize_axes_2_3",
    "test_resize_upsample_sizes_nearest_not_larger", "test_upsample_nearest",
    # shapes, gathers, reductions, control
    "test_reduce_mean_keepdims_example", "test_slice_neg_steps", "test_constant_pad", "test_reflect_pad", "test_gather_0", "test_where_example",
    "test_cast_FLOAT_to_FLOAT16", "test_top_k", "test_split_variable_parts_2d_opset18", "test_if",
    "test_nonmaxsuppression_suppress_by_IOU", "test_sce_mean_weight", "test_nllloss_NCd1_ii",
    "test_loop11", "test_scan9_sum", "test_onehot_with_axis", "test_reversesequence_batch",
    # sequence models, attention, quantized and spectral operators edgepack converts itself
    "test_lstm_with_peepholes", "test_gru_seq_length", "test_simple_rnn_batchwise",
    "test_attention_4d_gqa_with_past_and_present", "test_attention_3d_causal", "test_rotary_embedding_interleaved",
    "test_linear_attention_gated_delta_gqa", "test_causal_conv_with_state_silu", "test_flexattention_score_mod",
    "test_qlinearmatmul_2D_uint8_float32", "test_qlinearconv", "test_convinteger_with_padding",
    "test_dequantizelinear_blocked", "test_quantizelinear_e4m3fn", "test_cast_FLOAT_to_FLOAT8E5M2",
    "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN", "test_bitcast_float32_to_int32", "test_dft_rfft_opset19",
    "test_stft_with_window", "test_col2im_strides", "test_hannwindow", "test_tensorscatter_circular", "test_det_nd",
    # sub-byte types (8-bit containers at the model boundary)
    "test_cast_FLOAT_to_INT4", "test_cast_FLOAT_to_FLOAT4E2M1", "test_dequantizelinear_uint4", "test_quantizelinear_int4",
    # what the default CPU schedules got wrong once (no vector form, a vector across an index period)
    "test_sinh_example", "test_cosh", "test_rotary_embedding_3d_input",
]


@pytest.fixture(scope="module")
def results():
    found: dict[str, oc.CaseResult] = {}
    oc.run_cases(CASES, jobs=2, timeout=300, on_result=lambda r: found.__setitem__(r.case, r))
    return found


def test_the_cases_exist():
    assert set(CASES) <= set(oc.list_cases()), set(CASES) - set(oc.list_cases())
    # the suite the full run covers: every non-expanded case of the onnx 1.22 wheel
    assert len(oc.list_cases()) == 1325


@pytest.mark.parametrize("case", CASES)
def test_case_passes(results, case):
    res = results[case]
    assert res.status == "pass", f"{res.status} ({res.kind}): {res.message}"


# the device path: what differs from the host there (float8, bfloat16 and sub-byte types at the C API,
# scalar inputs, control flow, conversions 32-bit ARM does with libgcc) and the usual vision operators
DEVICE_CASES = [
    "test_conv_with_strides_padding", "test_maxpool_2d_pads", "test_averagepool_2d_same_upper",
    "test_batchnorm_example",
    "test_gemm_default_scalar_bias", "test_resize_downsample_scales_linear", "test_resize_upsample_sizes_cubic",
    "test_softmax_axis_1", "test_lstm_with_peepholes", "test_if", "test_loop11", "test_clip_example",
    "test_bitcast_scalar_float32_to_int32", "test_dequantizelinear", "test_cast_FLOAT_to_FLOAT8E4M3FN",
    "test_cast_FLOAT8E5M2_to_FLOAT", "test_cast_FLOAT_to_BFLOAT16", "test_cast_INT4_to_FLOAT", "test_top_k",
    # the default CPU schedules on the device: an index on a rounding boundary, an empty tensor, sinh
    "test_resize_upsample_sizes_nearest", "test_tril_zero", "test_sinh_example",
]
TFLITE_CASES = [
    "conv_2d.float32", "conv_2d.fp16", "conv_2d.int8", "depthwise_conv_2d.int8", "fully_connected.int8",
    "transpose_conv.float32", "transpose_conv.int8", "prelu.int8", "prelu.float32", "prelu_pixelwise.float32",
    "prelu_pixelwise.int8", "arg_max.float32", "transpose.int8", "pad.int8",
    "resize_bilinear.int8", "softmax.int8", "mean.int8", "hard_swish.int8", "concatenation.fp16",
]
TFLITE_DEVICE_CASES = ["conv_2d.int8", "conv_2d.fp16", "depthwise_conv_2d_mult2_stride2.int8", "transpose_conv.float32",
                       "resize_bilinear.int8", "softmax.int8", "prelu.int8", "prelu_pixelwise.float32",
                       "logistic.float32"]


def _sweep(module, cases, place=None) -> dict:
    found: dict = {}
    kwargs = {"place": place} if place else {}
    module.run_cases(cases, jobs=2, timeout=600, on_result=lambda r: found.__setitem__(r.case, r), **kwargs)
    return found


@pytest.fixture(scope="module")
def device_results():
    made: dict = {}

    def get(module, cases, profile):
        key = (module.__name__, profile)
        if key not in made:
            made[key] = _sweep(module, cases, Place(profile, "emulator"))
        return made[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
@pytest.mark.parametrize("case", DEVICE_CASES)
def test_case_passes_on_the_device(device_results, profile, case):
    res = device_results(oc, DEVICE_CASES, profile)[case]
    assert res.status == "pass", f"{res.status} ({res.kind}): {res.message}"


@pytest.mark.slow
def test_device_cases_are_cached(device_results):
    """A rerun of a device case only compares: the device library and the run's outputs are cached."""
    device_results(oc, DEVICE_CASES, "rpi4")  # built and run once
    again = _sweep(oc, ["test_if", "test_conv_with_strides_padding"], Place("rpi4", "emulator"))
    assert all(r.status == "pass" and r.cached for r in again.values()), again


@pytest.fixture(scope="module")
def tflite_results():
    return _sweep(tc, TFLITE_CASES)


def test_tflite_cases_exist():
    assert set(TFLITE_CASES) | set(TFLITE_DEVICE_CASES) <= set(tc.list_cases())
    assert {c.split(".")[1] for c in tc.list_cases()} == {"float32", "fp16", "int8"}


@pytest.mark.parametrize("case", TFLITE_CASES)
def test_tflite_case_matches_litert(tflite_results, case):
    res = tflite_results[case]
    assert res.status == "pass", f"{res.status} ({res.kind}): {res.message}"


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
@pytest.mark.parametrize("case", TFLITE_DEVICE_CASES)
def test_tflite_case_matches_litert_on_the_device(device_results, profile, case):
    res = device_results(tc, TFLITE_DEVICE_CASES, profile)[case]
    assert res.status == "pass", f"{res.status} ({res.kind}): {res.message}"


def test_device_outputs_are_grouped_like_the_expected_ones():
    a, b, c = (np.full(2, i) for i in range(3))
    assert [len(x) if isinstance(x, list) else x.tolist() for x in nest_like([a, b, c], [np.zeros(2), [a, b]])] == [
        [0, 0], 2]
    assert len(nest_like([a, b, c], [np.zeros(2)])) == 3  # extra outputs stay visible to the comparison


def test_report_sections_are_replaced_in_place(tmp_path):
    doc = tmp_path / "conformance.md"
    doc.write_text("# Title\n\nintro\n")
    write_section(doc, "onnx", "one")
    write_section(doc, "tflite", "two")
    write_section(doc, "onnx", "three")
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n") and "one" not in text
    assert text.index("three") < text.index("two")


def test_comparison_catches_wrong_outputs():
    """Negative control for the comparison the runner uses."""
    import numpy as np

    want = [np.ones((2, 3), np.float32)]
    assert oc.compare_outputs([np.ones((2, 3), np.float32)], want) == ""
    assert "values differ" in oc.compare_outputs([np.full((2, 3), 1.01, np.float32)], want)
    assert "shape" in oc.compare_outputs([np.ones((3, 2), np.float32)], want)
    assert "dtype" in oc.compare_outputs([np.ones((2, 3), np.float64)], want)


def test_a_crashing_case_is_recorded_and_the_run_goes_on(monkeypatch):
    """A worker that dies mid-case is replaced; the case is a crash, the next one still runs."""
    found = {}
    oc.run_cases(["test_relu", oc.CRASH_CASE, "test_abs"], jobs=1, timeout=120,
                 on_result=lambda r: found.__setitem__(r.case, r))
    assert found[oc.CRASH_CASE].status == "crash"
    assert found["test_relu"].status == "pass" and found["test_abs"].status == "pass"
