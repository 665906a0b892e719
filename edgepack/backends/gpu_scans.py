"""Scans (ONNX CumSum / CumProd) in GPU builds: only on the kernels that compute them right.

TVM lowers a GPU scan to one of two kernels, and the ONNX conformance sweep on lavapipe, then rows longer
than its 5-element cases, found both wrong where this machine's drivers run them:

- an inclusive sum along the last axis goes to ``gpu_2d_continuous_cumsum``: wrong past a handful of
  elements on PoCL (3 x 20 float rows: 9.8 off) and on lavapipe (3 x 37: 9.6 off);
- everything else goes to topi's up-sweep / down-sweep scan: right on PoCL (exclusive sums of 3 x 1000,
  products), wrong in WGSL on lavapipe for any input (an inclusive product of [1, 2, 3, 4, 5] came out
  [1, 4, 9, 4, 20]).

So where topi's scan is right (``GpuBackend.topi_scans``: OpenCL) an inclusive sum is the exclusive one
plus its input (``y[i] = (x[0] + ... + x[i - 1]) + x[i]``); where it is not (Vulkan) every scan runs on the
device's CPU (``scan_bindings``, ``placement.py``), or with ``--gpu-only`` is refused by name at compile time,
rather than computed wrong.
"""

from __future__ import annotations

from edgepack.backends.relax_exprs import call_rewrite_pass, on_cpu, op_name
from edgepack.errors import CompileError

SCAN_REFUSAL = "which TVM's GPU scan kernels compute wrong in WGSL"  # in the refusal's message
_NAMES = {"relax.cumsum": "cumulative sum (ONNX CumSum)", "relax.cumprod": "cumulative product (ONNX CumProd)"}


def scan_bindings(mod) -> dict[str, str]:
    """``{variable: why}`` of the scans of ``mod``'s ``main`` (outside If arms): where the GPU's are wrong, they
    run on the device's CPU (``placement.py``)."""
    from tvm import relax

    found = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call) and op_name(binding.value) in _NAMES:
                found[binding.var.name] = f"a {_NAMES[op_name(binding.value)]}, {SCAN_REFUSAL}"
    return found


def gpu_scans(model: str, topi_scans: bool):
    """A Relax pass: with ``topi_scans`` every inclusive ``cumsum`` as the exclusive one plus its input;
    without, every ``cumsum`` / ``cumprod`` refused (a CompileError naming ``model``)."""
    from tvm import relax

    def rewrite(call, builder):
        op = op_name(call)
        if op not in _NAMES or call.attrs is None or on_cpu(call):  # on the CPU (placement.py): TVM's loops
            return None
        if not topi_scans:
            raise CompileError(
                f"{model} has a {_NAMES[op]}, {SCAN_REFUSAL} (on lavapipe, for any input): edgepack refuses "
                "it for Vulkan rather than give wrong results.",
                "Compile it without --gpu-only (it then runs on the device's CPU), or for an OpenCL profile "
                "(mali-g610) or a CPU profile (rpi4).")
        if op != "relax.cumsum" or bool(call.attrs.exclusive):
            return None
        exclusive = builder.emit(relax.op.cumsum(call.args[0], axis=call.attrs.axis, dtype=call.attrs.dtype,
                                                 exclusive=True))
        data = call.args[0]
        if call.attrs.axis is None:  # over the flattened tensor
            data = builder.emit(relax.op.reshape(data, [-1]))
        if call.attrs.dtype is not None and str(call.attrs.dtype) != str(data.struct_info.dtype):
            data = builder.emit(relax.op.astype(data, call.attrs.dtype))
        return relax.op.add(exclusive, data)

    return call_rewrite_pass("EdgepackGpuScans", rewrite)
