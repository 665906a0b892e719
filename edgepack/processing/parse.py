"""Reading processing settings: the command line's ``--preprocess`` / ``--postprocess`` strings, TOML files
holding the same settings, or the dataclasses themselves (the Python API accepts all three).

    --preprocess input=image:bgr8,size=480x640,resize=bilinear,mean=123.7/116.3/103.5,std=58.4/57.1/57.4
    --preprocess frames.toml           # [input] image = "bgr8"  size = "480x640"  mean = [123.7, 116.3, 103.5] ...
    --postprocess logits=softmax+topk:5
    --postprocess boxes,scores=nms:iou=0.45,score=0.25,max=100,boxes=cxcywh
    --postprocess post.toml            # logits = "topk:5"   "boxes,scores" = "nms:iou=0.5"
"""

from __future__ import annotations

import re

import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgepack.dims import is_dim_name
from edgepack.errors import ProcessingError
from edgepack.processing.settings import (
    POSTPROCESS_SYNTAX,
    PREPROCESS_SYNTAX,
    ImagePreprocess,
    NmsPostprocess,
    OutputPostprocess,
    Postprocess,
)

PreprocessLike = str | Path | ImagePreprocess
PostprocessLike = str | Path | OutputPostprocess | NmsPostprocess
_IMAGE_KEYS = ("size", "resize", "mean", "std", "order", "layout")
_NMS_KEYS = ("iou", "score", "max", "boxes")


def _items(values) -> list:
    if values is None:
        return []
    if isinstance(values, (str, Path, ImagePreprocess, OutputPostprocess, NmsPostprocess)):
        return [values]
    return list(values)


def _is_file_setting(value: str | Path) -> bool:
    return isinstance(value, Path) or ("=" not in value and value.endswith(".toml"))


def _read_toml(path: Path, option: str) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ProcessingError(f"The {option} file {path} does not exist.", "Check the path.") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProcessingError(f"Cannot read the {option} file {path}: {exc}.",
                              "Write it as TOML, e.g. a table per input: [input] image = \"rgb8\".") from exc


def parse_preprocess(values: PreprocessLike | Iterable[PreprocessLike] | None) -> tuple[ImagePreprocess, ...]:
    """Settings from ``--preprocess`` strings, TOML files or :class:`ImagePreprocess` objects; one per input."""
    found: list[ImagePreprocess] = []
    for value in _items(values):
        if isinstance(value, ImagePreprocess):
            found.append(value)
        elif _is_file_setting(value):
            data = _read_toml(Path(value), "--preprocess")
            for name, table in data.items():
                if not isinstance(table, dict):
                    raise ProcessingError(f"{value}: {name!r} is not a table of settings.",
                                          f"Write [{name}] then image = \"rgb8\", size = \"480x640\", ...")
                found.append(_image_from_table(name, table, str(value)))
        else:
            found.append(_image_from_string(value))
    names = [p.input for p in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ProcessingError(f"Input(s) {', '.join(twice)} have more than one pre-processing setting.",
                              "Give one --preprocess per input.")
    return tuple(found)


def parse_postprocess(values: PostprocessLike | Iterable[PostprocessLike] | None) -> tuple[Postprocess, ...]:
    """Settings from ``--postprocess`` strings, TOML files or the dataclasses; one per output (NMS: two)."""
    found: list[Postprocess] = []
    for value in _items(values):
        if isinstance(value, (OutputPostprocess, NmsPostprocess)):
            found.append(value)
        elif _is_file_setting(value):
            data = _read_toml(Path(value), "--postprocess")
            for name, text in data.items():
                if not isinstance(text, str):
                    raise ProcessingError(f"{value}: the value of {name!r} is not a string.",
                                          f"Write {name} = \"topk:5\" (or \"nms:iou=0.45\" for BOXES,SCORES).")
                found.append(_postprocess_from_string(f"{name}={text}"))
        else:
            found.append(_postprocess_from_string(value))
    used: list[str] = []
    for p in found:
        used += [p.boxes, p.scores] if isinstance(p, NmsPostprocess) else [p.output]
    twice = sorted({n for n in used if used.count(n) > 1})
    if twice:
        raise ProcessingError(f"Output(s) {', '.join(twice)} have more than one post-processing setting.",
                              "Give one --postprocess per output; chain steps with '+', e.g. softmax+topk:5.")
    if sum(isinstance(p, NmsPostprocess) for p in found) > 1:
        raise ProcessingError("More than one NMS setting.", "Give one BOXES,SCORES=nms:... setting per model.")
    return tuple(found)


def _split_setting(text: str, syntax: str, option: str) -> tuple[str, str]:
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ProcessingError(f"Cannot read {option} {text!r}.", f"Write {syntax}.")
    return name.strip(), rest.strip()


def _image_from_string(text: str) -> ImagePreprocess:
    name, rest = _split_setting(text, PREPROCESS_SYNTAX, "--preprocess")
    kind, sep, tail = rest.partition(":")
    if kind != "image" or not sep:
        raise ProcessingError(f"--preprocess {text!r} is not an image setting (it must start with NAME=image:).",
                              f"Write {PREPROCESS_SYNTAX}.")
    fmt, *pairs = [p.strip() for p in tail.split(",")]
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in _IMAGE_KEYS:
            raise ProcessingError(f"Unknown or malformed setting {pair!r} in --preprocess {text!r}.",
                                  f"Settings are {', '.join(k + '=...' for k in _IMAGE_KEYS)}: {PREPROCESS_SYNTAX}.")
        if key in settings:
            raise ProcessingError(f"{key} is given twice in --preprocess {text!r}.", "Give it once.")
        settings[key] = value
    return _image(name, fmt, settings, f"--preprocess {text!r}")


def _image_from_table(name: str, table: dict[str, Any], where: str) -> ImagePreprocess:
    unknown = sorted(set(table) - {"image", *_IMAGE_KEYS})
    if unknown or "image" not in table:
        raise ProcessingError(
            f"{where}: the table [{name}] " + (f"has unknown keys {', '.join(unknown)}" if unknown
                                               else "lacks image = \"FORMAT\"") + ".",
            f"Keys are image, {', '.join(_IMAGE_KEYS)} (the same as {PREPROCESS_SYNTAX}).")
    return _image(name, str(table["image"]), {k: v for k, v in table.items() if k != "image"},
                  f"{where} [{name}]")


def _numbers(value: Any, key: str, where: str) -> tuple[float, ...]:
    items = value if isinstance(value, list) else str(value).split("/")
    try:
        return tuple(float(v) for v in items)
    except (TypeError, ValueError):
        raise ProcessingError(f"Cannot read {key}={value!r} in {where}.",
                              f"Write one number or one per channel separated by '/', e.g. {key}=127.5 or "
                              f"{key}=123.7/116.3/103.5.") from None


def _size(value: Any, where: str) -> tuple[int | str, int | str]:
    """``480x640``, or with names of ``--dim`` ranges for frames whose size changes at run time (``FHxFW``)."""
    parts = value if isinstance(value, list) else re.split(r"[xX]", str(value).strip())
    try:
        size = tuple(p.strip() if isinstance(p, str) and is_dim_name(p.strip()) else int(p) for p in parts)
        if len(size) != 2 or any(isinstance(d, int) and d <= 0 for d in size):
            raise ValueError
    except (TypeError, ValueError):
        raise ProcessingError(f"Cannot read size={value!r} in {where}.",
                              "Write the frame's height and width in pixels, e.g. size=480x640, or the names of "
                              "--dim ranges for frames of any size in them, e.g. size=FHxFW with --dim "
                              "FH=240..1080 --dim FW=320..1920 (names without an x).") from None
    return size  # type: ignore[return-value]


def _image(name: str, fmt: str, settings: dict[str, Any], where: str) -> ImagePreprocess:
    return ImagePreprocess(
        input=name,
        format=fmt,
        size=_size(settings["size"], where) if "size" in settings else None,
        resize=str(settings["resize"]) if "resize" in settings else None,
        mean=_numbers(settings["mean"], "mean", where) if "mean" in settings else (0.0,),
        std=_numbers(settings["std"], "std", where) if "std" in settings else (1.0,),
        order=str(settings.get("order", "rgb")),
        layout=str(settings["layout"]) if "layout" in settings else None,
    )


def _postprocess_from_string(text: str) -> Postprocess:
    left, right = _split_setting(text, POSTPROCESS_SYNTAX, "--postprocess")
    op, _, args = right.partition(":")
    if op.strip() != "nms":
        if "," in left:
            raise ProcessingError(f"--postprocess {text!r} names two outputs, which only nms takes.",
                                  f"Write {POSTPROCESS_SYNTAX}.")
        return OutputPostprocess(left, right)
    names = [n.strip() for n in left.split(",")]
    if len(names) != 2:
        raise ProcessingError(f"nms needs two outputs, boxes and scores, got {left!r} in --postprocess {text!r}.",
                              "Write BOXES,SCORES=nms:..., e.g. boxes,scores=nms:iou=0.45.")
    settings: dict[str, str] = {}
    for pair in [p.strip() for p in args.split(",") if p.strip()]:
        key, sep, value = pair.partition("=")
        if not sep or key not in _NMS_KEYS or key in settings:
            raise ProcessingError(f"Unknown, repeated or malformed NMS setting {pair!r} in --postprocess {text!r}.",
                                  f"Settings are {', '.join(k + '=...' for k in _NMS_KEYS)}: {POSTPROCESS_SYNTAX}.")
        settings[key] = value
    try:
        iou = float(settings.get("iou", 0.45))
        score = float(settings.get("score", 0.25))
        limit = int(settings.get("max", 100))
    except ValueError:
        raise ProcessingError(f"Cannot read the numbers of --postprocess {text!r}.",
                              "iou and score are numbers, max an integer, e.g. nms:iou=0.45,score=0.25,max=100.")\
            from None
    return NmsPostprocess(names[0], names[1], iou, score, limit, settings.get("boxes", "xyxy"))


def spec_strings(pre: Iterable[ImagePreprocess], post: Iterable[Postprocess]) -> list[str]:
    """Every setting in the command line's syntax (for messages and summaries)."""
    return [p.spec() for p in pre] + [p.spec() for p in post]
