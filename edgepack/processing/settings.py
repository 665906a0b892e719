"""The processing settings a user writes, as typed dataclasses: what camera frame an input takes
(:class:`ImagePreprocess`), what happens to an output (:class:`OutputPostprocess`), and non-maximum
suppression over a detector's boxes and scores (:class:`NmsPostprocess`).

Each dataclass checks its own values when made (a :class:`~edgepack.errors.ProcessingError` names
the bad one); whether the settings fit the model is decided later, against its inputs and outputs
(``edgepack.processing.plan``). ``spec()`` writes the setting back in the command line's syntax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edgepack.dims import is_dim_name
from edgepack.errors import ProcessingError

#: Frame formats: bytes per pixel of the HxWxC frame (NV21: its planes, 1.5 bytes per pixel).
FRAME_FORMATS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "gray8": 1, "nv21": 0}
RESIZE_METHODS = ("bilinear", "nearest", "none")
CHANNEL_ORDERS = ("rgb", "bgr")
LAYOUTS = ("nchw", "nhwc")
ELEMENTWISE_STEPS = ("softmax", "sigmoid")
SELECTING_STEPS = ("argmax", "topk")
BOX_FORMATS = ("xyxy", "yxyx", "cxcywh")

PREPROCESS_SYNTAX = ("NAME=image:FORMAT[,size=HxW][,resize=bilinear|nearest|none][,mean=M[/M/M]][,std=S[/S/S]]"
                     "[,order=rgb|bgr][,layout=nchw|nhwc]")
POSTPROCESS_SYNTAX = ("NAME=softmax|sigmoid|argmax|topk:K (steps joined by '+', e.g. softmax+topk:5), or "
                      "BOXES,SCORES=nms[:iou=0.45,score=0.25,max=100,boxes=xyxy|yxyx|cxcywh]")


def _choice(value: str, allowed, what: str, example: str, owner: str = "") -> str:
    if value not in allowed:
        raise ProcessingError(f"Unknown {what} {value!r}{owner}.", f"Use one of {', '.join(allowed)} (e.g. {example}).")
    return value


def _format_number(value: float) -> str:
    return f"{value:g}" if value == int(value) or abs(value) >= 1e-4 else repr(value)


@dataclass(frozen=True)
class ImagePreprocess:
    """A model input fed with uint8 camera frames, converted to the model's tensor inside the program.

    ``format``: ``rgb8``, ``bgr8``, ``rgba8`` (HxWx3/4 bytes), ``gray8`` (HxWx1) or ``nv21`` (Android
    camera: a Y plane HxW, then interleaved V,U at H/2 x W/2; full-range BT.601). ``size``: the frame's
    (height, width), default the model's; a name is a ``--dim`` range (``size=("FH", "FW")``: frames of any size
    in the ranges, resized to the model's fixed size at run time). ``resize``: ``bilinear`` (half-pixel centres), ``nearest``
    (``floor(dst * src / dst_size)``) or ``none``; default bilinear when the sizes differ. ``mean`` and
    ``std`` are in pixel units (0-255): one value, or one per channel of the model input in ``order``
    (the channel order the model expects). ``layout``: the model input's layout, default read from its
    shape.
    """

    input: str
    format: str
    size: tuple[int | str, int | str] | None = None  # a name: a --dim range (frames of any size in it)
    resize: str | None = None
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    order: str = "rgb"
    layout: str | None = None

    def __post_init__(self) -> None:
        if not self.input:
            raise ProcessingError("A pre-processing setting names no input.", f"Write {PREPROCESS_SYNTAX}.")
        _choice(self.format, tuple(FRAME_FORMATS), "frame format", "image:rgb8", f" for input {self.input!r}")
        if self.resize is not None:
            _choice(self.resize, RESIZE_METHODS, "resize method", "resize=bilinear", f" for input {self.input!r}")
        _choice(self.order, CHANNEL_ORDERS, "channel order", "order=rgb", f" for input {self.input!r}")
        if self.layout is not None:
            _choice(self.layout, LAYOUTS, "layout", "layout=nchw", f" for input {self.input!r}")
        if self.size is not None:
            size = tuple(self.size)
            if len(size) != 2 or not all((isinstance(d, int) and d > 0) or (isinstance(d, str) and is_dim_name(d))
                                         for d in size):
                raise ProcessingError(f"The frame size of input {self.input!r} is {self.size!r}.",
                                      "Give a height and a width in pixels, e.g. size=480x640, or names of --dim "
                                      "ranges (size=FHxFW).")
            object.__setattr__(self, "size", size)
        for key in ("mean", "std"):
            values = tuple(float(v) for v in getattr(self, key))
            if len(values) not in (1, 3) or not all(math.isfinite(v) for v in values):
                raise ProcessingError(
                    f"The {key} of input {self.input!r} has {len(values)} value(s): {list(values)}.",
                    f"Give one finite value or one per channel, in pixel units (0-255), e.g. {key}="
                    + ("123.7/116.3/103.5" if key == "mean" else "58.4/57.1/57.4") + ".")
            object.__setattr__(self, key, values)
        if any(v == 0 for v in self.std):
            raise ProcessingError(f"The std of input {self.input!r} contains 0.", "Every std value must be non-zero.")

    def spec(self) -> str:
        """The setting in the command line's syntax (``input=image:bgr8,size=480x640,...``)."""
        parts = [f"{self.input}=image:{self.format}"]
        if self.size is not None:
            parts.append(f"size={self.size[0]}x{self.size[1]}")
        if self.resize is not None:
            parts.append(f"resize={self.resize}")
        if self.mean != (0.0,):
            parts.append("mean=" + "/".join(_format_number(v) for v in self.mean))
        if self.std != (1.0,):
            parts.append("std=" + "/".join(_format_number(v) for v in self.std))
        if self.order != "rgb":
            parts.append(f"order={self.order}")
        if self.layout is not None:
            parts.append(f"layout={self.layout}")
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "format": self.format, "size": list(self.size) if self.size else None,
                "resize": self.resize, "mean": list(self.mean), "std": list(self.std), "order": self.order,
                "layout": self.layout}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImagePreprocess:
        size = data.get("size")
        return cls(data["input"], data["format"], tuple(size) if size else None, data.get("resize"),
                   tuple(data.get("mean", (0.0,))), tuple(data.get("std", (1.0,))), data.get("order", "rgb"),
                   data.get("layout"))


@dataclass(frozen=True)
class OutputPostprocess:
    """Steps applied to one model output along its last axis, in order: ``softmax``, ``sigmoid``, then at
    most one of ``argmax`` (int32 indices) or ``topk:K`` (int32 indices and float32 values, best first)."""

    output: str
    steps: tuple[str, ...]

    def __post_init__(self) -> None:
        steps = tuple(s.strip() for s in (self.steps.split("+") if isinstance(self.steps, str) else self.steps))
        object.__setattr__(self, "steps", steps)
        if not self.output or not steps:
            raise ProcessingError(f"Cannot read the post-processing of output {self.output!r}: no steps.",
                                  f"Write {POSTPROCESS_SYNTAX}.")
        for i, step in enumerate(steps):
            name, _, arg = step.partition(":")
            if name not in (*ELEMENTWISE_STEPS, *SELECTING_STEPS):
                raise ProcessingError(f"Unknown post-processing step {step!r} for output {self.output!r}.",
                                      f"Use softmax, sigmoid, argmax or topk:K (e.g. {self.output}=topk:5).")
            if name == "topk":
                if not arg.isdigit() or int(arg) < 1:
                    raise ProcessingError(f"topk needs a positive count, got {step!r} for output {self.output!r}.",
                                          "Write topk:K with K >= 1, e.g. topk:5.")
            elif arg:
                raise ProcessingError(f"{name} takes no argument ({step!r} for output {self.output!r}).",
                                      f"Write {name} alone.")
            if name in SELECTING_STEPS and i != len(steps) - 1:
                raise ProcessingError(f"{name} must be the last step for output {self.output!r} ({'+'.join(steps)}).",
                                      "Put softmax/sigmoid first, e.g. softmax+topk:5.")

    @property
    def topk(self) -> int | None:
        last = self.steps[-1]
        return int(last.partition(":")[2]) if last.startswith("topk") else None

    @property
    def argmax(self) -> bool:
        return self.steps[-1] == "argmax"

    def spec(self) -> str:
        return f"{self.output}={'+'.join(self.steps)}"

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.output, "steps": list(self.steps)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputPostprocess:
        return cls(data["output"], tuple(data["steps"]))


@dataclass(frozen=True)
class NmsPostprocess:
    """Non-maximum suppression with ONNX NonMaxSuppression's semantics over a detector's ``boxes``
    [B, N, 4] and ``scores`` [B, N, C] (or [B, N]) outputs: per class, boxes scoring above ``score`` are
    taken best first and a box is dropped when its IoU with a box already taken exceeds ``iou``, at most
    ``max`` per class; the detections of all classes are then ordered by score and the best ``max`` kept."""

    boxes: str
    scores: str
    iou: float = 0.45
    score: float = 0.25
    max: int = 100
    box_format: str = field(default="xyxy")

    def __post_init__(self) -> None:
        if not self.boxes or not self.scores or self.boxes == self.scores:
            raise ProcessingError(f"NMS needs two different outputs, boxes and scores (got {self.boxes!r}, "
                                  f"{self.scores!r}).", "Write BOXES,SCORES=nms:..., e.g. boxes,scores=nms.")
        if not (0.0 <= float(self.iou) <= 1.0):
            raise ProcessingError(f"The NMS IoU threshold {self.iou} is outside [0, 1].", "Use e.g. iou=0.45.")
        if not math.isfinite(float(self.score)):
            raise ProcessingError(f"The NMS score threshold {self.score} is not a number.", "Use e.g. score=0.25.")
        if not isinstance(self.max, int) or self.max < 1:
            raise ProcessingError(f"The NMS maximum {self.max!r} is not a positive integer.", "Use e.g. max=100.")
        _choice(self.box_format, BOX_FORMATS, "box format", "boxes=xyxy")
        object.__setattr__(self, "iou", float(self.iou))
        object.__setattr__(self, "score", float(self.score))

    def spec(self) -> str:
        return (f"{self.boxes},{self.scores}=nms:iou={_format_number(self.iou)},score={_format_number(self.score)},"
                f"max={self.max},boxes={self.box_format}")

    def to_dict(self) -> dict[str, Any]:
        return {"boxes": self.boxes, "scores": self.scores, "iou": self.iou, "score": self.score, "max": self.max,
                "box_format": self.box_format}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NmsPostprocess:
        return cls(data["boxes"], data["scores"], data["iou"], data["score"], data["max"], data["box_format"])


Postprocess = OutputPostprocess | NmsPostprocess
