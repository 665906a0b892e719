"""Post-training static quantization: a float ONNX model and calibration data in, an 8-bit model out that
``edgepack compile`` runs on integer kernels, with what quantizing cost, measured on held-out data.

ONNX Runtime's own tool does the quantization (``onnxruntime.quantization.quantize_static``: QDQ format,
8-bit weights per output channel or per tensor, unsigned 8-bit activations, their ranges by min/max,
percentile or entropy calibration); edgepack feeds it the calibration data, keeps operators in float on
request, checks the result against the float model and writes it atomically. Calibration data is an
``.npz`` of inputs (each array: the samples stacked on a new first axis) or a folder of pictures, read
with Pillow and made into the model's input by the same ``--preprocess`` settings ``compile`` takes.

TFLite models are refused with what to do: LiteRT's converter quantizes them where TensorFlow is (no
converter runs without it here), or quantize the ONNX export of the model.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.errors import EdgepackError, OutputExistsError
from edgepack.files import atomic_file
from edgepack.frontends import inspect_model
from edgepack.processing import parse_preprocess, plan_processing
from edgepack.processing.pictures import encode_frame
from edgepack.processing.reference import preprocess as preprocess_frame
from edgepack.progress import Progress
from edgepack.tensors import TensorSpec

METHODS = ("minmax", "percentile", "entropy")
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".webp", ".gif", ".tif", ".tiff")
#: operators whose presence means the model is quantized already
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                           "MatMulInteger", "DynamicQuantizeLinear", "QLinearAdd", "QLinearMul", "QGemm",
                           "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM"})


@dataclass(frozen=True)
class OutputAccuracy:
    """What quantizing cost on one output, over the held-out samples."""

    name: str
    max_abs_error: float
    mean_abs_error: float
    top1_agreement: float | None  # classifier-like outputs (one row of scores): argmax equal to the float model's


@dataclass(frozen=True)
class QuantizeResult:
    model: Path
    output: Path
    method: str
    per_channel: bool
    calibration_samples: int
    held_out_samples: int
    kept_float: tuple[str, ...]
    outputs: tuple[OutputAccuracy, ...]
    seconds: float
    note: str = ""  # e.g. held-out data reused from the calibration set

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(model=str(self.model), output=str(self.output), kept_float=list(self.kept_float),
                    seconds=round(self.seconds, 3))
        return data


def _refuse(problem: str, fix: str) -> EdgepackError:
    return EdgepackError(problem, fix)


def _at_least_opset(path: Path, opset: int) -> None:
    """Convert the ONNX model at ``path`` in place to ``opset`` where its own is older: ONNX Runtime's
    quantizer writes per-channel DequantizeLinear nodes (an ``axis``: opset 13) into models of any opset,
    and the result of an older one does not load."""
    import onnx
    from onnx import version_converter

    proto = onnx.load(str(path))
    current = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current < opset:
        converted = version_converter.convert_version(proto, opset)
        converted.ir_version = max(converted.ir_version, 7)  # IR 3 also listed every weight among the inputs
        constants = {init.name for init in converted.graph.initializer}
        for listed in [i for i in converted.graph.input if i.name in constants]:
            converted.graph.input.remove(listed)
        onnx.save(converted, str(path))


def _check_model(model: Path):
    info = inspect_model(model)
    if info.format != "onnx":
        raise _refuse(f"{model.name} is a TFLite model; edgepack quantize takes float ONNX models.",
                      "Quantize a TFLite model with LiteRT's converter (TensorFlow: "
                      "converter.optimizations = [tf.lite.Optimize.DEFAULT] with a representative dataset), or "
                      "quantize the model's ONNX export here; edgepack compiles either result.")
    already = sorted(QUANTIZED_OPS & set(info.operator_counts))
    if already:
        raise _refuse(f"{model.name} is quantized already (it has {', '.join(already)}).",
                      f"Compile it as it is (edgepack compile {model.name}), or quantize its float original.")
    return info


MIN_OPSET = 13  # per-channel quantization's DequantizeLinear(axis)


def _npz_samples(path: Path, inputs: tuple[TensorSpec, ...]) -> list[dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise _refuse(f"Cannot read calibration data from {path}: {exc}.",
                      "Pass an .npz made with numpy.savez(path, **{input_name: samples}), each array the "
                      "samples stacked on a new first axis.") from exc
    missing = [s.name for s in inputs if s.name not in arrays]
    if missing:
        raise _refuse(f"{path} has no array for input(s) {', '.join(missing)} (it has: {', '.join(arrays) or 'none'}).",
                      "Save one array per model input, named as the input, the samples stacked on a new first axis.")
    counts = set()
    for spec in inputs:
        array, shape = arrays[spec.name], tuple(spec.shape)
        fixed = all(isinstance(d, int) for d in shape)
        if array.dtype != np.dtype(spec.dtype) or array.ndim != len(shape) + 1 or \
                (fixed and tuple(array.shape[1:]) != shape):
            raise _refuse(f"Calibration array {spec.name!r} in {path} is {array.dtype} {list(array.shape)}; the model "
                          f"takes {spec.dtype} {list(shape)} per sample.",
                          f"Stack the samples on a new first axis: shape [N, {', '.join(map(str, shape))}], dtype "
                          f"{spec.dtype} (array.astype(...)).")
        counts.add(array.shape[0])
    if len(counts) != 1 or 0 in counts:
        raise _refuse(f"The arrays in {path} hold different numbers of samples ({sorted(counts)}), or none.",
                      "Give every input the same number of samples (at least one).")
    n = counts.pop()
    return [{s.name: arrays[s.name][i] for s in inputs} for i in range(n)]


def _picture_samples(folder: Path, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                     preprocess) -> list[dict[str, np.ndarray]]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in PICTURE_SUFFIXES)
    if not files:
        raise _refuse(f"{folder} holds no pictures ({', '.join(PICTURE_SUFFIXES)}).",
                      "Put calibration pictures there (a few dozen typical of the model's use), or pass an .npz.")
    settings = parse_preprocess(preprocess)
    if len(inputs) != 1 or len(settings) != 1:
        raise _refuse(f"Calibrating from pictures needs a model with one image input and one --preprocess setting "
                      f"for it (the model takes {', '.join(s.name for s in inputs)}).",
                      f"Pass --preprocess {inputs[0].name}=image:rgb8,mean=...,std=... as for compile, or an .npz.")
    frame = plan_processing(settings, (), inputs, outputs).frames[0]
    if frame.dynamic:  # frames of any size: calibrate on pictures at the model's own size
        frame = frame.at_size(frame.height, frame.width)
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as exc:
        raise _refuse("Reading calibration pictures needs Pillow.", "pip install pillow, or pass an .npz.") from exc
    samples = []
    for path in files:
        try:
            with Image.open(path) as image:
                rgb = np.asarray(image.convert("RGB").resize((frame.frame_width, frame.frame_height), Image.BILINEAR))
        except (OSError, UnidentifiedImageError) as exc:
            raise _refuse(f"Cannot read the picture {path}: {exc}.",
                          "Remove it from the calibration folder or replace it with a readable picture.") from exc
        samples.append({frame.name: preprocess_frame(frame, encode_frame(rgb, frame.setting.format))})
    return samples


def _run(model: Path, samples: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return [session.run(None, sample) for sample in samples]


def _accuracy(names: list[str], reference: list[list[np.ndarray]], quantized: list[list[np.ndarray]]):
    results = []
    for i, name in enumerate(names):
        errors = [np.abs(np.asarray(q[i], np.float64) - np.asarray(r[i], np.float64)) for r, q in zip(reference, quantized)]
        top1 = None
        first = np.asarray(reference[0][i])
        if first.ndim >= 1 and first.shape[-1] >= 2 and int(np.prod(first.shape[:-1])) == 1:
            top1 = float(np.mean([np.argmax(r[i]) == np.argmax(q[i]) for r, q in zip(reference, quantized)]))
        results.append(OutputAccuracy(name, float(max(e.max() for e in errors)),
                                      float(np.mean([e.mean() for e in errors])), top1))
    return tuple(results)


def quantize(model: Path | str, output: Path | str, *, calibration: Path | str, preprocess=None,
             input_shapes: dict[str, tuple[int, ...]] | None = None, method: str = "minmax", per_channel: bool = True,
             keep_float: tuple[str, ...] | list[str] = (), held_out: float = 0.2, force: bool = False,
             progress: Progress | None = None) -> QuantizeResult:
    """Quantize a float ONNX ``model`` to 8 bits from ``calibration`` (an .npz of inputs or a folder of
    pictures with ``preprocess`` settings) and write it to ``output``.

    ``method``: activation ranges by ``minmax``, ``percentile`` or ``entropy``. ``per_channel``: weights
    per output channel (else per tensor). ``keep_float``: operator types (``Softmax``) or node names left
    in float. ``held_out``: the share of the samples kept out of calibration to measure the cost.
    ``input_shapes``: sizes for dynamic input dimensions (pictures need a static image input). Nothing is
    written on any error."""
    started = time.perf_counter()
    model, output, calibration = Path(model), Path(output), Path(calibration)
    if method not in METHODS:
        raise _refuse(f"Unknown calibration method {method!r}.", f"Use one of: {', '.join(METHODS)}.")
    if not 0 <= held_out < 1:
        raise _refuse(f"--held-out {held_out} is not a share below 1.", "Pass a share such as 0.2 (0: reuse calibration).")
    if output.exists() and not force:
        raise OutputExistsError(f"{output} already exists.", "Pass --force to replace it, or choose another -o.")
    if not calibration.exists():
        raise _refuse(f"Calibration data {calibration} does not exist.", "Pass a folder of pictures or an .npz of inputs.")
    info = _check_model(model)
    say = progress or (lambda _message: None)
    say(f"Reading calibration data from {calibration}")
    inputs = tuple(TensorSpec(s.name, s.dtype, tuple((input_shapes or {}).get(s.name, s.shape))) for s in info.inputs)
    samples = _picture_samples(calibration, inputs, info.outputs, preprocess) if calibration.is_dir() \
        else _npz_samples(calibration, inputs)
    keep = max(1, round(len(samples) * held_out)) if held_out > 0 and len(samples) > 1 else 0
    calibrate, check = (samples[:-keep], samples[-keep:]) if keep else (samples, samples)
    note = "" if keep else "too few samples to hold some out: the cost is measured on the calibration samples"

    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(calibrate)

        def get_next(self):
            return next(self.items, None)

    op_types = set(info.operator_counts)
    kept_ops = [k for k in keep_float if k in op_types]
    with tempfile.TemporaryDirectory(prefix="edgepack-quantize-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        result = Path(tmp) / "quantized.onnx"
        say(f"Quantizing {model.name} ({method}, {len(calibrate)} calibration sample(s))")
        try:
            quant_pre_process(str(model), str(prepared), skip_symbolic_shape=True)
            _at_least_opset(prepared, MIN_OPSET)
            quantize_static(
                str(prepared), str(result), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method={"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
                                  "entropy": CalibrationMethod.Entropy}[method],
                nodes_to_exclude=[k for k in keep_float if k not in op_types],
                op_types_to_quantize=sorted(op_types - set(kept_ops)) if kept_ops else None)
        except Exception as exc:  # onnxruntime's tool raises its own errors for what it cannot quantize
            raise _refuse(f"ONNX Runtime's quantization tool failed on {model.name}: {str(exc).strip()[:300]}",
                          "Keep the operator it names in float (--keep-float OP_TYPE or NODE_NAME), or check that "
                          "the calibration data fits the model's inputs.") from exc
        say(f"Measuring the cost on {len(check)} held-out sample(s)")
        names = [s.name for s in info.outputs]
        outputs = _accuracy(names, _run(model, check), _run(result, check))
        with atomic_file(output) as staging:
            shutil.copyfile(result, staging)
    return QuantizeResult(model, output, method, per_channel, len(calibrate), len(check), tuple(keep_float), outputs,
                          time.perf_counter() - started, note)
