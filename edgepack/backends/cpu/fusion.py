"""Two fused functions of a Relax module merged into one, so that ``FuseTIR`` makes one kernel of them.

TVM's ``FuseOps`` never puts two convolutions in one kernel, nor an elementwise operator before a
convolution. The CPU backend's fusion passes (``fuse_depthwise.py``, ``fuse_scale.py``) run after it and
before ``FuseTIR``: they walk the model's calls in order and merge a producer, whose result exactly one
call reads, into that call where it reads the result as its convolution's data. What each pass
merges is its own choice (``merge_pairs``'s two classifiers); the walking, the merging and what they
need to know of a fused function's convolution are here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from edgepack.backends.cpu.schedules.anatomy import Anatomy, reduction_anatomy
from edgepack.errors import first_line

logger = logging.getLogger("edgepack.schedules")

#: What a classifier returns for a fused function it takes (anything but None; passed to ``keeps``).
Info = Any


def merge_pairs(mod, func, builder, producer: Callable[[Any, Any], Info | None],
                consumer: Callable[[Any, Any], Info | None],
                keeps: Callable[[Info, Info], bool] = lambda _p, _c: True) -> tuple[Any, int]:
    """``func`` with each producer/consumer pair of fused calls merged into one call, and how many.

    ``producer(mod, callee)`` / ``consumer(mod, callee)`` classify a called fused function (None: not
    one); a pair is a producer call whose result only the consumer call reads, as its convolution's
    data, and ``keeps(producer_info, consumer_info)``."""
    from tvm import relax

    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func, 0
    uses = use_counts(func)
    roles: dict[str, tuple[Info | None, Info | None]] = {}  # per fused function (called once per layer)
    blocks, count = [], 0
    for block in body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        producers: dict[Any, Any] = {}  # var -> (binding of a producer call, its info)
        kept: list[Any] = []
        for binding in block.bindings:
            value = binding.value if isinstance(binding, relax.VarBinding) else None
            callee = called_function(mod, value)
            if callee is not None and value.op.name_hint not in roles:
                roles[value.op.name_hint] = (producer(mod, callee), consumer(mod, callee))
            made, reads = roles[value.op.name_hint] if callee is not None else (None, None)
            if reads is not None:
                inputs = [a for a in value.args if isinstance(a, relax.Var) and a in producers]
                if len(inputs) == 1 and inputs[0].same_as(data_argument(callee, value)) \
                        and keeps(producers[inputs[0]][1], reads):
                    first = producers.pop(inputs[0])[0]
                    merged = _merge(mod, first, binding, builder)
                    if merged is not None:
                        kept = [b for b in kept if not b.same_as(first)]
                        kept.append(merged)
                        count += 1
                        continue
            if made is not None and uses.get(binding.var, 0) == 1:
                producers[binding.var] = (binding, made)
            kept.append(binding)
        blocks.append(relax.DataflowBlock(kept, block.span))
    if not count:
        return func, 0
    return relax.Function(func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span), count


def fusion_pass(name: str, what: str, fuse: Callable[[Any, Any, Any], tuple[Any, int]]):
    """A module pass applying ``fuse(mod, func, builder)`` to every Relax function that is not a fused
    one; on any failure the module is left as it was (a fusion is a speed choice)."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _pass(mod, _ctx):
        try:
            fused = 0
            builder = relax.BlockBuilder(mod)
            for gvar, func in list(mod.functions_items()):
                if isinstance(func, relax.Function) and not is_primitive(func):
                    func, count = fuse(mod, func, builder)
                    if count:
                        builder.update_func(gvar, func)
                        fused += count
            if not fused:
                return mod
            result = relax.transform.DeadCodeElimination()(builder.finalize())
        except Exception as exc:  # noqa: BLE001 - the kernels stay apart
            logger.info("%s: kept apart: %s", name, first_line(exc))
            return mod
        logger.info("%d %s", fused, what)
        return result

    return _pass


def is_primitive(func) -> bool:
    return bool(func.attrs and "Primitive" in func.attrs and int(func.attrs["Primitive"]))


def use_counts(func) -> dict[Any, int]:
    import tvm_ffi
    from tvm import relax

    counts: dict[Any, int] = {}

    def visit(var) -> None:
        counts[var] = counts.get(var, 0) + 1

    tvm_ffi.structural_walk(func.body, [(relax.Var, visit)], order="pre")
    for var in list(counts):  # a var's own binding is not a use
        counts[var] -= 1
    return counts


def called_function(mod, value):
    """The fused Relax function ``value`` calls, or None."""
    import tvm
    from tvm import relax

    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.GlobalVar):
        return None
    func = mod[value.op] if value.op in mod.get_global_vars() else None
    return func if isinstance(func, relax.Function) and is_primitive(func) else None


def kernel_calls(func) -> list[Any]:
    """The ``call_tir`` calls of a fused function, in order; empty where its body has another form."""
    from tvm import relax

    body = func.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return []
    values = [b.value for b in body.blocks[0].bindings]
    calls = [v for v in values if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.call_tir"]
    return calls if len(calls) == len(values) else []


def first_kernel(func):
    """The first ``call_tir`` of a fused function (FuseOps puts the convolution first), or None."""
    from tvm import relax

    body = func.body
    if not isinstance(body, relax.SeqExpr) or not body.blocks or not body.blocks[0].bindings:
        return None
    value = body.blocks[0].bindings[0].value
    if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_tir":
        return value
    return None


def data_argument(callee, call):
    """The argument of ``call`` that the fused function's first kernel (its convolution) reads first."""
    conv = first_kernel(callee)
    if conv is None or not conv.args[1].fields:
        return None
    data = conv.args[1].fields[0]
    for param, arg in zip(callee.params, call.args):
        if param.same_as(data):
            return arg
    return None


def kernel_anatomy(prim_func) -> Anatomy | None:
    from tvm import s_tir, tirx

    if not isinstance(prim_func, tirx.PrimFunc):
        return None
    try:
        return reduction_anatomy(s_tir.Schedule(prim_func))
    except Exception:  # noqa: BLE001 - not a kernel of this form
        return None


def _merge(mod, producer, consumer, builder):
    """One binding calling a new fused function: the producer's body, then the consumer's."""
    from tvm import relax

    first, second = called_function(mod, producer.value), called_function(mod, consumer.value)
    first = relax.utils.copy_with_new_vars(first)
    second = relax.utils.copy_with_new_vars(second)
    position = [i for i, a in enumerate(consumer.value.args) if a.same_as(producer.var)]
    if len(position) != 1 or len(first.body.blocks) != 1 or len(second.body.blocks) != 1:
        return None
    second, shared = _share_extents(first, second, producer.value.args, consumer.value.args)
    link = second.params[position[0]]
    dropped = [second.params[i] for i in shared]
    result = first.body.body
    second = second.bind_params({link: result})
    params = list(first.params) + [p for p in second.params if not any(p.same_as(d) for d in dropped)]
    args = list(producer.value.args) + [a for i, a in enumerate(consumer.value.args)
                                        if i != position[0] and i not in shared]
    bindings = list(first.body.blocks[0].bindings) + list(second.body.blocks[0].bindings)
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], second.body.body)
    merged = relax.Function(params, body, second.ret_ty, True, second.attrs)
    name = f"{producer.value.op.name_hint}_{consumer.value.op.name_hint.removeprefix('fused_')}"
    gvar = builder.add_func(merged, name)
    return relax.VarBinding(consumer.var, builder.normalize(relax.Call(gvar, args)))


def _share_extents(first, second, first_args, second_args) -> tuple[Any, set[int]]:
    """A ``--dim`` build's fused functions take the symbolic extents they use as a shape parameter
    (``R.Shape([W])``), each with its own copy of ``W``. Where both functions are given the same shape,
    the consumer's extents become the producer's and its shape parameter goes: merged with two, the
    kernel had two unrelated ``W`` and its buffers no longer agreed. Returns the consumer and the
    positions of its parameters to drop."""
    import tvm_ffi
    from tvm import relax, tirx

    mapping, shared = {}, set()
    for j, (param, arg) in enumerate(zip(second.params, second_args)):
        if not isinstance(param.ty, relax.ShapeType) or param.ty.values is None:
            continue
        for other, given in zip(first.params, first_args):
            if isinstance(other.ty, relax.ShapeType) and other.ty.values is not None \
                    and len(other.ty.values) == len(param.ty.values) and tvm_ffi.structural_equal(given, arg) \
                    and all(isinstance(v, tirx.Var) for v in param.ty.values):
                mapping.update(zip(param.ty.values, other.ty.values))
                shared.add(j)
                break
    return (second.bind_symbolic_vars(mapping) if mapping else second), shared
