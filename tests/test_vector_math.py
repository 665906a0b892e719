"""Sigmoid and tanh computed in SIMD vectors on CPUs (``backends/cpu/vector_math.py``): the library calls no
scalar ``expf``, and the outputs are ONNX Runtime's on the host and under qemu (rpi4, rpi3), in the functions'
tails too; a wrong sigmoid fails validation."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from model_factory import onnx_silu_tanh

from edgepack.backends.cpu import vector_math
from edgepack.compiling import compile_model
from edgepack.validation import validate


@pytest.fixture(scope="module")
def silu_tanh(tmp_path_factory):
    path = tmp_path_factory.mktemp("silu") / "silu_tanh.onnx"
    onnx_silu_tanh(path)
    inputs = path.with_suffix(".npz")  # wide inputs: the convolution's outputs reach +-40, tanh's input +-100
    np.savez(inputs, x=(np.random.default_rng(1).standard_normal((1, 3, 32, 40)) * 6).astype(np.float32))
    return path, inputs


def _calls_expf(library) -> bool:
    symbols = subprocess.run(["nm", "-D", str(library)], capture_output=True, text=True, check=True).stdout
    return any(line.split()[-1].startswith("expf") for line in symbols.splitlines() if " U " in line)


@pytest.mark.parametrize(("profile", "on"), [("host", "host"), ("rpi4", "emulator"), ("rpi3", "emulator")])
def test_sigmoid_and_tanh_run_in_vectors_and_match_onnxruntime(silu_tanh, tmp_path, profile, on):
    model, inputs = silu_tanh
    build = compile_model(model, profile, tmp_path / profile).output_dir
    assert not _calls_expf(build / "device" / "model.so")
    for report in (validate(build, on, seed=3), validate(build, on, inputs=inputs)):
        assert report.passed, [(o.name, o.max_abs_error) for o in report.outputs]
        if on == "emulator":
            assert report.ran_on.startswith("C runner under qemu-"), report.ran_on


def test_a_wrong_sigmoid_fails_validation(silu_tanh, tmp_path, monkeypatch):
    """``1 / (1 + exp(x))``: the sign of the exponent lost."""
    from tvm import topi

    model, inputs = silu_tanh
    monkeypatch.setattr(vector_math, "_fast_sigmoid",
                        lambda x: topi.divide(1.0, topi.add(1.0, topi.fast_exp(x))))
    build = compile_model(model, "host", tmp_path / "wrong").output_dir
    report = validate(build, "host", inputs=inputs)
    assert not report.passed and not report.outputs[0].passed
