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
from edgepack.processing import manifest_plan, picture_frames, random_frames, run_processed_reference
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
    inputs: str = ""  # what was fed: "random inputs (seed 0)", "random frames (seed 0) and a test picture", ...

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
            "inputs": self.inputs,
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


def merge(runs: list[tuple[OutputComparison, ...]]) -> tuple[OutputComparison, ...]:
    """Per output, the worst of several runs' comparisons (errors at their largest, mismatches summed)."""
    return tuple(
        OutputComparison(same[0].name, same[0].dtype, same[0].shape, max(c.max_abs_error for c in same),
                         max(c.max_rel_error for c in same), sum(c.mismatched for c in same),
                         all(c.passed for c in same))
        for same in zip(*runs))


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
    ``inputs``: an ``.npz`` path or arrays by input name (default: seeded random inputs; a build with
    pre-processing gets random frames and then a test picture, both compared). The report says per
    output whether it is within ``atol + rtol * |expected|``; it does not raise on a mismatch.
    ``threads``: CPU threads for the build's parallel kernels (None: ``$TVM_NUM_THREADS``, else every core).

    A build with processing is compared with an independent reference: the pre-processing as an ONNX
    graph on ONNX Runtime, the original model on its reference runtime, the post-processing in NumPy
    (``edgepack.processing.reference``).
    """
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    place = parse_place(on, inventory)
    plan = manifest_plan(manifest)
    if inputs is None:
        if plan is None:
            runs, fed = [random_inputs(manifest.inputs, seed)], f"random inputs (seed {seed})"
        elif plan.frames:
            runs, fed = [random_frames(plan, seed), picture_frames(plan, seed)], \
                f"random frames (seed {seed}) and a test picture"
        else:
            runs, fed = [random_frames(plan, seed)], f"random inputs (seed {seed})"
    elif isinstance(inputs, dict):
        runs, fed = [check_inputs(inputs, manifest.inputs)], "the given arrays"
    else:
        runs, fed = [load_inputs(Path(inputs), manifest.inputs)], f"inputs from {inputs}"
    started = time.perf_counter()
    compared = []
    ran_on = ""
    for feeds in runs:
        actual, ran_on = place.run(build_dir, manifest, feeds, threads=threads, progress=progress)
        if plan is None:
            expected = run_reference(build_dir / manifest.model_file, manifest.model_format, feeds, manifest.outputs)
        else:
            reference_run = run_processed_reference(build_dir / manifest.model_file, manifest.model_format, plan, feeds)
            expected = reference_run.expected(actual, atol, rtol)
        compared.append(tuple(compare(spec.name, a, e, atol, rtol)
                              for spec, a, e in zip(manifest.outputs, actual, expected)))
    reference = "onnxruntime" if manifest.model_format == "onnx" else "litert"
    if plan is not None:
        reference += " with the processing as ONNX (pre) and NumPy (post)"
    return ValidationReport(build_dir, on, ran_on, reference, atol, rtol, merge(compared),
                            time.perf_counter() - started, fed)
