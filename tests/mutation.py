"""Deliberately wrong builds of a real model: the harness of the tests that show a validation can fail.

``wrong_build(model, profile, out, mutation)`` compiles the model for the profile the way edgepack does,
with one defect, and leaves beside it the *original* model, so that ``validate`` compares the wrong build
with the right reference:

- ``scale_weights``: one convolution's weights scaled by 1.1 (a wrong constant, e.g. a bad layout rewrite);
- ``zero_channel``: one output channel of a convolution zeroed (weights and bias: a dropped tile);
- ``loop_bound``: a reduction loop of one kernel one iteration short (a schedule's off-by-one), injected
  into the TIR pipeline every build of the compile goes through (device library and host library);
- ``drop_output``: libraries made from the model without its last output (the manifest still lists it);
- ``rename_output``: libraries made from the model with its first output named otherwise.

The model-level mutations take ONNX models whose weights are initializers or Constant nodes.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from edgepack.compiling import compile_model
from edgepack.manifest import read_manifest

MUTATIONS = ("scale_weights", "zero_channel", "loop_bound")  # wrong values of the right shapes
LIBRARY_MUTATIONS = ("drop_output", "rename_output")  # libraries that return other outputs


def _weight_tensor(model, name: str):
    for init in model.graph.initializer:
        if init.name == name:
            return init
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return next(a.t for a in node.attribute if a.name == "value")
    raise KeyError(f"no constant named {name!r}")


def mutate_onnx(source: Path, dest: Path, mutation: str, conv: int = 1, op: str = "Conv") -> Path:
    """``source`` with the ``conv``-th ``op`` node's weights scaled by 1.1 or its output channel 0 zeroed
    (weights and bias), without its last output, or with its first output renamed."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    if mutation == "drop_output":
        del model.graph.output[-1]
    elif mutation == "rename_output":
        old = model.graph.output[0].name
        for node in model.graph.node:
            node.output[:] = ["renamed_output" if o == old else o for o in node.output]
        model.graph.output[0].name = "renamed_output"
    else:
        node = [n for n in model.graph.node if n.op_type == op][conv]
        for i, index in enumerate((1, 2)[: len(node.input) - 1]):
            tensor = _weight_tensor(model, node.input[index])
            values = numpy_helper.to_array(tensor).copy()
            if mutation == "scale_weights":
                if i == 0:
                    values *= np.asarray(1.1, values.dtype)
            elif mutation == "zero_channel":
                if i == 0 and op == "ConvTranspose":  # weights [in, out / groups, kh, kw]
                    values[:, 0] = 0
                else:
                    values[0] = 0
            else:
                raise ValueError(mutation)
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    onnx.save(model, str(dest))
    return dest


def _reduction_loops(func) -> set:
    """The loop variables a reduction axis of some block of ``func`` is bound to."""
    import tvm_ffi
    from tvm import s_tir, tirx

    found: set = set()

    def var(value, _visitor):
        found.add(value)

    def realize(value, visitor):
        for iv, bound in zip(value.block.iter_vars, value.iter_values):
            if int(iv.iter_type) == 2:  # CommReduce
                tvm_ffi.structural_visit(bound, [(tirx.Var, var)])
        visitor.default_visit(value)

    tvm_ffi.structural_visit(func.body, [(s_tir.SBlockRealize, realize)])
    return found


def _one_short(func):
    """``func`` with its outermost serial reduction loop of constant extent > 1 one iteration short, or None."""
    import tvm_ffi
    from tvm import tirx

    reduction = _reduction_loops(func)
    done = []

    def shorten(loop):
        if done or loop.loop_var not in reduction or not isinstance(loop.extent, tirx.IntImm):
            return loop
        if int(loop.extent) < 2 or int(loop.kind) not in (0, 3):  # serial, unrolled
            return loop
        done.append(loop.loop_var.name)
        return tirx.For(loop.loop_var, loop.min, int(loop.extent) - 1, loop.kind, loop.body, loop.thread_binding,
                        loop.annotations)

    body = tvm_ffi.structural_map(func.body, [(tirx.For, shorten)], order="pre")
    return func.with_body(body) if done else None


def _loop_bound_pass(kernel: str, mutated: list[str]):
    """A module pass that shortens one reduction loop of the first kernel whose name contains ``kernel``
    (modules without one, e.g. those compiled to fold weights, pass unchanged); ``mutated`` records it."""
    import tvm
    from tvm import tirx

    @tvm.transform.module_pass(opt_level=0, name="tests.LoopBoundOffByOne")
    def mutate(mod, _ctx):
        for gv in sorted(mod.functions, key=lambda g: g.name_hint):
            func = mod[gv]
            if isinstance(func, tirx.PrimFunc) and kernel in gv.name_hint:
                shorter = _one_short(func)
                if shorter is not None:
                    mod[gv] = shorter
                    mutated.append(gv.name_hint)
                    return mod
        return mod

    return mutate


@contextmanager
def loop_bound_off_by_one(kernel: str = "conv2d"):
    """Every TIR pipeline TVM knows, with the mutation first, for as long as the block runs; yields the
    list of the kernels it shortened (one per TVM build)."""
    import tvm
    from tvm.tirx import compilation_pipeline

    from edgepack.backends import backends

    for backend in backends().values():
        backend.tir_pipeline()  # registered before they are wrapped
    mutated: list[str] = []
    mutate = _loop_bound_pass(kernel, mutated)

    def wrapped(factory):
        def pipeline(**kwargs):
            lower, finalize_host, finalize_device = factory(**kwargs)
            return tvm.transform.Sequential([mutate, lower]), finalize_host, finalize_device
        return pipeline

    with pytest.MonkeyPatch.context() as patch:
        for name, factory in list(compilation_pipeline.PIPELINE_MAP.items()):
            patch.setitem(compilation_pipeline.PIPELINE_MAP, name, wrapped(factory))
        yield mutated


def wrong_build(model_path: Path, profile: str, out: Path, mutation: str, *, input_shapes=None, conv: int = 1,
                op: str = "Conv", kernel: str = "conv2d", dims=None, precision: str | None = None) -> Path:
    """A build of ``model_path`` for ``profile`` in ``out`` with one defect (see the module docstring), the
    original model beside it as the reference."""
    if mutation == "loop_bound":
        with loop_bound_off_by_one(kernel) as mutated:
            compile_model(model_path, profile, out, input_shapes=input_shapes, dims=dims, precision=precision)
        assert mutated, f"no kernel named *{kernel}* had a reduction loop to shorten"
        return out
    mutated = mutate_onnx(model_path, out.parent / f"{out.name}.{mutation}.onnx", mutation, conv, op)
    if mutation in LIBRARY_MUTATIONS:  # the right manifest, the libraries of the other model
        compile_model(model_path, profile, out, input_shapes=input_shapes)
        other = compile_model(mutated, profile, out.parent / f"{out.name}.other", input_shapes=input_shapes)
        for artifact in ("host_library", "device_library"):
            path = read_manifest(out).artifacts[artifact].path
            shutil.copyfile(other.output_dir / path, out / path)
        shutil.rmtree(other.output_dir)
        return out
    compile_model(mutated, profile, out, input_shapes=input_shapes, dims=dims, precision=precision)
    shutil.copyfile(model_path, out / read_manifest(out).model_file)
    return out
