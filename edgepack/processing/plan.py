"""Processing settings resolved against a model: which model input each frame feeds (its layout, size,
channels), which outputs the program returns, and why a setting does not fit (a ProcessingError).

The plan is what the Relax builders, the reference pipeline, the manifest and the generated APIs all
read; ``ProcessingPlan.to_dict`` is what a build's manifest records and ``from_dict`` resolves it again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from edgepack.errors import ProcessingError
from edgepack.processing.settings import (
    FRAME_FORMATS,
    ImagePreprocess,
    NmsPostprocess,
    OutputPostprocess,
    Postprocess,
)
from edgepack.tensors import TensorSpec

FLOAT_DTYPES = ("float32", "float16")
NMS_OUTPUTS = ("detection_boxes", "detection_scores", "detection_classes", "num_detections")
INDEX_DTYPE = "int32"  # top-K and argmax indices, class ids, counts: 32-bit everywhere (WGSL has no int64)


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class FramePlan:
    """One input fed with frames: the frame the program takes and the model tensor made from it."""

    setting: ImagePreprocess
    model: TensorSpec  # the model's input
    frame: TensorSpec  # the program's input: uint8 [H, W, C] (NV21: [H * 3 / 2, W])
    layout: str  # the model input's: "nchw" or "nhwc"
    channels: int  # the model input's: 1 or 3
    height: int  # the model input's
    width: int
    frame_height: int | str  # a name: a --dim range (frames of any size in it)
    frame_width: int | str
    resize: str  # "bilinear", "nearest" or "none"
    mean: tuple[float, ...]  # one per model channel
    std: tuple[float, ...]
    sources: tuple[int, ...]  # per model channel: the frame channel it is read from (NV21: of the decoded RGB)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def dynamic(self) -> bool:
        """Whether the frame's size changes at run time (``size=`` names ``--dim`` ranges)."""
        return isinstance(self.frame_height, str) or isinstance(self.frame_width, str)

    def at_size(self, frame_height: int, frame_width: int) -> FramePlan:
        """This plan for frames of one size (a dynamic frame's, as a run gets it)."""
        frame = TensorSpec(self.frame.name, "uint8", (frame_height, frame_width, self.frame.shape[-1]))
        return replace(self, frame=frame, frame_height=frame_height, frame_width=frame_width)

    def sized(self, sizes: dict[str, int]) -> FramePlan:
        """This plan at the ``--dim`` values ``sizes`` (itself where its size is fixed)."""
        if not self.dynamic:
            return self
        return self.at_size(*(sizes[d] if isinstance(d, str) else d for d in (self.frame_height, self.frame_width)))

    def describe(self) -> str:
        s = self.setting
        if s.format == "nv21":
            frame = (f"uint8 NV21 camera frame {self.frame_height}x{self.frame_width} (Y plane {self.frame_height}x"
                     f"{self.frame_width}, then V,U interleaved at {self.frame_height // 2}x{self.frame_width // 2}:"
                     f" {_shape(self.frame.shape)}), BT.601 full range to RGB")
        else:
            frame = f"uint8 {s.format} frame {self.frame_height}x{self.frame_width} (HxWxC {_shape(self.frame.shape)})"
        steps = [frame]
        if self.resize != "none":
            rule = "half-pixel centres" if self.resize == "bilinear" else "src = floor(dst * src_size / dst_size)"
            steps.append(f"resized {self.resize} ({rule}) to {self.height}x{self.width}")
        order = "gray" if self.channels == 1 else s.order
        if self.mean != (0.0,) * self.channels or self.std != (1.0,) * self.channels:
            steps.append(f"(x - mean) / std with mean {'/'.join(f'{v:g}' for v in self.mean)}, "
                         f"std {'/'.join(f'{v:g}' for v in self.std)} ({order})")
        steps.append(f"into the model's {self.model.dtype} {_shape(self.model.shape)} {self.layout.upper()} input")
        return "; ".join(steps)


@dataclass(frozen=True)
class OutputPlan:
    setting: OutputPostprocess
    model: TensorSpec
    outputs: tuple[TensorSpec, ...]

    def describe(self, name: str) -> str:
        steps = [s for s in self.setting.steps if s in ("softmax", "sigmoid")]
        what = f"{'+'.join(steps)} of " if steps else ""
        k = self.setting.topk
        if k is not None:
            if name.endswith("_indices"):
                return (f"indices of the top {k} of {what}{self.model.name!r} (last axis), best first "
                        "(ties: lower index)")
            return f"the top {k} values of {what}{self.model.name!r}, best first"
        if self.setting.argmax:
            return f"index of the largest value of {what}{self.model.name!r} (last axis; ties: lower index)"
        return f"{what}{self.model.name!r} (last axis)"


@dataclass(frozen=True)
class NmsPlan:
    setting: NmsPostprocess
    boxes: TensorSpec
    scores: TensorSpec
    batch: int
    count: int  # candidate boxes per batch item
    classes: int
    per_class: int  # at most this many selected per class: min(max, count)
    outputs: tuple[TensorSpec, ...]

    def describe(self, name: str) -> str:
        s = self.setting
        return {
            "detection_boxes": f"boxes x1,y1,x2,y2 (from {s.box_format}, the model's coordinates), best score first; "
                               f"rows from num_detections on are 0",
            "detection_scores": "their scores; 0 from num_detections on",
            "detection_classes": "their class ids; -1 from num_detections on",
            "num_detections": f"detections per batch item (NMS: IoU > {s.iou:g} suppressed, score > {s.score:g}, "
                              f"at most {s.max})",
        }[name]


@dataclass(frozen=True)
class ProcessingPlan:
    frames: tuple[FramePlan, ...]
    outputs: tuple[OutputPlan, ...]
    nms: NmsPlan | None
    model_inputs: tuple[TensorSpec, ...]
    model_outputs: tuple[TensorSpec, ...]
    inputs: tuple[TensorSpec, ...]  # what the compiled program takes, in the model's input order
    results: tuple[TensorSpec, ...]  # what it returns

    @property
    def settings(self) -> tuple[ImagePreprocess | Postprocess, ...]:
        return (*(f.setting for f in self.frames), *(o.setting for o in self.outputs),
                *((self.nms.setting,) if self.nms else ()))

    def frame(self, name: str) -> FramePlan | None:
        return next((f for f in self.frames if f.name == name), None)

    def output_plan(self, name: str) -> OutputPlan | None:
        return next((o for o in self.outputs if o.model.name == name), None)

    def describe(self, name: str) -> str | None:
        """What an input or output of the program is, in words (None: the model's own tensor, unchanged)."""
        frame = self.frame(name)
        if frame is not None:
            return frame.describe()
        for plan in self.outputs:
            if any(o.name == name for o in plan.outputs):
                return plan.describe(name)
        if self.nms is not None and name in NMS_OUTPUTS:
            return self.nms.describe(name)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "preprocess": [f.setting.to_dict() | {"spec": f.setting.spec()} for f in self.frames],
            "postprocess": [o.setting.to_dict() | {"spec": o.setting.spec()} for o in self.outputs],
            "nms": (self.nms.setting.to_dict() | {"spec": self.nms.setting.spec()}) if self.nms else None,
            "model_inputs": [t.to_dict() for t in self.model_inputs],
            "model_outputs": [t.to_dict() for t in self.model_outputs],
            "inputs": {t.name: self.describe(t.name) for t in self.inputs if self.describe(t.name)},
            "outputs": {t.name: self.describe(t.name) for t in self.results if self.describe(t.name)},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessingPlan:
        pre = tuple(ImagePreprocess.from_dict(d) for d in data["preprocess"])
        post: tuple[Postprocess, ...] = tuple(OutputPostprocess.from_dict(d) for d in data["postprocess"])
        if data.get("nms"):
            post += (NmsPostprocess.from_dict(data["nms"]),)
        return plan_processing(pre, post, tuple(TensorSpec.from_dict(t) for t in data["model_inputs"]),
                               tuple(TensorSpec.from_dict(t) for t in data["model_outputs"]))


def _unknown(kind: str, name: str, specs: tuple[TensorSpec, ...], option: str) -> ProcessingError:
    listing = ", ".join(f"{t.name} {t.dtype} {_shape(t.shape)}" for t in specs)
    return ProcessingError(f"{option} names the {kind} {name!r}, which the model does not have.",
                           f"The model's {kind}s are: {listing}.")


def plan_processing(pre: tuple[ImagePreprocess, ...], post: tuple[Postprocess, ...],
                    model_inputs: tuple[TensorSpec, ...], model_outputs: tuple[TensorSpec, ...]) -> ProcessingPlan:
    """Resolve the settings against the model's (static) inputs and outputs, or say why they do not fit."""
    by_input = {t.name: t for t in model_inputs}
    by_output = {t.name: t for t in model_outputs}
    frames = []
    for setting in pre:
        if setting.input not in by_input:
            raise _unknown("input", setting.input, model_inputs, f"--preprocess {setting.spec()}")
        frames.append(_plan_frame(setting, by_input[setting.input]))
    outputs, nms = [], None
    for setting in post:
        if isinstance(setting, NmsPostprocess):
            for name in (setting.boxes, setting.scores):
                if name not in by_output:
                    raise _unknown("output", name, model_outputs, f"--postprocess {setting.spec()}")
            nms = _plan_nms(setting, by_output[setting.boxes], by_output[setting.scores])
        else:
            if setting.output not in by_output:
                raise _unknown("output", setting.output, model_outputs, f"--postprocess {setting.spec()}")
            outputs.append(_plan_output(setting, by_output[setting.output]))
    inputs = tuple(next((f.frame for f in frames if f.name == t.name), t) for t in model_inputs)
    results: list[TensorSpec] = []
    for t in model_outputs:
        plan = next((o for o in outputs if o.model.name == t.name), None)
        if nms is not None and t.name == nms.boxes.name:
            results += nms.outputs
        elif nms is not None and t.name == nms.scores.name:
            continue
        else:
            results += plan.outputs if plan else (t,)
    names = [r.name for r in results]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ProcessingError(f"The processed outputs would have the same name twice: {', '.join(clash)}.",
                              "Post-process fewer outputs, or rename the model's outputs that clash.")
    return ProcessingPlan(tuple(frames), tuple(outputs), nms, tuple(model_inputs), tuple(model_outputs),
                          inputs, tuple(results))


def _plan_frame(s: ImagePreprocess, model: TensorSpec) -> FramePlan:
    where = f"--preprocess {s.spec()}"
    shape = tuple(model.shape)
    if len(shape) != 4 or shape[0] != 1:
        raise ProcessingError(
            f"{where}: the model input {model.name!r} has shape {_shape(shape)}, not an image batch of one "
            "([1, C, H, W] or [1, H, W, C]).",
            "Frames feed 4-d image inputs of batch 1; fix the batch with --input-shape NAME:1,... if it is dynamic.")
    if model.dtype not in FLOAT_DTYPES:
        raise ProcessingError(f"{where}: the model input {model.name!r} is {model.dtype}; frames are converted to "
                              "floating-point tensors.", "Pre-process float32 or float16 inputs only.")
    layout = s.layout
    if layout is None:
        nchw, nhwc = shape[1] in (1, 3), shape[3] in (1, 3)
        if nchw == nhwc:
            raise ProcessingError(
                f"{where}: cannot tell the layout of {model.name!r} {_shape(shape)} from its shape.",
                "Say it with layout=nchw or layout=nhwc (the model's channels must be 1 or 3).")
        layout = "nchw" if nchw else "nhwc"
    channels, height, width = (shape[1], shape[2], shape[3]) if layout == "nchw" else (shape[3], shape[1], shape[2])
    if channels not in (1, 3):
        raise ProcessingError(f"{where}: the model input {model.name!r} {_shape(shape)} ({layout.upper()}) has "
                              f"{channels} channels.", "Frames feed models with 1 (gray) or 3 (color) channels.")
    if channels == 1 and s.format != "gray8":
        raise ProcessingError(f"{where}: the model input {model.name!r} has one channel, but the frames are "
                              f"{s.format}.",
                              "Feed one-channel models with gray8 frames.")
    frame_height, frame_width = s.size or (height, width)
    named = [d for d in (frame_height, frame_width) if isinstance(d, str)]
    if named and s.format == "nv21":
        raise ProcessingError(f"{where}: NV21 frames of a size that changes at run time ({', '.join(named)}) are not "
                              "supported yet.", "Give the NV21 frame's size in pixels (size=HxW).")
    if named and s.resize == "none":
        raise ProcessingError(f"{where}: frames whose size changes at run time ({', '.join(named)}) need resizing to "
                              f"the model input {model.name!r} {_shape(shape)}.",
                              "Use resize=bilinear (the default) or resize=nearest.")
    resize = s.resize or ("none" if (frame_height, frame_width) == (height, width) else "bilinear")
    if resize == "none" and (frame_height, frame_width) != (height, width):
        raise ProcessingError(
            f"{where}: frames of {frame_height}x{frame_width} do not fit the model input {model.name!r} "
            f"{_shape(shape)} ({height}x{width}) without resizing.",
            f"Use resize=bilinear or resize=nearest, or size={height}x{width}.")
    if s.format == "nv21" and (frame_height % 2 or frame_width % 2):
        raise ProcessingError(f"{where}: NV21 frames have even sizes (2x2 pixels share a V,U pair); "
                              f"{frame_height}x{frame_width} is not.", "Use an even height and width.")
    means, stds = [], []
    for key, values in (("mean", s.mean), ("std", s.std)):
        if len(values) not in (1, channels):
            raise ProcessingError(
                f"{where}: {key} has {len(values)} values but the model input {model.name!r} has {channels} "
                f"channel{'s' * (channels > 1)}.",
                f"Give one {key} value, or {channels} separated by '/' in the model's channel order ({s.order}).")
        (means if key == "mean" else stds).append(tuple(values) * (channels // len(values)))
    if channels == 1:
        sources: tuple[int, ...] = (0,)
    else:
        rgb = {"rgb8": (0, 1, 2), "rgba8": (0, 1, 2), "bgr8": (2, 1, 0), "gray8": (0, 0, 0),
               "nv21": (0, 1, 2)}[s.format]
        sources = rgb if s.order == "rgb" else rgb[::-1]
    if s.format == "nv21":
        frame_shape: tuple[int, ...] = (frame_height * 3 // 2, frame_width)
    else:
        frame_shape = (frame_height, frame_width, FRAME_FORMATS[s.format])
    return FramePlan(s, model, TensorSpec(model.name, "uint8", frame_shape), layout, channels, height, width,
                     frame_height, frame_width, resize, means[0], stds[0], sources)


def _plan_output(s: OutputPostprocess, model: TensorSpec) -> OutputPlan:
    where = f"--postprocess {s.spec()}"
    shape = tuple(model.shape)
    if not shape or not all(isinstance(d, int) for d in shape):
        raise ProcessingError(f"{where}: the output {model.name!r} has shape {_shape(shape)}; post-processing works "
                              "along the last axis of a tensor of static shape.", "Post-process another output.")
    if not model.dtype.startswith("float"):
        raise ProcessingError(f"{where}: the output {model.name!r} is {model.dtype}, not floating point.",
                              "softmax, sigmoid, argmax and topk take floating-point outputs.")
    rows = shape[:-1] or (1,)
    k = s.topk
    if k is not None:
        if k > shape[-1]:
            raise ProcessingError(f"{where}: topk:{k} asks for more values than the last axis of {model.name!r} "
                                  f"{_shape(shape)} has ({shape[-1]}).", f"Use topk:K with K <= {shape[-1]}.")
        outputs = (TensorSpec(f"{model.name}_indices", INDEX_DTYPE, (*shape[:-1], k)),
                   TensorSpec(f"{model.name}_scores", "float32", (*shape[:-1], k)))
    elif s.argmax:
        outputs = (TensorSpec(model.name, INDEX_DTYPE, rows),)
    else:
        outputs = (TensorSpec(model.name, "float32", shape),)
    return OutputPlan(s, model, outputs)


def _plan_nms(s: NmsPostprocess, boxes: TensorSpec, scores: TensorSpec) -> NmsPlan:
    where = f"--postprocess {s.spec()}"
    bshape, sshape = tuple(boxes.shape), tuple(scores.shape)
    fits = (len(bshape) == 3 and bshape[2] == 4 and len(sshape) in (2, 3) and sshape[:2] == bshape[:2]
            and all(isinstance(d, int) and d > 0 for d in (*bshape, *sshape)))
    if not fits:
        raise ProcessingError(
            f"{where}: NMS takes boxes [B, N, 4] and scores [B, N, C] (or [B, N]) with the same B and N, but "
            f"{boxes.name!r} is {_shape(bshape)} and {scores.name!r} is {_shape(sshape)}.",
            "Name the detector's box and score outputs in that order (BOXES,SCORES=nms:...); outputs in another "
            "layout (e.g. scores [B, C, N]) need a Transpose in the model.")
    for t in (boxes, scores):
        if not t.dtype.startswith("float"):
            raise ProcessingError(f"{where}: the output {t.name!r} is {t.dtype}, not floating point.",
                                  "NMS takes floating-point boxes and scores.")
    batch, count = bshape[0], bshape[1]
    classes = sshape[2] if len(sshape) == 3 else 1
    m = s.max
    outputs = (TensorSpec(NMS_OUTPUTS[0], "float32", (batch, m, 4)), TensorSpec(NMS_OUTPUTS[1], "float32", (batch, m)),
               TensorSpec(NMS_OUTPUTS[2], INDEX_DTYPE, (batch, m)), TensorSpec(NMS_OUTPUTS[3], INDEX_DTYPE, (batch,)))
    return NmsPlan(s, boxes, scores, batch, count, classes, min(m, count), outputs)
