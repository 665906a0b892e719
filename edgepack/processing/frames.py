"""Pre-processing as Relax: a uint8 camera frame in, the model's input tensor out, emitted into the same
function as the model so that TVM fuses it (one injective kernel: read/convert, resize, normalise,
transpose) in front of the model's first kernel.

    pixels   a TE compute reading the frame's bytes (or, where kernels cannot read 8-bit tensors, its
             32-bit words through a view of the same memory), NV21 decoded with full-range BT.601,
             channels picked in the model's order: float32 [1, H, W, C]
    resize   relax.image.resize2d (bilinear, half-pixel centres) or an integer-exact nearest gather
    (x - mean) / std, then NCHW or NHWC and the model's dtype
"""

from __future__ import annotations

from typing import Any

from edgepack.processing.plan import FramePlan

#: Full-range BT.601 (JFIF) YCbCr -> RGB, what Android's camera2 API documents for YUV_420_888/NV21 frames.
#: TVM's OpPatternKind kInjective: the table-driven gathers below read their sources at indices loaded
#: from constant tables, which TVM's pattern analysis does not recognise; saying so lets FuseOps fuse
#: the whole pre-processing into one kernel.
INJECTIVE = 2
BT601_FULL = {"r_v": 1.402, "g_u": 0.344136, "g_v": 0.714136, "b_u": 1.772}


def frame_bytes_fit_words(plan: FramePlan) -> bool:
    """Whether the frame's size in bytes is a whole number of 32-bit words."""
    size = 1
    for d in plan.frame.shape:
        size *= int(d)
    return size % 4 == 0


def _byte_reader(source, plan: FramePlan, word_reads: bool):
    """``read(index)``: the frame's byte at ``index`` (int32 expressions in the frame's own shape) as int32."""
    from tvm import tirx

    shape = [int(d) for d in plan.frame.shape]

    def flat(index):
        offset = index[0]
        for i, d in zip(index[1:], shape[1:]):
            offset = offset * d + i
        return offset

    if word_reads:  # source: uint32 [n / 4], the frame's bytes in little-endian words
        def read(*index):
            i = flat(index)
            word = source[tirx.shift_right(i, 2)]
            shift = tirx.Cast("uint32", tirx.bitwise_and(i, 3) * 8)
            return tirx.Cast("int32", tirx.bitwise_and(tirx.shift_right(word, shift), tirx.const(255, "uint32")))
        return read

    def read(*index):  # source: the uint8 frame itself
        return tirx.Cast("int32", source[index])
    return read


def _pixels(plan: FramePlan, word_reads: bool):
    """The TE function making float32 [1, H, W, C] (the model's channels, in its order) from the frame."""
    from tvm import te, tirx

    fh = plan.frame_height
    nv21 = plan.setting.format == "nv21"
    sources = plan.sources

    def pick(c, values):
        """values[sources[c]] for a channel variable ``c``."""
        result = values[sources[-1]]
        for k in range(len(sources) - 2, -1, -1):
            result = tirx.Select(c == k, values[sources[k]], result)
        return result

    def compute(source):
        read = _byte_reader(source, plan, word_reads)

        def pixel(n, y, x, c):
            y, x, c = (tirx.Cast("int32", v) for v in (y, x, c))
            if not nv21:
                return tirx.Cast("float32", read(y, x, pick(c, [tirx.const(k, "int32") for k in range(4)])))
            luma = tirx.Cast("float32", read(y, x))
            row, col = fh + y // 2, (x // 2) * 2  # V at col, U at col + 1
            v = tirx.Cast("float32", read(row, col)) - tirx.const(128.0, "float32")
            u = tirx.Cast("float32", read(row, col + 1)) - tirx.const(128.0, "float32")
            k = {name: tirx.const(value, "float32") for name, value in BT601_FULL.items()}
            rgb = [luma + k["r_v"] * v, luma - k["g_u"] * u - k["g_v"] * v, luma + k["b_u"] * u]
            lo, hi = tirx.const(0.0, "float32"), tirx.const(255.0, "float32")
            return tirx.max(lo, tirx.min(hi, pick(c, rgb)))

        return te.compute((1, plan.frame_height, plan.frame_width, plan.channels), pixel, name="frame_pixels")

    return compute


def bilinear_taps(src: int, dst: int):
    """Per output row (or column): the two source indices and their weights, float32, computed with ONNX
    Resize's half-pixel formula ``x_src = (x + 0.5) / scale - 0.5`` (``scale = dst / src``) clamped to
    the image, as ONNX Runtime computes it. Computed once here, at compile time, so every backend uses
    the very same coordinates (a GPU's division is not correctly rounded)."""
    import numpy as np

    f32 = np.float32
    scale = f32(dst) / f32(src)
    x = (np.arange(dst, dtype=f32) + f32(0.5)) / scale - f32(0.5)
    x = np.maximum(f32(0), np.minimum(x, f32(src - 1)))
    lo = np.minimum(x.astype(np.int32), src - 1)
    hi = np.minimum(lo + 1, src - 1)
    w_hi = np.abs(x - lo.astype(f32)).astype(f32)  # the weight of `hi` is the distance from `lo`
    w_lo = np.abs(x - hi.astype(f32)).astype(f32)
    same = lo == hi
    w_lo[same], w_hi[same] = f32(0.5), f32(0.5)
    return lo, hi, w_lo, w_hi


def _bilinear(plan: FramePlan):
    """Bilinear resize reading the precomputed taps (``bilinear_taps``) of rows and columns, packed in four
    tables (indices and weights of the rows, of the columns: ``[2, n]`` each, low then high), so that the
    kernel binds six buffers (a Vulkan shader may bind eight)."""
    from tvm import te

    def compute(pixels, y_at, y_weight, x_at, x_weight):
        def value(n, y, x, c):
            def row(r):
                return x_weight[0, x] * pixels[n, r, x_at[0, x], c] + x_weight[1, x] * pixels[n, r, x_at[1, x], c]
            return y_weight[0, y] * row(y_at[0, y]) + y_weight[1, y] * row(y_at[1, y])
        return te.compute((1, plan.height, plan.width, plan.channels), value, name="resize_bilinear")

    return compute


def _nearest(plan: FramePlan):
    """Nearest-neighbour resize with exact integer source indices: ``src = dst * src_size // dst_size``."""
    from tvm import te, tirx

    fh, fw, h, w = plan.frame_height, plan.frame_width, plan.height, plan.width

    def compute(pixels):
        def value(n, y, x, c):
            y, x = tirx.Cast("int32", y), tirx.Cast("int32", x)
            return pixels[n, y * fh // h, x * fw // w, c]
        return te.compute((1, h, w, plan.channels), value, name="resize_nearest")

    return compute


def emit_frame(bb: Any, frame: Any, plan: FramePlan, *, word_reads: bool = False) -> Any:
    """Emit the pre-processing of ``frame`` (a Relax var of ``plan.frame``) into ``bb``'s dataflow block;
    returns the model's input. ``word_reads``: read the frame as 32-bit words (its byte size must be a
    multiple of 4: ``frame_bytes_fit_words``)."""
    import numpy as np
    from tvm import relax

    source = frame
    if word_reads:
        words = 1
        for d in plan.frame.shape:
            words *= int(d)
        source = bb.emit(relax.op.memory.view(frame, shape=(words // 4,), dtype="uint32"))
    x = bb.emit_te(_pixels(plan, word_reads), source, primfunc_name_hint="frame_pixels",
                   primfunc_attrs={"op_pattern": INJECTIVE})
    if plan.resize == "bilinear":
        taps = []
        for src, dst in ((plan.frame_height, plan.height), (plan.frame_width, plan.width)):
            lo, hi, w_lo, w_hi = bilinear_taps(src, dst)
            taps += [np.stack([lo, hi]).astype(np.int32), np.stack([w_lo, w_hi]).astype(np.float32)]
        x = bb.emit_te(_bilinear(plan), x, *(relax.const(t) for t in taps), primfunc_name_hint="resize_bilinear",
                       primfunc_attrs={"op_pattern": INJECTIVE})
    elif plan.resize == "nearest":
        x = bb.emit_te(_nearest(plan), x, primfunc_name_hint="resize_nearest", primfunc_attrs={"op_pattern": INJECTIVE})
    if any(v != 0.0 for v in plan.mean):
        x = bb.emit(relax.op.subtract(x, relax.const(np.array(plan.mean, "float32"))))
    if any(v != 1.0 for v in plan.std):
        x = bb.emit(relax.op.divide(x, relax.const(np.array(plan.std, "float32"))))
    if plan.layout == "nchw":
        x = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
    if plan.model.dtype != "float32":
        x = bb.emit(relax.op.astype(x, plan.model.dtype))
    return x
