"""An LSTM over a sequence whose length is known only at run time (``--dim``), as one TensorIR loop.

With a static length edgepack unrolls the recurrence (``recurrent.py``): every step is a few Relax
operators. With a symbolic one there is nothing to unroll, and Relax has no loop, so the whole recurrence
of one direction is one kernel: the input projections of every step (one matrix product, outside) go in,
and per batch item a serial loop over the steps multiplies the hidden state by the recurrent weights,
applies the gates and writes the step's output. The state lives in three small local buffers.

As the post-processing kernels (``processing/kernels.py``), the body is plain loops, one block per batch
item: a CPU runs them as written (the gate loops vectorize), a GPU's fallback rule binds the batch items to
threads. ``sequence_lens`` (ONNX: steps past a sequence's length output zeros and keep the state) is an
int32 operand; where the model has none edgepack passes the largest int32, so every step is live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tvm.script import tirx as T

NO_LENGTH = 2 ** 31 - 1  # sequence_lens of a model without them: every step is live


@dataclass(frozen=True)
class ActivationSpec:
    """One of a recurrent layer's activations as the ONNX node names it (``activations``, with its
    ``activation_alpha`` / ``activation_beta`` where it takes them)."""

    name: str
    alpha: float | None = None
    beta: float | None = None


def _activation(spec: ActivationSpec, dtype: str) -> Callable[[Any], Any]:
    """ONNX's recurrent activation ``spec`` on one scalar of ``dtype`` (a TIR expression)."""
    key, alpha, beta = spec.name.lower(), spec.alpha, spec.beta
    one, zero = T.Cast(dtype, 1), T.Cast(dtype, 0)

    def const(v):
        return T.Cast(dtype, float(v))

    table = {
        "sigmoid": lambda x: one / (one + T.exp(-x)),
        "tanh": lambda x: T.tanh(x),
        "relu": lambda x: T.max(x, zero),
        "leakyrelu": lambda x: T.Select(x < zero, x * const(0.01 if alpha is None else alpha), x),
        "hardsigmoid": lambda x: T.min(T.max(x * const(0.2 if alpha is None else alpha)
                                             + const(0.5 if beta is None else beta), zero), one),
        "elu": lambda x: T.Select(x < zero, const(1.0 if alpha is None else alpha) * (T.exp(x) - one), x),
        "softsign": lambda x: x / (one + T.fabs(x)),
        "softplus": lambda x: T.log(one + T.exp(x)),
        "affine": lambda x: x * const(alpha) + const(beta),
        "scaledtanh": lambda x: const(alpha) * T.tanh(x * const(beta)),
        "thresholdedrelu": lambda x: T.Select(x > const(1.0 if alpha is None else alpha), x, zero),
    }
    if key not in table:
        raise ValueError(f"RNN activation {spec.name} is not supported")
    return table[key]


def lstm_loop_kernel(batch: int, hidden: int, dtype: str, activations: tuple, clip: float | None,
                     reverse: bool) -> Any:
    """One direction of an ONNX LSTM over ``seq`` (symbolic) steps.

    Operands: xw [seq, batch, 4H] (the input projections with both biases added, gates in ONNX's order
    i, o, f, c), r [H, 4H] (the recurrent weights, transposed), h0 and c0 [batch, H], peep [3H] (the
    peepholes i, o, f; zeros for none), lens [batch] int32. Results: y [seq, batch, H], y_h and y_c
    [batch, H]."""
    f, g, h_act = (_activation(a, dtype) for a in activations)
    gates = 4 * hidden
    zero = T.Cast(dtype, 0)

    def clipped(x):
        return x if clip is None else T.min(T.max(x, T.Cast(dtype, -float(clip))), T.Cast(dtype, float(clip)))

    def step(s, seq):
        return seq - 1 - s if reverse else s

    @T.prim_func(private=True, s_tir=True)
    def lstm_loop(var_xw: T.handle, r: T.Buffer((hidden, gates), dtype), h0: T.Buffer((batch, hidden), dtype),
                  c0: T.Buffer((batch, hidden), dtype), peep: T.Buffer((3 * hidden,), dtype),
                  lens: T.Buffer((batch,), "int32"), var_y: T.handle, y_h: T.Buffer((batch, hidden), dtype),
                  y_c: T.Buffer((batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8})  # opaque: never fused with its neighbours
        seq = T.int64()
        xw = T.match_buffer(var_xw, (seq, batch, gates), dtype)
        y = T.match_buffer(var_y, (seq, batch, hidden), dtype)
        for b in range(batch):
            with T.sblock("lstm_loop"):
                vb = T.axis.spatial(batch, b)
                T.reads(xw[0:seq, vb, 0:gates], r[0:hidden, 0:gates], h0[vb, 0:hidden], c0[vb, 0:hidden],
                        peep[0:3 * hidden], lens[vb])
                T.writes(y[0:seq, vb, 0:hidden], y_h[vb, 0:hidden], y_c[vb, 0:hidden])
                h = T.alloc_buffer((hidden,), dtype, scope="local")
                c = T.alloc_buffer((hidden,), dtype, scope="local")
                acc = T.alloc_buffer((gates,), dtype, scope="local")
                new = T.alloc_buffer((2,), dtype, scope="local")  # this step's c and h of one unit
                for j in range(hidden):
                    h[j] = h0[vb, j]
                    c[j] = c0[vb, j]
                for s in range(seq):
                    for q in range(gates):
                        acc[q] = xw[step(s, seq), vb, q]
                    for k, q in T.grid(hidden, gates):
                        acc[q] = acc[q] + h[k] * r[k, q]
                    for j in range(hidden):
                        new[0] = f(clipped(acc[2 * hidden + j] + peep[2 * hidden + j] * c[j])) * c[j] \
                            + f(clipped(acc[j] + peep[j] * c[j])) * g(clipped(acc[3 * hidden + j]))
                        new[1] = f(clipped(acc[hidden + j] + peep[hidden + j] * new[0])) * h_act(new[0])
                        if T.Cast("int64", lens[vb]) > step(s, seq):
                            y[step(s, seq), vb, j] = new[1]
                            h[j] = new[1]
                            c[j] = new[0]
                        else:
                            y[step(s, seq), vb, j] = zero
                for j in range(hidden):
                    y_h[vb, j] = h[j]
                    y_c[vb, j] = c[j]

    return lstm_loop
