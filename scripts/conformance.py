"""What the conformance sweeps share (``scripts/onnx_conformance.py``, ``scripts/tflite_conformance.py``):
where a case runs, the worker pool, the comparison, the cache, the results and the report section.

Places (``--profile``, ``--on``):

* ``host`` (default): the case compiled for this machine by the profile's backend and run in TVM's
  Relax VM, as ``validate --on host`` runs a build.
* ``--profile vulkan-generic|mali-g610 --on gpu``: the case compiled for the GPU profile as ``edgepack
  compile`` does and run on this machine's driver (lavapipe, PoCL) as ``validate --on host-vulkan`` /
  ``host-opencl`` runs a build (each run in a child process: a driver abort is that case's error).
  Not cached: every run compiles.
* ``--profile rpi4|rpi3 --on emulator``: the case compiled for the profile's target, linked with its
  cross compiler into the device library the C API loads (``compiling.export_device_library``, the
  metadata embedded), and run by edgepack's C runner (``run.c_runner``) under qemu-user on ``.npy``
  files: what ``validate --on emulator`` does, with no Python on the running side.

Device cases are cached under ``<cache>/conformance/<tvm>/<profile>/<case>-<key>/``: the device library and
its tensor specs (or the import/compile failure), keyed by the case's model and input shapes, the target,
the compiler, the sources that compile (``BUILD_SOURCES``) and ``CACHE_VERSION``; beside them the outputs of each run, keyed
by the runner (its build covers the C API and the TVM runtime), the inputs and ``RUN_SOURCES``. A rerun
with nothing changed only compares; a change rebuilds or reruns what it could affect.

Isolation: cases run in long-lived worker processes (``--jobs``) that import TVM once and take cases
one at a time; a case that crashes its worker or runs past ``--timeout`` is recorded as ``crash`` /
``timeout`` and the worker is replaced. Each run by the C runner has its own time limit.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CRASH_CASE = "__crash__"  # a pseudo case whose worker dies (used by tests/test_conformance.py)
STATUSES = ("pass", "mismatch", "error", "crash", "timeout")
RUN_TIMEOUT_S = 120.0  # one C runner run under qemu
CACHE_VERSION = "2"  # bump when what a cache entry holds, or how it is made here, changes


@dataclass(frozen=True)
class Place:
    """Where a sweep runs its cases: ``host``, ``emulator`` with a device profile, or ``gpu`` with a GPU
    profile (this machine's driver)."""

    profile: str = "host"
    on: str = "host"

    @property
    def name(self) -> str:
        """``host``, ``rpi4-emulator`` ...: the key of its results."""
        return "host" if self.on == "host" else f"{self.profile}-{self.on}"

    @property
    def label(self) -> str:
        if self.on == "gpu":
            return f"{self.profile} (this machine's GPU driver)"
        return "host (this machine, Relax VM)" if self.on == "host" else f"{self.profile} (C runner under qemu-user)"


def parse_place(profile: str, on: str) -> Place:
    if on not in ("host", "emulator", "gpu"):
        raise SystemExit(f"--on {on}: use host, emulator or gpu")
    if on == "gpu":
        from edgepack.backends import backend_for
        from edgepack.profiles import get_profile

        if backend_for(get_profile(profile)).host_place == "host":
            raise SystemExit(f"--on gpu needs a GPU profile (vulkan-generic, mali-g610 ...), not {profile}")
        return Place(profile, on)
    if on == "emulator":
        from edgepack.profiles import get_profile

        if get_profile(profile).is_host:
            raise SystemExit(f"--on emulator needs a device profile (rpi4, rpi3 ...), not {profile}")
        return Place(profile, on)
    return Place()  # the host build is the same for every CPU profile: {"kind": "llvm"}


@dataclass
class CaseResult:
    case: str
    op: str
    status: str  # one of STATUSES
    kind: str = ""  # for errors: not-implemented / input / import / compile / boundary / run / output
    message: str = ""
    seconds: float = 0.0
    frozen: list[str] = field(default_factory=list)  # ONNX: parameter inputs baked in as constants
    cached: bool = False  # device path: the build (and the run's outputs) came from the cache


class CaseError(Exception):
    """A case that did not get as far as outputs: ``kind`` says where it stopped."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


# --- comparing ----------------------------------------------------------------------------------


def compare_outputs(actual: list, expected: list, rtol: float = 1e-3, atol: float = 1e-7) -> str:
    """'' when ``actual`` matches ``expected`` like ONNX's backend runner checks it, else why not."""
    import numpy as np

    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(actual, expected)):
        if isinstance(want, list):
            if not isinstance(got, list):
                return f"output {i}: a tensor where a sequence was expected"
            why = compare_outputs(got, want, rtol, atol)
            if why:
                return f"output {i}: {why}"
            continue
        if want is None:
            if got is not None and not (isinstance(got, list) and not got):
                return f"output {i}: expected an empty optional"
            continue
        if isinstance(got, list):
            return f"output {i}: a sequence where a tensor was expected"
        want = np.asarray(want)
        got = np.asarray(got)
        if got.shape != want.shape:
            return f"output {i}: shape {list(got.shape)}, expected {list(want.shape)}"
        if want.dtype == object:
            if not np.array_equal(got.astype(str), want.astype(str)):
                return f"output {i}: strings differ"
            continue
        if got.dtype != want.dtype:
            return f"output {i}: dtype {got.dtype}, expected {want.dtype}"
        try:
            np.testing.assert_allclose(got.astype(np.float64) if got.dtype.kind == "V" else got,
                                       want.astype(np.float64) if want.dtype.kind == "V" else want,
                                       rtol=rtol, atol=atol)
        except AssertionError as exc:
            detail = " ".join(ln.strip() for ln in str(exc).splitlines() if "Max" in ln)
            return f"output {i}: values differ ({detail or 'mismatch'})"
        except TypeError as exc:
            return f"output {i}: cannot compare ({exc})"
    return ""


def nest_like(flat: list, expected: list) -> list:
    """The C runner's flat outputs grouped like ``expected`` (whose lists are ONNX sequences)."""
    out, it = [], iter(flat)
    for want in expected:
        if isinstance(want, list):
            out.append(nest_like([next(it, None) for _ in want], want))
        else:
            out.append(next(it, None))
    return out + list(it)  # extra outputs stay visible to the comparison


def to_python(value):
    """A Relax VM result as numpy arrays and lists (tuples become lists: ONNX sequences)."""
    import numpy as np

    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (int, float, bool)):
        return np.array(value)
    return [to_python(v) for v in value]


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(text)


# --- running one case at a place ----------------------------------------------------------------

# What decides the device library a case compiles to (the build key), and how the runner runs it (with
# the runner's own key, which covers the C API and the TVM runtime).
BUILD_SOURCES = ("edgepack/frontends", "edgepack/backends", "edgepack/toolchain", "edgepack/compiling.py",
                 "edgepack/profiles.py", "edgepack/tensors.py", "edgepack/manifest.py", "device_profiles")
RUN_SOURCES = ("edgepack/run/c_runner.py", "edgepack/tensors.py")
_DIGESTS: dict[tuple[str, ...], str] = {}


def sources_digest(parts: tuple[str, ...]) -> str:
    """A digest of the files under ``parts`` (paths relative to the repository), once per process."""
    if parts not in _DIGESTS:
        h = hashlib.sha256(CACHE_VERSION.encode())
        for part in parts:
            base = ROOT / part
            files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()
                                                          and p.suffix in (".py", ".toml"))
            for path in files:
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
        _DIGESTS[parts] = h.hexdigest()
    return _DIGESTS[parts]


def _inputs_digest(inputs: dict) -> str:
    import numpy as np

    h = hashlib.sha256()
    for name in sorted(inputs):
        a = np.asarray(inputs[name])
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def run_model(place: Place, case: str, model_path: Path, shapes: dict, inputs: dict,
              import_model: Callable[[], object]) -> tuple[list, bool]:
    """Compile the case's model for ``place`` and run it on ``inputs`` (arrays by input name, already in
    the dtypes the compiled model takes). Returns (outputs, cached): outputs nested as the Relax function
    returns them on the host, flat from the C runner. ``import_model()`` imports the model (an
    ``ImportedModel``) and raises ``CaseError`` for import failures."""
    if place.on == "host":
        return _run_on_host(place, inputs, import_model()), False
    if place.on == "gpu":
        return _run_on_gpu(place, model_path, shapes, inputs, import_model), False
    return _run_on_emulator(place, case, model_path, shapes, inputs, import_model)


def _run_on_host(place: Place, inputs: dict, imported) -> list:
    import tvm
    from tvm import relax

    from edgepack.backends import backend_for
    from edgepack.profiles import get_profile
    from edgepack.tensors import contiguous

    profile = get_profile(place.profile)
    target = profile.tvm_target() if profile.is_host else backend_for(profile).host_target(profile)
    try:
        executable = backend_for(profile).build(imported, target).executable
    except Exception as exc:  # noqa: BLE001 - recorded, not raised
        raise CaseError("compile", str(exc)) from exc
    try:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        args = [tvm.runtime.tensor(contiguous(inputs[spec.name])) for spec in imported.inputs]
        out = to_python(vm["main"](*args))
    except Exception as exc:  # noqa: BLE001
        raise CaseError("run", f"{type(exc).__name__}: {last_line(str(exc))}") from exc
    return out


def _run_on_gpu(place: Place, model_path: Path, shapes: dict, inputs: dict,
                import_model: Callable[[], object]) -> list:
    import tempfile

    from edgepack.backends import backend_for
    from edgepack.compiling import compile_model
    from edgepack.errors import EdgepackError
    from edgepack.profiles import get_profile
    from edgepack.run.places import parse_place as place_named

    import_model()  # an import failure is recorded as such, as at the other places
    backend = backend_for(get_profile(place.profile))
    with tempfile.TemporaryDirectory(prefix="edgepack-conformance-") as tmp:
        try:
            build = compile_model(model_path, place.profile, Path(tmp) / "build", input_shapes=shapes)
        except EdgepackError as exc:
            raise CaseError("compile", f"{exc} {exc.hint}".strip()) from exc
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            raise CaseError("compile", f"{type(exc).__name__}: {last_line(str(exc))}") from exc
        try:
            ran = place_named(backend.host_place).run(build.output_dir, build.manifest, inputs, threads=1)
        except EdgepackError as exc:
            raise CaseError("run", str(exc)) from exc
        except Exception as exc:  # noqa: BLE001
            raise CaseError("run", f"{type(exc).__name__}: {last_line(str(exc))}") from exc
    return list(ran.arrays)


def _run_on_emulator(place: Place, case: str, model_path: Path, shapes: dict, inputs: dict,
                     import_model: Callable[[], object]) -> tuple[list, bool]:
    import numpy as np

    from edgepack.backends import backend_for, target_dict
    from edgepack.compiling import export_device_library, output_specs
    from edgepack.errors import EdgepackError
    from edgepack.files import cached_directory
    from edgepack.frontends.onnx_ops import container_dtype
    from edgepack.manifest import DEVICE_LIBRARY
    from edgepack.paths import cache_root
    from edgepack.profiles import get_profile
    from edgepack.run.c_runner import as_spec_dtype, run_c_runner, runner_for_profile
    from edgepack.tensors import TensorSpec
    from edgepack.toolchain.compilers import emulator_command, find_compilers
    from edgepack.versions import installed_tvm

    profile = get_profile(place.profile)
    compilers = find_compilers(profile)
    target = profile.tvm_target()
    key = hashlib.sha256("\n".join([
        hashlib.sha256(Path(model_path).read_bytes()).hexdigest(), json.dumps(shapes, sort_keys=True),
        json.dumps(target_dict(target), sort_keys=True), compilers.version, sources_digest(BUILD_SOURCES),
    ]).encode()).hexdigest()[:16]
    base = cache_root() / "conformance" / installed_tvm()[0] / profile.name
    base.mkdir(parents=True, exist_ok=True)
    built_now = []

    def make(staging: Path) -> None:
        built_now.append(True)
        try:
            imported = import_model()
            outputs = output_specs(imported)
        except CaseError as exc:
            (staging / "failure.json").write_text(json.dumps({"kind": exc.kind, "message": exc.message}))
            return
        except Exception as exc:  # noqa: BLE001 - e.g. an output that is not a tensor
            (staging / "failure.json").write_text(json.dumps({"kind": "boundary", "message": f"{exc}"}))
            return
        try:
            executable = backend_for(profile).build(imported, target).executable
        except Exception as exc:  # noqa: BLE001
            (staging / "failure.json").write_text(json.dumps({"kind": "compile", "message": str(exc)}))
            return
        # ONNX sub-byte types (int4 ...) cross the boundary in 8-bit containers (onnx_ops.to_container)
        takes = tuple(replace(t, dtype=container_dtype(t.dtype)) for t in imported.inputs)
        try:
            export_device_library(executable, staging, takes, outputs, compilers)
        except EdgepackError as exc:  # a dtype the C API does not carry, a link failure
            kind = "boundary" if "C runtime does not support" in str(exc) else "compile"
            (staging / "failure.json").write_text(json.dumps({"kind": kind, "message": f"{exc} {exc.hint}".strip()}))
            return
        (staging / "specs.json").write_text(json.dumps({
            "inputs": [t.to_dict() for t in takes], "outputs": [t.to_dict() for t in outputs]}))

    entry = cached_directory(base / f"{case}-{key}", make)
    if (entry / "failure.json").exists():
        failure = json.loads((entry / "failure.json").read_text())
        raise CaseError(failure["kind"], failure["message"])
    specs = json.loads((entry / "specs.json").read_text())
    in_specs = tuple(TensorSpec.from_dict(t) for t in specs["inputs"])
    out_specs = tuple(TensorSpec.from_dict(t) for t in specs["outputs"])
    runner = runner_for_profile(profile)
    prefix = emulator_command(profile)
    run_key = hashlib.sha256(f"{runner}|{prefix}|{sources_digest(RUN_SOURCES)}|{_inputs_digest(inputs)}"
                             .encode()).hexdigest()[:16]
    saved = entry / f"outputs-{run_key}.npz"
    if saved.exists():
        with np.load(saved) as data:
            return [as_spec_dtype(data[f"o{i}"], spec) for i, spec in enumerate(out_specs)], not built_now
    try:
        result = run_c_runner(prefix, runner, entry / DEVICE_LIBRARY, inputs, in_specs, out_specs,
                              threads=1, timeout=RUN_TIMEOUT_S)
    except EdgepackError as exc:
        raise CaseError("run", str(exc)) from exc
    tmp = entry / f".{saved.name}.{os.getpid()}.npz"
    np.savez(tmp, **{f"o{i}": a for i, a in enumerate(result.outputs)})
    tmp.replace(saved)
    return result.outputs, False


# --- the workers ---------------------------------------------------------------------------------


def _worker(conn, suite: str, place: Place) -> None:
    # Keep TVM's and the frontend's prints out of the report; results travel through the pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import shutil
    import tempfile
    import warnings

    warnings.simplefilter("ignore")
    import tvm  # noqa: F401 - imported once per worker, not once per case

    module = importlib.import_module(suite)
    workdir = tempfile.mkdtemp(prefix=f"edgepack-{suite}-")
    while True:
        case = conn.recv()
        if case is None:
            shutil.rmtree(workdir, ignore_errors=True)
            return
        if case == CRASH_CASE:  # the tests' way to check that a dying worker cannot end the run
            os._exit(3)
        try:
            res = module.run_case(case, workdir, place)
        except Exception as exc:  # noqa: BLE001 - the runner itself must not die on a case
            res = CaseResult(case, "?", "error", "runner", f"{type(exc).__name__}: {exc}")
        conn.send(asdict(res))


@dataclass
class _Slot:
    proc: mp.Process
    conn: object
    case: str | None = None
    since: float = 0.0
    done: int = 0


def run_pool(suite: str, cases: list[str], place: Place, jobs: int, timeout: float,
             on_result: Callable[[CaseResult], None], op_of: Callable[[str], str], recycle: int = 150) -> None:
    """Run ``cases`` of the sweep module ``suite`` (its ``run_case(case, workdir, place)``) on ``jobs``
    workers; ``on_result(CaseResult)`` for each, in completion order."""
    ctx = mp.get_context("spawn")

    def start() -> _Slot:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, suite, place), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent)

    def stop(slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    pending = list(reversed(cases))
    slots = [start() for _ in range(max(1, min(jobs, len(cases))))]
    try:
        while pending or any(s.case for s in slots):
            for i, slot in enumerate(slots):
                if slot.case is None and pending:
                    if slot.done >= recycle:  # long-lived workers grow; start a fresh one now and then
                        stop(slot)
                        slot = slots[i] = start()
                    slot.case, slot.since = pending.pop(), time.monotonic()
                    slot.conn.send(slot.case)
            busy = [s for s in slots if s.case]
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=1.0)
            now = time.monotonic()
            for i, slot in enumerate(slots):
                if slot.case is None:
                    continue
                if slot.conn in ready:
                    try:
                        data = slot.conn.recv()
                    except (EOFError, OSError):
                        data = None
                    if data is not None:
                        on_result(CaseResult(**data))
                        slot.case, slot.done = None, slot.done + 1
                        continue
                if slot.proc.sentinel in ready or not slot.proc.is_alive():
                    on_result(CaseResult(slot.case, op_of(slot.case), "crash", "worker",
                                         f"worker died (exit code {slot.proc.exitcode})", round(now - slot.since, 2)))
                    stop(slot)
                    slots[i] = start()
                elif now - slot.since > timeout:
                    on_result(CaseResult(slot.case, op_of(slot.case), "timeout", "worker",
                                         f"no result after {timeout:.0f} s", round(now - slot.since, 2)))
                    stop(slot)
                    slots[i] = start()
    finally:
        for slot in slots:
            try:
                slot.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            slot.proc.join(2)
            stop(slot)


# --- results and the report ----------------------------------------------------------------------


def results_dir() -> Path:
    """Where each place's results are kept between runs (the report compares them)."""
    from edgepack.paths import cache_root

    return cache_root() / "conformance" / "results"


def results_path(suite: str, place: Place) -> Path:
    return results_dir() / f"{suite}-{place.name}.json"


def save_results(path: Path, place: Place, results: dict[str, CaseResult], meta: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": {**(meta or {}), "place": asdict(place)},
            "results": [asdict(r) for r in sorted(results.values(), key=lambda r: r.case)]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def load_results(path: Path) -> tuple[dict, dict[str, CaseResult]]:
    data = json.loads(path.read_text())
    return data.get("meta", {}), {r["case"]: CaseResult(**r) for r in data["results"]}


def counts(results: list[CaseResult]) -> dict[str, int]:
    c = Counter(r.status for r in results)
    return {s: c.get(s, 0) for s in STATUSES}


def machine_line(*packages: str) -> str:
    from importlib.metadata import version

    return (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores), Python {platform.python_version()}, "
            + ", ".join(f"{p} {version(p)}" for p in ("apache-tvm", *packages)))


def now_line() -> str:
    return f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"


def write_section(path: Path, suite: str, text: str) -> None:
    """Replace the section of ``path`` between ``<!-- begin SUITE -->`` and ``<!-- end SUITE -->`` with
    ``text`` (appended when the file has no such section), atomically."""
    begin, end = f"<!-- begin {suite} -->", f"<!-- end {suite} -->"
    old = path.read_text() if path.exists() else ""
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + block
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(new)
    tmp.replace(path)


def differences(host: dict[str, CaseResult], device: dict[str, CaseResult]) -> list[tuple[CaseResult, CaseResult]]:
    """Cases run at both places whose status differs: (host result, device result)."""
    return [(host[c], device[c]) for c in sorted(set(host) & set(device)) if host[c].status != device[c].status]
