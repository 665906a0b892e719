"""Tensor descriptions shared by every layer: a model's inputs and outputs, and arrays made ready for a runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgepack.errors import EdgepackError, ShapeError

ModelFormat = Literal["onnx", "tflite"]
Dim = int | str  # a str names a dynamic dimension
Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def dynamic_dims(self) -> list[int]:
        return [i for i, d in enumerate(self.shape) if not isinstance(d, int)]

    @property
    def is_static(self) -> bool:
        return not self.dynamic_dims

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TensorSpec:
        return cls(data["name"], data["dtype"], tuple(data["shape"]))


def contiguous(array: Any) -> np.ndarray:
    """``array`` as a C-contiguous ndarray of the same shape; 0-d (scalar) arrays stay 0-d.

    ``np.ascontiguousarray`` turns a 0-d array into a 1-d one, which a runtime then refuses for a
    scalar input; this keeps the shape and copies only when needed.
    """
    result = np.asarray(array)
    if not result.flags.c_contiguous:
        result = np.array(result, copy=True, order="C")
    return result


def random_inputs(specs: tuple[TensorSpec, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs that respect each input's dtype: [0, 1) floats, 8-bit integers over their whole range
    (a quantized model's pixels or activations: a build that drops their sign or swaps their bytes then
    differs from the reference), wider integers small and non-negative (indices, lengths)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
        if dtype == np.bool_:
            value = np.asarray(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.floating):
            value = rng.random(shape, dtype=np.float32).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low, high = (info.min, info.max) if dtype.itemsize == 1 else (max(info.min, 0), min(info.max, 10))
            value = rng.integers(low, high + 1, size=shape, dtype=dtype)
        else:
            raise ShapeError(f"Cannot make random data for input {spec.name!r} of dtype {spec.dtype}.",
                             "Pass the inputs with --inputs inputs.npz.")
        inputs[spec.name] = value
    return inputs


def load_inputs(path: Path, specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    """Read inputs from an ``.npz`` keyed by input name and check them against the build."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise EdgepackError(f"Cannot read inputs from {path}: {exc}.",
                            "Pass an .npz made with numpy.savez(path, **{input_name: array}).") from exc
    return check_inputs(arrays, specs)


def check_inputs(arrays: dict[str, np.ndarray], specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    names = [s.name for s in specs]
    if len(specs) == 1 and len(arrays) == 1 and names[0] not in arrays:
        arrays = {names[0]: next(iter(arrays.values()))}  # one unnamed array (np.savez(f, x)) is fine
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ShapeError(f"The inputs lack {', '.join(missing)} (given: {', '.join(arrays) or 'nothing'}).",
                         f"The model's inputs are: {', '.join(names)}.")
    checked = {}
    for spec in specs:
        array = np.asarray(arrays[spec.name])
        want = spec.shape  # a named dimension (a build's --dim) takes any extent; edgepack.dims checks its range
        if len(array.shape) != len(want) or any(isinstance(w, int) and w != g for w, g in zip(want, array.shape)):
            raise ShapeError(f"Input {spec.name!r} has shape {list(array.shape)}, but the build expects {list(want)}.",
                             "Pass data of the compiled shape, or compile again with a matching --input-shape.")
        if array.dtype != np.dtype(spec.dtype):
            if np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
                array = array.astype(spec.dtype)
            else:
                raise ShapeError(f"Input {spec.name!r} has dtype {array.dtype}, but the build expects {spec.dtype}.",
                                 f"Convert it with array.astype('{spec.dtype}').")
        checked[spec.name] = contiguous(array)
    return checked


#: Constant folding (ONNX Runtime's at import, each backend's in its pipeline) stores a result only while it is
#: at most STORED_GROWTH times the constants it is made from, or small: a cast of 8- or 16-bit weights to
#: float32 is stored; a broadcast, tile or fill of a few values (a per-channel slope repeated per pixel, a
#: constant-filled tensor) stays the computation that makes it at run time.
STORED_GROWTH = 4
STORED_ANYWAY_BYTES = 1 << 16


def worth_storing(made_bytes: int, source_bytes: int) -> bool:
    """Whether a constant of ``made_bytes`` computed from constants of ``source_bytes`` is stored, not computed."""
    return made_bytes <= max(STORED_GROWTH * source_bytes, STORED_ANYWAY_BYTES)
