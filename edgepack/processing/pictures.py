"""Frames to feed processed builds: seeded random frames, and a test picture drawn here with NumPy (no
downloads): a gradient sky, a few coloured shapes and a face-like pattern, encoded in any frame format
(NV21 with full-range BT.601 and 2x2 chroma averaging, as a camera would deliver it)."""

from __future__ import annotations

import numpy as np

from edgepack.dims import at_size
from edgepack.processing.plan import FramePlan, ProcessingPlan
from edgepack.tensors import random_inputs


def synthetic_picture(height: int, width: int) -> np.ndarray:
    """An RGB uint8 [height, width, 3] picture with smooth areas, hard edges and a face-like pattern."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    v, u = y / max(height - 1, 1), x / max(width - 1, 1)
    img = np.stack([60 + 120 * u, 120 + 100 * v, 220 - 90 * v], axis=-1)  # sky gradient
    img[v > 0.75] = (70, 140, 60)  # grass
    img[(np.abs(u - 0.15) < 0.08) & (np.abs(v - 0.6) < 0.15)] = (200, 40, 40)  # red box
    img[(u - 0.85) ** 2 + ((v - 0.2) * height / width) ** 2 < 0.006] = (250, 220, 60)  # sun
    cy, cx, ry, rx = 0.45, 0.5, 0.3, 0.3 * height / width  # face: an ellipse of skin ...
    face = ((v - cy) / ry) ** 2 + ((u - cx) / rx) ** 2
    img[face < 1.0] = (224, 172, 140)
    for ex in (cx - 0.38 * rx, cx + 0.38 * rx):  # ... two eyes ...
        eye = ((v - (cy - 0.2 * ry)) / (0.1 * ry)) ** 2 + ((u - ex) / (0.14 * rx)) ** 2
        img[eye < 1.0] = (250, 250, 250)
        img[eye < 0.3] = (40, 30, 30)
    mouth = (np.abs(((v - (cy + 0.15 * ry)) / (0.35 * ry)) ** 2 + ((u - cx) / (0.5 * rx)) ** 2 - 1.0) < 0.12) & \
        (v > cy + 0.3 * ry)  # ... and a smile
    img[mouth] = (150, 50, 60)
    nose = (np.abs(u - cx) < 0.04 * rx) & (np.abs(v - cy) < 0.12 * ry)
    img[nose] = (190, 130, 110)
    noise = np.random.default_rng(1).normal(0, 3, img.shape)  # a little sensor noise
    return np.clip(img + noise, 0, 255).round().astype(np.uint8)


def rgb_to_nv21(rgb: np.ndarray) -> np.ndarray:
    """Full-range BT.601 (JFIF) YCbCr of an RGB uint8 [H, W, 3] picture as NV21: [H * 3 / 2, W] uint8."""
    h, w, _ = rgb.shape
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    luma = 0.299 * r + 0.587 * g + 0.114 * b
    cb = 128 - 0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 128 + 0.5 * r - 0.418688 * g - 0.081312 * b
    pool = lambda p: p.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))  # noqa: E731
    vu = np.stack([pool(cr), pool(cb)], axis=-1).reshape(h // 2, w)
    return np.clip(np.concatenate([luma, vu], axis=0).round(), 0, 255).astype(np.uint8)


def encode_frame(rgb: np.ndarray, fmt: str) -> np.ndarray:
    """An RGB uint8 picture in the frame format ``fmt`` (rgb8, bgr8, rgba8, gray8, nv21)."""
    if fmt == "rgb8":
        return np.ascontiguousarray(rgb)
    if fmt == "bgr8":
        return np.ascontiguousarray(rgb[..., ::-1])
    if fmt == "rgba8":
        return np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=-1)
    if fmt == "gray8":
        luma = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        return np.clip(luma.round(), 0, 255).astype(np.uint8)[..., None]
    if fmt == "nv21":
        return rgb_to_nv21(rgb)
    raise ValueError(fmt)


def picture_frame(plan: FramePlan) -> np.ndarray:
    """The test picture as the frame ``plan`` takes."""
    return encode_frame(synthetic_picture(plan.frame_height, plan.frame_width), plan.setting.format)


def random_frames(plan: ProcessingPlan, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs of a processed build: uniform 0-255 frames, the other inputs as ``random_inputs`` makes them;
    frames whose size changes at run time at the ``--dim`` values ``sizes``."""
    rng = np.random.default_rng(seed)
    feeds = random_inputs(at_size(plan.inputs, sizes or {}), seed)
    for frame in plan.frames:
        feeds[frame.name] = rng.integers(0, 256, tuple(int(d) for d in frame.sized(sizes or {}).frame.shape),
                                         dtype=np.uint8)
    return feeds


def picture_frames(plan: ProcessingPlan, seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Inputs of a processed build with the test picture in every frame (at ``sizes``, as ``random_frames``)."""
    feeds = random_inputs(at_size(plan.inputs, sizes or {}), seed)
    for frame in plan.frames:
        feeds[frame.name] = picture_frame(frame.sized(sizes or {}))
    return feeds
