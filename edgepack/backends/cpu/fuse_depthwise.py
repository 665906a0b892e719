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

import logging
from typing import Any

from edgepack.backends.cpu.schedules.anatomy import Anatomy, reduction_anatomy
from edgepack.backends.cpu.schedules.fused import pointwise_tile
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.tiling import choose_tile
from edgepack.errors import first_line

logger = logging.getLogger("edgepack.schedules")


def fuse_depthwise_pointwise(cpu: CpuInfo):
    """The module pass (between ``FuseOps`` and ``FuseTIR``) for a target with ``cpu``'s registers."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="EdgepackFuseDepthwisePointwise")
    def _pass(mod, _ctx):
        try:
            fused = 0
            builder = relax.BlockBuilder(mod)
            for gvar, func in list(mod.functions_items()):
                if isinstance(func, relax.Function) and not _is_primitive(func):
                    func, count = _fuse_in(mod, func, builder, cpu)
                    if count:
                        builder.update_func(gvar, func)
                        fused += count
            if not fused:
                return mod
            result = relax.transform.DeadCodeElimination()(builder.finalize())
        except Exception as exc:  # noqa: BLE001 - a fusion is a speed choice: the kernels stay apart
            logger.info("kept depthwise and pointwise convolutions apart: %s", first_line(exc))
            return mod
        logger.info("%d depthwise convolution(s) fused into the pointwise convolution after them", fused)
        return result

    return _pass


def _is_primitive(func) -> bool:
    return bool(func.attrs and "Primitive" in func.attrs and int(func.attrs["Primitive"]))


def _fuse_in(mod, func, builder, cpu: CpuInfo) -> tuple[Any, int]:
    """``func`` with each depthwise/pointwise pair of fused calls merged, and how many."""
    from tvm import relax

    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func, 0
    uses = _use_counts(func)
    roles: dict[str, tuple[str | None, Anatomy | None]] = {}  # per fused function (called once per layer)
    blocks, count = [], 0
    for block in body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        producers: dict[Any, Any] = {}  # var -> binding of a fused depthwise call
        kept: list[Any] = []
        for binding in block.bindings:
            value = binding.value if isinstance(binding, relax.VarBinding) else None
            callee = _callee(mod, value)
            if callee is not None and value.op.name_hint not in roles:
                roles[value.op.name_hint] = _role(mod, callee)
            role, anatomy = roles[value.op.name_hint] if callee is not None else (None, None)
            if role == "depthwise" and uses.get(binding.var, 0) == 1:
                producers[binding.var] = (binding, anatomy)
            elif role == "pointwise":
                inputs = [a for a in value.args if isinstance(a, relax.Var) and a in producers]
                if len(inputs) == 1 and inputs[0].same_as(_first_tensor_param(callee, value)) \
                        and _tile_keeps(producers[inputs[0]][1], anatomy, cpu):
                    producer = producers.pop(inputs[0])[0]
                    merged = _merge(mod, producer, binding, builder)
                    if merged is not None:
                        kept = [b for b in kept if not b.same_as(producer)]
                        kept.append(merged)
                        count += 1
                        continue
            kept.append(binding)
        blocks.append(relax.DataflowBlock(kept, block.span))
    if not count:
        return func, 0
    return relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span), count


def _use_counts(func) -> dict[Any, int]:
    import tvm_ffi
    from tvm import relax

    counts: dict[Any, int] = {}

    def visit(var) -> None:
        counts[var] = counts.get(var, 0) + 1

    tvm_ffi.structural_walk(func.body, [(relax.Var, visit)], order="pre")
    for var in list(counts):  # a var's own binding is not a use
        counts[var] -= 1
    return counts


def _callee(mod, value):
    """The fused Relax function ``value`` calls, or None."""
    import tvm
    from tvm import relax

    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.GlobalVar):
        return None
    func = mod[value.op] if value.op in mod.get_global_vars() else None
    return func if isinstance(func, relax.Function) and _is_primitive(func) else None


def _first_tensor_param(callee, call):
    """The argument of ``call`` that the fused function's convolution reads as its data."""
    conv = _convolution(callee)
    if conv is None:
        return None
    data = conv.args[1].fields[0]
    for param, arg in zip(callee.params, call.args):
        if param.same_as(data):
            return arg
    return None


def _convolution(func):
    """The first ``call_tir`` of a fused function (FuseOps puts the convolution first)."""
    from tvm import relax

    body = func.body
    if not isinstance(body, relax.SeqExpr) or not body.blocks or not body.blocks[0].bindings:
        return None
    value = body.blocks[0].bindings[0].value
    if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_tir":
        return value
    return None


def _role(mod, func) -> tuple[str | None, Anatomy | None]:
    """"depthwise" or "pointwise" for a fused function whose first kernel is a channels-last convolution
    of that kind (float32), else None; and that kernel's anatomy."""
    conv = _convolution(func)
    if conv is None:
        return None, None
    anatomy = _anatomy(mod[conv.args[0]])
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


def _anatomy(prim_func) -> Anatomy | None:
    from tvm import s_tir, tirx

    if not isinstance(prim_func, tirx.PrimFunc):
        return None
    try:
        return reduction_anatomy(s_tir.Schedule(prim_func))
    except Exception:  # noqa: BLE001 - not a kernel of this form
        return None


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
    """The data has the output's rows and columns."""
    data = anatomy.reads[0]
    return all(int(data.buffer.shape[axis]) == anatomy.extents[anatomy.output_axes[axis]] for axis in (1, 2))


def _merge(mod, producer, consumer, builder):
    """One binding calling a new fused function: the producer's body, then the consumer's."""
    from tvm import relax

    first, second = _callee(mod, producer.value), _callee(mod, consumer.value)
    first = relax.utils.copy_with_new_vars(first)
    second = relax.utils.copy_with_new_vars(second)
    position = [i for i, a in enumerate(consumer.value.args) if a.same_as(producer.var)]
    if len(position) != 1 or len(first.body.blocks) != 1 or len(second.body.blocks) != 1:
        return None
    link = second.params[position[0]]
    result = first.body.body
    second = second.bind_params({link: result})
    params = list(first.params) + list(second.params)
    args = list(producer.value.args) + [a for i, a in enumerate(consumer.value.args) if i != position[0]]
    bindings = list(first.body.blocks[0].bindings) + list(second.body.blocks[0].bindings)
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], second.body.body)
    merged = relax.Function(params, body, second.ret_ty, True, second.attrs)
    name = f"{producer.value.op.name_hint}_{consumer.value.op.name_hint.removeprefix('fused_')}"
    gvar = builder.add_func(merged, name)
    return relax.VarBinding(consumer.var, builder.normalize(relax.Call(gvar, args)))
