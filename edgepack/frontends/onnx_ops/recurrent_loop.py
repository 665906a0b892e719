"""An LSTM over a sequence whose length is known only at run time (``--dim``), as one TensorIR loop.

With a static length edgepack unrolls the recurrence (``recurrent.py``): every step is a few Relax
operators. With a symbolic one there is nothing to unroll, and Relax has no loop, so the whole recurrence
of one direction is one kernel: the input projections of every step (one matrix product, outside) go in,
and per batch item a serial loop over the steps multiplies the hidden state by the recurrent weights,
applies the gates and writes the step's output. The state lives in three small local buffers.

As the post-processing kernels (``processing/kernels.py``), the body is plain loops, one block per batch
item: a CPU runs them as written (the gate loops vectorize). A GPU would run each batch item's steps in one
thread, slower than the CPU by far (and lavapipe stops a shader's loops after 65535 iterations), so the kernel
is marked serial (``SERIAL_KERNEL_ATTR``) and GPU builds run it on the device's CPU, as LiteRT's GPU delegate
leaves LSTMs to the CPU. ``sequence_lens`` (ONNX: steps past a sequence's length output zeros and keep the state) is an
int32 operand; where the model has none edgepack passes the largest int32, so every step is live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tvm.script import tirx as T

from edgepack.frontends.types import SERIAL_KERNEL_ATTR

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
    i, o, f, c), r [H, 4H] (the recurrent weights, transposed), state0 [2, batch, H] (h0 and c0), peep [3H]
    (the peepholes i, o, f; zeros for none), lens [batch] int32. Results: y [seq, batch, H] and state
    [2, batch, H] (the last h and c). Seven tensors: within WebGPU's eight storage buffers per shader."""
    f, g, h_act = (_activation(a, dtype) for a in activations)
    gates = 4 * hidden
    zero = T.Cast(dtype, 0)

    def clipped(x):
        return x if clip is None else T.min(T.max(x, T.Cast(dtype, -float(clip))), T.Cast(dtype, float(clip)))

    def step(s, seq):
        return seq - 1 - s if reverse else s

    @T.prim_func(private=True, s_tir=True)
    def lstm_loop(var_xw: T.handle, r: T.Buffer((hidden, gates), dtype), state0: T.Buffer((2, batch, hidden), dtype),
                  peep: T.Buffer((3 * hidden,), dtype), lens: T.Buffer((batch,), "int32"), var_y: T.handle,
                  state: T.Buffer((2, batch, hidden), dtype)):
        T.func_attr({"tirx.noalias": True, "op_pattern": 8, SERIAL_KERNEL_ATTR: True})  # opaque: never fused
        seq = T.int64()
        xw = T.match_buffer(var_xw, (seq, batch, gates), dtype)
        y = T.match_buffer(var_y, (seq, batch, hidden), dtype)
        for b in range(batch):
            with T.sblock("lstm_loop"):
                vb = T.axis.spatial(batch, b)
                T.reads(xw[0:seq, vb, 0:gates], r[0:hidden, 0:gates], state0[0:2, vb, 0:hidden], peep[0:3 * hidden],
                        lens[vb])
                T.writes(y[0:seq, vb, 0:hidden], state[0:2, vb, 0:hidden])
                h = T.alloc_buffer((hidden,), dtype, scope="local")
                c = T.alloc_buffer((hidden,), dtype, scope="local")
                acc = T.alloc_buffer((gates,), dtype, scope="local")
                at = T.alloc_buffer((1,), "int32", scope="local")  # int32: WGSL has no 64-bit integers
                cell = T.alloc_buffer((2,), dtype, scope="local")  # c and h of one unit (WGSL reserves "new")
                for j in range(hidden):
                    h[j] = state0[0, vb, j]
                    c[j] = state0[1, vb, j]
                for s in range(seq):
                    # the step's position, kept in a buffer: a reversed index bound by common-subexpression
                    # elimination came out of the loop as a kernel argument in WGSL (wrong numbers)
                    at[0] = T.Cast("int32", step(s, seq))
                    for q in range(gates):
                        acc[q] = xw[at[0], vb, q]
                    for k, q in T.grid(hidden, gates):
                        acc[q] = acc[q] + h[k] * r[k, q]
                    for j in range(hidden):
                        cell[0] = f(clipped(acc[2 * hidden + j] + peep[2 * hidden + j] * c[j])) * c[j] \
                            + f(clipped(acc[j] + peep[j] * c[j])) * g(clipped(acc[3 * hidden + j]))
                        cell[1] = f(clipped(acc[hidden + j] + peep[hidden + j] * cell[0])) * h_act(cell[0])
                        if lens[vb] > at[0]:
                            y[at[0], vb, j] = cell[1]
                            h[j] = cell[1]
                            c[j] = cell[0]
                        else:
                            y[at[0], vb, j] = zero
                for j in range(hidden):
                    state[0, vb, j] = h[j]
                    state[1, vb, j] = c[j]

    return lstm_loop
