"""Write small TFLite flatbuffers (with the `tflite` schema package, no TensorFlow), for the tests and
the TFLite operator sweep (scripts/tflite_conformance.py): ``TFLiteWriter`` (tensors, constant buffers,
quantization, operators) and ``options`` (any builtin options table from its field values).

``int8_convnet`` is a fully int8-quantized network the way the TFLite converter makes them
(QUANTIZE at the input, per-channel int8 CONV_2D / DEPTHWISE_CONV_2D weights with int32 biases,
an int8 ADD of two branches with different scales, RESHAPE, FULLY_CONNECTED, DEQUANTIZE at the
output). LiteRT runs it as the reference.

``blazeface_block`` is a block of MediaPipe's BlazeFace that widens its channels (a depthwise and a 1x1
convolution, the input padded with zero channels as the residual, ADD with a fused ReLU).

``fp16_pointwise_conv`` and ``bilinear_upsample`` are layers of MediaPipe's models (CONV_2D with
float16 weights behind DEQUANTIZE; RESIZE_BILINEAR with half-pixel centres) that armv7 builds got
wrong (docs/armv7.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FLOAT32, FLOAT16, INT32, INT8 = 0, 1, 2, 9
ADD, CONV_2D, DEPTHWISE_CONV_2D, DEQUANTIZE, FULLY_CONNECTED, PAD, RESHAPE, RESIZE_BILINEAR, QUANTIZE = \
    0, 3, 4, 6, 9, 34, 22, 23, 114


@dataclass
class _Tensor:
    name: str
    shape: list[int]
    dtype: int
    data: bytes | None = None
    scale: list[float] | None = None
    zero_point: list[int] | None = None
    qdim: int = 0


@dataclass
class _Op:
    code: int
    inputs: list[int]
    outputs: list[int]
    options: tuple | None = None  # (BuiltinOptions type, writer(builder) -> offset)


@dataclass
class TFLiteWriter:
    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)

    def tensor(self, name, shape, dtype, data=None, scale=None, zero_point=None, qdim=0) -> int:
        raw = None if data is None else np.ascontiguousarray(data).tobytes()
        self.tensors.append(_Tensor(name, list(shape), dtype, raw, scale, zero_point, qdim))
        return len(self.tensors) - 1

    def op(self, code, inputs, outputs, options=None) -> None:
        self.ops.append(_Op(code, inputs, outputs, options))

    def write(self, path: Path, inputs: list[int], outputs: list[int]) -> Path:
        import flatbuffers
        import tflite

        b = flatbuffers.Builder(4096)

        def ivec(start, values):
            start(b, len(values))
            for v in reversed(values):
                b.PrependInt32(int(v))
            return b.EndVector()

        def offsets(start, items):
            start(b, len(items))
            for item in reversed(items):
                b.PrependUOffsetTRelative(item)
            return b.EndVector()

        # buffers: 0 is the empty buffer; each constant tensor gets its own
        buffers, buffer_of = [], {}
        for i, t in enumerate(self.tensors):
            if t.data is not None:
                buffer_of[i] = len(buffers) + 1
                data = b.CreateByteVector(t.data)
                tflite.BufferStart(b)
                tflite.BufferAddData(b, data)
                buffers.append(tflite.BufferEnd(b))
        tflite.BufferStart(b)
        empty = tflite.BufferEnd(b)
        buffers = [empty] + buffers

        tensors = []
        for i, t in enumerate(self.tensors):
            name = b.CreateString(t.name)
            shape = ivec(tflite.TensorStartShapeVector, t.shape)
            quant = None
            if t.scale is not None:
                tflite.QuantizationParametersStartScaleVector(b, len(t.scale))
                for v in reversed(t.scale):
                    b.PrependFloat32(float(v))
                scales = b.EndVector()
                tflite.QuantizationParametersStartZeroPointVector(b, len(t.zero_point))
                for v in reversed(t.zero_point):
                    b.PrependInt64(int(v))
                zps = b.EndVector()
                tflite.QuantizationParametersStart(b)
                tflite.QuantizationParametersAddScale(b, scales)
                tflite.QuantizationParametersAddZeroPoint(b, zps)
                tflite.QuantizationParametersAddQuantizedDimension(b, t.qdim)
                quant = tflite.QuantizationParametersEnd(b)
            tflite.TensorStart(b)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddType(b, t.dtype)
            tflite.TensorAddBuffer(b, buffer_of.get(i, 0))
            tflite.TensorAddName(b, name)
            if quant is not None:
                tflite.TensorAddQuantization(b, quant)
            tensors.append(tflite.TensorEnd(b))

        codes_used = sorted({op.code for op in self.ops})
        op_codes = []
        for code in codes_used:
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
            tflite.OperatorCodeAddBuiltinCode(b, code)
            tflite.OperatorCodeAddVersion(b, 1)
            op_codes.append(tflite.OperatorCodeEnd(b))

        operators = []
        for op in self.ops:
            opts = op.options[1](b) if op.options else None
            ins = ivec(tflite.OperatorStartInputsVector, op.inputs)
            outs = ivec(tflite.OperatorStartOutputsVector, op.outputs)
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, codes_used.index(op.code))
            tflite.OperatorAddInputs(b, ins)
            tflite.OperatorAddOutputs(b, outs)
            if opts is not None:
                tflite.OperatorAddBuiltinOptionsType(b, op.options[0])
                tflite.OperatorAddBuiltinOptions(b, opts)
            operators.append(tflite.OperatorEnd(b))

        t_vec = offsets(tflite.SubGraphStartTensorsVector, tensors)
        o_vec = offsets(tflite.SubGraphStartOperatorsVector, operators)
        sg_in = ivec(tflite.SubGraphStartInputsVector, inputs)
        sg_out = ivec(tflite.SubGraphStartOutputsVector, outputs)
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, t_vec)
        tflite.SubGraphAddInputs(b, sg_in)
        tflite.SubGraphAddOutputs(b, sg_out)
        tflite.SubGraphAddOperators(b, o_vec)
        subgraph = tflite.SubGraphEnd(b)

        codes_vec = offsets(tflite.ModelStartOperatorCodesVector, op_codes)
        sg_vec = offsets(tflite.ModelStartSubgraphsVector, [subgraph])
        buf_vec = offsets(tflite.ModelStartBuffersVector, buffers)
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, codes_vec)
        tflite.ModelAddSubgraphs(b, sg_vec)
        tflite.ModelAddBuffers(b, buf_vec)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        path.write_bytes(b.Output())
        return path


def options(table: str, **fields):
    """A builtin options table for ``TFLiteWriter.op``: ``options("Conv2DOptions", Padding=..., StrideW=1)``;
    list values become int32 vectors (``NewShape=[1, 64]``)."""
    import tflite

    def write(b):
        vectors = {}
        for name, value in fields.items():
            if isinstance(value, (list, tuple)):
                getattr(tflite, f"{table}Start{name}Vector")(b, len(value))
                for v in reversed(value):
                    b.PrependInt32(int(v))
                vectors[name] = b.EndVector()
        getattr(tflite, f"{table}Start")(b)
        for name, value in fields.items():
            getattr(tflite, f"{table}Add{name}")(b, vectors.get(name, value))
        return getattr(tflite, f"{table}End")(b)

    return getattr(tflite.BuiltinOptions, table), write


def _conv_options(depthwise: bool, relu: bool, stride: int = 1):
    import tflite

    common = {"Padding": tflite.Padding.SAME, "StrideW": stride, "StrideH": stride, "DilationWFactor": 1,
              "DilationHFactor": 1, "FusedActivationFunction": 1 if relu else 0}
    if depthwise:
        return options("DepthwiseConv2DOptions", DepthMultiplier=1, **common)
    return options("Conv2DOptions", **common)


def _simple_options(name: str):
    return options(name)


def _reshape_options(shape):
    return options("ReshapeOptions", NewShape=list(shape))


def quantize(x: np.ndarray, scale, zp=0, axis=None) -> np.ndarray:
    """``x`` as int8 with ``scale`` (per channel along ``axis`` when given) and zero point ``zp``."""
    s = np.asarray(scale, dtype=np.float64)
    if axis is not None:
        s = s.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    return np.clip(np.round(x / s) + zp, -128, 127).astype(np.int8)


def int8_convnet(path: Path, seed: int = 0, hw: int = 8, channels: int = 8, classes: int = 10) -> Path:
    """input f32 [1,hw,hw,3] -> QUANTIZE -> CONV_2D(relu) -> DEPTHWISE_CONV_2D -> ADD(conv, dw)
    -> RESHAPE -> FULLY_CONNECTED -> DEQUANTIZE -> output f32 [1, classes]."""
    rng = np.random.default_rng(seed)
    w = TFLiteWriter()
    in_scale, in_zp = 2 / 255, -1  # inputs in [-1, 1]
    x = w.tensor("input", [1, hw, hw, 3], FLOAT32)
    xq = w.tensor("input_q", [1, hw, hw, 3], INT8, scale=[in_scale], zero_point=[in_zp])
    w.op(QUANTIZE, [x], [xq], _simple_options("QuantizeOptions"))

    # conv 3x3, per-channel weights
    cw = rng.normal(0, 0.3, (channels, 3, 3, 3))
    cw_scale = np.abs(cw).reshape(channels, -1).max(axis=1) / 127
    cb = rng.normal(0, 0.1, channels)
    conv_w = w.tensor("conv_w", cw.shape, INT8, quantize(cw, cw_scale, axis=0), list(cw_scale), [0] * channels, 0)
    conv_b = w.tensor("conv_b", [channels], INT32, np.round(cb / (in_scale * cw_scale)).astype(np.int32),
                      list(in_scale * cw_scale), [0] * channels)
    conv_scale, conv_zp = 3.0 / 255, -128  # relu output in [0, 3]
    conv = w.tensor("conv", [1, hw, hw, channels], INT8, scale=[conv_scale], zero_point=[conv_zp])
    w.op(CONV_2D, [xq, conv_w, conv_b], [conv], _conv_options(False, relu=True))

    # depthwise 3x3
    dw = rng.normal(0, 0.4, (1, 3, 3, channels))
    dw_scale = np.abs(dw).reshape(-1, channels).max(axis=0) / 127
    db = rng.normal(0, 0.1, channels)
    dw_w = w.tensor("dw_w", dw.shape, INT8, quantize(dw, dw_scale, axis=3), list(dw_scale), [0] * channels, 3)
    dw_b = w.tensor("dw_b", [channels], INT32, np.round(db / (conv_scale * dw_scale)).astype(np.int32),
                    list(conv_scale * dw_scale), [0] * channels)
    dw_out_scale, dw_zp = 6.0 / 255, 0
    dwo = w.tensor("dw", [1, hw, hw, channels], INT8, scale=[dw_out_scale], zero_point=[dw_zp])
    w.op(DEPTHWISE_CONV_2D, [conv, dw_w, dw_b], [dwo], _conv_options(True, relu=False))

    # add the two branches (different scales: the ADD rescales both)
    add_scale, add_zp = 8.0 / 255, -20
    added = w.tensor("add", [1, hw, hw, channels], INT8, scale=[add_scale], zero_point=[add_zp])
    w.op(ADD, [conv, dwo], [added], _simple_options("AddOptions"))

    flat = hw * hw * channels
    shape_t = w.tensor("shape", [2], INT32, np.array([1, flat], dtype=np.int32))
    flat_t = w.tensor("flat", [1, flat], INT8, scale=[add_scale], zero_point=[add_zp])
    w.op(RESHAPE, [added, shape_t], [flat_t], _reshape_options([1, flat]))

    fw = rng.normal(0, 0.05, (classes, flat))
    fw_scale = float(np.abs(fw).max() / 127)
    fb = rng.normal(0, 0.1, classes)
    fc_w = w.tensor("fc_w", fw.shape, INT8, quantize(fw, fw_scale), [fw_scale], [0])
    fc_b = w.tensor("fc_b", [classes], INT32, np.round(fb / (add_scale * fw_scale)).astype(np.int32),
                    [add_scale * fw_scale], [0])
    fc_scale, fc_zp = 16.0 / 255, 0
    fc = w.tensor("logits_q", [1, classes], INT8, scale=[fc_scale], zero_point=[fc_zp])
    w.op(FULLY_CONNECTED, [flat_t, fc_w, fc_b], [fc], _simple_options("FullyConnectedOptions"))
    out = w.tensor("logits", [1, classes], FLOAT32)
    w.op(DEQUANTIZE, [fc], [out], _simple_options("DequantizeOptions"))
    return w.write(path, [x], [out])


def fp16_pointwise_conv(path: Path, seed: int = 0, hw: int = 4, cin: int = 96, cout: int = 24) -> Path:
    """input f32 [1,hw,hw,cin] -> CONV_2D 1x1 (weights [cout,1,1,cin] and bias [cout] float16 behind
    DEQUANTIZE, as the TFLite converter writes float16-quantized models) -> output f32 [1,hw,hw,cout].

    TVM imports DEQUANTIZE of a float16 constant as a cast that runs in the model, so the weight
    transpose to HWIO runs on the device too (the defaults are the layer of MediaPipe's hand_landmark
    that LLVM 22 miscompiled for armv7: see docs/armv7.md)."""
    rng = np.random.default_rng(seed)
    w = TFLiteWriter()
    x = w.tensor("input", [1, hw, hw, cin], FLOAT32)
    w16 = w.tensor("conv_w_f16", [cout, 1, 1, cin], FLOAT16, rng.normal(0, 0.3, (cout, 1, 1, cin)).astype(np.float16))
    b16 = w.tensor("conv_b_f16", [cout], FLOAT16, rng.normal(0, 0.1, cout).astype(np.float16))
    wf = w.tensor("conv_w", [cout, 1, 1, cin], FLOAT32)
    bf = w.tensor("conv_b", [cout], FLOAT32)
    w.op(DEQUANTIZE, [w16], [wf], _simple_options("DequantizeOptions"))
    w.op(DEQUANTIZE, [b16], [bf], _simple_options("DequantizeOptions"))
    out = w.tensor("output", [1, hw, hw, cout], FLOAT32)
    w.op(CONV_2D, [x, wf, bf], [out], _conv_options(False, relu=False))
    return w.write(path, [x], [out])


def bilinear_upsample(path: Path, seed: int = 0, hw: int = 6, channels: int = 8, scale: int = 2) -> Path:
    """input f32 [1,hw,hw,channels] -> RESIZE_BILINEAR (half-pixel centres, as in MediaPipe's palm and pose
    detectors) -> output f32 [1,hw*scale,hw*scale,channels]. TVM's kernel converts between float32 and
    int64, which 32-bit ARM does with libgcc helpers (see docs/armv7.md)."""
    w = TFLiteWriter()
    x = w.tensor("input", [1, hw, hw, channels], FLOAT32)
    size = w.tensor("size", [2], INT32, np.array([hw * scale, hw * scale], dtype=np.int32))
    out = w.tensor("output", [1, hw * scale, hw * scale, channels], FLOAT32)
    w.op(RESIZE_BILINEAR, [x, size], [out], options("ResizeBilinearOptions", AlignCorners=False, HalfPixelCenters=True))
    return w.write(path, [x], [out])


def blazeface_block(path: Path, seed: int = 0, hw: int = 32, cin: int = 24, cout: int = 28) -> Path:
    """input f32 [1,hw,hw,cin] -> DEPTHWISE_CONV_2D 3x3 -> CONV_2D 1x1 to ``cout`` channels, plus the input
    PADded with zero channels to ``cout``; ADD with a fused ReLU -> output f32 [1,hw,hw,cout]: BlazeFace's
    block that widens its channels (28 output channels, which edgepack computes as 32 on AVX-512 and
    crops)."""
    rng = np.random.default_rng(seed)
    w = TFLiteWriter()
    x = w.tensor("input", [1, hw, hw, cin], FLOAT32)
    dw_w = w.tensor("dw_w", [1, 3, 3, cin], FLOAT32, rng.normal(0, 0.3, (1, 3, 3, cin)).astype(np.float32))
    dw_b = w.tensor("dw_b", [cin], FLOAT32, rng.normal(0, 0.1, cin).astype(np.float32))
    dw = w.tensor("dw", [1, hw, hw, cin], FLOAT32)
    w.op(DEPTHWISE_CONV_2D, [x, dw_w, dw_b], [dw], _conv_options(True, relu=False))
    pw_w = w.tensor("pw_w", [cout, 1, 1, cin], FLOAT32, rng.normal(0, 0.3, (cout, 1, 1, cin)).astype(np.float32))
    pw_b = w.tensor("pw_b", [cout], FLOAT32, rng.normal(0, 0.1, cout).astype(np.float32))
    pw = w.tensor("pw", [1, hw, hw, cout], FLOAT32)
    w.op(CONV_2D, [dw, pw_w, pw_b], [pw], _conv_options(False, relu=False))
    pads = w.tensor("pads", [4, 2], INT32, np.array([[0, 0], [0, 0], [0, 0], [0, cout - cin]], dtype=np.int32))
    padded = w.tensor("padded", [1, hw, hw, cout], FLOAT32)
    w.op(PAD, [x, pads], [padded], _simple_options("PadOptions"))
    out = w.tensor("output", [1, hw, hw, cout], FLOAT32)
    w.op(ADD, [pw, padded], [out], options("AddOptions", FusedActivationFunction=1))
    return w.write(path, [x], [out])
