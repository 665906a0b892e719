"""A representative slice of the ONNX backend node suite through scripts/onnx_conformance.py.

The same runner as the full run (worker processes, edgepack's import + host build + Relax VM,
outputs compared with the ones shipped in the onnx wheel); the full suite stays a script:
``python scripts/onnx_conformance.py --markdown docs/conformance.md``.
"""

import onnx_conformance as oc
import pytest

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
