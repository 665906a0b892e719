"""Reference runtimes: ONNX Runtime for ONNX, LiteRT for TFLite.

edgepack's outputs are judged against these, never against itself.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgepack.errors import EdgepackError
from edgepack.tensors import ModelFormat, TensorSpec


def run_reference(
    model: Path, model_format: ModelFormat, inputs: dict[str, np.ndarray], outputs: tuple[TensorSpec, ...]
) -> list[np.ndarray]:
    """Run the model on ``inputs`` with the reference runtime; outputs in manifest order."""
    if model_format == "onnx":
        return _run_onnxruntime(model, inputs, outputs)
    return _run_litert(model, inputs, outputs)


def _run_onnxruntime(model: Path, inputs: dict[str, np.ndarray], outputs: tuple[TensorSpec, ...]):
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise EdgepackError("ONNX Runtime is needed as the reference for ONNX models.",
                            "pip install onnxruntime") from exc
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    try:
        results = session.run(None, inputs)
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument types
        text = str(exc).strip().splitlines()
        raise EdgepackError(
            f"ONNX Runtime, the reference, rejects these inputs: {text[0][:400] if text else type(exc).__name__}",
            "The model does not accept them: random inputs give integer inputs small values (0..10), which "
            "may select a branch the model cannot run for these shapes (e.g. Silero VAD's sample rate sr). "
            "Pass real inputs with --inputs inputs.npz.",
        ) from exc
    by_name = dict(zip(names, results))
    return [np.asarray(by_name[o.name]) if o.name in by_name else np.asarray(results[i])
            for i, o in enumerate(outputs)]


def _run_litert(model: Path, inputs: dict[str, np.ndarray], outputs: tuple[TensorSpec, ...]):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as exc:
        raise EdgepackError("LiteRT is needed as the reference for TFLite models.",
                            "pip install ai-edge-litert") from exc
    with quiet_native_stderr():  # LiteRT announces its XNNPACK delegate on stderr
        interpreter = Interpreter(model_path=str(model), num_threads=1)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], inputs[detail["name"]])
    interpreter.invoke()
    details = interpreter.get_output_details()
    by_name = {d["name"]: d for d in details}
    return [np.array(interpreter.get_tensor((by_name.get(o.name) or details[i])["index"]))
            for i, o in enumerate(outputs)]


@contextmanager
def quiet_native_stderr():
    """Silence C++ log lines (TVM's "Scope Loaded", LiteRT's delegate notice) that bypass sys.stderr."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
