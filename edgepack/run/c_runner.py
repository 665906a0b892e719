"""The C example runner (``runtimes/api/c/examples/main.c``): built once per triple, run natively or
under qemu-user on ``.npy`` inputs, its ``.npy`` outputs read back. No Python on the running side."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes  # noqa: F401 - names bfloat16 (and float8 types) for numpy
import numpy as np

from edgepack.errors import EdgepackError, ToolchainError
from edgepack.files import cached_directory, file_sha256
from edgepack.paths import cache_root
from edgepack.profiles import Profile
from edgepack.progress import Progress
from edgepack.tensors import TensorSpec, contiguous
from edgepack.toolchain.c_programs import build_c_program
from edgepack.toolchain.compilers import find_compilers
from edgepack.toolchain.sources import C_API, c_api_files, source_dir
from edgepack.toolchain.tvm_runtime import ensure_target_runtime

RUN_TIMEOUT_S = 900  # qemu is slow; a stuck run must still end
RUNNER_NAME = "edgepack_run"

#: What to do about each C API status (``ep_status_name``) a runner reports.
STATUS_HINTS = {
    "EP_ERR_SHAPE": "An input's shape or size differs from the compiled model's (`edgepack inspect BUILD` lists "
                    "them); pass inputs of exactly those shapes (a scalar input is a 0-d array).",
    "EP_ERR_DTYPE": "An input's dtype differs from the compiled model's; convert it (array.astype(...)).",
    "EP_ERR_LOAD": "The model library does not load here: check that it was built for this architecture "
                   "(`file` shows it) and that the runtime libraries sit beside the runner.",
    "EP_ERR_NOT_FOUND": "A file or tensor name was not found: check the paths and the input names.",
    "EP_ERR_METADATA": "The model's metadata is missing or does not match it: compile the model again.",
    "EP_ERR_RUNTIME": "TVM's runtime failed while running the model; the message above says where. Report it "
                      "with the model attached if it persists.",
    "EP_ERR_NO_MEMORY": "The device ran out of memory.",
    "EP_ERR_IO": "Reading an input or writing an output failed: check the paths and free disk space.",
}


@dataclass(frozen=True)
class RunResult:
    outputs: list[np.ndarray]  # every output the runner wrote, in its order (the model library's metadata)
    seconds: float
    command: list[str]
    names: tuple[str, ...] = ()  # the names it wrote them under ([A-Za-z0-9._-] kept, the rest as '_')


def _hint_for(message: str) -> str:
    found = re.search(r"\b(EP_ERR_[A-Z_]+)\b", message)
    if found and found.group(1) in STATUS_HINTS:
        return STATUS_HINTS[found.group(1)]
    return "Run the command again by hand to see the runner's whole output."


#: The dtypes the runner's .npy reader knows (ml_dtypes' float8_e5m2 also calls itself '<f1': not one of them).
_NPY_DTYPES = frozenset(np.dtype(n) for n in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                               "uint8", "uint16", "uint32", "uint64", "bool"))


def write_runner_input(path: Path, array: np.ndarray) -> Path:
    """``array`` as a file the runner reads: ``.npy`` (shape and dtype checked by the runner, 0-d arrays
    included) where NumPy can name the dtype, raw bytes (``.bin``, size checked against the model's
    metadata) where it cannot (bfloat16 and 8-bit floats, which ``np.save`` writes as ``V2``, ``V1``, ``f1``)."""
    array = contiguous(array)
    if array.dtype in _NPY_DTYPES:
        path = path.with_suffix(".npy")
        np.save(path, array)
    else:
        path = path.with_suffix(".bin")
        path.write_bytes(array.tobytes())
    return path


def read_runner_output(path: Path, spec: TensorSpec) -> np.ndarray:
    """An output ``.npy`` written by the runner, in the dtype of ``spec`` (bfloat16 arrives as its raw
    ``uint16`` bits, 8-bit floats as ``uint8``)."""
    return as_spec_dtype(np.load(path), spec)


def as_spec_dtype(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """``array`` viewed as the dtype of ``spec`` when it holds the same-sized raw bits of it."""
    want = np.dtype(spec.dtype)
    if array.dtype != want and array.dtype.itemsize == want.itemsize:
        array = array.view(want)
    return array


def run_c_runner(command_prefix: list[str], runner: Path, model_library: Path | None, inputs: dict[str, np.ndarray],
                 input_specs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], *,
                 threads: int | None = None, timeout: float = RUN_TIMEOUT_S) -> RunResult:
    """Run ``runner`` (the example program) on ``inputs`` and read back its ``.npy`` outputs.

    ``threads``: the runner's ``--threads`` (None: one per online CPU); a run that takes longer than
    ``timeout`` seconds is killed."""
    with tempfile.TemporaryDirectory(prefix="edgepack-run-") as tmp:
        tmp_path = Path(tmp)
        argv = [*command_prefix, str(runner)]
        if model_library is not None:
            argv.append(str(model_library))
        for i, spec in enumerate(input_specs):
            path = write_runner_input(tmp_path / f"input{i}", inputs[spec.name])
            argv += ["--input", f"{spec.name}={path}"]
        out_dir = tmp_path / "out"
        out_dir.mkdir()
        argv += ["--output-dir", str(out_dir)]
        if threads:
            argv += ["--threads", str(threads)]
        started = time.perf_counter()
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ToolchainError(f"{runner.name} did not finish within {timeout:.0f} s.",
                                 "The model may be too large for emulation; try a real device.") from exc
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines()
            message = lines[-1] if lines else f"no output (signal {-result.returncode})" if result.returncode < 0 \
                else "no output"
            raise EdgepackError(f"{runner.name} failed (exit {result.returncode}): {message}", _hint_for(message))
        arrays, names = [], []
        for path in sorted(out_dir.glob("*.npy"), key=lambda p: int(p.name.split("_", 1)[0])):
            i = len(arrays)
            arrays.append(read_runner_output(path, outputs[i]) if i < len(outputs) else np.load(path))
            names.append(path.stem.split("_", 1)[1])
        return RunResult(arrays, seconds, argv, tuple(names))


def runner_file_name(name: str) -> str:
    """An output's name as the runner writes it into a file name (``sanitize`` in main.c)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:199] or "output"


def runner_for_profile(profile: Profile, progress: Progress | None = None) -> Path:
    """The example runner for a profile's triple, built once and cached (it loads any model.so)."""
    compilers = find_compilers(profile)
    runtime = ensure_target_runtime(profile.triple, compilers.cc, compilers.cxx, need_static=False, log=progress)
    c_dir = source_dir(C_API)
    key = hashlib.sha256("\n".join([
        str(runtime.root), compilers.version, file_sha256(c_dir / "examples" / "main.c"),
        *(file_sha256(path) for path in c_api_files()),
    ]).encode()).hexdigest()[:12]
    base = cache_root() / "runners"
    base.mkdir(parents=True, exist_ok=True)

    def make(staging: Path) -> None:
        if progress:
            progress(f"Building the example runner for {profile.triple}")
        build_c_program(runtime, staging / RUNNER_NAME, cc=compilers.cc)

    root = cached_directory(base / f"{profile.triple}-{key}", make,
                            complete=lambda p: (p / RUNNER_NAME).is_file())
    return root / RUNNER_NAME
