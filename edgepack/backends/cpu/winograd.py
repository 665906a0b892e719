"""3x3 convolutions of stride 1 as Winograd F(m x m, 3x3): (m + 2)^2 multiplies per m x m output tile and
channel pair instead of 9 m^2 (F(2x2, 3x3): 2.25x fewer; F(4x4, 3x3): 4x fewer), in three kernels:

    d = pad(x)                             the input padded to whole (m + 2)^2 windows (fused into the
                                           kernel that makes x)
    V[e, p, c] = (B^T d_p B)[e]            input transform of each window p (stride m): its own rule
                                           (schedules/winograd.py); nothing is fused into it
    M[e, p, k] = sum_c V[e, p, c] U[e, c, k]   (m + 2)^2 matrix products, one per window position e
                                           (cpu.Matmul)
    Y[n, h, w, k] = (A^T M_p A)[h % m, w % m]  output transform: its own rule; the bias, activation,
                                           residual add or concatenation after it fuse into it

``U = G g G^T`` is computed here, once, from the constant weights (a model whose weights are not
constants keeps the direct convolution); it is (m + 2)^2 / 9 the size of the weights it replaces. Each
convolution gets the algorithm that multiplies least for its output size (``choose``), as far as the
library's size allows (``within_budget``: the transformed weights add at most a quarter of the model's
weights, spent where they save the most multiplies per byte: F(2x2) first, F(4x4) where it still fits;
the rest stay direct). F(2x2, 3x3)'s
coefficients are 0, +-1 and +-1/2: float32's accuracy kept (the same or smaller differences from ONNX
Runtime than the direct convolution); F(4x4, 3x3)'s go up to 8: measured 2.5x the direct convolution's
difference after ten 64-channel layers (8e-6), on host and under qemu for rpi4 and rpi3. Only
channels-last (NHWC, OHWI) convolutions are rewritten, those with enough channels that the products
outweigh the transforms.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from edgepack.backends.cpu.conv_rewrite import conv2d_rewrite_pass
from edgepack.backends.cpu.schedules.winograd import INPUT_BLOCK, OUTPUT_BLOCK
from edgepack.backends.program_sizes import constant_sizes
from edgepack.backends.relax_exprs import bound_constant, dtype_of, iter_bindings, static_shape

# below these the transforms (memory-bound, and serial below the parallel threshold) cost more than the
# multiplies saved (measured on a Zen 4 core, each convolution with its transforms against the direct
# one: 0.56-0.83x from 16 to 512 channels at 1 thread; 16 -> 16 channels at 56x56 was 0.8x at 1 thread
# but 1.5-2x at 2 threads)
MIN_CHANNELS = 16  # input and output channels
MIN_CHANNEL_PRODUCT = 32 * 32  # input times output channels
MIN_OUTPUT = 4  # output rows and columns
# Winograd's transformed weights may always add this many bytes, whatever the budget's share: less than the
# code of a small model (BlazeFace's kernels: 144 KB for aarch64), not what a download notices
MIN_BUDGET = 256 * 1024


@dataclass(frozen=True)
class Algorithm:
    """Winograd F(m x m, 3 x 3) (Lavin & Gray): ``Y = A^T [(G g G^T) * (B^T d B)] A`` for each m x m output
    tile, from the (m + 2) x (m + 2) input window ``d`` around it."""

    m: int
    bt: np.ndarray  # B^T, alpha x alpha
    g: np.ndarray  # G, alpha x 3
    at: np.ndarray  # A^T, m x alpha

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def positions(self) -> int:
        return self.alpha * self.alpha

    def tiles(self, extent: int) -> int:
        """Output tiles along a row or column of ``extent`` pixels (the last one may overhang)."""
        return -(-extent // self.m)


# interpolation points 0, 1, -1 and infinity: coefficients 0, +-1 and +-1/2, float32's accuracy kept
F2 = Algorithm(
    2,
    bt=np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
    g=np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64),
    at=np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64),
)
# points 0, 1, -1, 2, -2 and infinity: 2.25 multiplies per output instead of F2's 4 (and 9 direct), at
# the cost of coefficients up to 8 (rounding errors a few times F2's)
F4 = Algorithm(
    4,
    bt=np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                 [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], dtype=np.float64),
    g=np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], dtype=np.float64),
    at=np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
                dtype=np.float64),
)
ALGORITHMS = {algorithm.m: algorithm for algorithm in (F2, F4)}


def transformed_weights(weight_ohwi: np.ndarray, algorithm: Algorithm = F2) -> np.ndarray:
    """``U[e, c, k]`` (e = alpha * a + b) from OHWI weights ``g[k, i, j, c]``."""
    g = algorithm.g
    u = np.einsum("ai,kijc,bj->abck", g, weight_ohwi.astype(np.float64), g)
    k, c = weight_ohwi.shape[0], weight_ohwi.shape[3]
    return np.ascontiguousarray(u.reshape(algorithm.positions, c, k)).astype(weight_ohwi.dtype)


def _pick(index, values):
    """``values[index]`` for a small integer expression ``index`` (a chain of selects on constants)."""
    from tvm import tirx

    def const(value):
        return tirx.const(float(value), "float32")

    result = const(values[-1])
    for k in range(len(values) - 2, -1, -1):
        result = tirx.Select(index == k, const(values[k]), result)
    return result


def _bilinear(left, right, matrix: np.ndarray, value):
    """``sum_i sum_j matrix[left, i] * matrix[right, j] * value(i, j)`` for integer expressions ``left`` and
    ``right``, the coefficients picked from ``matrix``'s columns. Where a rule unrolls the loops that
    ``left`` and ``right`` come from, the picks fold to constants and the zero terms drop out."""
    result = None
    for i in range(matrix.shape[1]):
        row = None
        for j in range(matrix.shape[1]):
            term = _pick(right, matrix[:, j]) * value(i, j)
            row = term if row is None else row + term
        term = _pick(left, matrix[:, i]) * row
        result = term if result is None else result + term
    return result


def input_transform(padded, tiles_h: int, tiles_w: int, tile: int = 2):
    """TE: ``V[e, p, c] = (B^T d_p B)[e // alpha, e % alpha]`` for the m x m output tiles of a padded NHWC
    input (alpha x alpha windows ``d_p`` at stride m). The rule unrolls ``e``."""
    from tvm import te

    algorithm = ALGORITHMS[tile]
    n, c = int(padded.shape[0]), int(padded.shape[3])
    m, alpha = algorithm.m, algorithm.alpha

    def compute(e, p, ch):
        batch, th, tw = p // (tiles_h * tiles_w), (p // tiles_w) % tiles_h, p % tiles_w
        return _bilinear(e // alpha, e % alpha, algorithm.bt,
                         lambda i, j: padded[batch, th * m + i, tw * m + j, ch])

    return te.compute((algorithm.positions, n * tiles_h * tiles_w, c), compute, name=INPUT_BLOCK)


def output_transform(products, n: int, out_h: int, out_w: int, tile: int = 2):
    """TE: the NHWC output from ``M[e, p, k]``: pixel (y, x) is ``(A^T M_p A)[y % m, x % m]`` (the rule
    computes each m x m tile with its pixels unrolled). Where the tiles overhang the output, they are
    computed whole and cropped, so that no tile's pixels are computed under a bounds check."""
    from tvm import te

    algorithm = ALGORITHMS[tile]
    m, alpha = algorithm.m, algorithm.alpha
    tiles_h, tiles_w = algorithm.tiles(out_h), algorithm.tiles(out_w)
    k = int(products.shape[2])

    def compute(batch, y, x, ch):
        p = batch * tiles_h * tiles_w + (y // m) * tiles_w + x // m
        return _bilinear(y % m, x % m, algorithm.at, lambda a, b: products[a * alpha + b, p, ch])

    whole = te.compute((n, tiles_h * m, tiles_w * m, k), compute, name=OUTPUT_BLOCK)
    if (tiles_h * m, tiles_w * m) == (out_h, out_w):
        return whole
    return te.compute((n, out_h, out_w, k), lambda *index: whole(*index), name=OUTPUT_BLOCK + "_crop")


MAX_ZEROS = 0.5  # weights with more zeros than this share stay direct (see ``suits``)


def suits(call, weight: np.ndarray | None) -> bool:
    """A stride-1, undilated, ungrouped 3x3 float32 convolution, channels-last, with constant weights and
    enough channels and outputs, whose weights are not mostly zeros (a pruned model's weights are stored
    compressed, ``toolchain/packed_kernels.py``; transformed they would be dense)."""
    attrs = call.attrs
    if weight is None or str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" \
            or str(attrs.out_layout) != "NHWC" or int(attrs.groups) != 1:
        return False
    if any(int(s) != 1 for s in attrs.strides) or any(int(d) != 1 for d in attrs.dilation):
        return False
    data, out = static_shape(call.args[0]), static_shape(call)
    if data is None or out is None or weight.ndim != 4 or tuple(weight.shape[1:3]) != (3, 3):
        return False
    dtypes = {dtype_of(call.args[0]), dtype_of(call), str(weight.dtype)}
    if dtypes != {"float32"}:
        return False
    channels_out, channels_in = int(weight.shape[0]), int(weight.shape[3])
    return min(channels_out, channels_in) >= MIN_CHANNELS and channels_out * channels_in >= MIN_CHANNEL_PRODUCT \
        and min(out[1], out[2]) >= MIN_OUTPUT and np.count_nonzero(weight) > MAX_ZEROS * weight.size


# TVM's kOpaque, for the input transform: FuseOps fuses nothing into it. (An output transform before it,
# inlined, would be recomputed by every window that reads its pixels: 4x the work, 2.2 ms instead of 0.5.)
OPAQUE = 8


def choose(out_h: int, out_w: int, largest_tile: int, reuse: int = 0, batch: int = 1) -> Algorithm:
    """The algorithm, of those with tiles up to ``largest_tile``, that multiplies least for an output of
    ``out_h`` x ``out_w`` (whole tiles; on a tie the smaller tile: cheaper transforms, smaller rounding
    errors), among those whose transformed weights serve at least ``reuse`` tiles of the ``batch``
    (F(2x2) always qualifies). Measured on a Zen 4 core, each convolution with its transforms, F(4x4) against F(2x2):
    0.51x at 56x56, 0.54x at 28x28, 0.80x at 14x14, 0.88x at 7x7 (64 to 512 channels), 0.75x at 55x55
    and 0.84-0.92x at 13x13 with 16 to 64 input channels. Timed alone, with its weights in cache; in a
    model, F(4x4) at 7x7 reads 36 matrices of weights (37.7 MB for resnet50's 512 channels, 4x the
    convolution's own) to multiply each by 4 tiles, and memory bounds it: F(2x2) there (``reuse`` 16)
    made resnet50-light 2.5% faster at 2 threads, the same at 1."""
    def multiplies(algorithm: Algorithm) -> int:
        return algorithm.tiles(out_h) * algorithm.tiles(out_w) * algorithm.positions

    usable = [a for m, a in sorted(ALGORITHMS.items())
              if m <= largest_tile and (m == 2 or batch * a.tiles(out_h) * a.tiles(out_w) >= reuse)]
    return min(usable, key=multiplies)


@dataclass(frozen=True)
class Candidate:
    """A convolution that ``suits``, as the size budget weighs it."""

    key: tuple
    batch: int
    out_h: int
    out_w: int
    weight_bytes: int  # its weights in float32, as the transformed ones are stored

    def saved(self, algorithm: Algorithm) -> int:
        """Multiplies per channel pair that ``algorithm`` saves against the direct convolution."""
        tiles = algorithm.tiles(self.out_h) * algorithm.tiles(self.out_w)
        return self.batch * (9 * self.out_h * self.out_w - tiles * algorithm.positions)

    def extra(self, algorithm: Algorithm) -> float:
        """Bytes its transformed weights add to the library: (m + 2)^2 values for each 9."""
        return self.weight_bytes * (algorithm.positions - 9) / 9


def _key(call, weight: np.ndarray) -> tuple:
    return (tuple(weight.shape), hashlib.sha1(weight.tobytes()).hexdigest(), static_shape(call))


def within_budget(candidates: list[Candidate], budget: float, largest_tile: int, reuse: int) -> dict[tuple, Algorithm]:
    """The algorithm of each convolution whose transformed weights fit in ``budget`` bytes all together.
    From direct convolutions, the steps that save the most multiplies per byte added go first: each
    convolution's step to F(2x2, 3x3) (1.78x the weights, 9 -> 4 multiplies per output), then to the
    algorithm ``choose`` gives it (F(4x4): 4x the weights, -> 2.25); large images of few channels (small
    weights serving many tiles) before deep layers. The convolutions no step reached stay direct."""
    steps = []  # (multiplies saved per byte, candidate, algorithm, bytes it adds over the step before)
    for c in candidates:
        best = choose(c.out_h, c.out_w, largest_tile, reuse, c.batch)
        steps.append((c.saved(F2) / max(c.extra(F2), 1), c, F2, c.extra(F2)))
        if best is not F2:
            more = c.extra(best) - c.extra(F2)
            steps.append(((c.saved(best) - c.saved(F2)) / max(more, 1), c, best, more))
    chosen: dict[tuple, Algorithm] = {}
    spent = 0.0
    for _rate, c, algorithm, more in sorted(steps, key=lambda step: -step[0]):
        if (algorithm is F2) == (c.key in chosen) or spent + more > budget:
            continue  # a step to F(4x4) only from F(2x2); none past the budget
        chosen[c.key] = algorithm
        spent += more
    return chosen


def winograd_convolutions(largest_tile: int = 4, reuse: int = 0, budget: float = 0.0):
    """A Relax module pass: every convolution that ``suits`` becomes the three Winograd kernels, with
    output tiles of at most ``largest_tile`` (2 or 4) pixels a side (larger than 2 only where each
    transformed weight serves ``reuse`` tiles: ``choose``). With a ``budget`` (a share of the program's
    constant bytes, at least ``MIN_BUDGET``), the transformed weights add at most that much to the library
    (``within_budget``: YOLOv8n's 3x3 weights grew its rpi4 library to 1.97x the model); 0: no limit."""
    planned: dict[tuple, Algorithm] | None = None

    def plan(mod) -> None:
        nonlocal planned
        if not budget:
            planned = None
            return
        candidates, total = _candidates(mod)
        planned = within_budget(candidates, max(budget * total, MIN_BUDGET), largest_tile, reuse)

    def rewrite(call, weight: np.ndarray, bb):
        from tvm import relax

        if not suits(call, weight):
            return None
        top, left = (int(p) for p in call.attrs.padding[:2])
        batch, height, width, _channels = static_shape(call.args[0])
        _batch, out_h, out_w, _out_channels = static_shape(call)
        if planned is None:
            algorithm = choose(out_h, out_w, largest_tile, reuse, batch)
        elif (algorithm := planned.get(_key(call, weight))) is None:
            return None
        m = algorithm.m
        tiles_h, tiles_w = algorithm.tiles(out_h), algorithm.tiles(out_w)
        # every window inside: rows and columns past the input's (and its padding's) are zeros
        bottom, right = tiles_h * m + 2 - height - top, tiles_w * m + 2 - width - left
        padded = bb.emit(relax.op.nn.pad(call.args[0], [0, 0, top, bottom, left, right, 0, 0]))
        tiles = bb.emit_te(input_transform, padded, tiles_h, tiles_w, m, primfunc_name_hint=INPUT_BLOCK)
        kernel = bb.lookup_binding(tiles).args[0]  # the call_tir's PrimFunc
        bb.update_func(kernel, bb.get()[kernel].with_attr("op_pattern", OPAQUE))
        products = bb.emit(relax.op.matmul(tiles, relax.const(transformed_weights(weight, algorithm))))
        output = bb.call_te(output_transform, products, batch, out_h, out_w, m, primfunc_name_hint=OUTPUT_BLOCK)
        return output, f"as Winograd F({m}x{m}, 3x3)"

    return conv2d_rewrite_pass("EdgepackWinograd", rewrite, plan=plan)


def _candidates(mod) -> tuple[list[Candidate], int]:
    """The convolutions of ``mod`` that ``suits``, and the bytes of its constants (as the manifest counts them)."""
    import tvm
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    found: list[Candidate] = []
    for _gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        bindings: dict = {}
        for binding in iter_bindings(func.body):
            bindings[binding.var] = value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(conv):
                weight = bound_constant(value.args[1], bindings)
                if suits(value, weight):
                    batch, out_h, out_w, _k = static_shape(value)
                    found.append(Candidate(_key(value, weight), batch, out_h, out_w, weight.size * 4))  # float32
    return found, constant_sizes(mod).bytes
