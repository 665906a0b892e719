#!/usr/bin/env python3
"""Single-operator TFLite models through edgepack's import + compile + run path, against LiteRT.

    python scripts/tflite_conformance.py                                 # every case on this machine
    python scripts/tflite_conformance.py --profile rpi3 --on emulator    # cross-compiled, C runner under qemu
    python scripts/tflite_conformance.py --profile vulkan-generic --on gpu  # on this machine's GPU driver
    python scripts/tflite_conformance.py --filter 'conv' --failures
    python scripts/tflite_conformance.py --markdown docs/conformance.md  # the TFLite section of the report

Each case is one builtin operator (``OPS``) in one variant, written with ``scripts/tflite_factory.py``:

* ``float32``: float32 tensors and constants;
* ``fp16``: the constant operands (weights, biases, constant inputs) stored as float16 behind DEQUANTIZE,
  as the TFLite converter's float16 quantization writes them;
* ``int8``: the operator on int8 tensors between QUANTIZE and DEQUANTIZE, as full-integer quantization
  writes them: per-channel int8 weights, int32 biases, output scales from the float32 model's output
  range (or the ones LiteRT requires: the input's for data movement, 1/256 for SOFTMAX/LOGISTIC ...).

Every model takes and returns float32 (ARG_MAX: int32), so the same inputs go to LiteRT
(``ai_edge_litert``, the reference) and to edgepack, at the place ``--profile/--on`` names (see
``scripts/conformance.py``: the host's Relax VM, the device library run by the C runner under
qemu-user, or a GPU profile's build run on this machine's driver: lavapipe, PoCL). Tolerances: float32 and fp16 ``rtol 1e-3, atol 1e-5``; int8 one quantization step of the
output (integer arithmetic may round differently), nothing relative.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conformance import (  # noqa: E402 - after the path set-up
    STATUSES,
    CaseError,
    CaseResult,
    Place,
    compare_outputs,
    counts,
    load_results,
    machine_line,
    now_line,
    parse_place,
    results_dir,
    results_path,
    run_model,
    run_pool,
    save_results,
    write_section,
)
from tflite_factory import FLOAT16, FLOAT32, INT8, INT32, TFLiteWriter, options, quantize  # noqa: E402

SUITE = "tflite_conformance"
HOST = Place()
VARIANTS = ("float32", "fp16", "int8")
SAME, VALID = 0, 1  # tflite.Padding
NONE, RELU, RELU6 = 0, 1, 3  # tflite.ActivationFunctionType


@dataclass(frozen=True)
class Operand:
    """One input of the operator: ``x`` a model input (float32; quantized in the int8 variant), ``w`` a
    weight (per channel along ``axis`` in int8), ``b`` a bias (int32 in int8), ``c`` a float constant,
    ``p`` an int32 parameter (shape, axes, paddings, sizes), the same in every variant."""

    kind: str
    shape: tuple[int, ...] = ()
    value: tuple | None = None  # p: the values
    axis: int | None = None
    low: float = -1.0
    high: float = 1.0


@dataclass(frozen=True)
class Op:
    code: str  # tflite.BuiltinOperator name
    operands: tuple[Operand, ...]
    out: tuple[int, ...]
    table: str | None = None  # builtin options table, with ``fields``
    fields: dict = field(default_factory=dict)
    variants: tuple[str, ...] = ("float32", "int8")
    quant: str = "range"  # int8 output: range (float model's) / same (the input's) / softmax / tanh
    out_type: str = "float32"


def x(*shape, low=-1.0, high=1.0) -> Operand:
    return Operand("x", shape, low=low, high=high)


def w(*shape, axis=None) -> Operand:
    return Operand("w", shape, axis=axis)


def b(n) -> Operand:
    return Operand("b", (n,))


def c(*shape, low=-1.0, high=1.0) -> Operand:
    return Operand("c", shape, low=low, high=high)


def p(*values, shape=None) -> Operand:
    flat = np.asarray(values, dtype=np.int32)
    return Operand("p", tuple(shape or flat.shape), tuple(int(v) for v in flat.reshape(-1)))


CONV = {"DilationWFactor": 1, "DilationHFactor": 1}
ALL = ("float32", "fp16", "int8")
F32 = ("float32",)
F32_F16 = ("float32", "fp16")

OPS: dict[str, Op] = {
    # convolution and matrix products
    "conv_2d": Op("CONV_2D", (x(1, 6, 6, 4), w(8, 3, 3, 4, axis=0), b(8)), (1, 6, 6, 8), "Conv2DOptions",
                  {"Padding": SAME, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": NONE, **CONV}, ALL),
    "conv_2d_stride2_relu6": Op("CONV_2D", (x(1, 7, 7, 4), w(8, 3, 3, 4, axis=0), b(8)), (1, 3, 3, 8), "Conv2DOptions",
                                {"Padding": VALID, "StrideW": 2, "StrideH": 2, "FusedActivationFunction": RELU6,
                                 **CONV}, ALL),
    "depthwise_conv_2d": Op("DEPTHWISE_CONV_2D", (x(1, 6, 6, 8), w(1, 3, 3, 8, axis=3), b(8)), (1, 6, 6, 8),
                            "DepthwiseConv2DOptions", {"Padding": SAME, "StrideW": 1, "StrideH": 1,
                                                       "DepthMultiplier": 1, "FusedActivationFunction": RELU, **CONV},
                            ALL),
    "depthwise_conv_2d_mult2_stride2": Op("DEPTHWISE_CONV_2D", (x(1, 7, 7, 4), w(1, 3, 3, 8, axis=3), b(8)),
                                          (1, 3, 3, 8), "DepthwiseConv2DOptions",
                                          {"Padding": VALID, "StrideW": 2, "StrideH": 2, "DepthMultiplier": 2,
                                           "FusedActivationFunction": NONE, **CONV}, ALL),
    "fully_connected": Op("FULLY_CONNECTED", (x(2, 16), w(10, 16), b(10)), (2, 10), "FullyConnectedOptions",
                          {"FusedActivationFunction": NONE}, ALL),
    "transpose_conv": Op("TRANSPOSE_CONV", (p(1, 12, 12, 4), w(4, 3, 3, 8, axis=0), x(1, 6, 6, 8)), (1, 12, 12, 4),
                         "TransposeConvOptions", {"Padding": SAME, "StrideW": 2, "StrideH": 2}, ALL),
    "batch_matmul": Op("BATCH_MATMUL", (x(2, 3, 4), x(2, 4, 5)), (2, 3, 5), "BatchMatMulOptions",
                       {"AdjX": False, "AdjY": False}, F32),
    # elementwise with a constant or a second input
    "add": Op("ADD", (x(1, 4, 4, 8), c(8)), (1, 4, 4, 8), "AddOptions", {}, ALL),
    "add_broadcast_inputs": Op("ADD", (x(1, 4, 4, 8), x(1, 1, 1, 8)), (1, 4, 4, 8), "AddOptions", {}),
    "sub": Op("SUB", (x(1, 4, 4, 8), c(8)), (1, 4, 4, 8), "SubOptions", {}, ALL),
    "mul": Op("MUL", (x(1, 4, 4, 8), c(8)), (1, 4, 4, 8), "MulOptions", {}, ALL),
    "div": Op("DIV", (x(1, 4, 4, 8), c(8, low=0.5, high=2.0)), (1, 4, 4, 8), "DivOptions", {}, F32_F16),
    "maximum": Op("MAXIMUM", (x(1, 4, 4, 8), c(8)), (1, 4, 4, 8), "MaximumMinimumOptions", {}, ALL, quant="same"),
    "minimum": Op("MINIMUM", (x(1, 4, 4, 8), c(8)), (1, 4, 4, 8), "MaximumMinimumOptions", {}, ALL, quant="same"),
    "squared_difference": Op("SQUARED_DIFFERENCE", (x(1, 4, 4, 8), c(8)), (1, 4, 4, 8), "SquaredDifferenceOptions",
                             {}, F32_F16),
    "prelu": Op("PRELU", (x(1, 4, 4, 8), c(1, 1, 8, low=0.0, high=0.5)), (1, 4, 4, 8), None, {}, ALL),
    "prelu_pixelwise": Op("PRELU", (x(1, 4, 4, 8), c(4, 4, 8, low=0.0, high=0.5)), (1, 4, 4, 8), None, {}, ALL),
    # activations and unary functions
    "relu": Op("RELU", (x(1, 4, 4, 8, low=-4, high=4),), (1, 4, 4, 8)),
    "relu6": Op("RELU6", (x(1, 4, 4, 8, low=-8, high=8),), (1, 4, 4, 8)),
    "logistic": Op("LOGISTIC", (x(1, 4, 4, 8, low=-4, high=4),), (1, 4, 4, 8), quant="softmax"),
    "tanh": Op("TANH", (x(1, 4, 4, 8, low=-3, high=3),), (1, 4, 4, 8), quant="tanh"),
    "hard_swish": Op("HARD_SWISH", (x(1, 4, 4, 8, low=-4, high=4),), (1, 4, 4, 8), "HardSwishOptions", {}),
    "leaky_relu": Op("LEAKY_RELU", (x(1, 4, 4, 8, low=-2, high=2),), (1, 4, 4, 8), "LeakyReluOptions", {"Alpha": 0.2}),
    "elu": Op("ELU", (x(1, 4, 4, 8, low=-3, high=3),), (1, 4, 4, 8), variants=F32),
    "gelu": Op("GELU", (x(1, 4, 4, 8, low=-3, high=3),), (1, 4, 4, 8), "GeluOptions", {"Approximate": False}, F32),
    "softmax": Op("SOFTMAX", (x(2, 10, low=-3, high=3),), (2, 10), "SoftmaxOptions", {"Beta": 1.0}, quant="softmax"),
    "log_softmax": Op("LOG_SOFTMAX", (x(2, 10, low=-3, high=3),), (2, 10), "LogSoftmaxOptions", {}, F32),
    "exp": Op("EXP", (x(1, 4, 8, low=-2, high=2),), (1, 4, 8), "ExpOptions", {}, F32),
    "log": Op("LOG", (x(1, 4, 8, low=0.1, high=4),), (1, 4, 8), variants=F32),
    "sqrt": Op("SQRT", (x(1, 4, 8, low=0.1, high=4),), (1, 4, 8), variants=F32),
    "rsqrt": Op("RSQRT", (x(1, 4, 8, low=0.1, high=4),), (1, 4, 8), variants=F32),
    "square": Op("SQUARE", (x(1, 4, 8),), (1, 4, 8), "SquareOptions", {}, F32),
    "abs": Op("ABS", (x(1, 4, 8),), (1, 4, 8), "AbsOptions", {}, F32),
    "neg": Op("NEG", (x(1, 4, 8),), (1, 4, 8), "NegOptions", {}, F32),
    "l2_normalization": Op("L2_NORMALIZATION", (x(1, 4, 4, 8),), (1, 4, 4, 8), "L2NormOptions", {}, F32),
    # pooling and reductions
    "average_pool_2d": Op("AVERAGE_POOL_2D", (x(1, 8, 8, 4),), (1, 4, 4, 4), "Pool2DOptions",
                          {"Padding": SAME, "StrideW": 2, "StrideH": 2, "FilterWidth": 3, "FilterHeight": 3},
                          quant="same"),
    "max_pool_2d": Op("MAX_POOL_2D", (x(1, 8, 8, 4),), (1, 4, 4, 4), "Pool2DOptions",
                      {"Padding": VALID, "StrideW": 2, "StrideH": 2, "FilterWidth": 2, "FilterHeight": 2},
                      quant="same"),
    "mean": Op("MEAN", (x(1, 4, 4, 8), p(1, 2)), (1, 1, 1, 8), "ReducerOptions", {"KeepDims": True}),
    "sum": Op("SUM", (x(1, 4, 4, 8), p(2)), (1, 4, 8), "ReducerOptions", {"KeepDims": False}, F32),
    "reduce_max": Op("REDUCE_MAX", (x(1, 4, 4, 8), p(3)), (1, 4, 4), "ReducerOptions", {"KeepDims": False},
                     quant="same"),
    "arg_max": Op("ARG_MAX", (x(1, 10), p(1)), (1,), "ArgMaxOptions", {"OutputType": INT32}, F32, out_type="int32"),
    # data movement
    "reshape": Op("RESHAPE", (x(1, 4, 4, 8), p(1, 128)), (1, 128), "ReshapeOptions", {"NewShape": [1, 128]},
                  quant="same"),
    "squeeze": Op("SQUEEZE", (x(1, 4, 1, 8),), (4, 8), "SqueezeOptions", {"SqueezeDims": [0, 2]}, quant="same"),
    "transpose": Op("TRANSPOSE", (x(1, 4, 6, 8), p(0, 3, 1, 2)), (1, 8, 4, 6), "TransposeOptions", {}, quant="same"),
    "pad": Op("PAD", (x(1, 4, 4, 8), p(0, 0, 1, 1, 2, 0, 0, 0, shape=(4, 2))), (1, 6, 6, 8), "PadOptions", {},
              quant="same"),
    "mirror_pad": Op("MIRROR_PAD", (x(1, 4, 4, 8), p(0, 0, 1, 1, 2, 1, 0, 0, shape=(4, 2))), (1, 6, 7, 8),
                     "MirrorPadOptions", {"Mode": 0}, F32),
    "concatenation": Op("CONCATENATION", (x(1, 4, 4, 8), c(1, 4, 4, 4)), (1, 4, 4, 12), "ConcatenationOptions",
                        {"Axis": 3, "FusedActivationFunction": NONE}, ALL, quant="same"),
    "strided_slice": Op("STRIDED_SLICE", (x(1, 6, 6, 8), p(0, 1, 0, 0), p(1, 5, 6, 8), p(1, 2, 1, 2)), (1, 2, 6, 4),
                        "StridedSliceOptions", {}, quant="same"),
    "slice": Op("SLICE", (x(1, 6, 6, 8), p(0, 1, 2, 0), p(1, 3, 2, 8)), (1, 3, 2, 8), "SliceOptions", {}, F32),
    "space_to_depth": Op("SPACE_TO_DEPTH", (x(1, 4, 4, 2),), (1, 2, 2, 8), "SpaceToDepthOptions", {"BlockSize": 2},
                         quant="same"),
    "depth_to_space": Op("DEPTH_TO_SPACE", (x(1, 2, 2, 8),), (1, 4, 4, 2), "DepthToSpaceOptions", {"BlockSize": 2},
                         quant="same"),
    "gather": Op("GATHER", (x(5, 8), p(4, 0, 2)), (3, 8), "GatherOptions", {"Axis": 0}, F32),
    "tile": Op("TILE", (x(2, 3), p(2, 2)), (4, 6), "TileOptions", {}, F32),
    "resize_bilinear": Op("RESIZE_BILINEAR", (x(1, 6, 6, 8), p(12, 12)), (1, 12, 12, 8), "ResizeBilinearOptions",
                          {"AlignCorners": False, "HalfPixelCenters": True}, quant="same"),
    "resize_bilinear_align_corners": Op("RESIZE_BILINEAR", (x(1, 5, 5, 4), p(9, 9)), (1, 9, 9, 4),
                                        "ResizeBilinearOptions", {"AlignCorners": True, "HalfPixelCenters": False},
                                        F32),
    "resize_nearest_neighbor": Op("RESIZE_NEAREST_NEIGHBOR", (x(1, 6, 6, 8), p(12, 12)), (1, 12, 12, 8),
                                  "ResizeNearestNeighborOptions", {"AlignCorners": False, "HalfPixelCenters": False},
                                  quant="same"),
}


def list_cases(pattern: str | None = None) -> list[str]:
    import re

    names = [f"{name}.{v}" for name, op in OPS.items() for v in VARIANTS if v in op.variants]
    if pattern:
        rx = re.compile(pattern)
        names = [n for n in names if rx.search(n)]
    return names


def op_of(case: str) -> str:
    return OPS[case.split(".")[0]].code if case.split(".")[0] in OPS else "?"


# --- building a case --------------------------------------------------------------------------------


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _values(op: Op, name: str):
    """The case's float values: model inputs by name, and each constant operand (None for x and p)."""
    rng = np.random.default_rng(_seed(name))
    inputs, consts = {}, []
    for i, o in enumerate(op.operands):
        if o.kind == "x":
            inputs[f"x{i}"] = rng.uniform(o.low, o.high, o.shape).astype(np.float32)
            consts.append(None)
        elif o.kind == "w":
            consts.append(rng.normal(0, 0.3, o.shape).astype(np.float32))
        elif o.kind == "b":
            consts.append(rng.normal(0, 0.1, o.shape).astype(np.float32))
        elif o.kind == "c":
            consts.append(rng.uniform(o.low, o.high, o.shape).astype(np.float32))
        else:
            consts.append(None)
    return inputs, consts


def _range_params(low: float, high: float) -> tuple[float, int]:
    """Asymmetric int8 scale and zero point covering [low, high] (and 0)."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255 or 1.0
    return float(scale), int(np.clip(round(-128 - low / scale), -128, 127))


def build_model(op: Op, name: str, variant: str, path: Path, out_range: tuple[float, float] | None = None) -> float:
    """Write the case's model to ``path``; returns the int8 output's scale (0 for float outputs)."""
    import tflite

    inputs, consts = _values(op, name)
    wr = TFLiteWriter()
    model_inputs, operands = [], []
    x_scale, x_zp = 1.0, 0
    w_scales = None
    for i, (o, value) in enumerate(zip(op.operands, consts)):
        if o.kind == "x":
            t = wr.tensor(f"x{i}", o.shape, FLOAT32)
            model_inputs.append(t)
            if variant == "int8":
                x_scale, x_zp = _range_params(o.low, o.high)
                q = wr.tensor(f"x{i}_q", o.shape, INT8, scale=[x_scale], zero_point=[x_zp])
                wr.op(tflite.BuiltinOperator.QUANTIZE, [t], [q], options("QuantizeOptions"))
                t = q
        elif o.kind == "p":
            t = wr.tensor(f"p{i}", o.shape, INT32, np.asarray(o.value, np.int32).reshape(o.shape))
        elif variant == "float32":
            t = wr.tensor(f"{o.kind}{i}", o.shape, FLOAT32, value)
        elif variant == "fp16":
            half = wr.tensor(f"{o.kind}{i}_f16", o.shape, FLOAT16, value.astype(np.float16))
            t = wr.tensor(f"{o.kind}{i}", o.shape, FLOAT32)
            wr.op(tflite.BuiltinOperator.DEQUANTIZE, [half], [t], options("DequantizeOptions"))
        elif o.kind == "w":
            if o.axis is None:
                w_scales = np.array([np.abs(value).max() / 127])
                t = wr.tensor(f"w{i}", o.shape, INT8, quantize(value, w_scales[0]), list(w_scales), [0])
            else:
                other = tuple(d for d in range(value.ndim) if d != o.axis)
                w_scales = np.abs(value).max(axis=other) / 127
                t = wr.tensor(f"w{i}", o.shape, INT8, quantize(value, w_scales, axis=o.axis), list(w_scales),
                              [0] * len(w_scales), o.axis)
        elif o.kind == "b":
            scales = x_scale * w_scales
            data = np.round(value / (scales if scales.size > 1 else scales[0])).astype(np.int32)
            t = wr.tensor(f"b{i}", o.shape, INT32, data, list(scales), [0] * len(scales))
        else:  # c in int8
            scale, zp = (x_scale, x_zp) if op.quant == "same" else _range_params(float(value.min()), float(value.max()))
            t = wr.tensor(f"c{i}", o.shape, INT8, quantize(value, scale, zp), [scale], [zp])
        operands.append(t)
    out_dtype = INT32 if op.out_type == "int32" else FLOAT32
    out = wr.tensor("y", op.out, out_dtype)
    out_scale = 0.0
    if variant == "int8":
        if op.quant == "same":
            out_scale, out_zp = x_scale, x_zp
        elif op.quant == "softmax":
            out_scale, out_zp = 1 / 256, -128
        elif op.quant == "tanh":
            out_scale, out_zp = 1 / 128, 0
        else:
            out_scale, out_zp = _range_params(*out_range)
        q_out = wr.tensor("y_q", op.out, INT8, scale=[out_scale], zero_point=[out_zp])
        produced = q_out
    else:
        produced = out
    code = getattr(tflite.BuiltinOperator, op.code)
    wr.op(code, operands, [produced], options(op.table, **op.fields) if op.table else None)
    if variant == "int8":
        wr.op(tflite.BuiltinOperator.DEQUANTIZE, [produced], [out], options("DequantizeOptions"))
    wr.write(path, model_inputs, [out])
    return out_scale


def litert(path: Path, inputs: dict[str, np.ndarray]) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(str(path))
    interp.allocate_tensors()
    for detail in interp.get_input_details():
        interp.set_tensor(detail["index"], inputs[detail["name"]])
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


# --- one case (runs inside a worker) -------------------------------------------------------------


def run_case(case: str, workdir: str, place: Place = HOST) -> CaseResult:
    from edgepack.errors import EdgepackError
    from edgepack.frontends import import_model

    started = time.perf_counter()
    name, variant = case.split(".")
    op = OPS[name]

    def result(status: str, kind: str = "", message: str = "", cached: bool = False) -> CaseResult:
        return CaseResult(case, op.code, status, kind, message.strip()[:300], round(time.perf_counter() - started, 2),
                          [], cached)

    inputs, _ = _values(op, name)
    path = Path(workdir) / f"{case}.tflite"
    out_range = None
    if variant == "int8" and op.quant == "range":  # the output scale covers what the float model computes
        build_model(op, name, "float32", path)
        ref = litert(path, inputs)
        out_range = (float(ref.min()), float(ref.max()))
    out_scale = build_model(op, name, variant, path, out_range)
    try:
        want = litert(path, inputs)
    except Exception as exc:  # noqa: BLE001 - a model LiteRT refuses is a bug in the sweep
        return result("error", "reference", f"LiteRT: {exc}")

    def do_import():
        try:
            return import_model(path)
        except EdgepackError as exc:
            raise CaseError("import", str(exc)) from exc
        except Exception as exc:  # noqa: BLE001
            raise CaseError("import", f"{type(exc).__name__}: {exc}") from exc

    try:
        out, cached = run_model(place, case, path, {}, inputs, do_import)
    except CaseError as exc:
        return result("error", exc.kind, exc.message)
    got = out if isinstance(out, list) else [out]
    if variant == "int8":
        why = compare_outputs(got, [want], rtol=0.0, atol=out_scale * 1.001 + 1e-7)
    else:
        why = compare_outputs(got, [want], rtol=1e-3, atol=1e-5)
    return result("mismatch", "output", why, cached) if why else result("pass", cached=cached)


def run_cases(cases: list[str], jobs: int, timeout: float, on_result, place: Place = HOST) -> None:
    run_pool(SUITE, cases, place, jobs, timeout, on_result, op_of)


# --- reporting -----------------------------------------------------------------------------------


def known_places() -> list[tuple[Place, dict, dict[str, CaseResult]]]:
    found = []
    for path in sorted(results_dir().glob("tflite-*.json")):
        meta, results = load_results(path)
        if "place" in meta and results:
            found.append((Place(**meta["place"]), meta, results))
    return sorted(found, key=lambda item: (item[0].on != "host", item[0].name))


def markdown_section(places) -> str:
    cases = list_cases()
    lines = [
        "## TFLite operators (single-operator models against LiteRT)",
        "",
        "Written by `python scripts/tflite_conformance.py [--profile rpi4|rpi3 --on emulator | --profile"
        " vulkan-generic|mali-g610 --on gpu] --markdown docs/conformance.md`:",
        f"{len({op.code for op in OPS.values()})} builtin operators in {len(OPS)} configurations, {len(cases)} cases:"
        " each operator alone in a model written with",
        "`scripts/tflite_factory.py`, as float32, with float16 constants behind DEQUANTIZE (fp16, where the operator",
        "has constant operands) and fully int8-quantized between QUANTIZE and DEQUANTIZE (int8); compared with",
        "LiteRT on the same inputs (float32/fp16: rtol 1e-3, atol 1e-5; int8: one quantization step of the output).",
        "",
        "| place | cases run | pass | mismatch | error | crash | timeout | last run |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for place, meta, results in places:
        c = counts(list(results.values()))
        lines.append(f"| {place.label} | {len(results)} | **{c['pass']}** | {c['mismatch']} | {c['error']} | "
                     f"{c['crash']} | {c['timeout']} | {meta.get('date', '?')} |")
    lines += ["", "| operator | case | " + " | ".join(v for v in VARIANTS) + " |", "|---|---|---|---|---|"]

    def cell(name: str, variant: str) -> str:
        case = f"{name}.{variant}"
        marks = []
        for place, _, results in places:
            r = results.get(case)
            if r is not None:
                marks.append("pass" if r.status == "pass" else r.status)
        if variant not in OPS[name].variants:
            return "-"
        if not marks:
            return "not run"
        return marks[0] if len(set(marks)) == 1 else " / ".join(marks)

    for name, op in OPS.items():
        lines.append(f"| {op.code} | {name} | " + " | ".join(cell(name, v) for v in VARIANTS) + " |")
    failing = [(p, r) for p, _, res in places for r in res.values() if r.status != "pass"]
    lines += ["", f"Places: {', '.join(p.name for p, _, _ in places)} (a cell names each place's result where"
              " they differ).", ""]
    if failing:
        lines += ["### TFLite cases that do not pass", "", "| case | place | status | why |", "|---|---|---|---|"]
        for p, r in sorted(failing, key=lambda item: (item[1].case, item[0].name)):
            lines.append(f"| {r.case} | {p.name} | {r.status} ({r.kind}) | "
                         f"{r.message.replace('|', chr(92) + '|').replace(chr(10), ' ')[:200]} |")
    else:
        lines.append("Every case passes at every place.")
    return "\n".join(lines) + "\n"


def print_report(results: list[CaseResult], place: Place) -> None:
    c = counts(results)
    for r in results:
        if r.status != "pass":
            print(f"{r.status:8} {r.case}  {r.kind}: {r.message[:200]}")
    print(f"{len(results)} cases on {place.label}: {c['pass']} pass, " + ", ".join(f"{c[s]} {s}" for s in STATUSES[1:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="host",
                        help="device profile for --on emulator (rpi4, rpi3, ...) or --on gpu (vulkan-generic, mali-g610)")
    parser.add_argument("--on", default="host", choices=["host", "emulator", "gpu"],
                        help="where the cases run: the host, the C runner under qemu, or this machine's GPU driver")
    parser.add_argument("--filter", help="only cases whose name matches this regular expression")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    parser.add_argument("--markdown", type=Path,
                        help="write the TFLite section of this report from every place's results")
    parser.add_argument("--report-only", action="store_true", help="run nothing; only --markdown from stored results")
    args = parser.parse_args(argv)

    place = parse_place(args.profile, args.on)
    if not args.report_only:
        cases = list_cases(args.filter)
        path = results_path("tflite", place)
        meta, results = load_results(path) if path.exists() else ({}, {})
        meta = {**meta, "date": now_line(), "machine": machine_line("ai-edge-litert")}
        print(f"{len(cases)} cases on {place.label} with {args.jobs} worker(s)", flush=True)

        def on_result(res: CaseResult) -> None:
            results[res.case] = res
            print({"pass": ".", "mismatch": "M", "error": "E", "crash": "C", "timeout": "T"}[res.status], end="",
                  flush=True)

        run_cases(cases, args.jobs, args.timeout, on_result, place)
        print()
        save_results(path, place, results, meta)
        print_report([results[c] for c in cases if c in results], place)
    if args.markdown:
        write_section(args.markdown, "tflite", markdown_section(known_places()))
        print(f"wrote the TFLite section of {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
