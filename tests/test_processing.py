"""Pre- and post-processing compiled into the model (edgepack.processing), on this machine: the settings
and their errors, the independent reference itself (NumPy NMS against ONNX Runtime's NonMaxSuppression),
and small real builds whose outputs show exactly what the compiled processing computes, compared with
the reference (ONNX Runtime pre-graph, NumPy post). The device paths (qemu, PoCL, lavapipe, C runner,
JVM) are in test_processing_devices.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from model_factory import onnx_detector, onnx_passthrough

from edgepack.compiling import compile_model
from edgepack.errors import ProcessingError
from edgepack.manifest import read_manifest
from edgepack.packaging.c_header import model_header
from edgepack.processing import (
    ImagePreprocess,
    manifest_plan,
    random_frames,
    run_processed_reference,
    NmsPostprocess,
    OutputPostprocess,
    ProcessingPlan,
    encode_frame,
    parse_postprocess,
    parse_preprocess,
    plan_processing,
    processed_model,
    synthetic_picture,
)
from edgepack.processing.reference import ReferenceRun, nms_select, preprocess
from edgepack.tensors import TensorSpec
from edgepack.validation import validate

IMAGE_NCHW = (TensorSpec("input", "float32", (1, 3, 224, 224)),)
LOGITS = (TensorSpec("logits", "float32", (1, 1000)),)
DETECTOR = (TensorSpec("boxes", "float32", (1, 64, 4)), TensorSpec("scores", "float32", (1, 64, 3)))


def _plan(pre=(), post=(), inputs=IMAGE_NCHW, outputs=LOGITS) -> ProcessingPlan:
    return plan_processing(parse_preprocess(list(pre)), parse_postprocess(list(post)), inputs, outputs)


# ----------------------------------------------------------------------------------------------
# settings


def test_the_issue_example_parses_resolves_and_round_trips():
    spec = "input=image:bgr8,size=480x640,resize=bilinear,mean=123.7/116.3/103.5,std=58.4/57.1/57.4"
    (pre,) = parse_preprocess(spec)
    assert pre == ImagePreprocess("input", "bgr8", (480, 640), "bilinear", (123.7, 116.3, 103.5), (58.4, 57.1, 57.4))
    assert pre.spec() == spec and parse_preprocess(pre.spec()) == (pre,)
    (post,) = parse_postprocess("logits=topk:5")
    assert post == OutputPostprocess("logits", ("topk:5",)) and post.topk == 5
    plan = _plan([spec], ["logits=topk:5"])
    frame = plan.frames[0]
    assert (frame.layout, frame.channels, frame.height, frame.width) == ("nchw", 3, 224, 224)
    assert frame.sources == (2, 1, 0)  # bgr frame -> rgb model
    assert plan.inputs == (TensorSpec("input", "uint8", (480, 640, 3)),)
    assert plan.results == (TensorSpec("logits_indices", "int32", (1, 5)),
                            TensorSpec("logits_scores", "float32", (1, 5)))
    assert ProcessingPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert "resized bilinear (half-pixel centres) to 224x224" in plan.describe("input")


def test_settings_from_toml_files_and_dataclasses(tmp_path):
    pre_file = tmp_path / "frames.toml"
    pre_file.write_text('[input]\nimage = "nv21"\nsize = "480x640"\nmean = 127.5\nstd = [127.5]\n')
    post_file = tmp_path / "post.toml"
    post_file.write_text('"boxes,scores" = "nms:iou=0.5,score=0.3,max=10,boxes=cxcywh"\n')
    assert parse_preprocess(str(pre_file)) == (ImagePreprocess("input", "nv21", (480, 640), None, (127.5,), (127.5,)),)
    assert parse_postprocess([str(post_file), OutputPostprocess("other", "softmax")]) == (
        NmsPostprocess("boxes", "scores", 0.5, 0.3, 10, "cxcywh"), OutputPostprocess("other", ("softmax",)))
    (nms,) = parse_postprocess("boxes,scores=nms")
    assert (nms.iou, nms.score, nms.max, nms.box_format) == (0.45, 0.25, 100, "xyxy")


@pytest.mark.parametrize("pre,post,needle", [
    ("input=image:yuv9", None, "Unknown frame format 'yuv9'"),
    ("input=image:rgb8,size=480", None, "Cannot read size='480'"),
    ("input=image:rgb8,mean=1/2", None, "mean of input 'input' has 2 value(s)"),
    ("input=image:rgb8,std=0", None, "std of input 'input' contains 0"),
    ("input=image:rgb8,colour=red", None, "Unknown or malformed setting 'colour=red'"),
    ("input=rgb8", None, "not an image setting"),
    ("input=image:rgb8,resize=cubic", None, "Unknown resize method 'cubic'"),
    (None, "logits=topk:0", "topk needs a positive count"),
    (None, "logits=argmax+softmax", "argmax must be the last step"),
    (None, "logits=log_softmax", "Unknown post-processing step 'log_softmax'"),
    (None, "boxes,scores=nms:iou=2", "IoU threshold 2.0 is outside [0, 1]"),
    (None, "boxes,scores=nms:boxes=ltwh", "Unknown box format 'ltwh'"),
    (None, "boxes=nms", "nms needs two outputs"),
    (None, "a,b=softmax", "names two outputs, which only nms takes"),
])
def test_malformed_settings_are_clear_errors(pre, post, needle, tmp_path):
    with pytest.raises(ProcessingError) as err:
        parse_preprocess(pre)
        parse_postprocess(post)
    assert needle in str(err.value) and err.value.hint


@pytest.mark.parametrize("pre,post,inputs,outputs,needle", [
    (["input=image:rgb8,size=480x640,resize=none"], [], IMAGE_NCHW, LOGITS,
     "frames of 480x640 do not fit the model input 'input' [1, 3, 224, 224] (224x224) without resizing"),
    (["input=image:rgb8,mean=1/2/3"], [], (TensorSpec("input", "float32", (1, 1, 28, 28)),), LOGITS,
     "one channel, but the frames are rgb8"),
    (["input=image:gray8,mean=1/2/3"], [], (TensorSpec("input", "float32", (1, 1, 28, 28)),), LOGITS,
     "mean has 3 values but the model input 'input' has 1 channel"),
    (["image=image:rgb8"], [], IMAGE_NCHW, LOGITS, "names the input 'image', which the model does not have"),
    ([], ["probs=softmax"], IMAGE_NCHW, LOGITS, "names the output 'probs', which the model does not have"),
    ([], ["logits=topk:1001"], IMAGE_NCHW, LOGITS, "asks for more values than the last axis"),
    (["input=image:rgb8"], [], (TensorSpec("input", "float32", (1, 3, 8, 3)),), LOGITS, "cannot tell the layout"),
    (["input=image:rgb8"], [], (TensorSpec("input", "float32", (3, 224, 224)),), LOGITS, "not an image batch of one"),
    (["input=image:rgb8"], [], (TensorSpec("input", "int64", (1, 3, 224, 224)),), LOGITS, "is int64"),
    (["input=image:nv21,size=481x640"], [], IMAGE_NCHW, LOGITS, "NV21 frames have even sizes"),
    ([], ["scores,boxes=nms"], IMAGE_NCHW, DETECTOR, "NMS takes boxes [B, N, 4] and scores [B, N, C]"),
    ([], ["boxes,scores=nms"], IMAGE_NCHW, (TensorSpec("boxes", "float32", (1, 64, 4)),
                                           TensorSpec("scores", "float32", (1, 3, 64))), "NMS takes boxes"),
])
def test_settings_that_do_not_fit_the_model_are_clear_errors(pre, post, inputs, outputs, needle):
    with pytest.raises(ProcessingError) as err:
        _plan(pre, post, inputs, outputs)
    assert needle in str(err.value), err.value
    assert err.value.hint


def test_frames_a_backend_reads_as_words_must_be_whole_words():
    """Vulkan (WGSL has no 8-bit type) reads frames as 32-bit words: their byte size must allow it."""
    plan = _plan(["input=image:rgb8,size=5x7"], [], (TensorSpec("input", "float32", (1, 3, 8, 8)),),
                 (TensorSpec("output", "float32", (1, 3, 8, 8)),))
    imported = type("Imported", (), {"mod": None, "info": None, "inputs": ()})()
    with pytest.raises(ProcessingError, match="not a whole number of 32-bit words.*WGSL"):
        processed_model(imported, plan, word_reads="WGSL has no 8-bit integer type")


def test_bad_settings_exit_2_from_the_cli(tmp_path):
    model = onnx_passthrough(tmp_path / "img.onnx", (1, 3, 16, 16))
    result = run_cli("compile", str(model), "-p", "host", "-o", str(tmp_path / "b"),
                     "--preprocess", "input=image:rgb8,size=20x20,resize=none")
    assert_clean_error(result, "do not fit the model input 'input'", "resize=bilinear")
    result = run_cli("compile", str(model), "-p", "host", "-o", str(tmp_path / "b"), "--preprocess", "input=image:yuyv")
    assert_clean_error(result, "Unknown frame format 'yuyv'")
    result = run_cli("compile", str(model), "-p", "host", "-o", str(tmp_path / "b"), "--postprocess", "output,x=nms")
    assert_clean_error(result, "names the output 'x', which the model does not have")
    assert not (tmp_path / "b").exists()


def test_frames_of_any_size_need_their_ranges_and_a_resize(tmp_path):
    """size=FHxFW names --dim ranges: one missing, NV21 (not yet), resize=none, and frame sizes a word-reading
    backend (Vulkan) cannot read at every size of the range are refused by name, exit 2."""
    model = onnx_passthrough(tmp_path / "img.onnx", (1, 3, 16, 16))
    base = ["compile", str(model), "-o", str(tmp_path / "b")]
    result = run_cli(*base, "-p", "host", "--preprocess", "input=image:rgb8,size=FHxFW", "--dim", "FH=16..64")
    assert_clean_error(result, "names FW, which no --dim gives a range for", "--dim FW=")
    result = run_cli(*base, "-p", "host", "--preprocess", "input=image:nv21,size=FHxFW", "--dim", "FH=16..64",
                     "--dim", "FW=16..64")
    assert_clean_error(result, "NV21 frames of a size that changes at run time", "size=HxW")
    result = run_cli(*base, "-p", "host", "--preprocess", "input=image:rgb8,size=FHxFW,resize=none", "--dim",
                     "FH=16..64", "--dim", "FW=16..64")
    assert_clean_error(result, "need resizing", "resize=bilinear")
    result = run_cli(*base, "-p", "vulkan-generic", "--preprocess", "input=image:rgb8,size=FHxFW", "--dim",
                     "FH=16..64", "--dim", "FW=17..65:2")
    assert_clean_error(result, "at every size of its --dim ranges", "multiples of 4")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("pre", ["input=image:rgb8,size=FHxFW,mean=123.7/116.3/103.5,std=58.4/57.1/57.4",
                                 "input=image:bgr8,size=FHxFW,resize=nearest,mean=127.5,std=127.5"])
def test_frames_of_any_size_in_range_are_resized_to_the_model_at_run_time(tmp_path, pre):
    """A pass-through model: one build takes frames of every size in FH x FW (smaller and larger than the model,
    odd sizes) and its output, the pre-processed frame, matches the ONNX reference made at that frame's size."""
    model = onnx_passthrough(tmp_path / "img.onnx", (1, 3, 24, 32))
    build = compile_model(model, "host", tmp_path / "b", preprocess=[pre], dims=["FH=13..97", "FW=20..132:4"])
    manifest = build.manifest
    assert [(t.name, t.dtype, t.shape) for t in manifest.inputs] == [("input", "uint8", ("FH", "FW", 3))]
    assert set(manifest.dims) == {"FH", "FW"}
    report = validate(build.output_dir, "host")
    assert report.passed, report
    assert len(report.sizes) == 5 and report.inputs.endswith("at 5 sizes"), report.inputs
    frame = np.random.default_rng(3).integers(0, 256, (50, 44, 3), dtype=np.uint8)
    assert validate(build.output_dir, "host", inputs={"input": frame}).passed
    header = model_header(manifest)
    assert "EDGEPACK_MODEL_INPUT_FRAME_BYTES_MAX 38412" in header and "DIM_FH_MAX 97" in header


def test_run_time_taps_of_another_scale_fail_validation(monkeypatch, tmp_path):
    """A wrong build: run-time bilinear taps that scale by one pixel too many (dst + 1) do not match the
    reference."""
    from edgepack.processing import frames

    original = frames.run_time_taps
    monkeypatch.setattr(frames, "run_time_taps", lambda i, src, dst: original(i, src, dst + 1))
    model = onnx_passthrough(tmp_path / "img.onnx", (1, 3, 24, 32))
    build = compile_model(model, "host", tmp_path / "b", preprocess=["input=image:rgb8,size=FHxFW"],
                          dims=["FH=13..97", "FW=20..132:4"])
    assert not validate(build.output_dir, "host").passed


# ----------------------------------------------------------------------------------------------
# the reference itself


@pytest.mark.parametrize("box_format", ["yxyx", "cxcywh", "xyxy"])
def test_numpy_nms_selects_what_onnx_runtime_selects(box_format):
    """The reference's NMS against ONNX Runtime's NonMaxSuppression (center_point_box 0 / 1) on boxes
    that overlap a lot, with flipped corners, empty boxes and tied scores."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    n = 300
    centre = rng.uniform(0, 100, (n, 2)).astype(np.float32)
    size = rng.uniform(0, 30, (n, 2)).astype(np.float32)
    size[:5] = 0  # empty boxes never suppress nor get suppressed
    scores = rng.uniform(0, 1, n).astype(np.float32)
    scores[10:20] = scores[10]  # ties: the lower index first
    if box_format == "cxcywh":
        boxes, ort_boxes, center = np.concatenate([centre, size], 1), None, 1
    else:
        a, b = centre - size / 2, centre + size / 2
        flip = rng.random(n) < 0.3
        a[flip], b[flip] = b[flip].copy(), a[flip].copy()  # any diagonal pair of corners
        xyxy = np.concatenate([a, b], 1)
        boxes = xyxy if box_format == "xyxy" else xyxy[:, [1, 0, 3, 2]]
        ort_boxes, center = xyxy[:, [1, 0, 3, 2]], 0
    node = helper.make_node("NonMaxSuppression", ["b", "s", "m", "i", "t"], ["sel"], center_point_box=center)
    graph = helper.make_graph([node], "nms", [
        helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, n, 4]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1, n]),
        helper.make_tensor_value_info("m", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("i", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    from edgepack.processing.reference import _corners

    for iou, score, limit in ((0.45, 0.25, 100), (0.3, 0.0, 20), (0.7, 0.5, 300)):
        feed = boxes if ort_boxes is None else ort_boxes
        expected = session.run(None, {"b": feed[None], "s": scores[None, None], "m": np.array([limit]),
                                      "i": np.array([iou], np.float32), "t": np.array([score], np.float32)})[0]
        got = nms_select(_corners(boxes, box_format), scores, iou, score, limit)
        assert got == [int(i) for i in expected[:, 2]], (iou, score, limit)
        assert 0 < len(got) <= limit


def test_near_ties_take_the_programs_choice_and_nothing_else():
    base = np.array([[5.0, 3.0, 3.00001, 1.0]])
    run = ReferenceRun([np.array([[0, 1]], np.int32), np.array([[5.0, 3.0]], np.float32)],
                       ["x_indices", "x_scores"], {"x_indices": base})
    tie = run.expected([np.array([[0, 2]], np.int32), np.array([[5.0, 3.00001]], np.float32)], 1e-4, 1e-3)
    assert tie[0].tolist() == [[0, 2]] and tie[1][0, 1] == np.float32(3.00001)
    wrong = run.expected([np.array([[0, 3]], np.int32), np.array([[5.0, 1.0]], np.float32)], 1e-4, 1e-3)
    assert wrong[0].tolist() == [[0, 1]]


def test_nv21_test_picture_decodes_close_to_the_picture():
    """The test picture's NV21 encoding (full-range BT.601) decoded by the reference graph gives the picture
    back up to chroma subsampling: a check of the reference's NV21 formula against its inverse."""
    rgb = synthetic_picture(64, 96)
    plan = _plan(["input=image:nv21,size=64x96"], [], (TensorSpec("input", "float32", (1, 64, 96, 3)),), LOGITS)
    decoded = preprocess(plan.frames[0], encode_frame(rgb, "nv21"))[0]
    err = np.abs(decoded - rgb.astype(np.float32))
    assert np.median(err) < 2.0 and np.percentile(err, 90) < 12, (np.median(err), np.percentile(err, 90))


# ----------------------------------------------------------------------------------------------
# real builds on this machine: what the compiled processing computes vs the reference


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("processing")
    made = {}

    def build(key: str, shape, pre=(), post=(), model=None):
        if key not in made:
            path = model or onnx_passthrough(root / f"{key}.onnx", shape)
            made[key] = compile_model(path, "host", root / key, preprocess=list(pre), postprocess=list(post)).output_dir
        return made[key]

    return build


FRAME_CASES = {
    "rgb8-nchw-bilinear-down": ((1, 3, 24, 32),
                                "input=image:rgb8,size=61x83,mean=123.7/116.3/103.5,std=58.4/57.1/57.4"),
    "bgr8-nhwc-nearest": ((1, 24, 32, 3), "input=image:bgr8,size=60x80,resize=nearest,mean=127.5,std=127.5"),
    "rgba8-nchw-none-bgr-model": ((1, 3, 24, 32), "input=image:rgba8,order=bgr"),
    "gray8-to-color-bilinear-up": ((1, 3, 24, 32), "input=image:gray8,size=10x14,mean=0.5"),
    "gray8-one-channel": ((1, 1, 24, 32), "input=image:gray8,size=48x64,std=255"),
    "nv21-nhwc-bilinear": ((1, 24, 32, 3), "input=image:nv21,size=30x40,mean=127.5,std=127.5"),
    "nv21-nchw-none": ((1, 3, 24, 32), "input=image:nv21"),
}


@pytest.mark.parametrize("case", list(FRAME_CASES))
def test_compiled_preprocessing_matches_the_onnx_reference(builds, case):
    """A pass-through model: the build's output is exactly what the compiled pre-processing made."""
    shape, pre = FRAME_CASES[case]
    build = builds(case, shape, [pre])
    report = validate(build, "host")
    assert report.passed, report
    assert report.inputs == "random frames (seed 0) and a test picture"
    manifest = read_manifest(build)
    assert manifest.inputs[0].dtype == "uint8" and manifest.processing["preprocess"][0]["spec"] == pre


def test_compiled_preprocessing_is_the_documented_arithmetic(builds):
    """Independent of both implementations: rgba8 at the model's size is (x - mean) / std per channel, NCHW."""
    import tvm
    from tvm import relax

    build = builds("rgba8-plain", (1, 3, 4, 6), ["input=image:rgba8,mean=10/20/30,std=2/4/8"])
    frame = np.random.default_rng(0).integers(0, 256, (4, 6, 4), dtype=np.uint8)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(build / "device" / "model.so")), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(frame)).numpy()
    want = ((frame[..., :3].astype(np.float32) - [10, 20, 30]) / [2, 4, 8]).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("steps,outputs", [
    ("softmax", [("output", "float32", (2, 3, 50))]),
    ("sigmoid+argmax", [("output", "int32", (2, 3))]),
    ("softmax+topk:7", [("output_indices", "int32", (2, 3, 7)), ("output_scores", "float32", (2, 3, 7))]),
])
def test_compiled_postprocessing_matches_numpy(builds, steps, outputs):
    build = builds(f"post-{steps}", (2, 3, 50), [], [f"output={steps}"])
    manifest = read_manifest(build)
    assert [(t.name, t.dtype, t.shape) for t in manifest.outputs] == outputs
    assert validate(build, "host").passed
    x = np.random.default_rng(0).random((2, 3, 50), dtype=np.float32)
    x[0, 0, 10:20] = 0.75  # exact ties: the lower index first, like a stable sort
    report = validate(build, "host", inputs={"input": x})
    assert report.passed, report


def test_nms_on_a_detector_matches_the_reference(builds, tmp_path_factory):
    model = onnx_detector(tmp_path_factory.mktemp("det") / "detector.onnx")
    build = builds("nms", None, ["input=image:rgb8,size=96x128,mean=127.5,std=127.5"],
                   ["boxes,scores=nms:iou=0.45,score=0.5,max=100,boxes=cxcywh"], model=model)
    manifest = read_manifest(build)
    assert [t.name for t in manifest.outputs] == ["detection_boxes", "detection_scores", "detection_classes",
                                                  "num_detections"]
    report = validate(build, "host")
    assert report.passed, report

    plan = manifest_plan(manifest)
    run = run_processed_reference(build / manifest.model_file, "onnx", plan, random_frames(plan))
    count = int(run.outputs[3][0])
    assert 0 < count < 100 and (run.outputs[2][0, count:] == -1).all()  # suppression happened; rows padded


def test_manifest_inspect_and_c_header_describe_the_processing(builds):
    shape, pre = FRAME_CASES["nv21-nhwc-bilinear"]
    build = builds("nv21-nhwc-bilinear", shape, [pre])
    result = run_cli("inspect", str(build), "--json", check=True)
    data = json.loads(result.stdout)["build"]
    assert data["inputs"] == [{"name": "input", "dtype": "uint8", "shape": [45, 40], "processing": data["inputs"][0]
                               ["processing"]}]
    assert "NV21 camera frame 30x40" in data["inputs"][0]["processing"] and data["processing"] == [pre]
    text = run_cli("inspect", str(build), check=True).stdout
    assert "NV21 camera frame" in text and f"compiled in: {pre}" in text
    header = model_header(read_manifest(build))
    assert "#define EDGEPACK_MODEL_INPUT_FRAME_HEIGHT 30" in header and "--preprocess " + pre in header


def test_cli_compiles_validates_and_inspects_with_processing(tmp_path):
    model = onnx_detector(tmp_path / "detector.onnx")
    settings = tmp_path / "frames.toml"
    settings.write_text('[input]\nimage = "bgr8"\nsize = [72, 96]\nresize = "nearest"\nmean = 127.5\nstd = 127.5\n')
    out = tmp_path / "build"
    result = run_cli("compile", str(model), "-p", "host", "-o", str(out), "--preprocess", str(settings),
                     "--postprocess", "boxes,scores=nms:iou=0.5,score=0.55,max=8,boxes=cxcywh", "--json", check=True)
    data = json.loads(result.stdout)
    assert data["inputs"] == [{"name": "input", "dtype": "uint8", "shape": [72, 96, 3]}]
    assert data["processing"]["preprocess"][0]["spec"] == \
        "input=image:bgr8,size=72x96,resize=nearest,mean=127.5,std=127.5"
    report = json.loads(run_cli("validate", str(out), "--json", check=True).stdout)
    assert report["passed"] and report["inputs"] == "random frames (seed 0) and a test picture"
    assert [o["name"] for o in report["outputs"]] == ["detection_boxes", "detection_scores", "detection_classes",
                                                      "num_detections"]
    text = run_cli("compile", str(model), "-p", "host", "-o", str(tmp_path / "b2"), "--postprocess",
                   "scores=softmax+topk:2", check=True).stdout
    assert "scores_indices int32 [1, 64, 2]" in text


def test_compile_help_documents_the_processing_options():
    text = " ".join(run_cli("compile", "--help", check=True).stdout.split())
    assert "--preprocess" in text and "mean=M[/M/M]" in text and "--postprocess" in text and "topk:K" in text
