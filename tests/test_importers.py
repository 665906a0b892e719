
import pytest
from model_factory import onnx_with_unsupported_ops, tflite_with_custom_op

from edgepack.errors import ModelError, ShapeError
from edgepack.frontends import detect_format, import_model, inspect_model, parse_input_shapes


def test_inspect_reads_real_models(models):
    cls = inspect_model(models["ppocr_cls"].path)
    assert cls.format == "onnx" and [t.name for t in cls.inputs] == ["x"]
    assert cls.inputs[0].dynamic_dims == [0, 2, 3] and cls.operator_counts["Conv"] == 53
    assert not cls.unsupported_operators

    face = inspect_model(models["face_detection_short_range"].path)
    assert face.format == "tflite"
    assert [(t.name, t.shape) for t in face.inputs] == [("input", (1, 128, 128, 3))]
    assert [t.name for t in face.outputs] == ["regressors", "classificators"]
    assert face.operator_counts["DEQUANTIZE"] == 74

    resnet = inspect_model(models["light_resnet50"].path)
    # old ONNX IR: weights are listed as graph inputs too; only the real input is an input
    assert [t.name for t in resnet.inputs] == ["gpu_0/data_0"]


def test_format_is_detected_by_content(models, tmp_path):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(models["face_detection_short_range"].path.read_bytes())
    assert detect_format(renamed) == "tflite"


@pytest.mark.parametrize("make", ["truncated-onnx", "truncated-tflite", "random", "text", "empty", "missing"])
def test_corrupt_files_are_clear_model_errors(models, tmp_path, make):
    path = tmp_path / "bad"
    if make == "truncated-onnx":
        path.write_bytes(models["ppocr_cls"].path.read_bytes()[:100_000])
    elif make == "truncated-tflite":
        path.write_bytes(models["face_detection_short_range"].path.read_bytes()[:50_000])
    elif make == "random":
        path.write_bytes(bytes(range(7, 250)) * 10)
    elif make == "text":
        path.write_text("not a model")
    elif make == "empty":
        path.write_bytes(b"")
    with pytest.raises(ModelError) as err:
        inspect_model(path)
    assert err.value.hint


def test_unsupported_onnx_operators_are_listed_with_counts(tmp_path):
    info = inspect_model(onnx_with_unsupported_ops(tmp_path / "u.onnx"))
    assert info.unsupported_operators == {"com.example.FancyNorm": 2}
    with pytest.raises(ModelError, match=r"com.example.FancyNorm \(x2\)"):
        import_model(info.path)


def test_tflite_custom_ops_are_listed(tmp_path):
    info = inspect_model(tflite_with_custom_op(tmp_path / "c.tflite", "TFLite_Detection_PostProcess"))
    assert info.unsupported_operators == {"CUSTOM:TFLite_Detection_PostProcess": 1}
    with pytest.raises(ModelError, match="CUSTOM:TFLite_Detection_PostProcess"):
        import_model(info.path)


def test_dynamic_dims_need_input_shape(models):
    with pytest.raises(ShapeError) as err:
        import_model(models["ppocr_cls"].path)
    assert "x [?0, 3, ?, ?]" in err.value.message and "--input-shape x:1,3,1,1" in err.value.hint
    imported = import_model(models["ppocr_cls"].path, {"x": (1, 3, 48, 192)})
    assert imported.inputs[0].shape == (1, 3, 48, 192)


@pytest.mark.parametrize("shapes, match", [
    ({"y": (1, 3, 48, 192)}, "does not have"),
    ({"x": (1, 3, 48)}, "rank 4"),
    ({"x": (1, 4, 48, 192)}, "fixed dimension 1 of 3"),
])
def test_wrong_input_shapes_are_explained(models, shapes, match):
    with pytest.raises(ShapeError, match=match):
        import_model(models["ppocr_cls"].path, shapes)


@pytest.mark.parametrize("text", ["x", "x:", "x:1,2a", ":1,2", "x:0,3", "x:1,W-1"])
def test_input_shape_syntax(text):
    with pytest.raises(ShapeError, match="Cannot read input shape"):
        parse_input_shapes([text])
    assert parse_input_shapes(["a/b:0:1,2"]) == {"a/b:0": (1, 2)}
    assert parse_input_shapes(["x:1,3,48,W"]) == {"x": (1, 3, 48, "W")}  # W: a --dim range


def test_inspect_reports_per_operator_support(models, tmp_path):
    import json

    from conftest import run_cli

    path = onnx_with_unsupported_ops(tmp_path / "u.onnx")
    data = json.loads(run_cli("inspect", str(path), "--json", check=True).stdout)
    assert data["operators"] == [{"name": "com.example.FancyNorm", "count": 2, "supported": False},
                                 {"name": "Relu", "count": 1, "supported": True}]
    assert data["support"] == {"operators": 2, "supported_operators": 1, "unsupported_operators": 1,
                               "nodes": 3, "supported_nodes": 1, "unsupported_nodes": 2}
    text = run_cli("inspect", str(path)).stdout
    assert "1 of 2 operator types supported (1 of 3 nodes)" in " ".join(text.split())

    # operators edgepack converts itself (TVM 0.27's frontend lacks them) count as supported
    sparse = inspect_model(models["face_detection_sparse"].path)
    assert not sparse.unsupported_operators and sparse.support_summary()["unsupported_nodes"] == 0
    from edgepack.frontends.onnx_ops import supported_operators

    assert {"Celu", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "If"} <= supported_operators()
