"""Validate a build: run it, run the reference runtime on the same inputs, compare every output."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgepack.errors import EdgepackError, ShapeError
from edgepack.importers import TensorSpec
from edgepack.manifest import BuildManifest, read_manifest
from edgepack.reference import quiet_native_stderr, run_reference

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3

# Runs a build on named inputs and returns its outputs in manifest order.
BuildRunner = Callable[[Path, BuildManifest, dict[str, np.ndarray]], list[np.ndarray]]


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
            "reference": self.reference,
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "outputs": [asdict(o) | {"shape": list(o.shape)} for o in self.outputs],
        }


def random_inputs(specs: tuple[TensorSpec, ...], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs that respect each input's dtype: [0, 1) floats, small non-negative integers."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
        if dtype == np.bool_:
            value = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.floating):
            value = rng.random(shape, dtype=np.float32).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            value = rng.integers(max(info.min, 0), min(info.max, 10) + 1, size=shape, dtype=dtype)
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
        want = tuple(int(d) for d in spec.shape)
        if array.shape != want:
            raise ShapeError(f"Input {spec.name!r} has shape {list(array.shape)}, but the build expects {list(want)}.",
                             "Pass data of the compiled shape, or compile again with a matching --input-shape.")
        if array.dtype != np.dtype(spec.dtype):
            if np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
                array = array.astype(spec.dtype)
            else:
                raise ShapeError(f"Input {spec.name!r} has dtype {array.dtype}, but the build expects {spec.dtype}.",
                                 f"Convert it with array.astype('{spec.dtype}').")
        checked[spec.name] = np.ascontiguousarray(array)
    return checked


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
    inputs: Path | dict[str, np.ndarray] | None = None,
    seed: int = 0,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    inventory: Path | str | None = None,
) -> ValidationReport:
    """Run the build ``on`` a place (``host``, ...) and compare every output with the reference."""
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    runner = runner_for(on, inventory)
    if inputs is None:
        feeds = random_inputs(manifest.inputs, seed)
    elif isinstance(inputs, dict):
        feeds = check_inputs(inputs, manifest.inputs)
    else:
        feeds = load_inputs(Path(inputs), manifest.inputs)
    started = time.perf_counter()
    actual = runner(build_dir, manifest, feeds)
    expected = run_reference(build_dir / manifest.model_file, manifest.model_format, feeds, manifest.outputs)
    comparisons = tuple(
        compare(spec.name, a, e, atol, rtol) for spec, a, e in zip(manifest.outputs, actual, expected)
    )
    reference = "onnxruntime" if manifest.model_format == "onnx" else "litert"
    return ValidationReport(build_dir, on, reference, atol, rtol, comparisons, time.perf_counter() - started)


def runner_for(on: str, inventory: Path | str | None = None) -> BuildRunner:
    """``host``, ``emulator``, ``host-opencl`` (OpenCL builds), a device of the inventory (``NAME``) or the
    first free device of ``farm:PROFILE``.

    ``inventory`` defaults to ``$EDGEPACK_INVENTORY``, else ``~/.config/edgepack/devices.toml``.
    """
    if on == "host":
        return run_on_host
    if on == "emulator":
        from edgepack.bundle import run_on_emulator

        return run_on_emulator
    if on == "host-opencl":  # OpenCL builds: x86 host code + the kernels, on this machine's OpenCL device
        from edgepack.opencl import run_on_host_opencl

        return run_on_host_opencl
    if on == "host-vulkan":  # Vulkan builds: x86 host code + the WGSL shaders, on this machine's Vulkan driver
        from edgepack.vulkan import run_on_host_vulkan

        return run_on_host_vulkan
    from edgepack.remote.inventory import load_inventory

    devices = load_inventory(Path(inventory) if inventory else None)
    if on.startswith("farm:") or on in devices.devices:
        import functools

        from edgepack.remote.farm import run_on_target

        devices.resolve(on)  # an empty farm is a clear error now
        return functools.partial(run_on_target, target=on, inventory=devices)
    known = ", ".join(sorted(devices.devices)) or f"none in {devices.path}"
    raise EdgepackError(
        f"Unknown place to validate on: {on!r}.",
        f"Use --on host, --on emulator, --on host-opencl / host-vulkan (GPU builds), a device name (known: {known}) "
        "or farm:PROFILE; "
        "add devices with `edgepack device add`.",
    )


def run_on_host(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the host build of the model in TVM's Relax VM (GPU builds: on this machine's OpenCL/Vulkan)."""
    import tvm

    if manifest.profile.get("backend") == "opencl":
        from edgepack.opencl import run_on_host_opencl

        return run_on_host_opencl(build_dir, manifest, inputs)
    if manifest.profile.get("backend") == "vulkan":
        from edgepack.vulkan import run_on_host_vulkan

        return run_on_host_vulkan(build_dir, manifest, inputs)
    return run_host_library(build_dir, manifest, inputs, tvm.cpu())


def run_host_library(build_dir: Path, manifest: BuildManifest, inputs: dict[str, np.ndarray],
                     device) -> list[np.ndarray]:
    """The build's ``host/model.so`` in TVM's Relax VM on ``device``, inputs copied there."""
    import tvm
    from tvm import relax

    library = build_dir / manifest.artifacts["host_library"].path
    with quiet_native_stderr():
        executable = tvm.runtime.load_module(str(library))
    vm = relax.VirtualMachine(executable, device)
    args = [tvm.runtime.tensor(inputs[spec.name], device=device) for spec in manifest.inputs]
    return flatten_outputs(vm["main"](*args))  # .numpy() waits for the device


def flatten_outputs(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    flat: list[np.ndarray] = []
    for item in result:
        flat.extend(flatten_outputs(item))
    return flat
