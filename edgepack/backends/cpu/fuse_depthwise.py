"""A depthwise convolution fused into the pointwise (1x1) convolution that reads it: one kernel.

MobileNet-style blocks run a depthwise 3x3 convolution and then a 1x1 convolution over its output.
As two kernels, the depthwise one writes its whole output and the pointwise one reads it back: at
56x56x144 (MobileNetV2) that is 1.8 MB each way, more than a core's L2 cache, so both kernels wait on
memory. Fused, the kernel computes the depthwise output of a few pixels (every channel) into a small
buffer on the stack, and the pointwise convolution of those pixels reads it from L1
(``schedules/fused.py``, rule ``cpu.DepthwisePointwise``).

TVM's ``FuseOps`` never puts two convolutions in one kernel; this pass runs after it and before
``FuseTIR``: where a fused function whose reduction is a channels-last depthwise convolution is read
only by a fused function whose reduction is a channels-last 1x1 convolution of stride 1, the two become
one fused function, which ``FuseTIR`` then turns into one kernel.
"""

from __future__ import annotations

from edgepack.backends.cpu.fusion import first_kernel, fusion_pass, kernel_anatomy, merge_pairs
from edgepack.backends.cpu.schedules.anatomy import Anatomy
from edgepack.backends.cpu.schedules.fused import pointwise_tile
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.tiling import choose_tile


def fuse_depthwise_pointwise(cpu: CpuInfo):
    """The module pass (between ``FuseOps`` and ``FuseTIR``) for a target with ``cpu``'s registers."""

    def fuse(mod, func, builder):
        return merge_pairs(mod, func, builder, _depthwise, pointwise_convolution,
                           lambda depthwise, pointwise: _tile_keeps(depthwise, pointwise, cpu))

    return fusion_pass("EdgepackFuseDepthwisePointwise",
                       "depthwise convolution(s) fused into the pointwise convolution after them", fuse)


def _depthwise(mod, func) -> Anatomy | None:
    role, anatomy = _role(mod, func)
    return anatomy if role == "depthwise" else None


def pointwise_convolution(mod, func) -> Anatomy | None:
    """The anatomy of a fused function's first kernel where it is a channels-last 1x1 convolution of
    stride 1 without padding (float32), else None."""
    role, anatomy = _role(mod, func)
    return anatomy if role == "pointwise" else None


def _role(mod, func) -> tuple[str | None, Anatomy | None]:
    """"depthwise" or "pointwise" for a fused function whose first kernel is a channels-last convolution
    of that kind (float32), else None; and that kernel's anatomy."""
    conv = first_kernel(func)
    if conv is None:
        return None, None
    anatomy = kernel_anatomy(mod[conv.args[0]])
    if anatomy is None or len(anatomy.reads) != 2 or not anatomy.window or anatomy.dtype_bits != 32 \
            or anatomy.register_axis is None or not _channels_innermost(anatomy):
        return None, None
    if anatomy.channel_reduction == 1 and _reads_at(anatomy, (3,)) and _keeps_its_shape(func):
        return "depthwise", anatomy
    if all(anatomy.extents[k] == 1 or k in _channel_vars(anatomy) for k in anatomy.reduce) \
            and _reads_at(anatomy, (1, 2)) and _same_size(anatomy):
        return "pointwise", anatomy
    return None, None


def _tile_keeps(depthwise: Anatomy, pointwise: Anatomy, cpu: CpuInfo) -> bool:
    """The fused kernel tiles the pointwise convolution as a kernel of its own would be tiled: the
    depthwise output of its tile of pixels fits the stack. (MobileNetV2's 7x7x960 depthwise outputs
    fit one pixel: its 960 -> 160 convolution, weights reloaded for every pixel, ran 2x slower.)"""
    pixel_bytes = depthwise.extents[depthwise.vector_axis] * depthwise.dtype_bits // 8
    fused = pointwise_tile(pointwise, pixel_bytes, cpu)
    alone = choose_tile(pointwise.extents[pointwise.vector_axis], pointwise.extents[pointwise.register_axis],
                        cpu.lanes(pointwise.dtype_bits), cpu)
    return fused is not None and fused.repeat == alone.repeat


def _keeps_its_shape(func) -> bool:
    """Every kernel of the fused function writes a tensor of the function's output shape (the bias and
    activation after a convolution, not a crop or a reshape, which the fused rule cannot store from its
    accumulators)."""
    import tvm_ffi
    from tvm import relax

    shape = func.ret_ty.shape if isinstance(func.ret_ty, relax.TensorType) else None
    if shape is None:
        return False
    calls = [b.value for b in func.body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    return all(isinstance(c.ty, relax.TensorType) and c.ty.shape is not None
               and tvm_ffi.structural_equal(c.ty.shape, shape) for c in calls)


def _channel_vars(anatomy: Anatomy) -> set[int]:
    """The reduction variable that is the data's innermost index (input channels; none for a grouped
    convolution, whose input channel also depends on the output channel)."""
    from tvm import tirx

    index = anatomy.reads[0].indices[-1] if anatomy.reads[0].indices else None
    return {k for k in anatomy.reduce if isinstance(index, tirx.Var) and index.same_as(anatomy.iter_vars[k].var)}


def _channels_innermost(anatomy: Anatomy) -> bool:
    """NHWC: the output's innermost axis and the data's innermost index are channels."""
    data = anatomy.reads[0]
    vector = anatomy.vector_axis
    return vector is not None and anatomy.output_axes[-1] == vector and len(data.indices) == 4 \
        and len(anatomy.output_axes) == 4


def _reads_at(anatomy: Anatomy, axes: tuple[int, ...]) -> bool:
    """Along each of ``axes`` the data is read where the output is written (its index is the output's
    variable once the window's variables of extent 1 are 0): a depthwise convolution's channel (a depth
    multiplier of 1), a 1x1 convolution's row and column (stride 1, no padding)."""
    import tvm
    from tvm import sym, tirx

    data = anatomy.reads[0]
    analyzer = sym.Analyzer()
    for k in anatomy.reduce:
        analyzer.bind(anatomy.iter_vars[k].var, tvm.ir.Range(0, anatomy.extents[k]))
    for axis in axes:
        var = anatomy.output_axes[axis]
        index = analyzer.simplify(data.indices[axis])
        if var is None or not (isinstance(index, tirx.Var) and index.same_as(anatomy.iter_vars[var].var)):
            return False
    return True


def _same_size(anatomy: Anatomy) -> bool:
    """The data has the output's rows and columns (symbolic ones, ``--dim``, as the same expression)."""
    from tvm import sym

    data = anatomy.reads[0]
    analyzer = sym.Analyzer()
    return all(analyzer.can_prove_equal(data.buffer.shape[axis], anatomy.iter_vars[anatomy.output_axes[axis]].dom.extent)
               for axis in (1, 2))
