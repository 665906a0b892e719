"""edgepack's ONNX converters on configurations the backend node suite does not cover, each
checked against ONNX Runtime on a generated model (compiled for the host, run in the Relax VM)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgepack.backends import get_backend
from edgepack.frontends import import_model

HOST_TARGET = {"kind": "llvm"}


def build(imported, target):
    """The model compiled for ``target`` by the CPU backend (TVM's default CPU pipeline)."""
    return get_backend("cpu").build(imported, target).executable


def _run_both(model, feeds, tmp_path):
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from edgepack.run.host import flatten_outputs

    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    imported = import_model(path)
    vm = relax.VirtualMachine(build(imported, tvm.target.Target(HOST_TARGET)), tvm.cpu())
    actual = flatten_outputs(vm["main"](*[tvm.runtime.tensor(feeds[s.name]) for s in imported.inputs]))
    return actual, expected


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_bidirectional_recurrence_with_sequence_lengths_matches_onnxruntime(tmp_path, op):
    rng = np.random.default_rng(0)
    seq, batch, inp, hidden = 5, 3, 4, 6
    gates = 4 if op == "LSTM" else 3
    w = numpy_helper.from_array(rng.normal(0, 0.5, (2, gates * hidden, inp)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.normal(0, 0.5, (2, gates * hidden, hidden)).astype(np.float32), "R")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (2, 2 * gates * hidden)).astype(np.float32), "B")
    lens = numpy_helper.from_array(np.array([5, 3, 1], dtype=np.int32), "lens")
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    node = helper.make_node(op, ["X", "W", "R", "B", "lens"], outputs, hidden_size=hidden,
                            direction="bidirectional", **extra)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, inp])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], [w, r, b, lens])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    x = rng.normal(0, 1, (seq, batch, inp)).astype(np.float32)
    actual, expected = _run_both(model, {"X": x}, tmp_path)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_resize_keeps_tvms_kernel_where_it_is_exact_and_matches_elsewhere(tmp_path):
    """A 2x nearest upsample (the common YOLO/FPN case) stays TVM's resize2d; a fractional linear
    downscale goes through edgepack's interpolation matrices; both match ONNX Runtime."""
    for mode, scales, want_tvm in (("nearest", [1, 1, 2, 2], True), ("linear", [1, 1, 0.6, 0.7], False)):
        node = helper.make_node("Resize", ["X", "", "scales"], ["Y"], mode=mode)
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 10, 12])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.array(scales, dtype=np.float32), "scales")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
        x = np.random.default_rng(1).normal(0, 1, (1, 3, 10, 12)).astype(np.float32)
        actual, expected = _run_both(model, {"X": x}, tmp_path)
        np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5)
        path = tmp_path / "m.onnx"
        text = import_model(path).mod.script()
        assert ("image.resize2d" in text) == want_tvm, text


def test_residual_sum_and_relu6_fuse_into_the_convolution(tmp_path):
    """ResNet's residual ``Sum`` and MobileNet's ReLU6 (``Clip``) become one kernel with the
    convolution before them (no stacked copy of the inputs, no TE call Relax passes cannot see
    through), in NCHW and channels-last, and match ONNX Runtime."""
    import tvm

    from edgepack.backends import KernelForm
    from edgepack.tuning import extract_tasks

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), "W")
    lo, hi = (numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0.0, "lo"), (6.0, "hi")))
    nodes = [helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["c", "X"], ["s"]),
             helper.make_node("Clip", ["s", "lo", "hi"], ["Y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [w, lo, hi])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.normal(0, 3, (1, 8, 6, 6)).astype(np.float32)
    actual, expected = _run_both(model, {"X": x}, tmp_path)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5)

    imported = import_model(tmp_path / "m.onnx")
    for channels_last in (False, True):
        tasks, _ = extract_tasks(imported, get_backend("cpu"), tvm.target.Target(HOST_TARGET),
                                 KernelForm(channels_last=channels_last))
        names = [t.name for t in tasks if "transpose" not in t.name]
        assert len(names) == 1 and all(op in names[0] for op in ("conv2d", "add", "maximum", "minimum")), names


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 0), ([-1], 1), ([0, 2], 0), ([], 1)])
def test_max_and_min_reductions_keep_their_axes_in_every_opset(tmp_path, op, opset, axes, keepdims):
    """Axes are an attribute up to opset 17 and an input from 18; the attribute's were once dropped
    and the reduction ran over every axis (an opset-17 softmax's ReduceMax gave one number)."""
    rng = np.random.default_rng(0)
    inputs, inits, attrs = ["x"], [], {"keepdims": keepdims}
    if opset >= 18 and axes:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    elif axes:
        attrs["axes"] = axes
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    actual, expected = _run_both(model, {"x": rng.normal(0, 1, (3, 5, 7)).astype(np.float32)}, tmp_path)
    assert [a.shape for a in actual] == [e.shape for e in expected]
    np.testing.assert_array_equal(actual[0], expected[0])
