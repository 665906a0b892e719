"""Post-processing as Relax, emitted after the model's last kernels in the same function: softmax and
sigmoid (Relax ops, fused by TVM where it can), top-K and argmax (``kernels.topk_kernel``), and NMS
(box corners with Relax ops, then ``kernels.nms_select_kernel`` and ``kernels.nms_merge_kernel``)."""

from __future__ import annotations

from typing import Any

from edgepack.processing.plan import NmsPlan, OutputPlan


def _tensor(shape, dtype: str):
    from tvm import relax

    return relax.TensorType(tuple(int(d) for d in shape), dtype)


def emit_output(bb: Any, x: Any, plan: OutputPlan) -> list[Any]:
    """The outputs of ``plan`` (one, or top-K's indices and values) from the model output ``x``."""
    from tvm import relax

    from edgepack.processing.kernels import topk_kernel

    shape = tuple(int(d) for d in plan.model.shape)
    if plan.model.dtype != "float32":
        x = bb.emit(relax.op.astype(x, "float32"))
    for step in plan.setting.steps:
        if step == "softmax":
            x = bb.emit(relax.op.nn.softmax(x, axis=-1))
        elif step == "sigmoid":
            x = bb.emit(relax.op.sigmoid(x))
    k = plan.setting.topk if plan.setting.topk is not None else (1 if plan.setting.argmax else None)
    if k is None:
        return [x]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    flat = bb.emit(relax.op.reshape(x, (rows, shape[-1]))) if len(shape) != 2 else x
    kernel = bb.add_func(topk_kernel(rows, shape[-1], k), "edgepack_topk")
    found = bb.emit(relax.call_tir(kernel, [flat], [_tensor((rows, k), "float32"), _tensor((rows, k), "int32")]))
    values, indices = (bb.emit(relax.TupleGetItem(found, i)) for i in (0, 1))
    if plan.setting.argmax:
        return [bb.emit(relax.op.reshape(indices, plan.outputs[0].shape))]
    out_shape = (*shape[:-1], k)
    return [bb.emit(relax.op.reshape(t, out_shape)) if out_shape != (rows, k) else t for t in (indices, values)]


def _corners(bb: Any, boxes: Any, box_format: str) -> Any:
    """[B, N, 4] boxes as x1, y1, x2, y2. Corner formats are ordered per pair (min, max) as ONNX Runtime
    does; cxcywh is centre -/+ half the size (negative sizes stay negative, as in ONNX Runtime)."""
    from tvm import relax

    b, n, _ = (int(d) for d in boxes.ty.shape.values)
    cols = [bb.emit(relax.op.strided_slice(boxes, axes=[2], begin=[i], end=[i + 1])) for i in range(4)]
    op = relax.op
    if box_format == "cxcywh":
        cx, cy, w, h = cols
        half = relax.const(2.0, "float32")
        hw, hh = bb.emit(op.divide(w, half)), bb.emit(op.divide(h, half))
        parts = [op.subtract(cx, hw), op.subtract(cy, hh), op.add(cx, hw), op.add(cy, hh)]
    else:
        x_a, y_a, x_b, y_b = cols if box_format == "xyxy" else (cols[1], cols[0], cols[3], cols[2])
        parts = [op.minimum(x_a, x_b), op.minimum(y_a, y_b), op.maximum(x_a, x_b), op.maximum(y_a, y_b)]
    return bb.emit(op.concat([bb.emit(p) for p in parts], axis=2))


def emit_nms(bb: Any, boxes: Any, scores: Any, plan: NmsPlan) -> list[Any]:
    """detection_boxes, detection_scores, detection_classes, num_detections from the model's boxes and scores."""
    from tvm import relax

    from edgepack.processing.kernels import nms_merge_kernel, nms_select_kernel

    s = plan.setting
    batch, count, classes, m, limit = plan.batch, plan.count, plan.classes, plan.per_class, s.max
    if plan.boxes.dtype != "float32":
        boxes = bb.emit(relax.op.astype(boxes, "float32"))
    if plan.scores.dtype != "float32":
        scores = bb.emit(relax.op.astype(scores, "float32"))
    if len(plan.scores.shape) == 2:
        scores = bb.emit(relax.op.reshape(scores, (batch, count, 1)))
    corners = _corners(bb, boxes, s.box_format)
    select = bb.add_func(nms_select_kernel(batch, count, classes, m, s.iou, s.score), "edgepack_nms_select")
    kept = bb.emit(relax.call_tir(select, [corners, scores], [
        _tensor((batch, classes, m), "int32"), _tensor((batch, classes, m), "float32"),
        _tensor((batch, classes, count), "int32")]))
    index, score = bb.emit(relax.TupleGetItem(kept, 0)), bb.emit(relax.TupleGetItem(kept, 1))
    merge = bb.add_func(nms_merge_kernel(batch, count, classes, m, limit), "edgepack_nms_merge")
    merged = bb.emit(relax.call_tir(merge, [corners, index, score], [
        _tensor((batch, limit, 4), "float32"), _tensor((batch, limit), "float32"),
        _tensor((batch, limit), "int32"), _tensor((batch,), "int32"), _tensor((batch, classes), "int32")]))
    return [bb.emit(relax.TupleGetItem(merged, i)) for i in range(4)]
