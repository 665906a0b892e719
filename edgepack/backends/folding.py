"""Kernels applied to constants, run once at compile time: the constant folding of every backend's pipeline
(in place of TVM's ``FoldConstant``).

CPU builds: channels-last convolutions transpose their weights (OIHW to OHWI), and a schedule that reorders a
layout-free weight (``RewriteLayout``: a default rule's or a tuning record's) leaves a copy loop that
``SplitLayoutRewritePreproc`` moves into a ``*_weight_prepack`` function called on the constants.
TVM's ``FoldConstant`` compiles and runs each such call on its own, about 0.1-0.2 s each (8.7 of 18 s
for MobileNetV2's build); this pass compiles all of them as one library for this machine, runs each
once and puts the results in their place, round after round while folding makes new constants.

Every build: a call whose result would be many times its constant inputs stays a kernel
(``worth_folding``), as does one whose kernel calls the target's own instructions (``runs_here``). TVM's ``FoldConstant`` stored such results too, and GPU builds used it: a TFLite
palm detector's PReLU slopes broadcast per pixel made its OpenCL library 15.7 MB for a 1.9 MB model.
"""

from __future__ import annotations

import tempfile

from edgepack.tensors import worth_storing

MAX_ROUNDS = 8  # chains of kernels on constants (transpose, then reshape...) are short
#: a kernel (PrimFunc attribute) that runs at run time even on constants: it unpacks weights stored smaller
#: than the kernels read them (``wgsl_bytes.py``), and folding would store them large again
UNFOLDED = "edgepack.unfolded"


def worth_folding(call, args: list) -> bool:
    """Whether a call on constants should become a constant in the model: not a kernel that makes a
    tensor from nothing or from a few values (zeros, a broadcast scalar: the model file would carry what
    one loop writes at run time), and not an empty result (TVM's runtime cannot load an empty constant:
    "Invalid DLTensor file format")."""
    import tvm
    from tvm import relax

    fields = list(call.ty.fields) if isinstance(call.ty, relax.TupleType) else [call.ty]
    out_bytes = 0
    for field in fields:
        shape = getattr(getattr(field, "shape", None), "values", None)
        if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            return False
        elements = 1
        for d in shape:
            elements *= int(d.value)
        if elements == 0:
            return False
        dtype = tvm.runtime.DataType(str(field.dtype))
        out_bytes += elements * ((dtype.bits * dtype.lanes + 7) // 8)
    in_bytes = sum(int(a.numpy().nbytes) for a in args)
    return bool(args) and worth_storing(out_bytes, in_bytes)


#: LLVM intrinsics of one instruction set: this machine's LLVM cannot lower them for a plain x86 target
TARGET_INTRINSICS = ("llvm.x86.", "llvm.aarch64.", "llvm.arm.")


def runs_here(func) -> bool:
    """Whether this machine's LLVM can run ``func``: not where its schedule calls an instruction of the
    target's own (a dot product tensorized for aarch64's ``sdot`` or AVX-512 VNNI, folded on a plain x86
    target: "LLVM ERROR: Do not know how to split the result of this operator", which ends the process)."""
    import tvm
    import tvm_ffi
    from tvm.target import codegen

    specific = []

    def visit(call):
        if call.op.name in ("tirx.call_llvm_pure_intrin", "tirx.call_llvm_intrin") and call.args \
                and isinstance(call.args[0], tvm.tirx.IntImm) \
                and codegen.llvm_get_intrinsic_name(int(call.args[0].value)).startswith(TARGET_INTRINSICS):
            specific.append(call)

    tvm_ffi.structural_walk(func.body, [(tvm.ir.Call, visit)])
    return not specific


def fold_constant_calls():
    """A module pass: every ``call_tir`` whose arguments are all constants becomes its result."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    call_tir = tvm.ir.Op.get("relax.call_tir")

    def constant_calls(mod) -> list[tuple[relax.Call, list]]:
        """Calls whose arguments are constants, directly or through bindings, with those constants.
        (Kernels of the same shapes share one function: calls, not functions, are folded.)"""
        found = []
        runnable: dict = {}  # kernel -> runs_here(it), each kernel walked once
        for _gvar, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            known: dict = {}  # var -> a tensor or a list of tensors

            def resolve(expr):
                if isinstance(expr, tvm.ir.expr.Constant) and hasattr(expr.value, "numpy"):
                    return expr.value
                if isinstance(expr, relax.Var):
                    return known.get(expr)
                if isinstance(expr, relax.Tuple):
                    fields = [resolve(f) for f in expr.fields]
                    return fields if all(f is not None and not isinstance(f, list) for f in fields) else None
                if isinstance(expr, relax.TupleGetItem):
                    whole = resolve(expr.tuple_value)
                    return whole[expr.index] if isinstance(whole, list) else None
                return None

            for block in func.body.blocks:
                for binding in block.bindings:
                    value = binding.value
                    if isinstance(value, relax.Call) and value.op.same_as(call_tir) \
                            and isinstance(value.args[0], tvm.ir.GlobalVar):
                        args = resolve(value.args[1])
                        kernel = value.args[0]
                        if kernel not in runnable:
                            runnable[kernel] = runs_here(mod[kernel]) and UNFOLDED not in (mod[kernel].attrs or {})
                        if args is not None and worth_folding(value, args) and runnable[kernel]:
                            found.append((value, args))
                        continue
                    resolved = resolve(value)
                    if resolved is not None:
                        known[binding.var] = resolved
        return found

    def evaluate(mod, calls: list[tuple[relax.Call, list]]) -> list[tuple[relax.Call, list]]:
        names = {call.args[0].name_hint for call, _args in calls}
        funcs = {name: mod[name].with_attr("global_symbol", name) for name in names}
        # a shared library, not LLVM's JIT: the JIT compiles each function on its first lookup (~8 ms each)
        with tempfile.TemporaryDirectory(prefix="edgepack-fold-") as tmp:
            path = f"{tmp}/fold.so"
            # copies and casts run once: LLVM need not optimise them
            tvm.compile(tvm.IRModule(funcs), target=tvm.target.Target({"kind": "llvm", "opt-level": 0})).export_library(path)
            library = tvm.runtime.load_module(path)
        device = tvm.cpu(0)
        results = []
        for call, args in calls:
            name = call.args[0].name_hint
            out_types = call.ty
            fields = list(out_types.fields) if isinstance(out_types, relax.TupleType) else [out_types]
            outputs = [tvm.runtime.empty([int(d) for d in t.shape.values], t.dtype, device) for t in fields]
            library[name](*args, *outputs)
            results.append((call, outputs))
        return results

    @mutator
    class _Replace(PyExprMutator):
        def __init__(self, mod, results):
            super().__init__(mod)
            self.results = results

        def visit_call_(self, call):
            for folded, tensors in self.results:
                if folded.same_as(call):
                    constants = [relax.const(t) for t in tensors]
                    return relax.Tuple(constants) if isinstance(call.ty, relax.TupleType) else constants[0]
            return super().visit_call_(call)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackFoldConstantCalls")
    def _fold(mod, _ctx):
        for _round in range(MAX_ROUNDS):
            calls = constant_calls(mod)
            if not calls:
                break
            replace = _Replace(mod, evaluate(mod, calls))
            for gvar, func in mod.functions_items():
                if isinstance(func, relax.Function):
                    replace.builder_.update_func(gvar, replace.visit_expr(func))
            mod = replace.builder_.get()
        # not TVM's FoldConstant after it: it would fold what worth_folding() leaves (zeros of an empty
        # shape made a constant the runtime cannot load)
        return relax.transform.DeadCodeElimination()(mod)

    return _fold
