"""What the commands print: tables without empty header rows, dimensions that are all named still shown."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli


def _onnx_with_named_dims(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_inspect_shows_the_names_of_dynamic_dimensions(tmp_path):
    """Rich took ``[batch, seq]`` for markup and printed only `` (dynamic)``."""
    model = _onnx_with_named_dims(tmp_path / "named.onnx")
    out = run_cli("inspect", str(model), check=True).stdout
    assert "[batch, seq] (dynamic)" in " ".join(out.split())


def test_compile_summary_has_no_empty_header_row(tmp_path):
    model = _onnx_with_named_dims(tmp_path / "named.onnx")
    result = run_cli("compile", str(model), "--profile", "host", "-o", str(tmp_path / "b"), "--input-shape",
                     "x:2,3", check=True)
    table = result.stdout[result.stdout.index("Compiled named.onnx"):]
    assert "┃" not in table  # rich draws header rows with heavy lines; a label/value table has none
    assert "input" in table and "x float32 [2, 3]" in " ".join(table.split())
