"""Validate a build: run it where ``on`` says, run the reference runtime (ONNX Runtime / LiteRT) on the
same inputs, and compare every output."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.degenerate import degeneracy, input_independent
from edgepack.dims import at_size, check_sizes, dims_from_dict, parse_sizes, sizes_of
from edgepack.errors import EdgepackError
from edgepack.frontends import inspect_model
from edgepack.frontends.reference import reference_outputs
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.processing import manifest_plan, picture_frames, random_frames, run_processed_reference
from edgepack.progress import Progress
from edgepack.run.c_runner import runner_file_name
from edgepack.run.places import parse_place
from edgepack.run.results import RunOutputs
from edgepack.tensors import TensorSpec, check_inputs, load_inputs, random_inputs

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
#: fp16 builds (``compile --precision fp16``): float16 has 11 significant bits (a step of 1e-3 relative), and a
#: network's rounding accumulates over its layers, hardest where values cancel. Each value must be within 1e-2
#: of itself plus 1e-2 of its output's largest reference value (a near-zero logit next to large ones rounds
#: with the large ones' step).
FP16_ATOL = 1e-2  # times the output's largest |reference| value, at least DEFAULT_ATOL
FP16_RTOL = 1e-2


@dataclass(frozen=True)
class OutputComparison:
    name: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float  # max |actual - expected| relative to the largest |expected|
    mismatched: int  # elements outside atol + rtol * |expected|
    passed: bool
    problem: str = ""  # why it could not be compared at all: missing, extra, named otherwise, another shape
    degenerate: str = ""  # why the reference output cannot show a wrong build ("" when it can): edgepack.degenerate
    step: float | None = None  # a quantized output's step: values within one of it pass (8-bit arithmetic rounds)


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
    sizes: tuple[dict[str, int], ...] = ()  # a build with dims (``--dim``): the sizes it ran at, each compared
    atol_scaled: bool = False  # atol is a fraction of each output's largest |reference| value (fp16 builds)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    @property
    def degenerate(self) -> bool:
        """Whether some output's reference could not show a wrong build (``OutputComparison.degenerate``)."""
        return any(o.degenerate for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "build_dir": str(self.build_dir),
            "on": self.on,
            "ran_on": self.ran_on,
            "reference": self.reference,
            "atol": self.atol,
            "rtol": self.rtol,
            "atol_scaled": self.atol_scaled,
            "passed": self.passed,
            "degenerate": self.degenerate,
            "seconds": round(self.seconds, 3),
            "inputs": self.inputs,
            "sizes": [dict(s) for s in self.sizes],
            "outputs": [asdict(o) | {"shape": list(o.shape)} for o in self.outputs],
        }


def compare(name: str, actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float,
            step: float | None = None) -> OutputComparison:
    """``actual`` against ``expected``: each value within ``atol + rtol * |expected|``, or within one
    quantization ``step`` of a quantized output (two 8-bit kernels may round one value differently)."""
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return OutputComparison(name, str(actual.dtype), tuple(actual.shape), float("inf"), float("inf"),
                                int(expected.size), False,
                                f"shape {list(actual.shape)}, the reference's {list(expected.shape)}")
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    diff = np.abs(a - e)
    finite = np.isfinite(a) == np.isfinite(e)
    both_nan = np.isnan(a) & np.isnan(e)
    allowed = atol + rtol * np.abs(e)
    if step is not None:
        allowed = np.maximum(allowed, step * (1 + 1e-4))  # (q - z) * s rounds in float32 on both sides
    within = (diff <= allowed) | both_nan | (a == e)
    within &= finite
    max_abs = float(np.nanmax(diff)) if diff.size else 0.0
    scale = float(np.nanmax(np.abs(e))) if e.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    mismatched = int(within.size - np.count_nonzero(within))
    return OutputComparison(name, str(expected.dtype), tuple(expected.shape), max_abs, max_rel,
                            mismatched, mismatched == 0, step=step)


def merge(runs: list[tuple[OutputComparison, ...]]) -> tuple[OutputComparison, ...]:
    """Per output, the worst of several runs' comparisons (errors at their largest, mismatches summed, the
    first problem)."""
    return tuple(
        OutputComparison(same[0].name, same[0].dtype, same[0].shape, max(c.max_abs_error for c in same),
                         max(c.max_rel_error for c in same), sum(c.mismatched for c in same),
                         all(c.passed for c in same), next((c.problem for c in same if c.problem), ""),
                         step=same[0].step)
        for same in zip(*runs))


def _failed(spec: TensorSpec, problem: str) -> OutputComparison:
    shape = tuple(d if isinstance(d, int) else 0 for d in spec.shape)  # "?": decided at run time
    size = int(np.prod(shape)) if shape else 1
    return OutputComparison(spec.name, spec.dtype, shape, float("inf"), float("inf"), size, False, problem)


def compare_outputs(specs: tuple[TensorSpec, ...], ran: RunOutputs, expected: dict[str, np.ndarray],
                    atol: float | dict[str, float], rtol: float,
                    steps: dict[str, float] | None = None) -> tuple[OutputComparison, ...]:
    """Every output of the model (``specs``) against the reference's ``expected`` (by name): first that the
    run returned as many outputs as the model has, named as the model names them where the running side
    reports names, then their values (``atol`` one for all, or by output name)."""
    compared = []
    for i, spec in enumerate(specs):
        if i >= len(ran.arrays):
            compared.append(_failed(spec, f"missing: {ran.ran_on} returned {len(ran.arrays)} of the model's "
                                          f"{len(specs)} outputs"))
        elif spec.name not in expected:
            compared.append(_failed(spec, f"the reference model has no output {spec.name!r} (its outputs: "
                                          f"{', '.join(expected)}): the build was made from another model"))
        elif ran.names is not None and i < len(ran.names) and ran.names[i] != runner_file_name(spec.name):
            compared.append(_failed(spec, f"{ran.ran_on} returned output {i} as {ran.names[i]!r}, not "
                                          f"{spec.name!r}: the library was made from another model"))
        else:
            compared.append(compare(spec.name, ran.arrays[i], expected[spec.name], _of(atol, spec.name), rtol,
                                    (steps or {}).get(spec.name)))
    for i in range(len(specs), len(ran.arrays)):
        extra = TensorSpec(ran.names[i] if ran.names and i < len(ran.names) else f"output {i}",
                           str(ran.arrays[i].dtype), tuple(ran.arrays[i].shape))
        compared.append(_failed(extra, f"extra: {ran.ran_on} returned {len(ran.arrays)} outputs, the model has "
                                       f"{len(specs)}"))
    return tuple(compared)


def _of(atol: float | dict[str, float], name: str) -> float:
    return atol.get(name, 0.0) if isinstance(atol, dict) else atol


def scaled_atol(fraction: float, expected: dict[str, np.ndarray]) -> dict[str, float]:
    """Per output, ``fraction`` of its largest finite |reference| value, and never less than ``DEFAULT_ATOL``
    (fp16 builds' absolute tolerance: an output of values near 0, as a detector's map of a page without text,
    is not held to less than an fp32 build is)."""
    atol = {}
    for name, value in expected.items():
        e = np.abs(np.asarray(value, dtype=np.float64))
        e = e[np.isfinite(e)]
        atol[name] = max(fraction * float(e.max()) if e.size else 0.0, DEFAULT_ATOL)
    return atol


def _with_degeneracy(compared: tuple[OutputComparison, ...], references: list[dict[str, np.ndarray]],
                     probe: dict[str, np.ndarray] | None, atol: float | dict[str, float],
                     rtol: float) -> tuple[OutputComparison, ...]:
    """``compared`` with each output marked degenerate where the reference output of every run compared is
    (``edgepack.degenerate.degeneracy``), or where the reference gives the same for all of them and for
    the ``probe``'s other inputs."""
    marked = []
    for c in compared:
        values = [r[c.name] for r in references if c.name in r]
        reasons = [degeneracy(v, _of(atol, c.name), rtol) for v in values]
        why = reasons[0] if reasons and all(reasons) else ""
        others = values[1:] + ([probe[c.name]] if probe is not None and c.name in probe else [])
        if not why and values and others:
            same = [input_independent(values[0], v) for v in others]
            why = same[0] if all(same) else ""
        marked.append(replace(c, degenerate=why))
    return tuple(marked)


def _probe(build_dir: Path, manifest: BuildManifest, feeds: dict[str, np.ndarray],
           seed: int, size: dict[str, int]) -> dict[str, np.ndarray] | None:
    """The reference's outputs for other seeded inputs than ``feeds`` (None where the model refuses them)."""
    specs = at_size(manifest.inputs, size)
    other = random_inputs(specs, seed + 1)
    if all(np.array_equal(other[k], v) for k, v in feeds.items() if k in other):
        other = random_inputs(specs, seed + 2)
    try:
        return reference_outputs(build_dir / manifest.model_file, manifest.model_format, other)
    except EdgepackError:
        return None


def validate(
    build_dir: Path | str,
    on: str = "host",
    *,
    inputs: Path | str | dict[str, np.ndarray] | None = None,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    inventory: Path | str | None = None,
    threads: int | None = None,
    sizes: dict[str, int] | list[str] | None = None,
    progress: Progress | None = None,
) -> ValidationReport:
    """Run the build ``on`` a place and compare every output with the reference runtime.

    ``on``: ``host`` (this machine, on the device the build's backend runs on), ``host-opencl`` /
    ``host-vulkan``, ``emulator`` (qemu-user), a device of the inventory, or ``farm:PROFILE``.
    ``inputs``: an ``.npz`` path or arrays by input name (default: seeded random inputs; a build with
    pre-processing gets random frames and then a test picture, both compared). The report says per
    output whether it is within ``atol + rtol * |expected|``; it does not raise on a mismatch. Tolerances
    default to ``DEFAULT_ATOL`` / ``DEFAULT_RTOL``; for an fp16 build (``compile --precision fp16``) to
    ``FP16_RTOL`` and an ``atol`` of ``FP16_ATOL`` times each output's largest |reference| value.
    ``threads``: CPU threads for the build's parallel kernels (None: ``$TVM_NUM_THREADS``, else every core).

    A build whose inputs have dimensions that change at run time (``compile --dim``) runs at several sizes
    (``edgepack.dims.check_sizes``: each dim at its smallest, largest, and odd sizes between), each compared;
    ``sizes`` (``{"W": 417}`` or ``["W=417"]``) runs it at one size instead.

    A build with processing is compared with an independent reference: the pre-processing as an ONNX
    graph on ONNX Runtime, the original model on its reference runtime, the post-processing in NumPy
    (``edgepack.processing.reference``).
    """
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    scaled = atol is None and manifest.precision == "fp16"
    half = manifest.precision == "fp16"
    atol = FP16_ATOL if scaled else (DEFAULT_ATOL if atol is None else atol)
    rtol = (FP16_RTOL if half else DEFAULT_RTOL) if rtol is None else rtol
    place = parse_place(on, inventory)
    plan = manifest_plan(manifest)
    dims = dims_from_dict(manifest.dims)
    if isinstance(sizes, list) or (sizes is None and not dims):
        sizes = parse_sizes(sizes, dims)
    elif sizes is not None:
        sizes = parse_sizes([f"{k}={v}" for k, v in sizes.items()], dims)
    at = [sizes] if sizes is not None else check_sizes(dims)  # [{}] for a build with fixed shapes
    if inputs is None:
        if plan is None:
            runs = [random_inputs(at_size(manifest.inputs, size), seed) for size in at]
            fed = f"random inputs (seed {seed})" + (f" at {len(at)} sizes" if len(at) > 1 else "")
        elif plan.frames:  # frames whose size changes at run time: both at each size
            runs = [make(plan, seed, size) for size in at for make in (random_frames, picture_frames)]
            fed = f"random frames (seed {seed}) and a test picture" + (f" at {len(at)} sizes" if len(at) > 1 else "")
        else:
            runs, fed = [random_frames(plan, seed)], f"random inputs (seed {seed})"
    elif isinstance(inputs, dict):
        at = [sizes_of(inputs, manifest.inputs, dims)]
        runs, fed = [check_inputs(inputs, at_size(manifest.inputs, at[0]))], "the given arrays"
    else:
        arrays = load_inputs(Path(inputs), manifest.inputs)
        at = [sizes_of(arrays, manifest.inputs, dims)]
        runs, fed = [arrays], f"inputs from {inputs}"
    steps = inspect_model(build_dir / manifest.model_file).output_steps if plan is None else {}
    started = time.perf_counter()
    compared = []
    references: list[dict[str, np.ndarray]] = []
    ran_on = ""
    for feeds in runs:
        ran = place.run(build_dir, manifest, feeds, threads=threads, progress=progress)
        ran_on = ran.ran_on
        if plan is None:
            expected = reference_outputs(build_dir / manifest.model_file, manifest.model_format, feeds)
        else:
            reference_run = run_processed_reference(build_dir / manifest.model_file, manifest.model_format, plan, feeds)
            actual = ran.arrays if len(ran.arrays) == len(manifest.outputs) else \
                [np.asarray(e) for e in reference_run.outputs]
            expected = dict(zip(reference_run.names, reference_run.expected(actual, atol, rtol)))
        references.append(expected)
        tolerance = scaled_atol(atol, expected) if scaled else atol
        compared.append(compare_outputs(manifest.outputs, ran, expected, tolerance, rtol, steps))
    probe = _probe(build_dir, manifest, runs[0], seed, at[0]) if plan is None and len(runs) == 1 else None
    reference = "onnxruntime" if manifest.model_format == "onnx" else "litert"
    if plan is not None:
        reference += " with the processing as ONNX (pre) and NumPy (post)"
    outputs = _with_degeneracy(merge(compared), references, probe,
                               scaled_atol(atol, references[0]) if scaled else atol, rtol)
    return ValidationReport(build_dir, on, ran_on, reference, atol, rtol, outputs, time.perf_counter() - started, fed,
                            tuple(a for a in at if a) if dims else (), atol_scaled=scaled)
