"""Convolutions channels-last (NHWC): TVM's ``ConvertLayout``, made to hold on whole real models.

TVM's layout inference for ``R.stack`` gives the stacked tensor its inputs' layout, one dimension short,
and the first operator after it that reads the layout (a ``permute_dims``) fails with "String index out of
bounds". Every ONNX LSTM is imported as a loop of steps stacked at the end, so a CNN+LSTM model (PP-OCRv2's
text recogniser) lost channels-last for all of its convolutions: they ran in NCHW, 2x slower than in NHWC,
and its depthwise convolutions could not join the 1x1 convolutions after them. Each stack is rewritten
first as what it is, a concatenation of its inputs each given the new axis, whose layouts TVM infers right.
"""

from __future__ import annotations

import logging

from edgepack.backends.relax_exprs import call_rewrite_pass
from edgepack.errors import first_line

logger = logging.getLogger("edgepack.schedules")

NHWC_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "OHWI"], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}


def stack_as_concat():
    """A module pass: ``R.stack(xs, axis)`` as ``R.concat([R.expand_dims(x, axis) for x in xs], axis)``."""
    import tvm
    from tvm import relax

    stack = tvm.ir.Op.get("relax.stack")

    def rewrite(call, builder):
        if not call.op.same_as(stack):
            return None
        items = call.args[0]
        if isinstance(items, relax.Tuple):
            fields = list(items.fields)
        else:
            fields = [relax.TupleGetItem(items, k) for k in range(len(items.ty.fields))]
        axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
        expanded = [builder.emit(relax.op.expand_dims(field, axis)) for field in fields]
        return relax.op.concat(expanded, axis)

    return call_rewrite_pass("EdgepackStackAsConcat", rewrite)


def channels_last():
    """``ConvertLayout`` to NHWC convolutions (stacks rewritten first), or the model as it is where TVM's
    layout inference still fails on one of its operators (e.g. ONNX MaxPool with indices): a layout is a
    speed choice, and the log says which was kept."""
    import tvm
    from tvm import relax

    convert = tvm.transform.Sequential([stack_as_concat(), relax.transform.ConvertLayout(NHWC_LAYOUTS)])

    @tvm.transform.module_pass(opt_level=0, name="EdgepackChannelsLast")
    def _pass(mod, _ctx):
        try:
            return convert(mod)
        except Exception as exc:  # noqa: BLE001 - TVM raises its own errors from layout inference
            logger.info("kept the model's layout: ConvertLayout failed: %s", first_line(exc))
            return mod

    return _pass
