"""Issue 43: LSTMs over a sequence whose length is known only at run time (``--dim``).

With a static length the recurrence is unrolled; with a symbolic one each direction is one loop kernel
(``frontends/onnx_ops/recurrent_loop.py``), which GPU builds run on the device's CPU. Each build is
validated against ONNX Runtime at several lengths, on the host and on the device path (the device library
under qemu, lavapipe), and a build whose loop kernel is wrong fails."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_common import plugin_with_a_device
from model_factory import onnx_lstm_any_length

from edgepack.compiling import compile_model
from edgepack.frontends.onnx_ops import recurrent, recurrent_loop
from edgepack.manifest import read_manifest
from edgepack.validation import validate

SHAPES = {"x": ("T", 2, 12), "h0": (2, 2, 24), "c0": (2, 2, 24)}
DIMS = ["T=1..64"]


def _schedules(build) -> dict[str, str]:
    manifest = read_manifest(build)
    section = manifest.extra.get("cpu") or next(v for v in manifest.extra.values()
                                                 if isinstance(v, dict) and "functions" in v)
    return {f["name"]: f["schedule"] for f in section["functions"]}


@pytest.fixture(scope="module")
def lstm_model(tmp_path_factory):
    return onnx_lstm_any_length(tmp_path_factory.mktemp("lstm") / "lstm.onnx")


@pytest.fixture(scope="module")
def lstm_build(lstm_model, tmp_path_factory):
    """The two-layer bidirectional LSTM for rpi4 with T = 1..64: the device library and the host library."""
    out = tmp_path_factory.mktemp("lstm-rpi4") / "b"
    return compile_model(lstm_model, "rpi4", out, input_shapes=SHAPES, dims=DIMS).output_dir


def test_an_lstm_runs_at_every_length_on_the_host(lstm_build):
    """Peepholes, a clip, HardSigmoid/Relu activations, initial states from the inputs, both directions, two
    layers: five lengths from 1 to 64 (odd ones among them), each within validate's tolerance of ONNX
    Runtime, and one length asked for."""
    loops = [n for n in _schedules(lstm_build) if n.startswith("lstm_loop")]
    assert loops, _schedules(lstm_build)  # the recurrence is a loop kernel, not unrolled
    report = validate(lstm_build)
    assert report.passed, report.to_dict()
    assert len(report.sizes) == 5 and {s["T"] for s in report.sizes} >= {1, 64}
    one = validate(lstm_build, sizes=["T=37"])
    assert one.passed and one.outputs[0].shape == (37, 2, 2, 24), one.to_dict()


def test_an_lstm_runs_at_every_length_under_qemu(lstm_build):
    """The device library (aarch64), run by the C runner under qemu at the same five lengths."""
    report = validate(lstm_build, "emulator")
    assert report.passed, report.to_dict()
    assert len(report.sizes) == 5


def test_sequence_lengths_end_each_batch_items_steps(tmp_path):
    """``sequence_lens`` as an input: steps past a batch item's length output zeros and keep its state
    (the reverse direction starts at the item's last step), at two run-time lengths."""
    model = onnx_lstm_any_length(tmp_path / "lens.onnx", sequence_lens=True, seed=3)
    build = compile_model(model, "host", tmp_path / "b", input_shapes={**SHAPES, "lens": (2,)},
                          dims=DIMS).output_dir
    rng = np.random.default_rng(0)
    for steps, lens in ((9, [4, 9]), (40, [40, 17])):
        feeds = {"x": rng.normal(0, 1, (steps, 2, 12)).astype(np.float32),
                 "h0": rng.normal(0, 0.5, (2, 2, 24)).astype(np.float32),
                 "c0": rng.normal(0, 0.5, (2, 2, 24)).astype(np.float32), "lens": np.array(lens, np.int32)}
        np.savez(tmp_path / "in.npz", **feeds)
        report = validate(build, inputs=tmp_path / "in.npz")
        assert report.passed and not report.degenerate, report.to_dict()


def _forward_only(batch, hidden, dtype, activations, clip, reverse):
    """A wrong loop kernel: the reverse direction walks the sequence forwards."""
    return recurrent_loop.lstm_loop_kernel(batch, hidden, dtype, activations, clip, False)


def test_a_wrong_loop_kernel_fails_validation(lstm_model, tmp_path, monkeypatch):
    """The same model built with a loop kernel whose reverse direction runs forwards: validate fails on the
    host and under qemu (the right build passes at the same sizes, above)."""
    monkeypatch.setattr(recurrent, "lstm_loop_kernel", _forward_only)
    build = compile_model(lstm_model, "rpi4", tmp_path / "wrong", input_shapes=SHAPES, dims=DIMS).output_dir
    for on in ("host", "emulator"):
        report = validate(build, on, sizes=["T=23"])
        assert not report.passed, (on, report.to_dict())


def test_a_gpu_build_runs_the_loop_on_the_devices_cpu(lstm_model, tmp_path, monkeypatch):
    """vulkan-generic: the loop kernels run on the CPU of the same program (one GPU thread would take every
    step; lavapipe even stops a shader's loops after 65535 iterations), named in the build's report, and the
    build matches ONNX Runtime on lavapipe at five lengths. With a wrong loop kernel it does not."""
    plugin_with_a_device("vulkan")
    build = compile_model(lstm_model, "vulkan-generic", tmp_path / "vk", input_shapes=SHAPES, dims=DIMS).output_dir
    on_cpu = [n for n, rule in _schedules(build).items() if rule == "cpu (serial loop)"]
    assert on_cpu and all(n.startswith("lstm_loop") for n in on_cpu), _schedules(build)
    report = validate(build, "host-vulkan")
    assert report.passed and len(report.sizes) == 5, report.to_dict()
    monkeypatch.setattr(recurrent, "lstm_loop_kernel", _forward_only)
    wrong = compile_model(lstm_model, "vulkan-generic", tmp_path / "wrong", input_shapes=SHAPES,
                          dims=DIMS).output_dir
    assert not validate(wrong, "host-vulkan", sizes=["T=23"]).passed


# ----------------------------------------------------------------------------------------------
# real models: an OCR recognizer over its text line's width, a voice detector over its samples

@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4"])  # rpi3: scripts/zoo.py's sweep and docs/benchmarks.md (compile 35 s)
def test_an_lstm_text_recognizer_runs_at_every_width(models, tmp_path, profile):
    """PP-OCRv2's CRNN recognizer (MobileNetV3, then two bidirectional LSTMs over the columns: T = W / 4) with
    W = 32..1280: five widths and its natural text line, on the host (rpi4's compile) and under qemu."""
    model = models["ppocr_rec_lstm"]
    build = compile_model(model.path, profile, tmp_path / profile, input_shapes={"x": (1, 3, 32, "W")},
                          dims=["W=32..1280"]).output_dir
    assert any(n.startswith("lstm_loop") for n in _schedules(build))
    for on in ("host", "emulator") if profile == "rpi4" else ("emulator",):
        report = validate(build, on)
        assert report.passed and len(report.sizes) == 5, (on, report.to_dict())
        natural = validate(build, on, inputs=model.natural)
        assert natural.passed and not natural.degenerate, (on, natural.to_dict())


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_a_voice_detector_runs_at_every_length(models, tmp_path, profile):
    """Silero VAD v4 (openWakeWord's copy): its STFT, encoder and LSTM over any number of samples, N =
    512..4096, at five lengths (random inputs take its 8 kHz branch) and on 1536 samples of real speech at
    16 kHz, on the host (rpi4's compile) and under qemu."""
    model = models["silero_vad_v4"]
    build = compile_model(model.path, profile, tmp_path / profile,
                          input_shapes={"input": (1, "N"), "h": (2, 1, 64), "c": (2, 1, 64)},
                          dims=["N=512..4096"]).output_dir
    for on in ("host", "emulator") if profile == "rpi4" else ("emulator",):
        report = validate(build, on)
        assert report.passed and len(report.sizes) == 5, (on, report.to_dict())
        natural = validate(build, on, inputs=model.natural)
        assert natural.passed and not natural.degenerate, (on, natural.to_dict())
