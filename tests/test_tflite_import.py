"""TFLite import paths beyond plain fp32: sparse fp16 weights (DENSIFY) and int8 quantized models,
each compiled for the host and compared with LiteRT running the same file."""

import numpy as np
import pytest
from tflite_factory import int8_convnet

from edgepack.backends import get_backend
from edgepack.frontends import import_model, inspect_model

HOST_TARGET = {"kind": "llvm"}


def _litert(path, x):
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(str(path))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _edgepack(path, x):
    import tvm
    from tvm import relax

    from edgepack.run.host import flatten_outputs

    executable = get_backend("cpu").build(import_model(path), tvm.target.Target(HOST_TARGET)).executable
    return flatten_outputs(relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)))


def test_sparse_fp16_weights_match_litert(models):
    """MediaPipe's sparse BlazeFace: DENSIFY feeding DEQUANTIZE (TVM alone raises a TypeError)."""
    path = models["face_detection_sparse"].path
    info = inspect_model(path)
    assert info.operator_counts["DENSIFY"] > 0 and not info.unsupported_operators
    x = np.random.default_rng(0).uniform(-1, 1, (1, 192, 192, 3)).astype(np.float32)
    expected = _litert(path, x)
    actual = _edgepack(path, x)
    assert len(actual) == len(expected) == 2
    for got, want in zip(actual, expected):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def test_int8_model_matches_litert_within_one_step(tmp_path):
    path = int8_convnet(tmp_path / "int8.tflite")
    counts = inspect_model(path).operator_counts
    assert {"QUANTIZE", "CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "FULLY_CONNECTED", "DEQUANTIZE"} <= set(counts)
    step = 16 / 255  # the output's quantization scale
    for seed in range(3):
        x = np.random.default_rng(seed).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
        want = _litert(path, x)[0]
        got = _edgepack(path, x)[0]
        assert np.unique(np.round(want / step)).size > 4, "the reference output is degenerate"
        # integer arithmetic rounds differently in places: at most one quantization step apart
        assert np.abs(got - want).max() <= step * 1.001, (got, want)
        assert np.mean(np.isclose(got, want, atol=1e-6)) >= 0.5  # most are exact


def test_custom_operators_are_listed_by_name(tmp_path):
    from model_factory import tflite_with_custom_op

    from edgepack.errors import ModelError

    path = tflite_with_custom_op(tmp_path / "c.tflite", "TFLite_Detection_PostProcess")
    with pytest.raises(ModelError, match="CUSTOM:TFLite_Detection_PostProcess") as err:
        import_model(path)
    assert "custom ops" in err.value.hint
