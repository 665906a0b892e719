"""Operators of a GPU build that run on the device's CPU, inside the same program (Relax virtual devices).

A GPU target cannot run everything a model holds exactly: WGSL has no 64-bit integers (a value the int64
pass cannot narrow, ``backends/int64``) nor floats, Mali's and Adreno's OpenCL no 64-bit floats
(``dtype_bindings``), TVM's scan kernels are wrong in WGSL (``gpu_scans.py``), TVM computes data-dependent
shapes (NonZero, Unique) with runtime functions that read host memory (``operator_bindings``), and a kernel may
get no GPU schedule at all. ONNX Runtime's execution providers and LiteRT's GPU delegate run such operators on
the CPU; so does edgepack:

- ``place_on_cpu(mod, where, target)`` gives the module two virtual devices (``vdevices``), the GPU (index 0,
  where the VM puts the inputs, the constants and everything not named) and the device's CPU (index 1:
  ``target.host``, the CPU the VM already runs on), and moves the bindings named in ``where``
  (``{variable: why}``) to the CPU. Each value crossing between them is copied once
  (``R.to_vdevice``: ``vm.builtin.to_device``); a model output stays where it is computed, a binding that
  computes nothing (a tuple's field, a ``match_cast``) where its value is, a constant where it is (copied
  after legalisation).
- ``cone(func, names)``: the bindings a value needs to be computed exactly on the CPU, its 64-bit integer
  operands' producers back to the inputs (``vulkan.py`` places those of each int64 tensor it cannot narrow);
  ``readers``/``writers``: what must follow a value WGSL cannot store across the boundary.
- The pipeline's passes on the legalised program finish the work (``placed_kernels.py``).

The C API, the AAR and the RPC server already start the VM on (GPU, CPU), in that order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgepack.backends.int64.rebuild import Rebuild
from edgepack.backends.relax_exprs import dtype_of, has_tensor, on_cpu

#: the attribute of a placed function: {variable: why} of its bindings on the CPU, for the build's report
PLACED_ATTR = "edgepack.cpu_bindings"
_WIDE = ("int64", "uint64", "float64")


def placed(func) -> dict[str, str]:
    """``{variable: why}`` of the bindings ``place_on_cpu`` moved to the CPU in ``func``."""
    if func.attrs is None or PLACED_ATTR not in func.attrs:
        return {}
    return {str(k): str(v) for k, v in func.attrs[PLACED_ATTR].items()}


def _operand_fields(value) -> list:
    """The operands of a binding's value (a call's arguments; anything else itself), tuples flattened a level."""
    from tvm import relax

    operands = list(value.args) if isinstance(value, relax.Call) else [value]
    return [f for a in operands for f in (a.fields if isinstance(a, relax.Tuple) else [a])]


def top_level(func) -> dict[str, Any]:
    """The bindings of ``func`` outside If arms, by variable name (names repeated: the first)."""
    found: dict[str, Any] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            found.setdefault(binding.var.name, binding)
    return found


def cone(func, names: set[str]) -> set[str] | None:
    """The bindings that compute ``names`` with every 64-bit operand exact: each named binding and,
    through the operands that are 64-bit tensors (or tuples of them), their producers, back to the
    inputs and constants. None where one of them is inside an If arm (a CPU binding must be top-level)
    or is an operator of no tensor (as a Range of run-time bounds; those of constant bounds are folded first)."""
    from tvm import relax

    bindings = top_level(func)
    todo, found = list(names), set()
    while todo:
        name = todo.pop()
        if name in found:
            continue
        binding = bindings.get(name)
        if binding is None:
            if name in {p.name for p in func.params}:
                continue
            return None
        found.add(name)
        value = binding.value
        if isinstance(value, relax.If):
            return None
        if isinstance(value, relax.Call) and not any(has_tensor(a) for a in value.args):
            return None  # an operator of no tensor (arange, full of a run-time shape) has no device to follow
        operands = list(value.args) if isinstance(value, relax.Call) else [value]
        for a in operands:
            fields = a.fields if isinstance(a, relax.Tuple) else [a]
            for f in fields:
                f = f.tuple_value if isinstance(f, relax.TupleGetItem) else f
                if isinstance(f, relax.Var) and _is_wide(f):
                    todo.append(f.name)
    return found


def readers(func, where: dict[str, str], dtypes: tuple[str, ...], why: str) -> dict[str, str]:
    """``where`` with, again and again, each top-level binding that reads a value of ``dtypes`` which a binding of
    ``where`` computes: a GPU that cannot store such a tensor (WGSL: bool, 8- and 16-bit) gets none from the
    CPU, its readers run there too."""
    from tvm import relax

    where = dict(where)
    changed = True
    while changed:
        changed = False
        for name, binding in top_level(func).items():
            if name in where:
                continue
            if any(isinstance(f, relax.Var) and f.name in where and any(_has_dtype(f, d) for d in dtypes)
                   for f in _operand_fields(binding.value)):
                where[name] = why
                changed = True
    return where


def writers(func, where: dict[str, str], dtypes: tuple[str, ...], why: str) -> dict[str, str]:
    """``where`` with, again and again, the top-level binding that computes each value of ``dtypes`` a binding
    of ``where`` reads: a GPU that cannot store such a tensor (WGSL: bool, 8- and 16-bit) hands none to the
    CPU, its producers run there too (a comparison whose mask NonZero reads)."""
    from tvm import relax

    where = dict(where)
    bindings = top_level(func)
    todo = list(where)
    while todo:
        binding = bindings.get(todo.pop())
        if binding is None:
            continue
        for f in _operand_fields(binding.value):
            if isinstance(f, relax.Var) and f.name in bindings and f.name not in where \
                    and any(_has_dtype(f, d) for d in dtypes):
                where[f.name] = why
                todo.append(f.name)
    return where


def dtype_bindings(mod, dtype: str, why: str) -> dict[str, str]:
    """``{variable: why}`` of the bindings of ``mod``'s ``main`` (outside If arms) that compute, read or make
    a tensor of ``dtype`` ("float64": a GPU without 64-bit floats; "uint64": WGSL)."""
    from tvm import relax

    found = {}
    for name, binding in top_level(mod["main"]).items():
        value = binding.value
        operands = list(value.args) if isinstance(value, relax.Call) else []
        fields = [f for a in operands for f in (a.fields if isinstance(a, relax.Tuple) else [a])]
        if any(_has_dtype(e, dtype) for e in [binding.var, *fields]):
            found[name] = why
    return found


#: operators whose result's shape depends on the values: TVM runs them as runtime functions on the CPU
#: ("relax.run.nonzero", "relax.run.unique"; the C API has its own), which read their operand as host memory
DATA_DEPENDENT = ("relax.nonzero", "relax.unique")


def operator_bindings(mod, ops: tuple[str, ...], why: str) -> dict[str, str]:
    """``{variable: why}`` of the bindings of ``mod``'s ``main`` (outside If arms) that call one of ``ops``,
    directly or inside the ``match_cast`` that names a data-dependent shape."""
    import tvm
    from tvm import relax

    found = {}
    for name, binding in top_level(mod["main"]).items():
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ops:
            found[name] = why
    return found


def _has_dtype(expr, dtype: str) -> bool:
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TupleType):
        return any(str(getattr(t, "dtype", "")) == dtype for t in ty.fields)
    return dtype_of(expr) == dtype


def _is_wide(expr) -> bool:
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TupleType):
        return any(_is_wide_info(t) for t in ty.fields)
    return dtype_of(expr) in _WIDE


def _is_wide_info(info) -> bool:
    return str(getattr(info, "dtype", "")) in _WIDE


class _Placer(Rebuild):
    """Re-emit a function with the bindings named in ``where`` on ``cpu`` and every operand copied to the
    device of the binding that reads it."""

    def __init__(self, mod, where: Mapping[str, str], gpu, cpu):
        super().__init__(mod)
        self.where, self.gpu, self.cpu = where, gpu, cpu
        self.copies: dict = {}  # (new var, "cpu"|"gpu") -> its copy there
        #: where each new variable is computed ("cpu", "gpu"; the inputs are on the GPU)
        self.sides: dict = {}

    def device(self, expr) -> str:
        return self.sides.get(expr, "cpu" if on_cpu(expr) else "gpu")

    def on(self, expr, side: str):
        """``expr`` (an operand, mapped) on ``side``: a copy where it lives elsewhere."""
        import tvm
        from tvm import relax

        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.on(f, side) for f in expr.fields])
        new = self.map(expr)
        is_tensor = isinstance(getattr(new, "ty", None), relax.TensorType)
        if not is_tensor or not isinstance(new, (relax.Var, tvm.ir.GenericConst)):
            return new
        if isinstance(new, tvm.ir.GenericConst):
            # constants live on the VM's first device; a legalised CPU kernel's are copied after LegalizeOps
            # (``legalized_on_cpu``): an operator may read one at compile time (NMS's maximum box count)
            return new
        if isinstance(new, relax.Var) and self.device(new) == side:
            return new
        key = (new, side)
        if key not in self.copies:
            target = self.cpu if side == "cpu" else self.gpu
            name = f"{new.name}_{side}" if isinstance(new, relax.Var) else f"const_{side}"
            self.copies[key] = self.bb.emit(relax.op.to_vdevice(new, target), name_hint=name)
            self.sides[self.copies[key]] = side
        return self.copies[key]

    def binding(self, binding) -> None:
        from tvm import relax

        var, value = binding.var, binding.value
        side = "cpu" if var.name in self.where else "gpu"
        if isinstance(binding, relax.MatchCast):  # of a call, as a data-dependent shape is named: its operands move
            if isinstance(value, relax.Call):
                value = self._call(value, side)
            else:  # computes nothing: stays where its value is (a field of a tuple the CPU made)
                value = self.map(value)
                side = self.where_is(value)
            ty = binding.ty  # with the side's device: RealizeVDevice leaves a match_cast's type as it is
            if isinstance(ty, relax.TensorType) and ty.vdevice is None:
                ty = relax.TensorType(ty.shape, ty.dtype, self.cpu if side == "cpu" else self.gpu,
                                       -1 if ty.shape is not None else ty.ndim)
            self.vmap[var] = self.bb.match_cast(value, ty, name_hint=var.name)
            self.sides[self.vmap[var]] = side
            return
        if isinstance(value, relax.If):
            new = relax.If(self.on(value.cond, "gpu"), self.arm(value.true_branch), self.arm(value.false_branch))
        elif isinstance(value, relax.Call):
            new = self._call(value, side)
        elif isinstance(value, relax.Tuple):
            new = relax.Tuple([self.on(f, side) for f in value.fields])
        else:  # a field of a tuple, a variable: computes nothing, stays where its value is
            new = self.map(value)
            side = self.where_is(new)
        self.vmap[var] = self.emit(new, like=var)
        self.sides[self.vmap[var]] = side


    def where_is(self, expr) -> str:
        """The side of a value that computes nothing: a variable's, a tuple field's tuple's."""
        from tvm import relax

        return self.device(expr.tuple_value if isinstance(expr, relax.TupleGetItem) else expr)

    def _call(self, call, side: str):
        from tvm import relax

        return relax.Call(call.op, [self.on(a, side) for a in call.args], call.attrs,
                          list(call.ty_args) if call.ty_args else None)


def place_on_cpu(mod, where: Mapping[str, str], target):
    """``mod`` (a Relax IRModule before legalisation) with the bindings of its ``main`` named in ``where``
    (``{variable: why}``, top-level bindings) running on ``target.host``, the rest on ``target``."""
    from tvm import relax

    out = mod.clone()
    gpu, cpu = vdevices(out, target)
    for gvar, func in list(out.functions_items()):
        if not isinstance(func, relax.Function) or gvar.name_hint != "main":
            continue
        out, new = _Placer(out, where, gpu, cpu).run_function(func)
        new = new.with_attr(PLACED_ATTR, {k: v for k, v in where.items()})
        out.update_func(gvar, new)
    return relax.transform.RealizeVDevice()(out)


def _without_host(target):
    import tvm

    data = dict(target.export())
    data.pop("host", None)
    return tvm.target.Target(data)


def vdevices(mod, target):
    """The (GPU, CPU) virtual devices of ``mod``, added (in that order: the VM's devices) where it has none
    (``mod`` changed in place)."""
    from tvm import relax

    infos = mod.global_infos.get("vdevice") if mod.global_infos is not None else None
    if infos is not None and len(infos) == 2:
        return infos[0], infos[1]
    gpu, cpu = relax.VDevice(_without_host(target), 0, "global"), relax.VDevice(target.host, 0, "global")
    mod.update_global_info("vdevice", [gpu, cpu])
    return gpu, cpu


def cpu_bindings(mod) -> dict[str, str]:
    """``{variable: why}`` of every Relax function of ``mod`` placed on the CPU."""
    from tvm import relax

    found: dict[str, str] = {}
    for _gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            found.update(placed(func))
    return found


__all__ = [
    "DATA_DEPENDENT",
    "PLACED_ATTR",
    "cone",
    "cpu_bindings",
    "dtype_bindings",
    "operator_bindings",
    "place_on_cpu",
    "placed",
    "readers",
    "vdevices",
    "writers",
]
