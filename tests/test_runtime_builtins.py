"""Operators TVM runs with functions its Python package registers (NonZero, Unique: ``relax.run.*``) or
its optional runtime part has (TopK, NMS, argsort: ``tvm.contrib.sort.*``): a device has neither, so the
C API registers C versions of them (runtimes/api/c/src/edgepack.c). Outputs whose shape depends on the
data have '?' dimensions in the model's metadata; the C runner writes what each run produced.

Checked with the C runner for this machine (it links only TVM's core runtime and has no Python) and,
slow, under qemu for rpi4 and rpi3; the values are ONNX Runtime's."""

from __future__ import annotations

import numpy as np
import pytest
from model_factory import onnx_with_data_dependent_outputs

from edgepack.compiling import compile_model
from edgepack.frontends import run_reference
from edgepack.manifest import read_manifest
from edgepack.profiles import get_profile
from edgepack.run.c_runner import run_c_runner, runner_for_profile
from edgepack.toolchain.model_library import parse_model_meta
from edgepack.validation import validate

X = np.array([[0.3, -1.2, 2.6, 0.0], [1.4, 1.4, -0.2, 0.9], [-2.1, 0.0, 0.7, 3.3]], np.float32)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return onnx_with_data_dependent_outputs(tmp_path_factory.mktemp("builtins") / "data_dependent.onnx")


def test_outputs_decided_at_run_time_are_marked_in_the_metadata(model, tmp_path):
    build = compile_model(model, "host", tmp_path / "build").output_dir
    manifest = read_manifest(build)
    assert [(o.name, tuple(o.shape)) for o in manifest.outputs] == [
        ("nonzero", ("?", "?")), ("top_values", (3, 2)), ("top_indices", (3, 2)), ("unique", ("?",)),
        ("unique_counts", ("?",))]
    _, outputs = parse_model_meta((build / "device" / "model.meta").read_text())
    assert outputs[0].shape == ("?", "?")


def test_the_c_runner_runs_them_without_python(model, tmp_path):
    build = compile_model(model, "host", tmp_path / "build").output_dir
    manifest = read_manifest(build)
    runner = runner_for_profile(get_profile("host"))
    for x in (X, -X, np.zeros_like(X)):  # a different number of nonzeros and unique values each time
        got = run_c_runner([], runner, build / "device" / "model.so", {"x": x}, manifest.inputs,
                           manifest.outputs).outputs
        want = run_reference(model, "onnx", {"x": x}, manifest.outputs)
        for spec, a, e in zip(manifest.outputs, got, want):
            assert a.shape == e.shape and a.dtype == e.dtype, spec.name
            np.testing.assert_allclose(a, e, rtol=1e-6, err_msg=spec.name)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_under_qemu(model, tmp_path, profile):
    build = compile_model(model, profile, tmp_path / profile).output_dir
    for x in (X, -X):
        report = validate(build, "emulator", inputs={"x": x})
        assert report.passed, [(o.name, o.shape, o.max_abs_error) for o in report.outputs]
