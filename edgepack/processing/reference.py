"""The reference for a processed build, independent of edgepack's implementation of the processing:

    frames -> pre-processing as a small ONNX graph run by ONNX Runtime (Cast, Gather of channels, NV21
              as its own arithmetic, Transpose, Resize(linear, half_pixel) or a Gather of integer
              source rows/columns for nearest, Sub, Div)
           -> the original model on ONNX Runtime / LiteRT (``frontends.run_reference``)
           -> post-processing in NumPy (softmax, sigmoid, stable top-K / argmax, greedy NMS as ONNX
              Runtime's NonMaxSuppression does it)

Near-ties: when two candidates of a top-K or argmax are closer than the comparison's tolerance, the
compiled program and the reference may order them differently; ``ReferenceRun.expected`` accepts the
program's index there (and its value), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgepack.frontends.reference import run_reference
from edgepack.processing.plan import FramePlan, NmsPlan, OutputPlan, ProcessingPlan
from edgepack.tensors import ModelFormat

ONNX_OPSET = 18


# ----------------------------------------------------------------------------------------------
# pre-processing: an ONNX graph per frame input


def preprocess_graph(plan: FramePlan):
    """An ``onnx.ModelProto`` taking the uint8 frame ``frame`` and giving the model's input ``tensor``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    counter = iter(range(10**6))

    def const(array, dtype=np.float32) -> str:
        name = f"c{next(counter)}"
        inits.append(numpy_helper.from_array(np.asarray(array, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], **attrs) -> str:
        out = f"t{next(counter)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    fh, fw, c = plan.frame_height, plan.frame_width, plan.channels
    if plan.setting.format == "nv21":
        luma = node("Cast", [node("Slice", ["frame", const([0], np.int64), const([fh], np.int64),
                                            const([0], np.int64)])], to=TensorProto.FLOAT)
        chroma = node("Slice", ["frame", const([fh], np.int64), const([fh * 3 // 2], np.int64), const([0], np.int64)])
        chroma = node("Cast", [node("Reshape", [chroma, const([fh // 2, 1, fw // 2, 1, 2], np.int64)])],
                      to=TensorProto.FLOAT)
        # each V,U pair covers 2x2 pixels: repeat it along both axes
        chroma = node("Reshape", [node("Expand", [chroma, const([fh // 2, 2, fw // 2, 2, 2], np.int64)]),
                                  const([fh, fw, 2], np.int64)])
        centred = node("Sub", [chroma, const(128.0)])
        v = node("Slice", [centred, const([0], np.int64), const([1], np.int64), const([2], np.int64)])
        u = node("Slice", [centred, const([1], np.int64), const([2], np.int64), const([2], np.int64)])
        y = node("Unsqueeze", [luma, const([2], np.int64)])
        red = node("Add", [y, node("Mul", [v, const(1.402)])])
        green = node("Sub", [node("Sub", [y, node("Mul", [u, const(0.344136)])]), node("Mul", [v, const(0.714136)])])
        blue = node("Add", [y, node("Mul", [u, const(1.772)])])
        pixels = node("Clip", [node("Concat", [red, green, blue], axis=2), const(0.0), const(255.0)])
    else:
        pixels = node("Cast", ["frame"], to=TensorProto.FLOAT)
    x = node("Gather", [pixels, const(list(plan.sources), np.int64)], axis=2)  # [FH, FW, C], the model's order
    x = node("Unsqueeze", [node("Transpose", [x], perm=[2, 0, 1]), const([0], np.int64)])  # [1, C, FH, FW]
    if plan.resize == "bilinear":
        x = node("Resize", [x, "", "", const([1, c, plan.height, plan.width], np.int64)], mode="linear",
                 coordinate_transformation_mode="half_pixel")
    elif plan.resize == "nearest":
        rows = np.arange(plan.height, dtype=np.int64) * fh // plan.height
        cols = np.arange(plan.width, dtype=np.int64) * fw // plan.width
        x = node("Gather", [node("Gather", [x, const(rows, np.int64)], axis=2), const(cols, np.int64)], axis=3)
    x = node("Sub", [x, const(np.array(plan.mean, np.float32).reshape(1, c, 1, 1))])
    x = node("Div", [x, const(np.array(plan.std, np.float32).reshape(1, c, 1, 1))])
    if plan.layout == "nhwc":
        x = node("Transpose", [x], perm=[0, 2, 3, 1])
    if plan.model.dtype != "float32":
        x = node("Cast", [x], to=helper.np_dtype_to_tensor_dtype(np.dtype(plan.model.dtype)))
    nodes.append(helper.make_node("Identity", [x], ["tensor"]))
    graph = helper.make_graph(
        nodes, f"edgepack_preprocess_{plan.name}",
        [helper.make_tensor_value_info("frame", TensorProto.UINT8, list(plan.frame.shape))],
        [helper.make_tensor_value_info("tensor", helper.np_dtype_to_tensor_dtype(np.dtype(plan.model.dtype)),
                                       list(plan.model.shape))],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="edgepack.processing.reference")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def preprocess(plan: FramePlan, frame: np.ndarray) -> np.ndarray:
    """The model's input made from ``frame`` by ONNX Runtime running ``preprocess_graph(plan)``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(preprocess_graph(plan).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"frame": np.asarray(frame, np.uint8)})[0]


# ----------------------------------------------------------------------------------------------
# post-processing in NumPy


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _top(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the k largest along the last axis, best first, ties to the lower index."""
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return order.astype(np.int32), np.take_along_axis(x, order, axis=-1)


def postprocess_output(plan: OutputPlan, raw: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The outputs of ``plan`` from the model's output, and the values a top-K / argmax chose from."""
    x = raw.astype(np.float64)
    for step in plan.setting.steps:
        if step == "softmax":
            x = _softmax(x)
        elif step == "sigmoid":
            x = 1.0 / (1.0 + np.exp(-x))
    if plan.setting.topk is not None:
        indices, values = _top(x, plan.setting.topk)
        return [indices, values.astype(np.float32)], x
    if plan.setting.argmax:
        indices, _ = _top(x, 1)
        return [indices.reshape(plan.outputs[0].shape)], x
    return [x.astype(np.float32)], x


def _corners(boxes: np.ndarray, box_format: str) -> np.ndarray:
    b = boxes.astype(np.float32)
    if box_format == "cxcywh":
        half_w, half_h = b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
        return np.stack([b[..., 0] - half_w, b[..., 1] - half_h, b[..., 0] + half_w, b[..., 1] + half_h], axis=-1)
    xa, ya, xb, yb = (b[..., i] for i in ((0, 1, 2, 3) if box_format == "xyxy" else (1, 0, 3, 2)))
    return np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb), np.maximum(ya, yb)], axis=-1)


def _suppresses(a: np.ndarray, others: np.ndarray, threshold: float) -> np.ndarray:
    """Whether box ``a`` (x1, y1, x2, y2) suppresses each of ``others``, as ONNX Runtime decides it."""
    f32 = np.float32
    ix1, iy1 = np.maximum(a[0], others[:, 0]), np.maximum(a[1], others[:, 1])
    ix2, iy2 = np.minimum(a[2], others[:, 2]), np.minimum(a[3], others[:, 3])
    overlap = (ix2 > ix1) & (iy2 > iy1)
    inter = ((ix2 - ix1) * (iy2 - iy1)).astype(f32)
    area_a = f32((a[2] - a[0]) * (a[3] - a[1]))
    area_o = ((others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])).astype(f32)
    union = (area_a + area_o - inter).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = (inter / union).astype(f32)
    return overlap & (inter > 0) & (area_a > 0) & (area_o > 0) & (union > 0) & (iou > f32(threshold))


def nms_select(corners: np.ndarray, scores: np.ndarray, iou: float, score: float, limit: int) -> list[int]:
    """Greedy NMS of one class: indices kept, best first (ties: lower index), at most ``limit``."""
    candidates = np.flatnonzero(scores > np.float32(score))
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    kept: list[int] = []
    alive = np.ones(len(order), bool)
    for i, box in enumerate(order):
        if len(kept) == limit:
            break
        if not alive[i]:
            continue
        kept.append(int(box))
        rest = slice(i + 1, None)
        alive[rest] &= ~_suppresses(corners[box], corners[order[rest]], iou)
    return kept


def postprocess_nms(plan: NmsPlan, boxes: np.ndarray, scores: np.ndarray) -> list[np.ndarray]:
    s = plan.setting
    corners = _corners(boxes, s.box_format)
    scores = scores.astype(np.float32).reshape(plan.batch, plan.count, plan.classes)
    out_boxes = np.zeros((plan.batch, s.max, 4), np.float32)
    out_scores = np.zeros((plan.batch, s.max), np.float32)
    out_classes = np.full((plan.batch, s.max), -1, np.int32)
    counts = np.zeros((plan.batch,), np.int32)
    for b in range(plan.batch):
        found = [(c, i) for c in range(plan.classes)
                 for i in nms_select(corners[b], scores[b, :, c], s.iou, s.score, plan.per_class)]
        order = sorted(range(len(found)), key=lambda j: -float(scores[b, found[j][1], found[j][0]]))[:s.max]
        for k, j in enumerate(order):  # sorted() is stable: ties keep class order, then NMS order
            c, i = found[j]
            out_boxes[b, k], out_scores[b, k], out_classes[b, k] = corners[b, i], scores[b, i, c], c
        counts[b] = len(order)
    return [out_boxes, out_scores, out_classes, counts]


# ----------------------------------------------------------------------------------------------
# the whole pipeline


@dataclass
class ReferenceRun:
    outputs: list[np.ndarray]  # the program's outputs as the reference computes them, in order
    names: list[str]
    # output name -> the values its top-K / argmax chose from (float64), for near-tie tolerance
    bases: dict[str, np.ndarray] = field(default_factory=dict)
    model_inputs: dict[str, np.ndarray] = field(default_factory=dict)

    def expected(self, actual: list[np.ndarray], atol: float, rtol: float) -> list[np.ndarray]:
        """The reference outputs, where the program chose a different index among near-ties taking its choice."""
        result = [np.array(e, copy=True) for e in self.outputs]
        for i, name in enumerate(self.names):
            base = self.bases.get(name)
            if base is None or actual[i].shape != result[i].shape:
                continue
            got = actual[i].astype(np.int64)
            want = result[i].astype(np.int64)
            rows_base = base.reshape(-1, base.shape[-1])
            got2, want2 = got.reshape(len(rows_base), -1), want.reshape(len(rows_base), -1)
            valid = (got2 >= 0) & (got2 < base.shape[-1])
            picked = np.take_along_axis(rows_base, np.where(valid, got2, 0), axis=1)
            wanted = np.take_along_axis(rows_base, want2, axis=1)
            tie = valid & (got2 != want2) & (np.abs(picked - wanted) <= atol + rtol * np.abs(wanted))
            if tie.any():
                want2[tie] = got2[tie]
                result[i] = want2.reshape(want.shape).astype(result[i].dtype)
                values = self.names.index(name.removesuffix("_indices") + "_scores") \
                    if name.endswith("_indices") and name.removesuffix("_indices") + "_scores" in self.names else None
                if values is not None:
                    result[values] = np.take_along_axis(rows_base, want2, axis=1).reshape(
                        result[values].shape).astype(result[values].dtype)
        return result


def run_processed_reference(model: Path, model_format: ModelFormat, plan: ProcessingPlan,
                            inputs: dict[str, np.ndarray]) -> ReferenceRun:
    """The reference outputs of a processed build for the program's ``inputs`` (frames by input name)."""
    feeds = {}
    for spec in plan.model_inputs:
        frame = plan.frame(spec.name)
        if frame is not None and frame.dynamic:  # the frame's size is this run's
            frame = frame.at_size(*np.shape(inputs[spec.name])[:2])
        feeds[spec.name] = preprocess(frame, inputs[spec.name]) if frame else inputs[spec.name]
    raw = dict(zip((t.name for t in plan.model_outputs),
                   run_reference(model, model_format, feeds, plan.model_outputs)))
    outputs: list[np.ndarray] = []
    names: list[str] = []
    bases: dict[str, np.ndarray] = {}
    for spec in plan.model_outputs:
        if plan.nms is not None and spec.name == plan.nms.boxes.name:
            outputs += postprocess_nms(plan.nms, raw[spec.name], raw[plan.nms.scores.name])
            names += [t.name for t in plan.nms.outputs]
        elif plan.nms is not None and spec.name == plan.nms.scores.name:
            continue
        elif (output_plan := plan.output_plan(spec.name)) is not None:
            values, base = postprocess_output(output_plan, raw[spec.name])
            outputs += values
            names += [t.name for t in output_plan.outputs]
            if output_plan.setting.topk is not None or output_plan.setting.argmax:
                bases[output_plan.outputs[0].name] = base
        else:
            outputs.append(raw[spec.name])
            names.append(spec.name)
    return ReferenceRun(outputs, names, bases, feeds)
