"""The GPU pipeline's passes that finish the placement (``placement.py``) on the legalised program.

- ``legalized_on_cpu`` (right after ``LegalizeOps``): the CPU kernels' operands copied to the CPU (constants, and
  any value the GPU computed that reached them without a copy), and the constant-only kernels only the CPU reads
  moved there.
- ``cpu_functions`` (right after ``FuseTIR``, which drops the ``target`` ``LegalizeOps`` gave each kernel of a
  CPU binding): every kernel whose result lives on the CPU gets the CPU target again, so TVM compiles it as
  host code and dlight's GPU rules leave it alone.
- ``unscheduled_to_cpu`` (right after the GPU schedules): a kernel no rule took runs on the CPU, its operands
  copied there and its results back.
"""

from __future__ import annotations

from edgepack.backends.placement import vdevices
from edgepack.backends.relax_exprs import has_tensor, on_cpu, vdevice_of
from edgepack.frontends.types import is_serial_kernel


def _name(expr) -> str:
    from tvm import relax

    return expr.name if isinstance(expr, relax.Var) else "const"


def cpu_functions():
    """A pass (after ``FuseTIR``): every kernel a Relax function calls with its result on a CPU virtual
    device gets that device's target, which ``FuseTIR`` dropped."""
    import tvm
    import tvm_ffi
    from tvm import relax, tirx

    @tvm.transform.module_pass(opt_level=0, name="edgepack_cpu_functions")
    def _pass(mod, _ctx):
        targets: dict = {}

        def visit(call):
            if call.op.same_as(tvm.ir.Op.get("relax.call_tir")) and on_cpu(call):
                targets[call.args[0]] = vdevice_of(call).target

        for _gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                tvm_ffi.structural_walk(func.body, [(relax.Call, visit)], order="pre")
        for gvar, target in targets.items():
            func = mod[gvar]
            if isinstance(func, tirx.PrimFunc):
                mod[gvar] = func.with_attr("target", target)
        return mod

    return _pass


def legalized_on_cpu():
    """A pass right after ``LegalizeOps``: what the kernels of operators placed on the CPU need there.

    - Their constant operands are copied to the CPU (``place_on_cpu`` leaves constants as they are: a
      legaliser may read one's value, as TVM's NMS does its maximum box count), as is any operand the GPU
      computed that reached them without a copy (a pass after the placement made it: Vulkan's bool widening
      casts a bool constant back to bool right before its reader).
    - A kernel of no operand but constants (a constant begin or stride TVM's legalisation of NMS makes for a
      slice; that cast of a constant) whose results only the CPU reads runs on the CPU; it was left without a
      device, on the GPU, where WGSL cannot even hold its int64 or bool."""
    import tvm
    import tvm_ffi
    from tvm import relax

    call_tir, to_vdevice = tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.to_vdevice")

    def sources(func) -> set:
        made, readers = {}, {}
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Call) and value.op.same_as(call_tir) \
                        and isinstance(value.ty, relax.TensorType) and value.ty.vdevice is None \
                        and all(isinstance(a, tvm.ir.GenericConst) for a in value.args[1].fields
                                if has_tensor(a)):
                    made[binding.var] = value
                users: list = []
                tvm_ffi.structural_walk(value, [(relax.Var, users.append)])
                for used in users:
                    readers.setdefault(used, []).append(on_cpu(binding.var))
        return {call for var, call in made.items() if readers.get(var) and all(readers[var])}

    @relax.expr_functor.mutator
    class _Move(relax.PyExprMutator):
        def __init__(self, mod, moved, cpu):
            super().__init__(mod)
            self.moved, self.cpu = moved, cpu

        def copied(self, arg):
            """``arg`` on the CPU: a constant, or a value the GPU computed (no device: the GPU's), copied."""
            if isinstance(arg, relax.Tuple):
                return relax.Tuple([self.copied(f) for f in arg.fields])
            if isinstance(arg, (tvm.ir.GenericConst, relax.Var)) and isinstance(getattr(arg, "ty", None),
                                                                             relax.TensorType) and not on_cpu(arg):
                return self.builder_.emit(relax.op.to_vdevice(arg, self.cpu), name_hint=f"{_name(arg)}_cpu")
            return arg

        def visit_call_(self, call):
            moved = any(call.same_as(m) for m in self.moved)
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op) or call.op.same_as(to_vdevice) or not (moved or on_cpu(call)):
                return call
            ty_args = [relax.TensorType(call.ty.shape, call.ty.dtype, self.cpu)] if moved else \
                (list(call.ty_args) if call.ty_args else None)
            return relax.Call(call.op, [self.copied(a) for a in call.args], call.attrs, ty_args)

    @tvm.transform.module_pass(opt_level=0, name="edgepack_legalized_on_cpu")
    def _pass(mod, _ctx):
        infos = mod.global_infos.get("vdevice") if mod.global_infos is not None else None
        if infos is None or len(infos) != 2:
            return mod  # nothing placed
        move = _Move(mod, set(), infos[1])
        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                move.moved = sources(func)
                move.builder_.update_func(gvar, move.visit_expr(func))
        return move.builder_.get()

    return _pass


def unscheduled_to_cpu(record: dict[str, str], target, cpu_rule: str, serial_rule: str):
    """A pass right after the GPU schedules: each kernel no rule scheduled (``record``: "none") runs on
    ``target.host`` instead, as TVM's plain loops, its operands copied to the CPU and its results back to the GPU;
    ``record`` then says ``cpu_rule`` for it, or ``serial_rule`` for a kernel the importer marked serial
    (``is_serial_kernel``: no rule is tried on those). (TVM would compile it as host code handed the GPU's
    buffers.) Other such kernels are rare: edgepack's tests make one from an opaque block."""
    import tvm
    from tvm import relax, tirx

    @relax.expr_functor.mutator
    class _Calls(relax.PyExprMutator):
        def __init__(self, mod, moved, gpu, cpu):
            super().__init__(mod)
            self.moved, self.gpu, self.cpu = moved, gpu, cpu

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not call.op.same_as(tvm.ir.Op.get("relax.call_tir")) or call.args[0] not in self.moved:
                return call
            to_cpu = [self.builder_.emit(relax.op.to_vdevice(a, self.cpu))
                      if isinstance(getattr(a, "ty", None), relax.TensorType) else a for a in call.args[1].fields]
            outs = call.ty.fields if isinstance(call.ty, relax.TupleType) else [call.ty]
            on_cpu_ty = [relax.TensorType(t.shape, t.dtype, self.cpu) for t in outs]
            result = self.builder_.emit(relax.call_tir(call.args[0], relax.Tuple(to_cpu),
                                                       on_cpu_ty if len(outs) > 1 else on_cpu_ty[0]))
            if len(outs) == 1:
                return relax.op.to_vdevice(result, self.gpu)
            return relax.Tuple([self.builder_.emit(relax.op.to_vdevice(relax.TupleGetItem(result, i), self.gpu))
                                for i in range(len(outs))])

    @tvm.transform.module_pass(opt_level=0, name="edgepack_unscheduled_to_cpu")
    def _pass(mod, _ctx):
        moved = [g for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and record.get(g.name_hint) == "none"]
        if not moved:
            return mod
        gpu, cpu = vdevices(mod, target)
        for gvar in moved:
            record[gvar.name_hint] = serial_rule if is_serial_kernel(mod[gvar]) else cpu_rule
            mod[gvar] = mod[gvar].with_attr("target", target.host)
        calls = _Calls(mod, moved, gpu, cpu)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                calls.builder_.update_func(gvar, calls.visit_expr(func))
        return calls.builder_.get()

    return _pass
