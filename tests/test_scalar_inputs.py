"""Scalar (0-d) inputs and outputs on every path a build runs on: the host, the C runner (.npy files of
shape ``()``, the C API with ndim 0) natively and under qemu for rpi4 and rpi3, a C bundle's static runner,
and Silero VAD (a real model with a scalar int64 sample rate). The JVM path is in test_android.py, a
farm device (RPC) in test_devices.py.

The small model (tests/model_factory.py ``onnx_with_scalar_input``) uses its scalar ``sr`` in arithmetic
and in an ``If`` and returns a scalar, so a wrong shape anywhere fails a test; both arms of the ``If``
are checked."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from model_factory import onnx_with_scalar_input

from edgepack.compiling import compile_model
from edgepack.errors import EdgepackError
from edgepack.frontends import run_reference
from edgepack.manifest import read_manifest
from edgepack.packaging.c import package_c, run_bundle
from edgepack.profiles import get_profile
from edgepack.run.c_runner import run_c_runner, runner_for_profile
from edgepack.validation import validate

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)


def _feeds(sr: int) -> dict[str, np.ndarray]:
    return {"x": X, "sr": np.array(sr, np.int64)}


def _vad_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    """A 16 kHz Silero VAD frame (512 samples + 64 of context); the compiled length admits only sr = 16000."""
    rng = np.random.default_rng(seed)
    return {"input": (rng.standard_normal((1, 576)) * 0.1).astype(np.float32),
            "state": (rng.standard_normal((2, 1, 128)) * 0.5).astype(np.float32),
            "sr": np.array(16000, np.int64)}


@pytest.fixture(scope="module")
def scalar_model(tmp_path_factory):
    return onnx_with_scalar_input(tmp_path_factory.mktemp("scalar") / "scalar_sr.onnx")


@pytest.fixture(scope="module")
def builds(scalar_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("scalar-builds")
    made = {}

    def get(profile: str):
        if profile not in made:
            made[profile] = compile_model(scalar_model, profile, root / profile).output_dir
        return made[profile]

    return get


def test_manifest_keeps_the_scalar_shapes(builds):
    manifest = read_manifest(builds("rpi4"))
    assert [(t.name, t.dtype, tuple(t.shape)) for t in (*manifest.inputs, *manifest.outputs)] == [
        ("x", "float32", (1, 8)), ("sr", "int64", ()), ("y", "float32", (1, 8)), ("sr_next", "int64", ())]
    assert "input sr int64 -" in (builds("rpi4") / "device" / "model.meta").read_text()


@pytest.mark.parametrize("sr", [16000, 8000])
def test_validate_on_host_with_a_scalar_input(builds, tmp_path, sr):
    np.savez(tmp_path / "in.npz", **_feeds(sr))
    report = json.loads(run_cli("validate", str(builds("host")), "--on", "host", "--inputs", str(tmp_path / "in.npz"),
                                "--json", check=True).stdout)
    assert report["passed"] and [o["shape"] for o in report["outputs"]] == [[1, 8], []]


def test_c_runner_round_trips_0d_arrays(builds):
    """The runner built for this machine: a 0-d .npy in, a 0-d .npy out, the values of the reference."""
    build = builds("host")
    manifest = read_manifest(build)
    runner = runner_for_profile(get_profile("host"))
    for sr in (16000, 8000):
        result = run_c_runner([], runner, build / "device" / "model.so", _feeds(sr), manifest.inputs, manifest.outputs)
        y, sr_next = result.outputs
        assert sr_next.shape == () and sr_next.dtype == np.int64 and int(sr_next) == sr + 1
        expected = run_reference(build / manifest.model_file, "onnx", _feeds(sr), manifest.outputs)
        np.testing.assert_allclose(y, expected[0], rtol=1e-6)


def test_runner_errors_carry_the_hint_of_their_status(builds):
    """A 1-d array where the model takes a scalar is a shape error, and its hint says so (it used to
    suggest checking the library's architecture)."""
    build = builds("host")
    manifest = read_manifest(build)
    runner = runner_for_profile(get_profile("host"))
    library = build / "device" / "model.so"
    wrong = {"x": X, "sr": np.array([16000], np.int64)}
    with pytest.raises(EdgepackError, match=r"'sr' has 0 dimensions, got 1 \(EP_ERR_SHAPE\)") as err:
        run_c_runner([], runner, library, wrong, manifest.inputs, manifest.outputs)
    assert "0-d array" in err.value.hint and "architecture" not in err.value.hint
    with pytest.raises(EdgepackError, match="EP_ERR_DTYPE") as err:
        run_c_runner([], runner, library, {"x": X, "sr": np.array(16000, np.int32)}, manifest.inputs, manifest.outputs)
    assert "astype" in err.value.hint and "architecture" not in err.value.hint
    with pytest.raises(EdgepackError, match="EP_ERR_LOAD") as err:
        run_c_runner([], runner, build / "manifest.json", _feeds(16000), manifest.inputs, manifest.outputs)
    assert "architecture" in err.value.hint


def test_a_1d_array_for_a_scalar_input_is_refused_before_running(builds, tmp_path):
    np.savez(tmp_path / "in.npz", x=X, sr=np.array([16000], np.int64))
    result = run_cli("validate", str(builds("rpi4")), "--on", "emulator", "--inputs", str(tmp_path / "in.npz"))
    assert_clean_error(result, "Input 'sr' has shape [1], but the build expects []")


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_scalar_inputs_under_qemu(builds, models, tmp_path, profile):
    """`validate --on emulator` (the device library, the C runner under qemu-user) with a scalar input:
    the small model on both If arms, then Silero VAD."""
    for sr in (16000, 8000):
        np.savez(tmp_path / f"in{sr}.npz", **_feeds(sr))
        report = json.loads(run_cli("validate", str(builds(profile)), "--on", "emulator",
                                    "--inputs", str(tmp_path / f"in{sr}.npz"), "--json", check=True).stdout)
        assert report["passed"] and report["ran_on"].startswith("C runner under qemu-"), report
    vad = models["silero_vad"]
    build = compile_model(vad.path, profile, tmp_path / "vad", input_shapes=vad.input_shapes).output_dir
    report = validate(build, "emulator", inputs=_vad_feeds(1))
    assert report.passed, [(o.name, o.max_abs_error) for o in report.outputs]


@pytest.mark.slow
def test_c_bundle_static_runner_with_a_scalar_input(builds, tmp_path):
    """`package c` + the bundle's static runner under qemu (rpi3): a 0-d .npy in, a 0-d .npy out."""
    bundle = package_c(builds("rpi3"), tmp_path / "dist")
    for sr in (16000, 8000):
        result = run_bundle(bundle.output_dir, _feeds(sr), static=True, save_to=tmp_path / "out.npz")
        with np.load(tmp_path / "out.npz") as saved:
            assert saved["sr_next"].shape == () and int(saved["sr_next"]) == sr + 1
        expected = run_reference(builds("rpi3") / "model.onnx", "onnx", _feeds(sr), bundle.outputs)
        np.testing.assert_allclose(result.outputs[0], expected[0], rtol=1e-5)
