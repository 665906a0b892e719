"""Sigmoid and tanh with an ``exp`` the CPU computes in SIMD vectors.

TVM lowers ``sigmoid`` to ``1 / (1 + exp(-x))`` and ``tanh`` through ``exp`` as well, and LLVM has no vector
``exp``: every element was a call to the C library's scalar ``expf``. SiLU (``x * sigmoid(x)``) follows every
convolution of YOLOv8, and its build called ``expf`` from 9343 places; its first convolution (3 -> 16
channels, 160x160 out) ran at 13 GFLOP/s, and the model took 1.56x ONNX Runtime's time on a Rocket Lake
core (26.6 ms; 14.1 ms with this). An LSTM's gates and cell are sigmoids and tanhs.

Here float32 ``sigmoid`` is ``1 / (1 + fast_exp(-x))`` with TOPI's ``fast_exp`` (Cephes' polynomial after
range reduction, the one ``softmax.py`` uses: at most 4.1e-6 relative error; its input clamped to +-88.4,
where float32's ``exp`` overflows, so the result stays in [0, 1]), and ``tanh`` is TOPI's ``fast_tanh`` (a
rational polynomial on [-9, 9], +-1 outside). Both vectorize and fuse where the operators did.
"""

from __future__ import annotations

from edgepack.backends.relax_exprs import call_rewrite_pass, dtype_of, op_name


def _fast_sigmoid(x):
    from tvm import topi

    return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))


def _fast_tanh(x):
    from tvm import topi

    return topi.fast_tanh(x)


def vector_sigmoid_tanh():
    """A Relax module pass: each float32 ``R.sigmoid`` and ``R.tanh`` in SIMD-vectorizable arithmetic."""
    computes = {"relax.sigmoid": _fast_sigmoid, "relax.tanh": _fast_tanh}

    def rewrite(call, builder):
        name = op_name(call)
        if name not in computes or dtype_of(call.args[0]) != "float32":
            return None
        return builder.call_te(computes[name], call.args[0], primfunc_name_hint=name.split(".")[-1])

    return call_rewrite_pass("EdgepackVectorSigmoidTanh", rewrite)
