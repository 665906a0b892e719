"""ONNX ``If`` nodes in the compiled program (``frontends/onnx_ops/if_arms.py``): one the static shapes decide is
its taken arm's bindings, with no ``If`` left (Silero VAD's ten, which stopped ``--precision fp16``); one
decided at run time keeps both arms and selects by its input's data."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgepack.compiling import compile_model
from edgepack.frontends.importer import import_model
from edgepack.validation import validate


def _ifs(mod) -> int:
    import tvm_ffi
    from tvm import relax

    found: list = []
    for _gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func.body, [(relax.If, found.append)], order="pre")
    return len(found)


def test_ifs_the_shapes_decide_leave_no_if_and_convert_to_fp16(models):
    from edgepack.backends.half_precision import half_precision

    silero = models["silero_vad"]
    imported = import_model(silero.path, silero.input_shapes, {})
    assert _ifs(imported.mod) == 0
    half = half_precision(imported.mod, "float32", "silero_vad.onnx")  # refused before: inside the Ifs
    assert "float16" in half["main"].script(show_meta=False)


def _runtime_if_model(path):
    """y = If(sum(x) > 0) then relu(x @ w) else -(x @ w): the branch depends on the input's data."""
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    then = helper.make_graph([helper.make_node("Relu", ["xw"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 8])])
    other = helper.make_graph([helper.make_node("Neg", ["xw"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 8])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "runtime_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(0), "zero")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


@pytest.mark.parametrize(("profile", "on"), [("host", "host"), ("rpi4", "emulator")])
def test_an_if_decided_at_run_time_keeps_both_arms(tmp_path, profile, on):
    model = _runtime_if_model(tmp_path / "if.onnx")
    assert _ifs(import_model(model, {}, {}).mod) == 1
    build = compile_model(model, profile, tmp_path / profile).output_dir
    for sign in (1, -1):  # each arm taken once, against ONNX Runtime
        x = sign * np.abs(np.random.default_rng(1).standard_normal((1, 16))).astype(np.float32)
        np.savez(tmp_path / "x.npz", x=x)
        report = validate(build, on, inputs=tmp_path / "x.npz")
        assert report.passed, report.to_dict()
