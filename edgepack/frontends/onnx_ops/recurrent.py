"""Recurrent layers: RNN, GRU and LSTM, unrolled over a static sequence length; an LSTM over a symbolic one
is a loop kernel (``recurrent_loop``)."""

from __future__ import annotations

import numpy as _np
from tvm import relax, tirx
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.activations import _softplus
from edgepack.frontends.onnx_ops.common import _attr_str, _const, _dtype, _opt, _rank, _shape
from edgepack.frontends.onnx_ops.recurrent_loop import NO_LENGTH, ActivationSpec, lstm_loop_kernel
from edgepack.frontends.onnx_ops.registry import register


def _rnn_activation(spec: ActivationSpec, dt: str):
    name, alpha, beta = spec.name, spec.alpha, spec.beta
    key = name.lower()

    def f(x):
        if key == "sigmoid":
            return relax.op.sigmoid(x)
        if key == "tanh":
            return relax.op.tanh(x)
        if key == "relu":
            return relax.op.nn.relu(x)
        if key == "leakyrelu":
            return relax.op.nn.leakyrelu(x, alpha if alpha is not None else 0.01)
        if key == "hardsigmoid":
            a, b = (alpha if alpha is not None else 0.2), (beta if beta is not None else 0.5)
            return relax.op.clip(x * _const(a, dt) + _const(b, dt), 0, 1)
        if key == "elu":
            a = alpha if alpha is not None else 1.0
            return relax.op.where(relax.op.less(x, _const(0, dt)), _const(a, dt) * (relax.op.exp(x) - _const(1, dt)), x)
        if key == "softsign":
            return x / (_const(1, dt) + relax.op.abs(x))
        if key == "softplus":
            return _softplus(x, dt)
        if key == "affine":
            return x * _const(alpha, dt) + _const(beta, dt)
        if key == "scaledtanh":
            return _const(alpha, dt) * relax.op.tanh(x * _const(beta, dt))
        if key == "thresholdedrelu":
            a = alpha if alpha is not None else 1.0
            return relax.op.where(relax.op.greater(x, _const(a, dt)), x, _const(0, dt))
        raise ValueError(f"RNN activation {name} is not supported")

    return f


_TAKES_ALPHA = {"leakyrelu", "hardsigmoid", "elu", "affine", "scaledtanh", "thresholdedrelu"}
_TAKES_BETA = {"hardsigmoid", "affine", "scaledtanh"}


def _rnn_activation_specs(attr: dict, defaults: tuple[str, ...], num_dirs: int) -> list[list[ActivationSpec]]:
    """Each direction's activations, as the node names them (``activations``, alphas and betas in turn)."""
    names = list(attr.get("activations", [])) or list(defaults) * num_dirs
    if len(names) == len(defaults) and num_dirs == 2:
        names = names * 2
    alphas, betas = list(attr.get("activation_alpha", [])), list(attr.get("activation_beta", []))
    specs = []
    for name in names:
        name = name.decode() if isinstance(name, bytes) else name
        key = name.lower()
        alpha = alphas.pop(0) if key in _TAKES_ALPHA and alphas else None
        beta = betas.pop(0) if key in _TAKES_BETA and betas else None
        specs.append(ActivationSpec(name, alpha, beta))
    per = len(defaults)
    return [specs[d * per:(d + 1) * per] for d in range(num_dirs)]


class _Recurrent(OnnxOpConverter):
    """Shared driver of RNN / GRU / LSTM: input projections for every step at once, then the
    recurrence unrolled over the (static) sequence; ``sequence_lens`` masks finished sequences."""

    gates = 1
    defaults = ("Tanh",)

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        x, w = inputs[0], inputs[1]
        b, seq_lens, h0 = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
        extra = [_opt(inputs, i) for i in range(6, len(inputs))]
        dt = _dtype(x)
        layout = attr.get("layout", 0)
        if layout == 1:
            x = bb.normalize(relax.op.permute_dims(x, [1, 0, 2]))
            h0 = bb.normalize(relax.op.permute_dims(h0, [1, 0, 2])) if h0 is not None else None
            extra = [bb.normalize(relax.op.permute_dims(e, [1, 0, 2])) if e is not None and _rank(e) == 3 else e
                     for e in extra]
        seq, batch = x.ty.shape[0], int(x.ty.shape[1])
        symbolic = not isinstance(seq, tirx.IntImm)
        seq = seq if symbolic else int(seq)
        num_dirs = _shape(w)[0]
        hidden = cls.hidden_size(w)
        gh = hidden * cls.gates
        direction = _attr_str(attr, "direction", "forward")
        specs = _rnn_activation_specs(attr, cls.defaults, num_dirs)
        acts = [[_rnn_activation(a, dt) for a in per_dir] for per_dir in specs]
        clip = attr.get("clip")
        ys, hs, cs = [], [], []
        for d in range(num_dirs):
            wd, rd = cls.direction_weights(bb, inputs, d)
            xw = bb.normalize(cls.times(bb, x, wd))  # [seq, batch, gates*H]
            wb = rb = None
            if b is not None:
                bd = relax.op.squeeze(relax.op.strided_slice(b, [0], [d], [d + 1]), [0])
                wb = bb.normalize(relax.op.strided_slice(bd, [0], [0], [gh]))
                rb = bb.normalize(relax.op.strided_slice(bd, [0], [gh], [2 * gh]))
                xw = bb.normalize(xw + wb)
            state = cls.initial_state(bb, h0, extra, d, batch, hidden, dt)
            reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
            if symbolic:
                y, state = cls.loop(bb, xw, state, rd, rb, seq_lens, extra, d, specs[d], clip, reverse, dt)
                ys.append(y)
                hs.append(state[0])
                cs.extend(state[1:])
                continue
            order = range(seq - 1, -1, -1) if reverse else range(seq)
            outs = [None] * seq
            for t in order:
                xt = relax.op.squeeze(relax.op.strided_slice(xw, [0], [t], [t + 1]), [0])
                new_state = cls.step(bb, xt, state, rd, rb, extra, d, acts[d], clip, hidden, dt)
                if seq_lens is not None:
                    live = relax.op.reshape(relax.op.less(_const(t, _dtype(seq_lens)), seq_lens), [batch, 1])
                    outs[t] = bb.normalize(relax.op.where(live, new_state[0], _const(0, dt)))
                    state = tuple(bb.normalize(relax.op.where(live, n, o)) for n, o in zip(new_state, state))
                else:
                    state = new_state
                    outs[t] = state[0]
            ys.append(bb.normalize(relax.op.stack(outs, axis=0)))  # [seq, batch, H]
            hs.append(state[0])
            if len(state) > 1:
                cs.append(state[1])
        y = relax.op.stack(ys, axis=1)  # [seq, dirs, batch, H]
        y_h = relax.op.stack(hs, axis=0)
        results = [y, y_h] + ([relax.op.stack(cs, axis=0)] if cs else [])
        if layout == 1:
            results = [relax.op.permute_dims(results[0], [2, 0, 1, 3])] + \
                      [relax.op.permute_dims(e, [1, 0, 2]) for e in results[1:]]
        n = attr["tvm_custom"]["num_outputs"]
        return relax.Tuple(results[:max(n, 1)]) if n > 1 else results[0]

    @classmethod
    def loop(cls, bb, xw, state, rd, rb, seq_lens, extra, d, specs, clip, reverse, dt):
        """One direction over a symbolic sequence length: ([seq, batch, H], final state)."""
        raise ValueError(f"{cls.__name__.lstrip('_')} over a sequence whose length is known only at run time "
                         "(--dim) is not supported; only LSTM is. Fix the sequence length with --input-shape.")

    @classmethod
    def hidden_size(cls, w) -> int:
        return _shape(w)[1] // cls.gates

    @classmethod
    def direction_weights(cls, bb, inputs, d):
        """Direction ``d``'s input and recurrent weights as the right operands of :meth:`times`
        ([input, gates*H] and [H, gates*H])."""
        def pick(e):
            return bb.normalize(relax.op.permute_dims(relax.op.squeeze(relax.op.strided_slice(e, [0], [d], [d + 1]),
                                                                       [0])))

        return pick(inputs[1]), pick(inputs[2])

    @classmethod
    def times(cls, bb, a, weights):
        return relax.op.matmul(a, weights)

    @classmethod
    def initial_state(cls, bb, h0, extra, d, batch, hidden, dt):
        h = relax.op.squeeze(relax.op.strided_slice(h0, [0], [d], [d + 1]), [0]) if h0 is not None \
            else relax.op.zeros((batch, hidden), dt)
        return (bb.normalize(h),)

    @staticmethod
    def _clip(x, clip, dt):
        return relax.op.clip(x, -float(clip), float(clip)) if clip is not None else x


@register("RNN")
class RNN(_Recurrent):
    gates = 1
    defaults = ("Tanh",)

    @classmethod
    def step(cls, bb, xt, state, rd, rb, extra, d, acts, clip, hidden, dt):
        pre = xt + relax.op.matmul(state[0], rd)
        if rb is not None:
            pre = pre + rb
        return (bb.normalize(acts[0](cls._clip(pre, clip, dt))),)


@register("GRU")
class GRU(_Recurrent):
    gates = 3
    defaults = ("Sigmoid", "Tanh")

    @classmethod
    def step(cls, bb, xt, state, rd, rb, extra, d, acts, clip, hidden, dt):
        f, g = acts
        h = state[0]
        hr = bb.normalize(relax.op.matmul(h, rd))  # [batch, 3H]
        if rb is not None:
            hr = bb.normalize(hr + rb)

        def part(e, i):
            return relax.op.strided_slice(e, [1], [i * hidden], [(i + 1) * hidden])

        z = f(cls._clip(part(xt, 0) + part(hr, 0), clip, dt))
        rr = f(cls._clip(part(xt, 1) + part(hr, 1), clip, dt))
        if cls._linear_before_reset:
            cand = part(xt, 2) + rr * part(hr, 2)
        else:
            rd_h = relax.op.strided_slice(rd, [1], [2 * hidden], [3 * hidden])
            cand = part(xt, 2) + relax.op.matmul(rr * h, rd_h)
            if rb is not None:
                cand = cand + relax.op.strided_slice(rb, [0], [2 * hidden], [3 * hidden])
        hh = g(cls._clip(cand, clip, dt))
        return (bb.normalize((_const(1, dt) - z) * hh + z * h),)

    _linear_before_reset = False

    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        impl = _GRULinearBeforeReset if attr.get("linear_before_reset", 0) else GRU
        return _Recurrent._impl_v7.__func__(impl, bb, inputs, attr, params)


class _GRULinearBeforeReset(GRU):
    _linear_before_reset = True


@register("LSTM")
class LSTM(_Recurrent):
    gates = 4
    defaults = ("Sigmoid", "Tanh", "Tanh")

    @classmethod
    def initial_state(cls, bb, h0, extra, d, batch, hidden, dt):
        (h,) = _Recurrent.initial_state(bb, h0, extra, d, batch, hidden, dt)
        c0 = extra[0] if extra else None
        c = relax.op.squeeze(relax.op.strided_slice(c0, [0], [d], [d + 1]), [0]) if c0 is not None \
            else relax.op.zeros((batch, hidden), dt)
        return (h, bb.normalize(c))

    @classmethod
    def step(cls, bb, xt, state, rd, rb, extra, d, acts, clip, hidden, dt):
        f, g, hact = acts
        h, c = state
        pre = bb.normalize(xt + cls.times(bb, h, rd) + (rb if rb is not None else _const(0, dt)))
        p = extra[1] if len(extra) > 1 else None
        peep = None
        if p is not None:
            peep = bb.normalize(relax.op.squeeze(relax.op.strided_slice(p, [0], [d], [d + 1]), [0]))

        def part(e, i):
            return relax.op.strided_slice(e, [len(e.ty.shape) - 1], [i * hidden], [(i + 1) * hidden])

        gi, go, gf, gc = (part(pre, i) for i in range(4))
        if peep is not None:
            gi = gi + part(peep, 0) * c
            gf = gf + part(peep, 2) * c
        it = f(cls._clip(gi, clip, dt))
        ft = f(cls._clip(gf, clip, dt))
        ct = g(cls._clip(gc, clip, dt))
        c_new = bb.normalize(ft * c + it * ct)
        if peep is not None:
            go = go + part(peep, 1) * c_new
        ot = f(cls._clip(go, clip, dt))
        return (bb.normalize(ot * hact(c_new)), c_new)

    @classmethod
    def loop(cls, bb, xw, state, rd, rb, seq_lens, extra, d, specs, clip, reverse, dt):
        if cls.times.__func__ is not _Recurrent.times.__func__:
            raise ValueError(f"{cls.__name__} over a sequence whose length is known only at run time (--dim) is "
                             "not supported (only float LSTMs are). Fix the sequence length with --input-shape.")
        batch, hidden = (int(v) for v in state[0].ty.shape)
        if rb is not None:
            xw = bb.normalize(xw + rb)
        p = extra[1] if len(extra) > 1 else None
        peep = bb.normalize(relax.op.squeeze(relax.op.strided_slice(p, [0], [d], [d + 1]), [0])) if p is not None \
            else relax.op.zeros((3 * hidden,), dt)
        lens = bb.normalize(relax.op.astype(seq_lens, "int32")) if seq_lens is not None \
            else relax.const(_np.full((batch,), NO_LENGTH, "int32"), "int32")
        kernel = lstm_loop_kernel(batch, hidden, dt, tuple(specs), clip, reverse)
        gv = bb.add_func(kernel, "lstm_loop")
        seq = xw.ty.shape[0]
        state0 = bb.normalize(relax.op.stack(list(state), axis=0))
        out = bb.emit(relax.call_tir(gv, [xw, rd, state0, peep, lens],
                                     [relax.TensorType([seq, batch, hidden], dt),
                                      relax.TensorType([2, batch, hidden], dt)]))
        last = bb.emit(relax.TupleGetItem(out, 1))
        h, c = (bb.normalize(relax.op.squeeze(relax.op.strided_slice(last, [0], [i], [i + 1]), [0])) for i in (0, 1))
        return bb.emit(relax.TupleGetItem(out, 0)), (h, c)
