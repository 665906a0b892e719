"""Libraries about the size of their model (issue 42): constants are stored once, and a constant made from a
few values (a broadcast, a fill, a tile) stays the computation that makes it, on every backend.

ONNX Runtime's constant folding at import, and TVM's FoldConstant in the GPU pipelines, stored such
results: a 2 KB model that adds a constant-filled 512 x 512 tensor to its input compiled to a 1 MiB
library (the issue's case: an 80 KB model, a 78 MB static runner)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gpu_common import plugin_with_a_device
from onnx import TensorProto, helper, numpy_helper

import edgepack
from edgepack.frontends.onnx import _fold_onnx_constants
from edgepack.tensors import TensorSpec
from edgepack.validation import validate

SHAPE = (1, 512, 512)


def _filled_model(path):
    """y = x + ConstantOfShape(0.5) * Expand(bias) + Tile(row): three tensors of 1 MiB made at import from
    2 KiB of weights (random bias and row: the output depends on them and on x)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(SHAPE, np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.standard_normal((1, 1, 512)).astype(np.float32), "row"),
             numpy_helper.from_array(np.array([1, 512, 1], np.int64), "repeats"),
             numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32).T.copy(), "weight_t")]
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["full"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
        helper.make_node("Expand", ["bias", "shape"], ["wide"]),
        helper.make_node("Mul", ["full", "wide"], ["scaled"]),
        helper.make_node("Tile", ["row", "repeats"], ["tiled"]),
        # a fold that is stored: a transposed weight is as large as the weight
        helper.make_node("Transpose", ["weight_t"], ["weight"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "weight"], ["projected"]),
        helper.make_node("Add", ["projected", "scaled"], ["sum"]),
        helper.make_node("Add", ["sum", "tiled"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "filled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_only_expansions_are_computed_again(tmp_path):
    """After ONNX Runtime's folding at import, the transposed weight (as large as its source) stays folded;
    the three expansions go back to the nodes that make them, from the original initializers."""
    model = onnx.load(str(_filled_model(tmp_path / "filled.onnx")))
    folded = _fold_onnx_constants(model, (TensorSpec("x", "float32", SHAPE),))
    stored = {t.name: numpy_helper.to_array(t).nbytes for t in folded.graph.initializer}
    assert stored.get("weight") == 512 * 512 * 4 and "weight_t" not in stored, stored
    assert max(n for name, n in stored.items() if name != "weight") <= 4096, stored
    computed = {n.op_type for n in folded.graph.node}
    assert {"ConstantOfShape", "Expand", "Tile", "Mul"} <= computed and "Transpose" not in computed, computed
    onnx.checker.check_model(folded)


@pytest.mark.parametrize(("profile", "place"), [("host", "host"), ("rpi4", "emulator"), ("mali-g610", "host-opencl"),
                                                ("vulkan-generic", "host-vulkan")])
def test_constant_filled_tensors_stay_computed(tmp_path, profile, place):
    if place == "host-opencl":
        plugin_with_a_device("opencl")
    if place == "host-vulkan":
        plugin_with_a_device("vulkan")
    model = _filled_model(tmp_path / "filled.onnx")
    build = edgepack.compile(model, profile, tmp_path / "build").output_dir
    library = edgepack.inspect(build).build.library
    weights = 512 * 4 * 2 + 512 * 512 * 4  # bias, row and the (transposed) projection
    assert library.constants.bytes <= weights + 1024, library.constants
    assert library.library_bytes < weights + 512 * 1024, library.library_bytes  # was weights + 3 MiB
    assert 512 * 512 * 4 <= library.run_memory <= 4 * 512 * 512 * 4, library.run_memory  # the output, fused
    report = validate(build, place)
    assert report.passed and not report.degenerate, report.to_dict()
