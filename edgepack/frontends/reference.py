"""Reference runtimes: ONNX Runtime for ONNX, LiteRT for TFLite.

edgepack's outputs are judged against these, never against itself.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgepack.errors import EdgepackError, ValidationError
from edgepack.tensors import ModelFormat, TensorSpec


def reference_outputs(model: Path, model_format: ModelFormat, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model on ``inputs`` with the reference runtime: every output of the model, by name, in its order."""
    if model_format == "onnx":
        return _run_onnxruntime(model, inputs)
    return _run_litert(model, inputs)


def run_reference(
    model: Path, model_format: ModelFormat, inputs: dict[str, np.ndarray], outputs: tuple[TensorSpec, ...]
) -> list[np.ndarray]:
    """Run the model on ``inputs`` with the reference runtime; the ``outputs`` named, in their order. An
    output the model does not have is an error (the build was made from another model)."""
    found = reference_outputs(model, model_format, inputs)
    missing = [o.name for o in outputs if o.name not in found]
    if missing:
        raise ValidationError(
            f"{model.name} has no output named {', '.join(map(repr, missing))} (its outputs: "
            f"{', '.join(map(repr, found))}): the build was made from another model than the one beside it.",
            "Compile the model again into a new directory.",
        )
    return [found[o.name] for o in outputs]


def _run_onnxruntime(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise EdgepackError("ONNX Runtime is needed as the reference for ONNX models.",
                            "pip install onnxruntime") from exc
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's InvalidGraph/Fail: a model TVM imported but ONNX Runtime refuses
        text = str(exc).strip().splitlines()
        raise EdgepackError(
            f"ONNX Runtime, the reference, cannot load {Path(model).name}: "
            f"{text[0][:400] if text else type(exc).__name__}",
            "The build compiled, but the model is not valid ONNX as ONNX Runtime reads it (e.g. an attribute "
            "or input of another opset): fix the export (onnx.checker.check_model names the node), or compare "
            "the build's outputs with `edgepack run` against a reference of your own.") from exc
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
    return {name: np.asarray(result) for name, result in zip(names, results)}


def _run_litert(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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
    return {d["name"]: np.array(interpreter.get_tensor(d["index"])) for d in interpreter.get_output_details()}


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
