"""64-bit integers for GPU code generators that have none (TVM's ``webgpu`` target: WGSL).

WGSL has no 64-bit integers, and TVM's WebGPU code generator stops at the first int64 value in a
kernel ("CodeGenWebGPU: do not support i64"). Its build already forces *index* arithmetic to 32 bits
(``tirx.transform.ForceNarrowIndexToInt32`` inside ``target.build.webgpu``, which narrows loop
variables, thread indices and integer constants, but not int64 tensors or values loaded from them).
What is left are int64 *tensors*, and ONNX exporters write them everywhere: shapes and shape
arithmetic (Shape -> Gather -> Concat -> Reshape), indices (Gather, ArgMax, TopK, Range), scalar
inputs such as Silero VAD's sample rate.

``narrow_int64(mod)`` rewrites a Relax module, before legalisation, so that its kernels only see
int32 where that keeps every result exact, and raises :class:`Int64Refused` naming each tensor that
really needs 64 bits. The function signatures do not change (int64 inputs and outputs stay int64).

1. **Fold.** Integer and boolean computations on constants and static shapes (``shape_to_tensor``,
   ``take``, ``add``, ``where``, comparisons, ...; at most 4096 elements) are evaluated with numpy;
   ``If`` nodes whose condition becomes a constant, or whose two arms are the same, are replaced by
   the arm taken; unused bindings are dropped.
2. **Prove.** Every int64 tensor gets a fact about the 32-bit tensor that replaces it, found forward
   through the program:

   * *exact* ``[lo, hi]``: the int64 values are known to lie in ``[lo, hi]`` within int32, so the
     32-bit tensor holds the same values. Sources: constants, casts from narrower types, ArgMax /
     ArgMin / TopK / ArgSort indices (< the axis length), Range / Full; propagated by interval
     arithmetic through add, subtract, multiply, negative, abs, min/max, clip, floor_divide,
     floor_mod, sum, cumsum, where, and value-preserving operators (reshape, take, concat,
     strided_slice, ...). A result that could leave int32 is not narrowed.
   * *saturated*, agreeing on ``[a, b]``: for values nothing bounds (an int64 model input; a cast
     from float), the 32-bit tensor holds the value clamped to +-(2^31 - 128): equal to the original
     wherever the original lies in ``[a, b]``, and beyond ``b`` (or ``a``) wherever it does. Adding
     or subtracting an exact value shifts the interval, value-preserving operators keep it, ``where``
     intersects it. Such a tensor may only reach consumers whose result is the same for every value
     beyond the interval: comparisons with an exact operand strictly inside it (``sr == 16000``),
     ``clip`` to bounds inside it, and indices whose valid range it covers (an out-of-range index is
     an error in ONNX, and undefined in TVM's ``take``).
3. **Rewrite.** Each int64 tensor is replaced by its 32-bit form: constants converted, ``astype``
   and creation operators given int32, ArgMax/ArgMin computed by an int32 reduction, others re-emitted
   on the 32-bit operands (their type follows). An int64 model input is read as (low, high) int32
   words through a ``memory.view`` of its buffer and saturated on the GPU; an int64 model output is
   written as (low, sign) words and viewed as int64 again: the caller sees the dtypes of the model.

Anything else that holds an int64 tensor in a live computation -- an output whose values cannot be
bounded, a constant beyond int32, arithmetic on saturated values, an operator without a 32-bit rule
-- is refused, by ONNX node name (when the importer recorded it) and Relax variable, with the reason.
Should TVM's code generator still meet a 64-bit integer (uint64 is not narrowed), ``int64_kernels``
names the fused kernels holding 64-bit buffers.

Two neighbouring WGSL gaps are closed on the way, since int64 models hit them at once: an ``If``
condition (read by the VM from the GPU) is handed over as int32, because TVM declares bool tensors
``array<i8>``, which WGSL does not have; and ``isfinite``/``isinf`` (TVM's Cast from float to an
integer guards with them) compare ``|x|`` with the largest finite value, because TVM writes infinity
as ``inff``. The rewritten function is regrouped into dataflow blocks (TVM's ONNX importer leaves
functions with ``If`` nodes without them, and FuseOps only fuses inside them).

Layout: ``exprs`` (helpers on Relax expressions), ``rebuild`` (re-emitting a function binding by
binding), ``fold`` (step 1), ``facts`` (the intervals), ``prove`` (step 2, the refusals), ``rewrite``
(step 3); this module: the pass, :class:`Int64Refused` and ``int64_kernels``. Pure TVM and numpy: apart
from :mod:`edgepack.errors`, nothing of edgepack is imported (``backends/vulkan.py`` applies the pass).
"""

from __future__ import annotations

from edgepack.backends.int64.facts import SAT_BOUND, Fact
from edgepack.backends.int64.fold import Simplify
from edgepack.backends.int64.prove import Prover
from edgepack.backends.int64.rewrite import Rewriter
from edgepack.backends.relax_exprs import NAMES_ATTR, names_of
from edgepack.errors import CompileError

__all__ = ["NAMES_ATTR", "SAT_BOUND", "Fact", "Int64Refused", "int64_kernels", "narrow_int64", "simplify_int64",
           "target_lacks_int64"]


class Int64Refused(CompileError):
    """Tensors that need 64-bit integers on a GPU without them; ``problems`` lists them."""

    def __init__(self, problems: list[str], model: str = "the model", reasons: dict[str, str] | None = None):
        self.problems = problems
        self.reasons = reasons or {}  # {variable of ``main``: why}, of each refused one
        self.names = list(self.reasons)
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        super().__init__(
            f"{model} needs 64-bit integers on the GPU, which WGSL (TVM's webgpu target) does not have: {shown}.",
            "Every other int64 tensor was narrowed to int32 where its values provably fit. Without --gpu-only, "
            "edgepack runs such operators on the device's CPU in int64 (those outside If branches); otherwise "
            "compile it for an OpenCL profile (mali-g610) or a CPU profile (rpi4), or change the model so these "
            "values fit in 32 bits (e.g. int32 outputs, smaller constants).",
        )


def target_lacks_int64(target) -> bool:
    """Whether TVM's code generator for ``target`` has no 64-bit integers (``webgpu``: WGSL)."""
    return str(target.kind.name) == "webgpu"


def simplify_int64(mod):
    """``mod`` with step 1 (fold) done on its Relax functions: what ``narrow_int64`` would prove."""
    from tvm import relax

    out = mod.clone()
    for gvar, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            simplified = Simplify(out).run(func)
            out = simplified.module
            out.update_func(gvar, simplified.func)
    return out


def narrow_int64(mod, *, model: str = "the model", simplified: bool = False):
    """``mod`` (a Relax IRModule, before legalisation) with every int64 tensor of its Relax functions
    narrowed to int32 where that is exact; :class:`Int64Refused` names those that cannot be. Bindings on
    the CPU (``placement.py``) stay int64; their int64 results read on the GPU are read like int64 inputs.
    ``simplified``: ``mod`` is ``simplify_int64``'s (step 1 is not done again)."""
    from tvm import relax

    out = mod.clone()  # the BlockBuilders below add to the module they are given
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        names = names_of(func)
        if simplified:
            body, module = func, out
        else:
            step = Simplify(out).run(func)
            body, module = step.func, step.module
        prover = Prover(body, names)
        problems = prover.run()
        if problems:
            raise Int64Refused(problems, model, prover.refused if gvar.name_hint == "main" else {})
        out, narrowed = Rewriter(module, body, prover.live).run()
        out.update_func(gvar, narrowed)
    # TVM's ONNX importer builds functions with If nodes without dataflow blocks, and FuseOps only
    # fuses inside them: group the pure bindings again (an unfused comparison would also store a
    # bool tensor, which WGSL cannot)
    return relax.transform.ConvertToDataflow()(out)


def int64_kernels(mod, target) -> list[str]:
    """The fused kernels of ``mod`` (legalised and fused as the GPU pipeline does) that still hold
    64-bit integer buffers, as "kernel (buffer dtype, ...)": for a message when code generation
    stops at an int64 that the Relax-level narrowing did not see."""
    import tvm
    import tvm_ffi
    from tvm import relax, s_tir, tirx

    passes = [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
              relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    with target:
        fused = tvm.transform.Sequential(passes)(mod)
    found = []
    for gvar, func in fused.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        wide = [f"{p.name} {p.dtype}" for p in func.params  # buffers (scalars are narrowed by the codegen)
                if type(getattr(p, "ty", None)).__name__ == "BufferType" and str(p.dtype) in ("int64", "uint64")]

        def block(node, wide=wide):
            for buf in node.alloc_buffers:
                if str(buf.dtype) in ("int64", "uint64"):
                    wide.append(f"{buf.name} {buf.dtype}")

        def alloc(node, wide=wide):
            if str(node.buffer.dtype) in ("int64", "uint64"):
                wide.append(f"{node.buffer.name} {node.buffer.dtype}")

        tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, block), (tirx.AllocBuffer, alloc)], order="pre")
        if wide:
            found.append(f"{gvar.name_hint} ({', '.join(dict.fromkeys(wide))})")
    return found
