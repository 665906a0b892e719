"""Losses (training graphs exported for inference, metric heads): NegativeLogLikelihoodLoss and
SoftmaxCrossEntropyLoss.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _attr_str, _const, _dtype
from edgepack.frontends.onnx_ops.registry import register


def _nll(bb, logp, target, weight, attr):
    """NegativeLogLikelihoodLoss on log-probabilities ``logp`` [N, C, d...] and targets [N, d...]."""
    dt = _dtype(logp)
    ignore = attr.get("ignore_index")
    tdt = _dtype(target)
    if ignore is not None:
        ignored = relax.op.equal(target, _const(ignore, tdt))
        safe = relax.op.where(ignored, _const(0, tdt), target)
    else:
        ignored, safe = None, target
    picked = relax.op.squeeze(
        relax.op.gather_elements(logp, relax.op.expand_dims(safe, 1), axis=1), [1])
    w = relax.op.take(weight, safe, axis=0) if weight is not None else relax.op.ones_like(picked)
    if ignored is not None:
        w = relax.op.where(ignored, _const(0, dt), w)
    loss = -picked * w
    reduction = _attr_str(attr, "reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return relax.op.sum(loss)
    return relax.op.sum(loss) / relax.op.sum(w)


@register("NegativeLogLikelihoodLoss")
class NegativeLogLikelihoodLoss(OnnxOpConverter):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        weight = inputs[2] if len(inputs) > 2 else None
        return _nll(bb, inputs[0], inputs[1], weight, attr)


@register("SoftmaxCrossEntropyLoss")
class SoftmaxCrossEntropyLoss(OnnxOpConverter):
    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        logp = bb.normalize(relax.op.nn.log_softmax(inputs[0], axis=1))
        weight = inputs[2] if len(inputs) > 2 else None
        loss = _nll(bb, logp, inputs[1], weight, attr)
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([loss, logp])
        return loss
