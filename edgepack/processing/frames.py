"""Pre-processing as Relax: a uint8 camera frame in, the model's input tensor out, emitted into the same
function as the model so that TVM fuses it (one injective kernel: read/convert, resize, normalise,
transpose) in front of the model's first kernel.

    pixels   a TE compute reading the frame's bytes (or, where kernels cannot read 8-bit tensors, its
             32-bit words through a view of the same memory), NV21 decoded with full-range BT.601,
             channels picked in the model's order: float32 [1, H, W, C]
    resize   bilinear (half-pixel centres) from taps computed at compile time, or in the kernel for a frame
             whose size changes at run time (``size=FHxFW``, ``--dim`` ranges), or an integer-exact nearest
             gather
    (x - mean) / std, then NCHW or NHWC and the model's dtype
"""

from __future__ import annotations

from typing import Any

from edgepack.dims import Dims
from edgepack.processing.plan import FramePlan

#: Full-range BT.601 (JFIF) YCbCr -> RGB, what Android's camera2 API documents for YUV_420_888/NV21 frames.
#: TVM's OpPatternKind kInjective: the table-driven gathers below read their sources at indices loaded
#: from constant tables, which TVM's pattern analysis does not recognise; saying so lets FuseOps fuse
#: the whole pre-processing into one kernel.
INJECTIVE = 2
BT601_FULL = {"r_v": 1.402, "g_u": 0.344136, "g_v": 0.714136, "b_u": 1.772}


def frame_bytes_fit_words(plan: FramePlan, dims: Dims | None = None) -> bool:
    """Whether the frame's size in bytes is a whole number of 32-bit words (a dynamic frame's at every size of
    its ``dims``: ``(h0 + i * sh) * (w0 + j * sw) * c`` for all i, j, so each of ``c * h0 * w0``,
    ``c * h0 * sw``, ``c * sh * w0`` and ``c * sh * sw``)."""
    dims = dims or {}

    def start_step(d):
        return (d, 0) if isinstance(d, int) else (dims[d].min, dims[d].step)

    (h0, sh), (w0, sw) = (start_step(d) for d in plan.frame.shape[:2])
    c = 1
    for d in plan.frame.shape[2:]:
        c *= int(d)
    return all((c * a * b) % 4 == 0 for a, b in ((h0, w0), (h0, sw), (sh, w0), (sh, sw)))


def frame_shape(plan: FramePlan, sizes: dict[str, Any]) -> list:
    """The frame's shape with each ``--dim`` name as its variable in ``sizes``."""
    return [sizes[d] if isinstance(d, str) else int(d) for d in plan.frame.shape]


def _int32(value):
    from tvm import tirx

    return tirx.const(value, "int32") if isinstance(value, int) else tirx.Cast("int32", value)


def _byte_reader(source, plan: FramePlan, word_reads: bool, sizes: dict[str, Any]):
    """``read(index)``: the frame's byte at ``index`` (int32 expressions in the frame's own shape) as int32."""
    from tvm import tirx

    shape = [_int32(d) for d in frame_shape(plan, sizes)]

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


def _pixels(plan: FramePlan, word_reads: bool, sizes: dict[str, Any]):
    """The TE function making float32 [1, H, W, C] (the model's channels, in its order) from the frame."""
    from tvm import te, tirx

    fh, fw = (sizes.get(d, d) if isinstance(d, str) else d for d in (plan.frame_height, plan.frame_width))
    nv21 = plan.setting.format == "nv21"
    sources = plan.sources

    def pick(c, values):
        """values[sources[c]] for a channel variable ``c``."""
        result = values[sources[-1]]
        for k in range(len(sources) - 2, -1, -1):
            result = tirx.Select(c == k, values[sources[k]], result)
        return result

    def compute(source):
        read = _byte_reader(source, plan, word_reads, sizes)

        def pixel(n, y, x, c):
            y, x, c = (tirx.Cast("int32", v) for v in (y, x, c))
            if not nv21:
                return tirx.Cast("float32", read(y, x, pick(c, [tirx.const(k, "int32") for k in range(4)])))
            luma = tirx.Cast("float32", read(y, x))
            row, col = _int32(fh) + y // 2, (x // 2) * 2  # V at col, U at col + 1
            v = tirx.Cast("float32", read(row, col)) - tirx.const(128.0, "float32")
            u = tirx.Cast("float32", read(row, col + 1)) - tirx.const(128.0, "float32")
            k = {name: tirx.const(value, "float32") for name, value in BT601_FULL.items()}
            rgb = [luma + k["r_v"] * v, luma - k["g_u"] * u - k["g_v"] * v, luma + k["b_u"] * u]
            lo, hi = tirx.const(0.0, "float32"), tirx.const(255.0, "float32")
            return tirx.max(lo, tirx.min(hi, pick(c, rgb)))

        return te.compute((1, fh, fw, plan.channels), pixel, name="frame_pixels")

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


def run_time_taps(i, src, dst: int):
    """``bilinear_taps`` for output index ``i`` of ``dst`` from ``src`` (a run-time size), as TIR: the same float32
    operations in the same order (lo, hi, w_lo, w_hi)."""
    from tvm import tirx

    f32 = "float32"
    src = _int32(src)
    scale = tirx.const(float(dst), f32) / tirx.Cast(f32, src)
    x = (tirx.Cast(f32, tirx.Cast("int32", i)) + tirx.const(0.5, f32)) / scale - tirx.const(0.5, f32)
    x = tirx.max(tirx.const(0.0, f32), tirx.min(x, tirx.Cast(f32, src - 1)))
    lo = tirx.min(tirx.Cast("int32", x), src - 1)
    hi = tirx.min(lo + 1, src - 1)
    half = tirx.const(0.5, f32)
    w_hi = tirx.Select(lo == hi, half, tirx.abs(x - tirx.Cast(f32, lo)))
    w_lo = tirx.Select(lo == hi, half, tirx.abs(x - tirx.Cast(f32, hi)))
    return lo, hi, w_lo, w_hi


def _bilinear_at_run_time(plan: FramePlan):
    """Bilinear resize of a frame whose size changes at run time: its taps (``run_time_taps``) computed in the
    kernel."""
    from tvm import te

    def compute(pixels):
        fh, fw = pixels.shape[1], pixels.shape[2]  # the frame's size, as the kernel's buffer declares it

        def value(n, y, x, c):
            y_lo, y_hi, wy_lo, wy_hi = run_time_taps(y, fh, plan.height)
            x_lo, x_hi, wx_lo, wx_hi = run_time_taps(x, fw, plan.width)

            def row(r):
                return wx_lo * pixels[n, r, x_lo, c] + wx_hi * pixels[n, r, x_hi, c]
            return wy_lo * row(y_lo) + wy_hi * row(y_hi)
        return te.compute((1, plan.height, plan.width, plan.channels), value, name="resize_bilinear")

    return compute


def _nearest(plan: FramePlan):
    """Nearest-neighbour resize with exact integer source indices: ``src = dst * src_size // dst_size``."""
    from tvm import te, tirx

    h, w = plan.height, plan.width

    def compute(pixels):
        fh, fw = _int32(pixels.shape[1]), _int32(pixels.shape[2])  # as the kernel's buffer declares them

        def value(n, y, x, c):
            y, x = tirx.Cast("int32", y), tirx.Cast("int32", x)
            return pixels[n, y * fh // h, x * fw // w, c]
        return te.compute((1, h, w, plan.channels), value, name="resize_nearest")

    return compute


def emit_frame(bb: Any, frame: Any, plan: FramePlan, *, word_reads: bool = False,
               sizes: dict[str, Any] | None = None) -> Any:
    """Emit the pre-processing of ``frame`` (a Relax var of ``plan.frame``) into ``bb``'s dataflow block;
    returns the model's input. ``word_reads``: read the frame as 32-bit words (its byte size must be a
    multiple of 4: ``frame_bytes_fit_words``). ``sizes``: the variable of each ``--dim`` the frame's size names."""
    import numpy as np
    from tvm import relax

    sizes = sizes or {}
    source = frame
    if word_reads:
        words = 1
        for d in frame_shape(plan, sizes):
            words = words * d
        source = bb.emit(relax.op.memory.view(frame, shape=(words // 4,), dtype="uint32"))
    x = bb.emit_te(_pixels(plan, word_reads, sizes), source, primfunc_name_hint="frame_pixels",
                   primfunc_attrs={"op_pattern": INJECTIVE})
    if plan.resize == "bilinear" and plan.dynamic:
        x = bb.emit_te(_bilinear_at_run_time(plan), x, primfunc_name_hint="resize_bilinear",
                       primfunc_attrs={"op_pattern": INJECTIVE})
    elif plan.resize == "bilinear":
        taps = []
        for src, dst in ((plan.frame_height, plan.height), (plan.frame_width, plan.width)):
            lo, hi, w_lo, w_hi = bilinear_taps(src, dst)
            taps += [np.stack([lo, hi]).astype(np.int32), np.stack([w_lo, w_hi]).astype(np.float32)]
        x = bb.emit_te(_bilinear(plan), x, *(relax.const(t) for t in taps), primfunc_name_hint="resize_bilinear",
                       primfunc_attrs={"op_pattern": INJECTIVE})
    elif plan.resize == "nearest":
        x = bb.emit_te(_nearest(plan), x, primfunc_name_hint="resize_nearest",
                       primfunc_attrs={"op_pattern": INJECTIVE})
    if any(v != 0.0 for v in plan.mean):
        x = bb.emit(relax.op.subtract(x, relax.const(np.array(plan.mean, "float32"))))
    if any(v != 1.0 for v in plan.std):
        x = bb.emit(relax.op.divide(x, relax.const(np.array(plan.std, "float32"))))
    if plan.layout == "nchw":
        x = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
    if plan.model.dtype != "float32":
        x = bb.emit(relax.op.astype(x, plan.model.dtype))
    return x
