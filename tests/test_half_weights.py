"""Float16 weights stay float16 in CPU builds (issue 42: "fp16 stays fp16"): MediaPipe's TFLite models store
their weights in float16, and CPU builds had widened them at compile time, a library twice the model.
Now the kernels widen them as they read them (``backends/cpu/half_weights.py``); the numbers are the
same to the bit, on the host and on the devices (BlazeFace, a float16 model, is validated under qemu for
rpi4 and rpi3 by test_compile.py; iris_landmark, float32, by test_zoo.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import skip_outside_setup

import edgepack
from edgepack.backends.cpu import half_weights
from edgepack.compiling import compile_model
from edgepack.profiles import get_profile
from edgepack.validation import validate


def test_only_weights_that_are_float16_values_are_stored_as_float16():
    rng = np.random.default_rng(0)
    exact = rng.standard_normal(4096).astype(np.float16).astype(np.float32)
    exact[:3] = [np.inf, -np.inf, -0.0]
    half = half_weights.stored_in_half(exact)
    assert half is not None and half.dtype == np.float16
    assert np.array_equal(half.astype(np.float32).view(np.uint32), exact.view(np.uint32))  # -0.0 kept
    inexact = exact.copy()
    inexact[100] = np.float32(1 / 3)  # one value float16 cannot hold keeps the whole tensor float32
    assert half_weights.stored_in_half(inexact) is None
    assert half_weights.stored_in_half(np.full(65536, 1e6, np.float32)) is None  # beyond float16's range
    assert half_weights.stored_in_half(exact[:64]) is None  # too small to be worth it


@pytest.mark.parametrize(("profile", "widens"), [("rpi4", True), ("rpi3", True), ("android-arm64", True)])
def test_the_device_profiles_widen_in_hardware(profile, widens):
    import tvm

    assert half_weights.widens_in_hardware(tvm.target.Target(get_profile(profile).target_spec)) is widens
    # an ARMv7 without VFPv4's conversions would call a library routine per weight: float32 there
    plain = tvm.target.Target({"kind": "llvm", "mtriple": "armv7a-unknown-linux-gnueabihf", "mattr": ["+neon"]})
    assert not half_weights.widens_in_hardware(plain)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_a_float16_model_keeps_its_weights_in_float16(models, build_cache, profile):
    """BlazeFace (0.23 MB of float16 weights) on the devices: its constants are float16 and no larger than
    the model (2x before); its outputs are checked under qemu by test_compile.py on the same build."""
    build = build_cache(models["face_detection_short_range"], profile)
    library = edgepack.inspect(build).build.library
    assert library.constants.bytes <= library.model_bytes, (library.constants, library.model_bytes)
    assert {dtype for dtype, _shape, _bytes in library.constants.largest} == {"float16"}, library.constants


@pytest.mark.slow
@pytest.mark.parametrize(("profile", "on"), [("host", "host"), ("rpi4", "emulator")])
def test_weights_narrowed_with_a_loss_fail_validation(models, tmp_path, monkeypatch, profile, on):
    """A wrong build fails, on the host and under qemu: float32 weights narrowed to float16 although they are
    not float16 values (the check ``stored_in_half`` makes, left out). iris_landmark's weights are float32."""
    iris = models["iris_landmark"]
    if on == "host" and not half_weights.widens_in_hardware(_target("host")):
        skip_outside_setup("this machine's CPU has no F16C: its builds keep float32 weights")

    def lossy(weight):
        return weight.astype(np.float16) if weight.dtype == np.float32 and weight.size >= 256 else None

    monkeypatch.setattr(half_weights, "stored_in_half", lossy)
    build = compile_model(iris.path, profile, tmp_path / profile).output_dir
    constants = edgepack.inspect(build).build.library.constants
    assert "float16" in {dtype for dtype, _shape, _bytes in constants.largest}, constants
    report = validate(build, on, seed=2)
    assert not report.passed, [(o.name, o.max_abs_error) for o in report.outputs]
    if on == "emulator":
        assert report.ran_on.startswith("C runner under qemu-"), report.ran_on


def _target(profile: str):
    import tvm

    return tvm.target.Target(get_profile(profile).target_spec)
