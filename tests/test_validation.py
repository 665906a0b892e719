"""What `validate` can see: degenerate references, the outputs' count and names, and wrong builds of a real
model on this machine (the same harness runs on the device paths: test_wrong_builds.py, test_opencl.py,
test_vulkan.py, test_devices.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import run_cli
from mutation import MUTATIONS, wrong_build

from edgepack.compiling import compile_model
from edgepack.degenerate import degeneracy, input_independent
from edgepack.run.results import RunOutputs
from edgepack.tensors import TensorSpec, random_inputs
from edgepack.validation import compare_outputs, validate

ATOL, RTOL = 1e-4, 1e-3

# ----------------------------------------------------------------------------------------------
# degenerate references


@pytest.mark.parametrize("values,why", [
    (np.full((1, 1000), 0.001, np.float32), "constant"),
    (np.zeros((4, 4), np.int32), "constant"),
    (np.random.default_rng(0).random((1, 1, 8, 8), np.float32) * 1e-5, "vanishing"),
    (np.array([[1.0, 4.4e-8]], np.float32), "saturated"),
    (np.array([[0.5001, 0.4999]], np.float32), "near tie"),
    (np.array([[1.0, 0.0, 0.0], [0.334, 0.333, 0.333]], np.float32), "near tie"),  # no row decides
])
def test_degenerate_references_are_named(values, why):
    assert degeneracy(values, ATOL, RTOL).startswith(why)


@pytest.mark.parametrize("values", [
    np.array([[0.576, 0.424]], np.float32),  # PP-OCR cls on random inputs: a decision either way
    np.array([[171.4, 170.9, -3.0]], np.float32),  # landmark coordinates, not probabilities: no "tie"
    np.random.default_rng(1).normal(0, 3, (1, 896, 16)).astype(np.float32),
    np.array([0.5], np.float32),  # one value cannot be constant
    np.array([[0.2, 0.3, 0.5], [0.334, 0.333, 0.333]], np.float32),  # one row of two decides
])
def test_informative_references_are_not_degenerate(values):
    assert degeneracy(values, ATOL, RTOL) == ""


def test_random_inputs_span_8_bit_ranges_and_keep_wider_integers_small():
    """8-bit inputs (quantized pixels, activations) over their whole range, negatives included: a build that
    drops an int8 input's sign passed validation on 0..10. Wider integers stay small (indices, lengths)."""
    specs = (TensorSpec("a", "int8", (4096,)), TensorSpec("b", "uint8", (4096,)), TensorSpec("c", "int64", (64,)))
    drawn = random_inputs(specs, seed=0)
    assert drawn["a"].min() == -128 and drawn["a"].max() == 127 and (drawn["a"] < 0).mean() > 0.4
    assert drawn["b"].min() == 0 and drawn["b"].max() == 255
    assert 0 <= drawn["c"].min() and drawn["c"].max() <= 10
    assert all(v.dtype == s.dtype for v, s in zip(drawn.values(), specs))


def test_input_independence_needs_two_equal_outputs():
    a = np.array([0.1, 0.2], np.float32)
    assert input_independent(a, a.copy()).startswith("input-independent")
    assert input_independent(a, a + 1e-7) == ""


def test_validate_flags_a_constant_model_in_its_report_json_and_text(models, build_cache):
    """light_squeezenet's weights are constant: ONNX Runtime gives 0.001 for every class and input. Its build
    passes whatever the kernels compute, and `validate` says so."""
    build = build_cache(models["light_squeezenet"], "host")
    report = validate(build, "host")
    assert report.passed and report.degenerate
    assert report.outputs[0].degenerate.startswith("constant: every one of its 1000 values is 0.001")
    data = json.loads(run_cli("validate", str(build), "--json", check=True).stdout)
    assert data["degenerate"] is True and data["outputs"][0]["degenerate"].startswith("constant")
    text = " ".join(run_cli("validate", str(build), check=True).stdout.split())
    assert "is degenerate (constant" in text and "a wrong build could pass on it" in text


def test_validate_flags_an_output_that_ignores_its_input(tmp_path):
    """An output that two different random inputs leave exactly the same (a model's constant branch)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bias = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8), "bias")
    zero = numpy_helper.from_array(np.zeros((1, 8), np.float32), "zero")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "zero"], ["gated"]), helper.make_node("Add", ["gated", "bias"], ["y"]),
         helper.make_node("Relu", ["x"], ["z"])],
        "ignores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])], [bias, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "ignores.onnx"))
    build = compile_model(tmp_path / "ignores.onnx", "host", tmp_path / "build").output_dir
    report = validate(build, "host")
    y, z = report.outputs
    assert y.degenerate.startswith("input-independent") and z.degenerate == ""


# ----------------------------------------------------------------------------------------------
# the outputs' count and names, before any value


SPECS = (TensorSpec("boxes", "float32", (1, 4)), TensorSpec("scores", "float32", (1, 2)))
EXPECTED = {"boxes": np.ones((1, 4), np.float32), "scores": np.array([[0.3, 0.7]], np.float32)}


def test_a_missing_output_fails():
    ran = RunOutputs([EXPECTED["boxes"]], "this machine: cpu(0)")
    boxes, scores = compare_outputs(SPECS, ran, EXPECTED, ATOL, RTOL)
    assert boxes.passed and not scores.passed
    assert scores.problem == "missing: this machine: cpu(0) returned 1 of the model's 2 outputs"


def test_an_extra_output_fails():
    ran = RunOutputs([EXPECTED["boxes"], EXPECTED["scores"], np.zeros(3, np.float32)], "pi4: cpu(0)")
    compared = compare_outputs(SPECS, ran, EXPECTED, ATOL, RTOL)
    assert [c.passed for c in compared] == [True, True, False]
    assert compared[2].problem == "extra: pi4: cpu(0) returned 3 outputs, the model has 2"


def test_outputs_named_otherwise_by_the_device_library_fail():
    ran = RunOutputs([EXPECTED["boxes"], EXPECTED["scores"]], "C runner under qemu-aarch64", ("boxes", "logits"))
    boxes, scores = compare_outputs(SPECS, ran, EXPECTED, ATOL, RTOL)
    assert boxes.passed and not scores.passed and "as 'logits', not 'scores'" in scores.problem


def test_an_output_the_reference_model_lacks_fails():
    ran = RunOutputs([EXPECTED["boxes"], EXPECTED["scores"]], "this machine: cpu(0)")
    compared = compare_outputs(SPECS, ran, {"boxes": EXPECTED["boxes"]}, ATOL, RTOL)
    assert not compared[1].passed and "the reference model has no output 'scores'" in compared[1].problem


def _vad_inputs(models) -> str:
    return str(models["silero_vad"].natural)


@pytest.mark.slow
def test_a_build_that_returns_fewer_outputs_fails_here_and_under_qemu(models, tmp_path):
    """Silero VAD returns its probability and its state; a library built from the model without the state
    (the original model beside it, as the reference) fails `validate` on this machine and in the C runner."""
    vad = models["silero_vad"]
    for profile, on in (("host", "host"), ("rpi4", "emulator")):
        build = wrong_build(vad.path, profile, tmp_path / profile, "drop_output", input_shapes=vad.input_shapes)
        report = validate(build, on, inputs=vad.natural)
        assert not report.passed, report.to_dict()
        assert [o.passed for o in report.outputs] == [True, False]
        assert report.outputs[1].problem.startswith("missing:") and "returned 1 of the model's 2" in \
            report.outputs[1].problem
        result = run_cli("validate", str(build), "--on", on, "--inputs", _vad_inputs(models))
        assert result.returncode == 1 and "missing:" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_a_device_library_of_another_model_fails_on_names_under_qemu(models, tmp_path):
    """The C runner reports its outputs' names from the library's metadata: a library whose output is named
    otherwise (made from another model of the same shapes) fails under qemu though its values match."""
    cls = models["ppocr_cls"]
    build = wrong_build(cls.path, "rpi4", tmp_path / "renamed", "rename_output", input_shapes=cls.input_shapes)
    report = validate(build, "emulator")
    assert not report.passed and "not 'save_infer_model/scale_0.tmp_1'" in report.outputs[0].problem, \
        report.to_dict()


# ----------------------------------------------------------------------------------------------
# wrong builds of a real model fail on this machine; the right one passes


@pytest.fixture(scope="module")
def cls_host(models, build_cache):
    return build_cache(models["ppocr_cls"], "host")


def test_the_unmodified_build_passes_and_can_fail(models, cls_host):
    report = validate(cls_host, "host")
    assert report.passed and not report.degenerate, report.to_dict()


@pytest.mark.slow
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_wrong_build_fails_on_this_machine(models, tmp_path, mutation):
    cls = models["ppocr_cls"]
    build = wrong_build(cls.path, "host", tmp_path / mutation, mutation, input_shapes=cls.input_shapes)
    report = validate(build, "host")
    assert not report.passed and report.outputs[0].mismatched > 0 and not report.degenerate, report.to_dict()
    result = run_cli("validate", str(build))
    assert result.returncode == 1 and "FAIL" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("mutation", "profile"), [("loop_bound", "rpi4"), ("zero_channel", "rpi3")])
def test_a_wrong_build_fails_where_the_device_code_runs(models, build_cache, tmp_path, profile, mutation):
    """The device library (aarch64, armv7) run by the C runner under qemu: a wrong build fails, the
    unmodified one passes."""
    cls = models["ppocr_cls"]
    assert validate(build_cache(cls, profile), "emulator").passed
    build = wrong_build(cls.path, profile, tmp_path / mutation, mutation, input_shapes=cls.input_shapes)
    report = validate(build, "emulator")
    assert report.ran_on.startswith("C runner under qemu-"), report.ran_on
    assert not report.passed and report.outputs[0].mismatched > 0 and not report.degenerate, report.to_dict()


@pytest.mark.slow
def test_a_wrong_build_fails_on_natural_inputs_too(models, tmp_path):
    """PP-OCR's detector on the scanned page (its output on noise is all but zero: degenerate), with one
    transposed convolution's weights scaled."""
    det = models["ppocr_det"]
    build = wrong_build(det.path, "host", tmp_path / "det", "scale_weights", input_shapes=det.input_shapes,
                        conv=-1, op="ConvTranspose")
    noise = validate(build, "host")
    assert noise.degenerate and noise.outputs[0].degenerate.startswith("vanishing")
    page = validate(build, "host", inputs=det.natural)
    assert not page.passed and not page.degenerate, page.to_dict()
    shutil.rmtree(build)


def test_a_model_onnx_runtime_cannot_load_is_a_clean_error(tmp_path):
    """TVM imports a ReduceMean whose axes come as an input at opset 17 (an opset-18 form) and the build
    compiles; ONNX Runtime, the reference, refuses the graph. validate says so in one paragraph, exit 2,
    instead of an internal error."""
    import onnx
    from conftest import assert_clean_error
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    graph = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=0)], "bad",
                              [helper.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("m", T.FLOAT, [2])],
                              initializer=[numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "bad.onnx"))
    compile_model(tmp_path / "bad.onnx", "host", tmp_path / "b")
    result = run_cli("validate", str(tmp_path / "b"))
    assert_clean_error(result, "ONNX Runtime, the reference, cannot load model.onnx", "fix the export")
