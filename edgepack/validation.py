"""Validate a build: run it where ``on`` says, run the reference runtime (ONNX Runtime / LiteRT) on the
same inputs, and compare every output."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.frontends.reference import run_reference
from edgepack.manifest import read_manifest
from edgepack.progress import Progress
from edgepack.run.places import parse_place
from edgepack.tensors import check_inputs, load_inputs, random_inputs

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


@dataclass(frozen=True)
class OutputComparison:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float  # max |actual - expected| relative to the largest |expected|
    mismatched: int  # elements outside atol + rtol * |expected|
    passed: bool


@dataclass(frozen=True)
class ValidationReport:
    build_dir: Path
    on: str
    ran_on: str  # what computed the outputs: "this machine: opencl(0)", "pi4: cpu(0)", "C runner under qemu-arm ..."
    reference: str
    atol: float
    rtol: float
    outputs: tuple[OutputComparison, ...]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "build_dir": str(self.build_dir),
            "on": self.on,
            "ran_on": self.ran_on,
            "reference": self.reference,
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "outputs": [asdict(o) | {"shape": list(o.shape)} for o in self.outputs],
        }


def compare(name: str, actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> OutputComparison:
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return OutputComparison(name, str(actual.dtype), tuple(actual.shape), float("inf"), float("inf"),
                                int(expected.size), False)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    diff = np.abs(a - e)
    finite = np.isfinite(a) == np.isfinite(e)
    both_nan = np.isnan(a) & np.isnan(e)
    within = (diff <= atol + rtol * np.abs(e)) | both_nan | (a == e)
    within &= finite
    max_abs = float(np.nanmax(diff)) if diff.size else 0.0
    scale = float(np.nanmax(np.abs(e))) if e.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    mismatched = int(within.size - np.count_nonzero(within))
    return OutputComparison(name, str(expected.dtype), tuple(expected.shape), max_abs, max_rel,
                            mismatched, mismatched == 0)


def validate(
    build_dir: Path | str,
    on: str = "host",
    *,
    inputs: Path | str | dict[str, np.ndarray] | None = None,
    seed: int = 0,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    inventory: Path | str | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
) -> ValidationReport:
    """Run the build ``on`` a place and compare every output with the reference runtime.

    ``on``: ``host`` (this machine, on the device the build's backend runs on), ``host-opencl`` /
    ``host-vulkan``, ``emulator`` (qemu-user), a device of the inventory, or ``farm:PROFILE``.
    ``inputs``: an ``.npz`` path or arrays by input name (default: seeded random inputs). The report
    says per output whether it is within ``atol + rtol * |expected|``; it does not raise on a mismatch.
    ``threads``: CPU threads for the build's parallel kernels (None: ``$TVM_NUM_THREADS``, else every core).
    """
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    place = parse_place(on, inventory)
    if inputs is None:
        feeds = random_inputs(manifest.inputs, seed)
    elif isinstance(inputs, dict):
        feeds = check_inputs(inputs, manifest.inputs)
    else:
        feeds = load_inputs(Path(inputs), manifest.inputs)
    started = time.perf_counter()
    actual, ran_on = place.run(build_dir, manifest, feeds, threads=threads, progress=progress)
    expected = run_reference(build_dir / manifest.model_file, manifest.model_format, feeds, manifest.outputs)
    comparisons = tuple(
        compare(spec.name, a, e, atol, rtol) for spec, a, e in zip(manifest.outputs, actual, expected)
    )
    reference = "onnxruntime" if manifest.model_format == "onnx" else "litert"
    return ValidationReport(build_dir, on, ran_on, reference, atol, rtol, comparisons, time.perf_counter() - started)
