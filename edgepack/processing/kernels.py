"""Post-processing kernels written in TensorIR: top-K and non-maximum suppression.

TVM 0.27's own ``relax.op.topk`` and ``relax.op.vision.all_class_non_max_suppression`` do not fit (tried
through edgepack's backends): on CPUs both become calls of ``tvm.contrib.sort.*``, packed functions the
runtimes edgepack builds from source do not carry; topk does not compile for WebGPU ("blockIdx.z is
not supported"), NMS not for OpenCL ("Buffer T_gather is used before its definition") and its int64
indices cannot be narrowed for Vulkan. These kernels are written once for every target:
one block per independent row (a row of top-K, a (batch, class) pair of NMS, a batch item of the
merge) whose body is a plain serial loop nest. On a CPU the loops run as they are; on a GPU dlight's
fallback rule binds the rows to threads (``gpu.Fallback`` in the build's schedule report).

Selection, not sorting: top-K picks, K times, the best element after the one picked last in the
order (value descending, index ascending), so ties go to the lower index and no scratch memory is
needed; NMS picks the best remaining candidate and drops the candidates it overlaps, at most M times.
"""

from __future__ import annotations

from typing import Any

from tvm.script import tirx as T


def topk_kernel(rows: int, count: int, k: int) -> Any:
    """values, indices [rows, k] of the k largest of x [rows, count] along its last axis, best first."""

    @T.prim_func(private=True, s_tir=True)
    def topk(x: T.Buffer((rows, count), "float32"), values: T.Buffer((rows, k), "float32"),
             indices: T.Buffer((rows, k), "int32")):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})  # opaque: never fused with its neighbours
        for r in range(rows):
            with T.sblock("topk"):
                vr = T.axis.spatial(rows, r)
                T.reads(x[vr, 0:count])
                T.writes(values[vr, 0:k], indices[vr, 0:k])
                best_value = T.alloc_buffer((1,), "float32", scope="local")
                best_index = T.alloc_buffer((1,), "int32", scope="local")
                last_value = T.alloc_buffer((1,), "float32", scope="local")
                last_index = T.alloc_buffer((1,), "int32", scope="local")
                last_index[0] = -1
                last_value[0] = T.float32(0)
                for j in range(k):
                    best_index[0] = -1
                    best_value[0] = T.float32(0)
                    for n in range(count):
                        v: T.float32 = x[vr, n]
                        after: T.bool = last_index[0] < 0 or v < last_value[0] or (
                            v == last_value[0] and n > last_index[0])
                        if after and (best_index[0] < 0 or v > best_value[0]):
                            best_value[0] = v
                            best_index[0] = n
                    values[vr, j] = best_value[0]
                    indices[vr, j] = best_index[0]
                    last_value[0] = best_value[0]
                    last_index[0] = best_index[0]

    return topk


def nms_select_kernel(batch: int, count: int, classes: int, per_class: int, iou_threshold: float,
                      score_threshold: float) -> Any:
    """Per (batch, class): the boxes NMS keeps, best first (ONNX NonMaxSuppression semantics).

    corners [batch, count, 4] (x1, y1, x2, y2; as ONNX Runtime orders each pair for corner formats),
    scores [batch, count, classes] -> index, score [batch, classes, per_class] (index -1: none), and
    state [batch, classes, count] (scratch: 1 while a box is a candidate)."""
    iou_t = T.float32(iou_threshold)
    score_t = T.float32(score_threshold)

    @T.prim_func(private=True, s_tir=True)
    def nms_select(corners: T.Buffer((batch, count, 4), "float32"),
                   scores: T.Buffer((batch, count, classes), "float32"),
                   index: T.Buffer((batch, classes, per_class), "int32"),
                   score: T.Buffer((batch, classes, per_class), "float32"),
                   state: T.Buffer((batch, classes, count), "int32")):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        for b, c in T.grid(batch, classes):
            with T.sblock("nms_select"):
                vb, vc = T.axis.remap("SS", [b, c])
                # state (scratch) is listed as written only: a block reading and writing one buffer is not a
                # "complete block" to dlight, and nothing outside this block ever reads it
                T.reads(corners[vb, 0:count, 0:4], scores[vb, 0:count, vc])
                T.writes(index[vb, vc, 0:per_class], score[vb, vc, 0:per_class], state[vb, vc, 0:count])
                best = T.alloc_buffer((1,), "int32", scope="local")
                best_score = T.alloc_buffer((1,), "float32", scope="local")
                for n in range(count):
                    state[vb, vc, n] = T.Select(scores[vb, n, vc] > score_t, 1, 0)
                for m in range(per_class):
                    best[0] = -1
                    best_score[0] = T.float32(0)
                    for n in range(count):
                        if state[vb, vc, n] == 1 and (best[0] < 0 or scores[vb, n, vc] > best_score[0]):
                            best[0] = n
                            best_score[0] = scores[vb, n, vc]
                    index[vb, vc, m] = best[0]
                    score[vb, vc, m] = best_score[0]
                    if best[0] >= 0:
                        state[vb, vc, best[0]] = 0
                        for n in range(count):
                            if state[vb, vc, n] == 1:
                                ix1: T.float32 = T.max(corners[vb, best[0], 0], corners[vb, n, 0])
                                iy1: T.float32 = T.max(corners[vb, best[0], 1], corners[vb, n, 1])
                                ix2: T.float32 = T.min(corners[vb, best[0], 2], corners[vb, n, 2])
                                iy2: T.float32 = T.min(corners[vb, best[0], 3], corners[vb, n, 3])
                                if ix2 > ix1 and iy2 > iy1:
                                    inter: T.float32 = (ix2 - ix1) * (iy2 - iy1)
                                    area1: T.float32 = (corners[vb, best[0], 2] - corners[vb, best[0], 0]) * (
                                        corners[vb, best[0], 3] - corners[vb, best[0], 1])
                                    area2: T.float32 = (corners[vb, n, 2] - corners[vb, n, 0]) * (
                                        corners[vb, n, 3] - corners[vb, n, 1])
                                    union: T.float32 = area1 + area2 - inter
                                    if inter > T.float32(0) and area1 > T.float32(0) and area2 > T.float32(0) and \
                                            union > T.float32(0) and inter / union > iou_t:
                                        state[vb, vc, n] = 0

    return nms_select


def nms_merge_kernel(batch: int, count: int, classes: int, per_class: int, limit: int) -> Any:
    """Per batch item: the best ``limit`` detections of all classes by score (ties: lower class, then
    the order NMS kept them in), their corner boxes, scores, class ids and how many there are. Each
    class's list is already best first, so this is a merge of sorted lists (``heads``: scratch)."""

    @T.prim_func(private=True, s_tir=True)
    def nms_merge(corners: T.Buffer((batch, count, 4), "float32"),
                  index: T.Buffer((batch, classes, per_class), "int32"),
                  score: T.Buffer((batch, classes, per_class), "float32"),
                  out_boxes: T.Buffer((batch, limit, 4), "float32"), out_scores: T.Buffer((batch, limit), "float32"),
                  out_classes: T.Buffer((batch, limit), "int32"), out_count: T.Buffer((batch,), "int32"),
                  heads: T.Buffer((batch, classes), "int32")):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})
        for b in range(batch):
            with T.sblock("nms_merge"):
                vb = T.axis.spatial(batch, b)
                T.reads(corners[vb, 0:count, 0:4], index[vb, 0:classes, 0:per_class],
                        score[vb, 0:classes, 0:per_class])  # heads: scratch, written only (see nms_select)
                T.writes(out_boxes[vb, 0:limit, 0:4], out_scores[vb, 0:limit], out_classes[vb, 0:limit],
                         out_count[vb], heads[vb, 0:classes])
                best = T.alloc_buffer((1,), "int32", scope="local")
                best_score = T.alloc_buffer((1,), "float32", scope="local")
                found = T.alloc_buffer((1,), "int32", scope="local")
                found[0] = 0
                for c in range(classes):
                    heads[vb, c] = 0
                for k in range(limit):
                    best[0] = -1
                    best_score[0] = T.float32(0)
                    for c in range(classes):
                        if heads[vb, c] < per_class:
                            if index[vb, c, heads[vb, c]] >= 0 and (
                                    best[0] < 0 or score[vb, c, heads[vb, c]] > best_score[0]):
                                best[0] = c
                                best_score[0] = score[vb, c, heads[vb, c]]
                    if best[0] >= 0:
                        for j in range(4):
                            out_boxes[vb, k, j] = corners[vb, index[vb, best[0], heads[vb, best[0]]], j]
                        out_scores[vb, k] = best_score[0]
                        out_classes[vb, k] = best[0]
                        heads[vb, best[0]] = heads[vb, best[0]] + 1
                        found[0] = found[0] + 1
                    else:
                        for j in range(4):
                            out_boxes[vb, k, j] = T.float32(0)
                        out_scores[vb, k] = T.float32(0)
                        out_classes[vb, k] = -1
                out_count[vb] = found[0]

    return nms_merge
