"""Tune a model's kernels with MetaSchedule, keep the records, and compile with the best of them.

A tuning directory holds::

    tuning.json                  what was tuned: model sha256, input shapes, profile, target, TVM version
    tasks.json                   the model's tuning tasks (fused kernels): name, workload hash, weight, flop
    database_workload.json       MetaSchedule's JSON database (append-only, one JSON value per line):
    database_tuning_record.json    every finished measurement is one line of the record file
    state.json                   time spent tuning so far (all runs), number of runs
    logs/tune.log                MetaSchedule's own log

Resuming: every measurement batch is recorded as soon as it is measured (one appended line per
record; TVM's ``JSONDatabase`` closes the file after each). The runner is made blocking and the task
scheduler joins finished batches before every pick: MetaSchedule by default builds the next batch
while the last one runs and records a batch only when it comes back to its task, so a kill could
lose several. A run killed at any moment thus loses at most the batch in flight; Ctrl-C (or
SIGTERM) finishes and records that batch, then stops. A rerun repairs a torn last line, counts the
records per task and only measures what the budgets leave; the search strategy is wrapped so that a
candidate whose schedule already has a record is answered from the database instead of being
measured again (the evolutionary search starts from the best recorded schedules, so it would
otherwise propose some of them again), and the cost model is trained on the recorded measurements
before the first new batch.

Budgets hold for the directory as a whole, across runs: ``trials`` counts every record, and
``time_budget_s`` every second spent tuning (kept in ``state.json``). Every task first gets a small
probe batch (heaviest first), then the trials go to the task whose weighted latency (weight x best
latency: its share of the model's time) is expected to drop most, as MetaSchedule's gradient task
scheduler decides, with the history of earlier runs taken from the records.

Measuring happens on this machine (``on="host"``, host profiles only), on a device of the
inventory (``on=NAME``: the device's RPC server through an SSH tunnel), or on every device of a
profile through the farm's RPC tracker (``on="farm:PROFILE"``). Candidates for devices are built on
this machine and linked with the profile's cross compiler.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edgepack import __version__
from edgepack.errors import EdgepackError

META_FILE = "tuning.json"
TASKS_FILE = "tasks.json"
STATE_FILE = "state.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOCK_FILE = ".lock"
LOG_DIR = "logs"
FORMAT_VERSION = 1

DEFAULT_TRIALS = 1000
DEFAULT_BATCH = 16  # candidates per measurement batch: records are flushed after each batch
PROBE_TRIALS = 4  # a task's first batch: every kernel gets a measured schedule before any gets many
BUILDER_TIMEOUT_S = 180.0  # see docs: a cold builder worker may take ~30 s before it builds anything
FAILED_SECONDS = 1e9  # run_secs at or above this mean "did not run" (MetaSchedule writes 1e10)
HOST_OPENCL = "host-opencl"  # --on: this machine's OpenCL device (OpenCL profiles)

Progress = Callable[["TuningProgress"], None]
Log = Callable[[str], None]


class TuningError(EdgepackError):
    """Tuning cannot start, or its records cannot be used."""


class TuningMismatchError(TuningError):
    """The tuning directory was made for another model, input shape, target or TVM version."""


# ---------------------------------------------------------------------------------------------
# data


@dataclass(frozen=True)
class TuningTask:
    """One kernel of the model that MetaSchedule tunes (a fused TIR function)."""

    name: str
    workload: str  # MetaSchedule's structural hash of the kernel (the key in database_workload.json)
    weight: int  # how many times the model calls it
    flop: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TuningMeta:
    """What a tuning directory was made for (``tuning.json``)."""

    model_name: str
    model_sha256: str
    model_format: str
    inputs: tuple[dict[str, Any], ...]  # [{name, dtype, shape}]
    profile: str
    target: dict[str, Any]  # the compile target (the profile's), as exported by TVM
    tuning_target: dict[str, Any]  # the same with the core count MetaSchedule schedules for
    tvm_version: str
    tvm_ffi_version: str
    edgepack_version: str
    created: str
    format_version: int = FORMAT_VERSION
    # CPU kernels were tuned with their constant weights layout-free (see _prepare_passes); directories
    # made before this existed were not, and stay usable as they were made
    weight_prepack: bool = False
    # host CPU candidates were timed with their weights flushed from the cache before every run, as
    # they are in the model (read once per inference); older directories timed them cache-warm
    cold_weights: bool = False
    # CPU convolutions were tuned channels-last (NHWC), see _prepare_passes; older directories NCHW
    channels_last: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = list(self.inputs)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuningMeta:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["inputs"] = tuple(fields.get("inputs", ()))
        return cls(**fields)


@dataclass(frozen=True)
class TaskSummary:
    name: str
    workload: str
    weight: int
    flop: float
    trials: int  # records (finished measurements), failed ones included
    failed: int  # records whose candidate did not build or run
    best_seconds: float | None  # the fastest recorded run of the kernel
    share: float | None  # weight * best / sum over tasks of weight * best (None: no valid record)

    @property
    def weighted_seconds(self) -> float | None:
        return None if self.best_seconds is None else self.best_seconds * self.weight

    @property
    def gflops(self) -> float | None:
        if not self.best_seconds or not self.flop:
            return None
        return self.flop / self.best_seconds / 1e9

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"weighted_seconds": self.weighted_seconds, "gflops": self.gflops}


@dataclass(frozen=True)
class TuningSummary:
    """A tuning directory as read from disk (no TVM needed): per task, what the records say."""

    directory: Path
    meta: TuningMeta
    tasks: tuple[TaskSummary, ...]
    seconds: float  # time spent tuning, all runs together
    runs: int
    ignored_lines: int = 0  # torn or unreadable lines skipped while reading

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tasks)

    @property
    def tuned_tasks(self) -> int:
        return sum(t.best_seconds is not None for t in self.tasks)

    @property
    def estimated_seconds(self) -> float | None:
        """Sum of weight * best latency over tasks: the kernels' share of one inference."""
        if not self.tasks or any(t.best_seconds is None for t in self.tasks):
            return None
        return sum(t.weighted_seconds or 0.0 for t in self.tasks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "meta": self.meta.to_dict(),
            "trials": self.trials,
            "tuned_tasks": self.tuned_tasks,
            "seconds": round(self.seconds, 1),
            "runs": self.runs,
            "estimated_seconds": self.estimated_seconds,
            "ignored_lines": self.ignored_lines,
            "tasks": [t.to_dict() for t in self.tasks],
        }


@dataclass(frozen=True)
class TaskProgress:
    name: str
    weight: int
    trials: int  # records of this task so far (earlier runs included)
    best_seconds: float | None
    cap: int | None  # the most records this task may have (None: no per-task limit)
    tuning: bool  # measured in this run (not finished before it started)
    finished: bool


@dataclass(frozen=True)
class TuningProgress:
    """A snapshot for progress displays: sent at the start, after every batch, and at the end."""

    tasks: tuple[TaskProgress, ...]
    trials: int  # records in the directory
    trials_budget: int
    trials_this_run: int
    elapsed_s: float  # this run
    seconds_total: float  # all runs
    time_budget_s: float | None
    eta_s: float | None
    last_task: int | None  # index of the task whose batch just finished
    finished: bool = False
    current_task: int | None = None  # index of the task being measured now
    message: str = ""


@dataclass(frozen=True)
class TuningResult:
    summary: TuningSummary
    on: str
    trials_before: int
    trials_run: int  # measured in this run
    skipped: int  # candidates answered from the records instead of being measured again
    seconds: float  # this run
    stopped: str  # "trials" | "time" | "tasks" (all at their cap or out of candidates) | "interrupted" | "nothing to do"
    repaired: tuple[str, ...] = ()
    lost: int = 0  # remote measurements lost to a dropped device or link (not recorded: a rerun measures them)

    @property
    def directory(self) -> Path:
        return self.summary.directory

    def to_dict(self) -> dict[str, Any]:
        return {
            "on": self.on,
            "trials_before": self.trials_before,
            "trials_run": self.trials_run,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 1),
            "stopped": self.stopped,
            "repaired": list(self.repaired),
            "lost": self.lost,
        } | self.summary.to_dict()


@dataclass(frozen=True)
class AppliedTuning:
    """What ``compile`` needs: the Relax pipeline that applies the records, and what they cover."""

    relax_pipeline: Any  # tvm.transform.Pass, for tvm.compile(..., relax_pipeline=...)
    summary: TuningSummary
    tuned_tasks: int
    total_tasks: int

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.summary.directory), "tuned_tasks": self.tuned_tasks,
                "total_tasks": self.total_tasks, "trials": self.summary.trials}


# ---------------------------------------------------------------------------------------------
# small helpers


def parse_duration(text: str | float | None) -> float | None:
    """``90``, ``90s``, ``30m``, ``1h30m``, ``2h`` -> seconds (None stays None)."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return float(text)
    spec = text.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(\.\d+)?", spec):
        return float(spec)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", spec)
    if not parts or "".join(n + u for n, u in parts) != spec:
        raise TuningError(f"Cannot read the duration {text!r}.", "Write it like 90s, 30m, 1h or 1h30m.")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in parts)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TuningError(f"Cannot read {path}: {exc}.",
                          "The tuning directory is damaged; tune into a new directory.") from exc


def _versions() -> tuple[str, str]:
    from importlib.metadata import version

    return version("apache-tvm"), version("apache-tvm-ffi")


def _record_seconds(record: list) -> float | None:
    """Mean run time of one record line's value (``[trace, run_secs, target, args_info]``), None if failed."""
    try:
        run_secs = record[1]
    except (IndexError, TypeError):
        return None
    if not run_secs:
        return None
    try:
        values = [float(s) for s in run_secs]
    except (TypeError, ValueError):
        return None
    mean = sum(values) / len(values)
    return None if not math.isfinite(mean) or mean >= FAILED_SECONDS else mean


def _short_error(exc: BaseException) -> str:
    from edgepack.importers import _first_line

    return _first_line(exc)[:200]


def _normalized_target(target: dict[str, Any]) -> dict[str, Any]:
    """A target dict for comparisons: without the core count (a scheduling hint) and empty tags."""
    return {key: _normalized_target(value) if isinstance(value, dict) else value
            for key, value in target.items() if key not in ("num-cores", "tag")}


def _target_export(target) -> dict[str, Any]:
    from edgepack.compiler import _target_dict

    return _target_dict(target)


# ---------------------------------------------------------------------------------------------
# reading the database without TVM


@dataclass(frozen=True)
class _Lines:
    values: list[Any]
    complete_bytes: int  # length of the prefix made of complete, valid lines
    ignored: int  # lines skipped (torn last line, unreadable lines)
    torn_tail: bool  # the file ends with an incomplete line


def _read_lines(path: Path, valid: Callable[[Any], bool]) -> _Lines:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _Lines([], 0, 0, False)
    values: list[Any] = []
    ignored = 0
    good_prefix = 0
    prefix_ok = True
    pos = 0
    torn = False
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:  # no newline: the writer died in the middle of this line
            torn = True
            ignored += 1
            break
        line = data[pos:end].strip()
        pos = end + 1
        if not line:
            if prefix_ok:
                good_prefix = pos
            continue
        try:
            value = json.loads(line)
            ok = valid(value)
        except ValueError:
            ok = False
        if ok:
            values.append(value)
            if prefix_ok:
                good_prefix = pos
        else:
            ignored += 1
            prefix_ok = False
    return _Lines(values, good_prefix, ignored, torn)


def _valid_workload(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], str)


def _valid_record(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and isinstance(value[1], list) and len(value[1]) >= 2)


def _read_database(directory: Path) -> tuple[list[str], list[list], int]:
    """(workload hashes by index, [workload index, record] pairs, ignored lines) from the JSON files."""
    workloads = _read_lines(directory / WORKLOAD_FILE, _valid_workload)
    records = _read_lines(directory / RECORD_FILE, _valid_record)
    hashes = [w[0] for w in workloads.values]
    good = [r for r in records.values if 0 <= r[0] < len(hashes)]
    return hashes, good, workloads.ignored + records.ignored + (len(records.values) - len(good))


def load_tuning(directory: Path | str) -> TuningSummary:
    """Read a tuning directory: per task, records, best latency, weight and share of model time."""
    directory = Path(directory)
    meta_data = _read_json(directory / META_FILE)
    tasks_data = _read_json(directory / TASKS_FILE)
    if meta_data is None or tasks_data is None:
        raise TuningError(f"{directory} is not a tuning directory (no {META_FILE} or {TASKS_FILE}).",
                          "Make one with `edgepack tune MODEL --profile PROFILE -o DIR`.")
    try:
        meta = TuningMeta.from_dict(meta_data)
        tasks = [TuningTask(t["name"], str(t["workload"]), int(t["weight"]), float(t.get("flop", 0.0)))
                 for t in tasks_data["tasks"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise TuningError(f"{directory} has a malformed {META_FILE} or {TASKS_FILE} ({exc}).",
                          "Tune into a new directory.") from exc
    state = _read_json(directory / STATE_FILE) or {}
    hashes, records, ignored = _read_database(directory)
    counts: dict[str, int] = {}
    failed: dict[str, int] = {}
    best: dict[str, float] = {}
    for index, record in records:
        workload = hashes[index]
        counts[workload] = counts.get(workload, 0) + 1
        seconds = _record_seconds(record)
        if seconds is None:
            failed[workload] = failed.get(workload, 0) + 1
        elif workload not in best or seconds < best[workload]:
            best[workload] = seconds
    total = sum(best[t.workload] * t.weight for t in tasks if t.workload in best)
    summaries = tuple(
        TaskSummary(t.name, t.workload, t.weight, t.flop, counts.get(t.workload, 0), failed.get(t.workload, 0),
                    best.get(t.workload),
                    (best[t.workload] * t.weight / total) if t.workload in best and total > 0 else None)
        for t in tasks
    )
    return TuningSummary(directory, meta, summaries, float(state.get("seconds", 0.0)), int(state.get("runs", 0)),
                         ignored)


def repair_database(directory: Path | str) -> list[str]:
    """Make the JSON database loadable after a kill: drop a torn last line, and unreadable lines.

    Only ever removes bytes that TVM could not load anyway; returns what was done, for the log.
    Must not run while a tuner writes to the directory (``tune_model`` holds the lock).
    """
    directory = Path(directory)
    done = []
    workloads = _read_lines(directory / WORKLOAD_FILE, _valid_workload)
    if workloads.ignored and workloads.complete_bytes < (directory / WORKLOAD_FILE).stat().st_size:
        if not workloads.torn_tail or workloads.ignored > 1:
            raise TuningError(
                f"{directory / WORKLOAD_FILE} has unreadable lines in the middle; the records cannot be matched "
                "to their kernels any more.",
                "Tune into a new directory (or restore the file from a backup).",
            )
        os.truncate(directory / WORKLOAD_FILE, workloads.complete_bytes)
        done.append(f"dropped a torn last line of {WORKLOAD_FILE}")
    records_path = directory / RECORD_FILE
    records = _read_lines(records_path, _valid_record)
    n_workloads = len(workloads.values)
    dangling = [r for r in records.values if not 0 <= r[0] < n_workloads]
    if records.ignored or dangling:
        if records.torn_tail and records.ignored == 1 and not dangling:
            os.truncate(records_path, records.complete_bytes)
            done.append(f"dropped a torn last line of {RECORD_FILE}")
        else:
            keep = [r for r in records.values if 0 <= r[0] < n_workloads]
            backup = records_path.with_name(f"{RECORD_FILE}.damaged-{int(time.time())}")
            shutil.copyfile(records_path, backup)
            tmp = records_path.with_name(f".{RECORD_FILE}.tmp")
            tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep))
            tmp.replace(records_path)
            done.append(f"rewrote {RECORD_FILE} without {records.ignored + len(dangling)} unreadable lines "
                        f"(the original is kept as {backup.name})")
    return done


# ---------------------------------------------------------------------------------------------
# the model's tasks


def _cpu_pipeline():
    # the module, not the package: tvm.relax.backend.cpu_generic does not export dataflow_lower_passes
    from tvm.relax.backend.cpu_generic import pipeline

    return pipeline


def _prepare_passes(target, weight_prepack: bool = False, channels_last: bool = False):
    """Relax passes up to fused TIR kernels: the same for task extraction and for applying records.

    ``weight_prepack``: the weights are constants, so the CPU kernels mark them layout-free;
    MetaSchedule may then pick a weight layout that suits its loop nest (``RewriteLayout``), and
    the rewrite is done once at compile time (``_weight_prepack_passes``), not on every inference.
    ``channels_last``: convolutions (and the elementwise and pooling operators between them) work on
    NHWC activations, the model's NCHW input and output transposed once at its ends. Channels are
    the axis SIMD lanes fill best: a depthwise or strided convolution in NCHW vectorizes along a row
    of 7-112 pixels (strided loads for stride 2), in NHWC along 16-1280 contiguous channels
    (MobileNetV2's stride-2 depthwise convolution on 112x112: 0.28 ms after 64 trials in NHWC,
    0.40 ms in NCHW).
    """
    from tvm import relax

    if _is_gpu(target):  # OpenCL (Mali/Adreno): the GPU pipeline without dlight's default schedules
        from edgepack.opencl import tuning_passes

        return tuning_passes(target)
    cpu = _cpu_pipeline()
    prepack = [relax.transform.AttachAttrLayoutFreeBuffers()] if weight_prepack else []
    layout = [relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})] if channels_last else []
    return [*layout, *cpu.library_dispatch_passes(target), *cpu.legalize_passes(target), *prepack]


def _weight_prepack_passes():
    """After the records are applied: split each kernel's weight-layout rewrite into its own
    function and fold it into the constant weights (so it never runs on the device)."""
    from tvm import relax

    return [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant(),
            relax.transform.DeadCodeElimination()]


def _is_gpu(target) -> bool:
    return str(target.kind.name) == "opencl"


def _fused_module(imported, target, weight_prepack: bool, channels_last: bool):
    import tvm

    with target:
        return tvm.transform.Sequential(_prepare_passes(target, weight_prepack, channels_last))(imported.mod)


def extract_tasks(imported, target, *, weight_prepack: bool = False,
                  channels_last: bool = False) -> tuple[list[TuningTask], list[Any]]:
    """The model's tuning tasks and MetaSchedule's ExtractedTask objects, in a stable order."""
    import tvm_ffi
    from tvm.s_tir.analysis import estimate_tir_flops
    from tvm.s_tir.meta_schedule.relax_integration import extract_tasks as ms_extract

    extracted = [t for t in ms_extract(_fused_module(imported, target, weight_prepack, channels_last), target)
                 if not t.mod.attrs or not t.mod.attrs.get("tirx.is_scheduled", False)]
    tasks = []
    for task in extracted:
        mod = task.dispatched[0]
        try:
            flop = float(estimate_tir_flops(mod))
        except Exception:  # noqa: BLE001 - flop counts are for display only
            flop = 0.0
        tasks.append(TuningTask(str(task.task_name), str(tvm_ffi.structural_hash(mod)), int(task.weight), flop))
    order = sorted(range(len(tasks)), key=lambda i: tasks[i].name)
    return [tasks[i] for i in order], [extracted[i] for i in order]


# ---------------------------------------------------------------------------------------------
# where candidates are measured


def build_candidate(mod, target, _params):
    """MetaSchedule builder function (runs in the builder's worker processes).

    Unlike MetaSchedule's default it does not import ``tvm.s_tir.tensor_intrin`` (about 25 s in every
    fresh worker, for every batch): tensorized candidates already carry the intrinsic's body.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def export_candidate(cxx: str | None, rt_mod) -> str:
    """MetaSchedule export function: a shared library, linked with the cross compiler ``cxx``."""
    from tvm.support import cc

    path = os.path.join(tempfile.mkdtemp(prefix="edgepack-ms-"), "candidate.so")
    if cxx:
        rt_mod.export_library(path, fcompile=cc.cross_compiler(cxx))
    else:
        rt_mod.export_library(path)
    return path


def alloc_arguments(session, device, args_info, alloc_repeat: int):
    """MetaSchedule RPC argument allocation that needs nothing but the runtime on the device.

    (The default asks the device for ``tvm.contrib.random.random_fill_for_measure``, which the plain
    runtime library does not have.) Random data is made here and copied over.
    """
    import numpy as np
    import tvm

    rng = np.random.default_rng(0)
    repeated = []
    for _ in range(alloc_repeat):
        args = []
        for info in args_info:
            kind, dtype, shape = info[0], info[1], info[2]
            if kind != "TENSOR":
                raise NotImplementedError(f"Unsupported argument kind {kind}")
            np_dtype = np.dtype(dtype)
            if np.issubdtype(np_dtype, np.floating):
                value = rng.random(shape, dtype=np.float32).astype(np_dtype)
            elif np_dtype == np.bool_:
                value = rng.random(shape) < 0.5
            else:
                value = rng.integers(0, 8, size=shape).astype(np_dtype)
            array = tvm.runtime.empty(shape, dtype, device)
            array.copyfrom(value)
            args.append(array)
        repeated.append(args)
    return repeated


def cleanup_remote(session, remote_path: str | None) -> None:
    """MetaSchedule RPC cleanup: remove the uploaded candidate.

    (The default also removes ``""``, the work directory itself, which edgepack's device server
    refuses: the error would discard a finished measurement.) The server drops the session's work
    directory when the session ends anyway.
    """
    if session is not None and remote_path:
        with contextlib.suppress(Exception):
            session.remove(remote_path)


def connect_forwarded(port: int, key: str, session_timeout: float, _rpc_config):
    """MetaSchedule RPC session factory: the device's server through a local forwarded port."""
    from tvm import rpc

    return rpc.connect("127.0.0.1", port, key=key, session_timeout=session_timeout)


def _evaluator_config(remote: bool, cold_weights: bool = False):
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig

    # remote devices (and emulated ones) are slow: fewer repetitions, the same minimum run time
    if remote:
        return EvaluatorConfig(number=1, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)
    if cold_weights:
        # every timed run starts with all arguments but the first (the input activation, which the
        # previous kernel has just written) flushed from the cache: kernels timed warm, weights and
        # all, ran ~20% slower inside the model than their timings said
        return EvaluatorConfig(number=1, repeat=16, min_repeat_ms=0, enable_cpu_cache_flush=True)
    return EvaluatorConfig(number=3, repeat=3, min_repeat_ms=40, enable_cpu_cache_flush=False)


@dataclass
class _Measurer:
    builder: Any
    runner: Any
    on: str
    close: Callable[[], None] = lambda: None


def _host_measurer(profile, say: Log, cold_weights: bool = False) -> _Measurer:
    from tvm.s_tir.meta_schedule.builder import LocalBuilder
    from tvm.s_tir.meta_schedule.runner import LocalRunner

    if not profile.is_host:
        raise TuningError(
            f"Profile {profile.name!r} is for {profile.triple}; its kernels cannot be measured on this machine.",
            f"Measure on a device: --on DEVICE (see `edgepack device list`) or --on farm:{profile.name}.",
        )
    say("Measuring on this machine")
    builder = LocalBuilder(max_workers=max(1, os.cpu_count() or 1), timeout_sec=BUILDER_TIMEOUT_S,
                           f_build=build_candidate)
    runner = LocalRunner(timeout_sec=60.0, evaluator_config=_evaluator_config(remote=False, cold_weights=cold_weights))
    return _Measurer(builder, runner, "host")


def _cross_builder(profile):
    from tvm.s_tir.meta_schedule.builder import LocalBuilder

    from edgepack.toolchain import find_compilers

    compilers = find_compilers(profile)
    return LocalBuilder(max_workers=max(1, os.cpu_count() or 1), timeout_sec=BUILDER_TIMEOUT_S,
                        f_build=build_candidate, f_export=functools.partial(export_candidate, compilers.cxx))


def _farm_measurer(profile, on: str, inventory, session_timeout: float, say: Log) -> _Measurer:
    from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

    from edgepack.remote.farm import read_state

    name = on.removeprefix("farm:")
    devices = inventory.farm(name)
    if devices[0].profile != profile.name:
        raise TuningError(f"The farm {on} is made of {devices[0].profile} devices, not {profile.name}.",
                          f"Tune with --profile {devices[0].profile}, or use --on farm:{profile.name}.")
    state = read_state(inventory)
    if state is None:
        raise TuningError(f"The farm is not running, so {on} cannot measure anything.",
                          "Start it with `edgepack farm start` (it keeps the devices on an RPC tracker), "
                          "or measure on one device with --on NAME.")
    say(f"Measuring on the {len(devices)} {profile.name} device(s) of the farm (tracker port {state.tracker_port})")
    config = RPCConfig(tracker_host="127.0.0.1", tracker_port=state.tracker_port, tracker_key=profile.rpc_key,
                       session_timeout_sec=int(session_timeout))
    runner = RPCRunner(rpc_config=config, evaluator_config=_evaluator_config(remote=True),
                       f_alloc_argument=alloc_arguments, f_cleanup=cleanup_remote, max_workers=len(devices))
    return _Measurer(_cross_builder(profile), runner, on)


def _device_measurer(profile, device, session_timeout: float, say: Log) -> _Measurer:
    """One device of the inventory: its RPC server through an SSH tunnel run in its own process."""
    from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

    from edgepack.remote import devices as remote
    from edgepack.remote.ssh import LocalTunnel, connect

    if device.profile != profile.name:
        raise TuningError(f"Device {device.name} has profile {device.profile}, not {profile.name}.",
                          f"Tune with --profile {device.profile}, or pick a {profile.name} device.")
    builder = _cross_builder(profile)
    endpoint = remote.endpoint_for(device)
    say(f"Connecting to {device.name} ({device.host}:{device.port})")
    session = connect(endpoint)
    tunnel = None
    try:
        install = remote.deploy(session, device, profile, progress=say)
        server = remote.ensure_rpc_server(session, device, profile, install, progress=say)
        tunnel = LocalTunnel(endpoint, server.port, connect_deadline=20.0)
        tunnel.start()
    except BaseException:
        with contextlib.suppress(Exception):
            if tunnel is not None:
                tunnel.close()
            session.close()
        raise
    say(f"Measuring on {device.name} through local port {tunnel.local_port}")
    runner = RPCRunner(
        # no tracker here: the config only carries the session timeout (connect_forwarded connects)
        rpc_config=RPCConfig(tracker_host="127.0.0.1", tracker_port=1, tracker_key=profile.rpc_key,
                             session_timeout_sec=int(session_timeout)),
        evaluator_config=_evaluator_config(remote=True),
        f_create_session=functools.partial(connect_forwarded, tunnel.local_port, server.key, session_timeout),
        f_alloc_argument=alloc_arguments,
        f_cleanup=cleanup_remote,
        max_workers=1,
    )

    def close() -> None:
        with contextlib.suppress(Exception):
            tunnel.close()
        with contextlib.suppress(Exception):
            session.close()

    return _Measurer(builder, runner, device.name, close)


def _host_opencl_measurer(session_timeout: float, say: Log) -> _Measurer:
    """This machine's OpenCL device (e.g. PoCL) as the device: edgepack's RPC server built for this
    machine with the OpenCL runtime plug-in next to it (``opencl.HostRPCServer``), measured over
    RPC exactly like a device; candidates are built here with x86 host code."""
    from tvm.s_tir.meta_schedule.builder import LocalBuilder
    from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

    from edgepack import opencl

    info = opencl.require_device(log=say)
    server = opencl.HostRPCServer.start(log=say)
    say(f"Measuring on this machine's OpenCL device ({info['devices'][0]['name']}) through edgepack's RPC "
        f"server on port {server.port}")
    builder = LocalBuilder(max_workers=max(1, os.cpu_count() or 1), timeout_sec=BUILDER_TIMEOUT_S,
                           f_build=build_candidate, f_export=functools.partial(export_candidate, None))
    runner = RPCRunner(
        rpc_config=RPCConfig(tracker_host="127.0.0.1", tracker_port=1, tracker_key=server.key,
                             session_timeout_sec=int(session_timeout)),
        evaluator_config=_evaluator_config(remote=True),
        f_create_session=functools.partial(connect_forwarded, server.port, server.key, session_timeout),
        f_alloc_argument=alloc_arguments,
        f_cleanup=cleanup_remote,
        max_workers=1,
    )
    return _Measurer(builder, runner, HOST_OPENCL, server.stop)


def _measurer(profile, on: str, inventory_path: Path | None, session_timeout: float, say: Log,
              cold_weights: bool = False) -> _Measurer:
    if on == "host":
        return _host_measurer(profile, say, cold_weights)
    if on == HOST_OPENCL:
        return _host_opencl_measurer(session_timeout, say)
    from edgepack.remote.inventory import load_inventory

    inventory = load_inventory(inventory_path)
    if on.startswith("farm:"):
        return _farm_measurer(profile, on, inventory, session_timeout, say)
    if on in inventory.devices:
        return _device_measurer(profile, inventory.get(on), session_timeout, say)
    known = ", ".join(sorted(inventory.devices)) or f"none in {inventory.path}"
    raise TuningError(f"Unknown place to measure on: {on!r}.",
                      f"Use --on host (host profiles), --on {HOST_OPENCL} (OpenCL profiles), a device name "
                      f"(known: {known}) or farm:PROFILE.")


# ---------------------------------------------------------------------------------------------
# resumable search: never measure a schedule that already has a record


@dataclass
class _TaskPlan:
    index: int
    task: TuningTask
    trials: int  # records so far
    left: int  # trials this task may still get in this run
    best: float | None
    cap: int | None
    known: dict[int, list[float] | None] = field(default_factory=dict)  # recorded: schedule hash -> run_secs
    in_flight: list[int] = field(default_factory=list)  # schedule hashes of the batch being measured
    skipped: int = 0
    tuning: bool = True
    exhausted: bool = False
    history: list[float] = field(default_factory=list)  # best seconds after each batch (1e10: none valid yet)


@dataclass
class _Control:
    deadline: float | None  # time.monotonic() after which no new batch starts
    left: int  # trials this run may still measure, all tasks together
    stopped_by_time: bool = False
    interrupted: bool = False  # SIGINT/SIGTERM: finish the batch in flight, then stop
    lost: int = 0  # remote measurements lost to a dropped connection (not recorded)

    def expired(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.stopped_by_time = True
        return self.stopped_by_time


def _schedule_hash(mod) -> int:
    import tvm_ffi

    return int(tvm_ffi.structural_hash(mod))


def _replay(workload_mod, trace):
    """A record's schedule: its trace (postprocessing included) replayed on its kernel."""
    from tvm.s_tir import Schedule

    sch = Schedule(workload_mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def _resumable_strategy_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

    @derived_object
    class ResumableSearch(PySearchStrategy):
        """Wraps MetaSchedule's evolutionary search with the records already in the database.

        * candidates whose schedule has a record are not measured again: the inner search is told
          their recorded result instead;
        * the task's budget (``plan.left``) and the run's deadline are enforced here.
        """

        def __init__(self, inner, plan: _TaskPlan, control: _Control) -> None:
            self.inner = inner
            self.plan = plan
            self.control = control
            self._pending: tuple[list, list] = ([], [])

        def _initialize_with_tune_context(self, context) -> None:
            self.inner._initialize_with_tune_context(context)

        def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None):
            # the inner search gets no trial limit of its own: budgets are enforced in this wrapper
            self.inner.pre_tuning(1 << 30, num_trials_per_iter, design_spaces, database, cost_model)

        def post_tuning(self) -> None:
            self.inner.post_tuning()

        def generate_measure_candidates(self):
            plan, control = self.plan, self.control
            if plan.left <= 0 or control.left <= 0 or control.interrupted or control.expired():
                return None
            for _ in range(32):  # rounds that only proposed recorded schedules
                try:
                    candidates = self.inner.generate_measure_candidates()
                except Exception as exc:  # noqa: BLE001 - a gap in TVM's search ends this task, not the run
                    logging.getLogger("tvm.s_tir.meta_schedule").warning(
                        "search failed for %s, which keeps what it has: %s", plan.task.name, exc)
                    candidates = None
                if candidates is None:
                    plan.exhausted = True
                    return None
                fresh, fresh_hashes, known, known_results = [], [], [], []
                for candidate in candidates:
                    digest = _schedule_hash(candidate.sch.mod)
                    if digest in plan.known or digest in fresh_hashes:
                        run_secs = plan.known.get(digest)
                        known.append(candidate)
                        known_results.append(RunnerResult(run_secs, None) if run_secs
                                             else RunnerResult(None, "failed before (recorded)"))
                    else:
                        fresh.append(candidate)
                        fresh_hashes.append(digest)
                plan.skipped += len(known)
                if fresh:
                    limit = min(plan.left, control.left, PROBE_TRIALS if not plan.history else len(fresh))
                    fresh, fresh_hashes = fresh[:limit], fresh_hashes[:limit]
                    control.left -= len(fresh)  # reserved now: the scheduler may start other batches meanwhile
                    self._pending = (known, known_results)
                    plan.in_flight = fresh_hashes
                    return fresh
                self.inner.notify_runner_results(known, known_results)
            plan.exhausted = True
            return None

        def notify_runner_results(self, measure_candidates, results) -> None:
            known, known_results = self._pending
            self._pending = ([], [])
            self.inner.notify_runner_results(list(known) + list(measure_candidates),
                                             list(known_results) + list(results))
            # plan.known learns of this batch from the recorder: only what it records counts as done
            self.plan.left -= len(measure_candidates)

        def clone(self):
            return ResumableSearch(self.inner.clone(), self.plan, self.control)

    return ResumableSearch


def _blocking_runner_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner

    @derived_object
    class BlockingRunner(PyRunner):
        """Returns a batch's futures only once they are all done.

        MetaSchedule's scheduler otherwise builds the next batch while the runner measures, and adds
        finished measurements to the database only when it gets back to them: a kill in between loses
        them. Waiting here means every batch is recorded right after it is measured, and that no
        compilation runs beside a measurement on a small machine (which skews timings).
        """

        def __init__(self, inner) -> None:
            self.inner = inner

        def run(self, runner_inputs):
            futures = self.inner.run(runner_inputs)
            for future in futures:
                future.result()
            return futures

    return BlockingRunner


def _space_generators(target=None):
    """MetaSchedule's default search space, then fallbacks for kernels it fails on.

    TVM 0.27's multi-level tiling fails on some fused epilogues (e.g. BlazeFace's residual ``pad`` +
    ``add`` after a convolution: "requires all the producer(s) ... under the target loop") when it
    tries to compute the epilogue inside the tiles. With a cache write the epilogue stays after the
    tiled loop nest and it works; without tiling at all, parallel/vectorize/unroll still apply.
    """
    from tvm.s_tir.meta_schedule import schedule_rule as rules
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply

    yield "default", "post-order-apply"
    if target is not None and _is_gpu(target):
        return  # the fallbacks below are CPU rules; a GPU kernel MetaSchedule cannot take keeps dlight's

    def tiling_with_cache_write():
        return rules.MultiLevelTiling(structure="SSRSRS", tile_binds=None, max_innermost_factor=64,
                                      vector_load_lens=None, reuse_read=None,
                                      reuse_write=rules.ReuseType(req="must", levels=[1, 2], scope="global"))

    base = rules.ScheduleRule.create("llvm")
    yield "cache-write tiling", PostOrderApply(
        sch_rules=[tiling_with_cache_write() if type(r).__name__ == "MultiLevelTiling" else r for r in base],
        postprocs="llvm", mutator_probs="llvm")
    yield "untiled", PostOrderApply(sch_rules=[r for r in rules.ScheduleRule.create("llvm")
                                               if "MultiLevelTiling" not in type(r).__name__],
                                    postprocs="llvm", mutator_probs="llvm")


def _scheduler_class():
    import random

    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler

    @derived_object
    class GradientScheduler(PyTaskScheduler):
        """MetaSchedule's gradient-based task scheduler, aware of the records of earlier runs.

        Each task first gets a small probe batch (heaviest first: weight x flop), except tasks that
        already have records: an untuned kernel is far slower than any measured schedule, so every
        kernel gets one before any gets many. Then the next batch goes to the task whose weighted
        latency (weight x best latency, its share of the model's time) is expected to drop most:
        ``weight * (alpha * recent slope + (1 - alpha) * best / rounds)``, as TVM's ``GradientBased``
        does, with the history of earlier runs rebuilt from the records. Finished batches are joined
        (and so recorded) before every pick.
        """

        def __init__(self, plans: list[_TaskPlan], on_pick: Callable[[int], None], alpha: float = 0.2,
                     window: int = 3, seed: int = 0) -> None:
            self.plans = plans
            self.on_pick = on_pick
            self.alpha = alpha
            self.window = window
            self.rng = random.Random(seed)

        def next_task_id(self) -> int:
            task_id = self._pick()
            if task_id >= 0:
                self.on_pick(task_id)
            return task_id

        def _pick(self) -> int:
            outer = self._outer()
            records = outer.tasks_
            alive = []
            for i in range(len(records)):
                if not records[i].is_terminated:
                    outer.touch_task(i)  # joins a finished batch: its records are written now
                if not records[i].is_terminated:
                    alive.append(i)
            if not alive:
                return -1
            fresh = [i for i in alive if not self.plans[i].history]
            if fresh:
                return max(fresh, key=lambda i: (self.plans[i].task.weight * self.plans[i].task.flop, -i))
            grads = []
            for i in alive:
                history = self.plans[i].history
                best, n, w = history[-1], len(history), self.window
                if best >= FAILED_SECONDS:
                    grads.append(-1e9)
                    continue
                slope = (history[-1 - w] - best) / w if n >= 1 + w else 0.0
                grads.append((self.alpha * slope + (1 - self.alpha) * best / n) * self.plans[i].task.weight)
            top = max(grads)
            return self.rng.choice([i for i, g in zip(alive, grads) if g == top])

    return GradientScheduler


def _history_from_records(latencies: list[float | None], batch: int) -> list[float]:
    """Best latency after each batch-sized chunk of a task's records (in the order they were made)."""
    history, best = [], FAILED_SECONDS * 10
    for start in range(0, len(latencies), batch):
        for value in latencies[start:start + batch]:
            if value is not None and value < best:
                best = value
        history.append(best)
    return history


def _record_callback_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.database import TuningRecord
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class RecordAndReport(PyMeasureCallback):
        """MetaSchedule's ``AddToDatabase`` (one appended line per measurement), then progress.

        The difference: after an interrupt, candidates whose build or run failed are not recorded;
        their workers were most likely killed by the same Ctrl-C, and a rerun should try them again.
        """

        def __init__(self, database, control: _Control, on_batch: Callable[[int, list], None],
                     remote: bool = False) -> None:
            self.database = database
            self.control = control
            self.on_batch = on_batch
            self.remote = remote

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            context = task_scheduler.tasks_[task_id].ctx
            workload = self.database.commit_workload(context.mod)
            recorded: list[tuple[int, list[float] | None]] = []  # (position in the batch, run_secs; None: failed)
            for position, (candidate, built, result) in enumerate(
                    zip(measure_candidates, builder_results, runner_results)):
                failed = built.error_msg is not None or not result.run_secs
                if failed and self.control.interrupted:
                    continue
                if failed and self.remote and built.error_msg is None and _lost_device(result.error_msg):
                    self.control.lost += 1  # the device, not the candidate, failed: a rerun measures it
                    continue
                run_secs = [float(v) for v in result.run_secs] if not failed else None
                self.database.commit_tuning_record(TuningRecord(
                    candidate.sch.trace, workload, run_secs or [1e10], context.target, candidate.args_info))
                recorded.append((position, run_secs))
            self.on_batch(int(task_id), recorded)

    return RecordAndReport


_LOST_DEVICE = ("timeout", "timed out", "connection", "connect to", "broken pipe", "reset by peer", "closed",
                "kshutdown", "eof", "subprocess terminated", "no route", "unreachable", "session")


def _lost_device(message: str | None) -> bool:
    """Whether a remote run failed because the link or the device went away (not the candidate)."""
    text = (message or "").lower()
    return any(word in text for word in _LOST_DEVICE)


@contextlib.contextmanager
def _stop_on_signals(control: _Control, say: Log) -> Iterator[None]:
    """First Ctrl-C (or SIGTERM): finish and record the batch in flight, then stop. Second: stop at once."""
    import signal

    def handler(signum, _frame) -> None:
        control.interrupted = True
        say("Stopping after the batch in flight (its results are recorded); interrupt again to stop at once")
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    saved = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave signals alone
        saved = {}
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


# ---------------------------------------------------------------------------------------------
# tuning


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    import fcntl

    path = directory / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 - held for the whole run
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip()
            raise TuningError(
                f"Another `edgepack tune` is writing to {directory}" + (f" (pid {owner})." if owner else "."),
                "Wait for it to finish, or stop it; records are kept, and rerunning resumes.",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            handle.truncate(0)
        handle.close()


@contextlib.contextmanager
def _metaschedule_log(directory: Path) -> Iterator[logging.Logger]:
    """MetaSchedule logs to ``logs/tune.log`` only (by default it prints to stdout)."""
    (directory / LOG_DIR).mkdir(exist_ok=True)
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    handler = logging.FileHandler(directory / LOG_DIR / "tune.log")
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    handler.setLevel(logging.INFO)
    saved = (logger.level, logger.propagate, list(logger.handlers))
    for existing in saved[2]:
        logger.removeHandler(existing)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        for existing in saved[2]:
            logger.addHandler(existing)


def _tuning_target(profile, num_cores: int | None, on: str = "host"):
    import tvm

    if profile.backend == "opencl":
        # the kernels are the profile's; their host code is this machine's when measured here
        # (--on host-opencl), the device's otherwise. A kernel's records do not depend on it.
        host = {"kind": "llvm"} if on == HOST_OPENCL else profile.host_target
        return tvm.target.Target(dict(profile.target), host=host) if host else tvm.target.Target(dict(profile.target))
    spec = dict(profile.target)
    if num_cores:
        spec["num-cores"] = int(num_cores)
    elif "num-cores" not in spec:
        spec["num-cores"] = (os.cpu_count() or 1) if profile.is_host else 4
    host = profile.host_target
    return tvm.target.Target(spec, host=host) if host else tvm.target.Target(spec)


def _meta_for(imported, profile, tuning_target, on: str = "host") -> TuningMeta:
    tvm_version, ffi_version = _versions()
    return TuningMeta(
        model_name=imported.info.path.name,
        model_sha256=imported.info.sha256,
        model_format=imported.info.format,
        inputs=tuple(t.to_dict() for t in imported.inputs),
        profile=profile.name,
        target=_target_export(profile.tvm_target()),
        tuning_target=_target_export(tuning_target),
        tvm_version=tvm_version,
        tvm_ffi_version=ffi_version,
        edgepack_version=__version__,
        created=_now(),
        weight_prepack=not _is_gpu(tuning_target),
        cold_weights=on == "host" and not _is_gpu(tuning_target),
        channels_last=not _is_gpu(tuning_target),
    )


def _check_meta(existing: TuningMeta, *, model_sha256: str, inputs: list[dict[str, Any]] | None,
                target: dict[str, Any], directory: Path, action: str) -> None:
    """Refuse records made for another model, input shapes, target or TVM version."""
    tvm_version, _ = _versions()
    problems = []
    if existing.model_sha256 != model_sha256:
        problems.append(f"another model ({existing.model_name}, sha256 {existing.model_sha256[:12]}…, "
                        f"not {model_sha256[:12]}…)")
    if inputs is not None:
        want = {t["name"]: list(t["shape"]) for t in existing.inputs}
        got = {t["name"]: list(t["shape"]) for t in inputs}
        if want != got:
            problems.append(f"other input shapes ({_shapes_text(existing.inputs)}, not {_shapes_text(inputs)})")
    if _normalized_target(existing.target) != _normalized_target(target):
        problems.append(f"another target ({_target_text(existing.target)} of profile {existing.profile}, "
                        f"not {_target_text(target)})")
    if existing.tvm_version != tvm_version:
        problems.append(f"another TVM version ({existing.tvm_version}, not {tvm_version})")
    if problems:
        raise TuningMismatchError(
            f"Cannot {action}: the records in {directory} were made for {'; '.join(problems)}.",
            "Records only fit the exact model, input shapes and target they were tuned for: tune this one into "
            "its own directory (edgepack tune ... -o NEW_DIR).",
        )


def _shapes_text(inputs) -> str:
    return ", ".join(f"{t['name']}:{','.join(str(d) for d in t['shape'])}" for t in inputs)


def _target_text(target: dict[str, Any]) -> str:
    parts = [str(target.get("kind", "?"))]
    for key in ("mtriple", "mcpu", "device"):
        if target.get(key):
            parts.append(f"{key}={target[key]}")
    if target.get("mattr"):
        parts.append("mattr=" + ",".join(target["mattr"]))
    return " ".join(parts)


def _load_known(database, tasks: list[TuningTask]) -> dict[str, list[tuple[Any, list[float] | None, int]]]:
    """Per workload hash: (record, run_secs, schedule hash) for every record in the database."""
    import tvm_ffi

    wanted = {t.workload for t in tasks}
    by_workload: dict[str, list] = {}
    cache: dict[int, str] = {}
    for record in database.get_all_tuning_records():
        # keyed by the C++ object, which the database keeps alive: id() of the short-lived Python
        # wrapper is reused, and gave records to the wrong kernel (which then measured them again)
        key = record.workload.__chandle__()
        workload = cache.get(key)
        if workload is None:
            workload = cache[key] = str(tvm_ffi.structural_hash(record.workload.mod))
        if workload not in wanted:
            continue
        run_secs = [float(s) for s in record.run_secs] if record.run_secs else None
        if run_secs and sum(run_secs) / len(run_secs) >= FAILED_SECONDS:
            run_secs = None
        try:
            sch = _replay(record.workload.mod, record.trace)
            digest = _schedule_hash(sch.mod)
        except Exception:  # noqa: BLE001 - a record that no longer applies is still a finished trial
            digest = -1
            sch = None
        by_workload.setdefault(workload, []).append((record, run_secs, digest, sch))
    return by_workload


def _warm_start(cost_model, contexts, plans: list[_TaskPlan], known: dict[str, list]) -> int:
    """Train the cost model on the recorded measurements, so that a resumed search is not blind."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    used = 0
    for context, plan in zip(contexts, plans):
        candidates, results = [], []
        for record, run_secs, _digest, sch in known.get(plan.task.workload, []):
            if sch is None or not run_secs:
                continue
            candidates.append(MeasureCandidate(sch, record.args_info))
            results.append(RunnerResult(run_secs, None))
        if candidates:
            cost_model.update(context, candidates, results)
            used += len(candidates)
    return used


def _ensure_directory(directory: Path, meta: TuningMeta, tasks: list[TuningTask]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / TASKS_FILE).exists():
        _write_json_atomic(directory / TASKS_FILE, {"tasks": [t.to_dict() for t in tasks]})
    if not (directory / META_FILE).exists():  # written last: it marks the directory as a tuning directory
        _write_json_atomic(directory / META_FILE, meta.to_dict())


def _existing_meta(directory: Path) -> TuningMeta | None:
    data = _read_json(directory / META_FILE)
    if data is None:
        return None
    try:
        return TuningMeta.from_dict(data)
    except (KeyError, TypeError) as exc:
        raise TuningError(f"{directory / META_FILE} is malformed ({exc}).", "Tune into a new directory.") from exc


def tune_model(
    model: Path | str,
    profile,
    output_dir: Path | str,
    *,
    on: str = "host",
    trials: int = DEFAULT_TRIALS,
    time_budget_s: float | None = None,
    max_trials_per_task: int | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    trials_per_batch: int = DEFAULT_BATCH,
    only: list[str] | tuple[str, ...] | None = None,
    num_cores: int | None = None,
    inventory: Path | str | None = None,
    session_timeout: float = 600.0,
    seed: int | None = None,
    progress: Progress | None = None,
    log: Log | None = None,
) -> TuningResult:
    """Tune ``model``'s kernels for ``profile``, measuring ``on`` host / a device / ``farm:PROFILE``.

    ``output_dir`` is created, or resumed when it holds records for the same model, shapes and
    target. ``trials`` and ``time_budget_s`` are totals for the directory (see the module docstring).
    ``max_trials_per_task`` caps each task's records; ``only`` tunes just the tasks whose names
    contain one of the given strings. ``progress`` gets a :class:`TuningProgress` at the start,
    after every batch and at the end; ``log`` gets one line per step.
    """
    from edgepack.importers import import_model
    from edgepack.profiles import get_profile, require_supported

    say = log or (lambda _msg: None)
    started = time.monotonic()
    model, directory = Path(model), Path(output_dir)
    profile = get_profile(profile) if isinstance(profile, str) else profile
    require_supported(profile)
    if profile.backend not in ("cpu", "opencl"):
        raise TuningError(f"Tuning {profile.backend} profiles is not supported yet.",
                          "Tune a CPU profile (host, rpi3, rpi4, rpi5, android-arm64) or an OpenCL one "
                          "(mali-g610, adreno-6xx).")
    if profile.backend == "opencl" and on == "host":
        raise TuningError(
            f"Profile {profile.name!r} runs on an OpenCL GPU, so its kernels are not measured with --on host.",
            "Measure on this machine's OpenCL device with --on host-opencl (e.g. PoCL), or on a device "
            f"(--on DEVICE or --on farm:{profile.name}) whose RPC server has edgepack's OpenCL runtime.",
        )
    if on == HOST_OPENCL and profile.backend != "opencl":
        raise TuningError(f"--on {HOST_OPENCL} measures OpenCL kernels; {profile.name!r} is a {profile.backend} profile.",
                          "Use --on host for host profiles, or a device / farm:PROFILE.")
    if trials < 0 or (max_trials_per_task is not None and max_trials_per_task < 1) or trials_per_batch < 1:
        raise TuningError("Trial counts must be positive.", "Use e.g. --trials 1000 --batch 16.")
    if on == "host" and not profile.is_host:
        raise TuningError(
            f"Profile {profile.name!r} is for {profile.triple}; its kernels cannot be measured on this machine.",
            f"Measure on a device: --on DEVICE (see `edgepack device list`) or --on farm:{profile.name}.",
        )
    if directory.exists() and not directory.is_dir():
        raise TuningError(f"{directory} exists and is not a directory.", "Choose another -o/--output.")
    existing = _existing_meta(directory) if directory.is_dir() else None
    if directory.is_dir() and existing is None and any(p.name != LOCK_FILE for p in directory.iterdir()):
        raise TuningError(f"{directory} exists and is not a tuning directory.",
                          "Choose a new or empty directory for -o/--output.")
    if input_shapes is None and existing is not None:
        input_shapes = {t["name"]: tuple(t["shape"]) for t in existing.inputs}

    say(f"Importing {model.name}")
    imported = import_model(model, input_shapes)
    tuning_target = _tuning_target(profile, num_cores, on)
    meta = _meta_for(imported, profile, tuning_target, on)
    if existing is not None:
        _check_meta(existing, model_sha256=meta.model_sha256, inputs=list(meta.inputs), target=meta.target,
                    directory=directory, action="resume tuning")

    say("Extracting the tuning tasks")
    if existing is not None:
        # resume the directory as it was made
        meta = replace(meta, weight_prepack=existing.weight_prepack, cold_weights=existing.cold_weights,
                       channels_last=existing.channels_last)
    tasks, extracted = extract_tasks(imported, tuning_target, weight_prepack=meta.weight_prepack,
                                     channels_last=meta.channels_last)
    if not tasks:
        raise TuningError(f"{model.name} has no kernels to tune.", "Nothing to do; compile it without --tuning.")
    if existing is not None:
        recorded = _read_json(directory / TASKS_FILE) or {"tasks": []}
        if [t["workload"] for t in recorded["tasks"]] != [t.workload for t in tasks]:
            raise TuningMismatchError(
                f"The kernels of {model.name} differ from the ones recorded in {directory}.",
                "The records were made by another edgepack/TVM pipeline; tune into a new directory.",
            )
    _ensure_directory(directory, meta, tasks)

    with _locked(directory), _metaschedule_log(directory) as ms_logger:
        repaired = tuple(repair_database(directory))
        for line in repaired:
            say(f"Repaired the records: {line}")
        return _run_tuning(
            directory, profile, imported, tuning_target, tasks, extracted, on=on, trials=trials,
            time_budget_s=time_budget_s, max_trials_per_task=max_trials_per_task,
            trials_per_batch=trials_per_batch, only=tuple(only or ()),
            inventory=Path(inventory) if inventory else None,
            session_timeout=session_timeout, seed=seed, progress=progress, say=say, logger=ms_logger,
            started=started, repaired=repaired, cold_weights=meta.cold_weights,
        )


def _run_tuning(directory: Path, profile, imported, tuning_target, tasks: list[TuningTask], extracted, *, on: str,
                trials: int, time_budget_s: float | None, max_trials_per_task: int | None, trials_per_batch: int,
                only: tuple[str, ...], inventory: Path | None, session_timeout: float, seed: int | None, progress: Progress | None,
                say: Log, logger: logging.Logger, started: float, repaired: tuple[str, ...],
                cold_weights: bool = False) -> TuningResult:
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.cost_model import CostModel
    from tvm.s_tir.meta_schedule.database import JSONDatabase
    from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

    before = load_tuning(directory)
    state = _read_json(directory / STATE_FILE) or {}
    seconds_before = float(state.get("seconds", 0.0))
    runs_before = int(state.get("runs", 0))
    runs_now = runs_before + 1  # runs started, killed ones included
    trials_before = before.trials
    counts = {t.workload: t for t in before.tasks}

    plans = []
    for index, task in enumerate(tasks):
        summary = counts[task.workload]
        cap = max_trials_per_task
        left = max(0, cap - summary.trials) if cap is not None else 1 << 30
        if only and not any(part in task.name for part in only):
            left = 0
        plans.append(_TaskPlan(index, task, summary.trials, left, summary.best_seconds, cap))
    remaining = max(0, trials - trials_before)
    time_left = None if time_budget_s is None else max(0.0, time_budget_s - seconds_before)
    active = [p for p in plans if p.left > 0]
    for plan in plans:
        plan.tuning = plan in active

    def snapshot(run_trials: int, last: int | None = None, finished: bool = False, message: str = "",
                 current: int | None = None) -> TuningProgress:
        elapsed = time.monotonic() - started
        eta = None
        if not finished and run_trials > 0 and tuning_started is not None:
            rate = run_trials / max(1e-6, time.monotonic() - tuning_started)
            left = min(remaining - run_trials, sum(p.left for p in active if not p.exhausted))
            eta = max(0, left) / rate
            if time_left is not None:
                eta = min(eta, max(0.0, time_left - (time.monotonic() - started)))
        return TuningProgress(
            tasks=tuple(TaskProgress(p.task.name, p.task.weight, p.trials, p.best, p.cap, p.tuning,
                                     finished=not p.tuning or p.exhausted or p.left <= 0) for p in plans),
            trials=trials_before + run_trials, trials_budget=trials, trials_this_run=run_trials,
            elapsed_s=elapsed, seconds_total=seconds_before + elapsed, time_budget_s=time_budget_s, eta_s=eta,
            last_task=last, finished=finished, message=message, current_task=current,
        )

    tuning_started: float | None = None
    report = progress or (lambda _p: None)

    def finish(stopped: str, run_trials: int, skipped: int, lost: int = 0) -> TuningResult:
        elapsed = time.monotonic() - started
        _write_json_atomic(directory / STATE_FILE, {"seconds": round(seconds_before + elapsed, 1),
                                                    "runs": runs_now, "updated": _now()})
        report(snapshot(run_trials, finished=True, message=stopped))
        return TuningResult(load_tuning(directory), on, trials_before, run_trials, skipped, elapsed, stopped, repaired,
                            lost)

    if remaining <= 0 or not active or time_left == 0.0:
        why = ("the trial budget is used up" if remaining <= 0 else
               "the time budget is used up" if time_left == 0.0 else
               "every task has its trials" if not only else f"no task matches {', '.join(only)} or they have their trials")
        say(f"Nothing to tune: {why} ({trials_before} records); raise the budget to tune more")
        report(snapshot(0))
        return finish("nothing to do", 0, 0)

    measurer = _measurer(profile, on, inventory, session_timeout, say, cold_weights)
    try:
        say(f"Reading {trials_before} records")
        database = JSONDatabase(path_workload=str(directory / WORKLOAD_FILE),
                                path_tuning_record=str(directory / RECORD_FILE), module_equality="structural")
        known = _load_known(database, tasks)
        hashes, lines, _ignored = _read_database(directory)  # file order: the order of measurement
        in_order: dict[str, list[float | None]] = {}
        for index, record in lines:
            in_order.setdefault(hashes[index], []).append(_record_seconds(record))
        for plan in plans:
            entries = known.get(plan.task.workload, [])
            plan.known = {digest: run_secs for _r, run_secs, digest, _s in entries if digest != -1}
            plan.history = _history_from_records(in_order.get(plan.task.workload, []), trials_per_batch)

        say(f"Preparing {len(active)} of {len(tasks)} tasks (MetaSchedule search spaces)")
        control = _Control(None, remaining)
        strategy_class = _resumable_strategy_class()
        run_seed = (seed if seed is not None else 0) + runs_before * 7919 + trials_before
        contexts, schedulable = [], []
        for plan in active:
            context, last_error = None, None
            # the scheduler would stop everything on the first kernel MetaSchedule cannot schedule: try
            # its default search space, then simpler ones (_space_generators), and skip the kernel last
            for label, space in _space_generators(tuning_target):
                # half MetaSchedule's default population and one fewer generation: on a small machine
                # the search, not the measurements, is what costs most per trial
                inner = EvolutionarySearch(population_size=256, genetic_num_iters=3)
                candidate = TuneContext(
                    mod=extracted[plan.index].dispatched[0], target=tuning_target, space_generator=space,
                    search_strategy=strategy_class(inner, plan, control), task_name=plan.task.name,
                    rand_state=(run_seed + plan.index * 104729) % (2**31 - 1),
                    num_threads=max(1, os.cpu_count() or 1), logger=logger,
                )
                try:
                    candidate.generate_design_space()
                except Exception as exc:  # noqa: BLE001 - TVM raises ScheduleError/TVMError for gaps in its rules
                    logger.warning("%s search space of %s failed: %s", label, plan.task.name, exc)
                    last_error = exc
                    continue
                if label != "default":
                    logger.warning("%s uses the %s search space", plan.task.name, label)
                context = candidate
                break
            if context is None:
                say(f"Skipping {plan.task.name}: MetaSchedule cannot schedule it ({_short_error(last_error)}); "
                    "it keeps its untuned schedule")
                plan.tuning, plan.exhausted = False, True
                continue
            contexts.append(context)
            schedulable.append(plan)
        active[:] = schedulable
        if not active:
            return finish("tasks", 0, 0)
        cost_model = CostModel.create("xgb", num_tuning_cores=max(1, os.cpu_count() or 1), tree_method="auto")
        warm = _warm_start(cost_model, contexts, active, known)
        if warm:
            say(f"Trained the cost model on {warm} recorded measurements")

        run_trials = 0

        def on_batch(task_id: int, recorded: list[tuple[int, list[float] | None]]) -> None:
            nonlocal run_trials
            plan = active[task_id]
            for position, run_secs in recorded:
                if position < len(plan.in_flight):
                    plan.known[plan.in_flight[position]] = run_secs
                if run_secs:
                    mean = sum(run_secs) / len(run_secs)
                    if mean < FAILED_SECONDS and (plan.best is None or mean < plan.best):
                        plan.best = mean
            plan.in_flight = []
            plan.trials += len(recorded)
            plan.history.append(plan.best if plan.best is not None else FAILED_SECONDS * 10)
            run_trials += len(recorded)
            elapsed = time.monotonic() - started
            _write_json_atomic(directory / STATE_FILE, {"seconds": round(seconds_before + elapsed, 1),
                                                        "runs": runs_now, "updated": _now()})
            report(snapshot(run_trials, last=plan.index))

        def on_pick(task_id: int) -> None:
            if not control.expired() and control.left > 0:
                report(snapshot(run_trials, current=active[task_id].index))

        from tvm.s_tir.meta_schedule.measure_callback import RemoveBuildArtifact, UpdateCostModel

        callbacks = [_record_callback_class()(database, control, on_batch, remote=on != "host"), RemoveBuildArtifact(),
                     UpdateCostModel()]
        tuning_started = time.monotonic()
        if time_left is not None:
            control.deadline = started + time_left  # the budget counts this run's setup too
        report(snapshot(0))
        say(f"Tuning: up to {remaining} trials" + (f" within {format_duration(time_left)}" if time_left else ""))
        with _stop_on_signals(control, say):
            _scheduler_class()(active, on_pick, seed=run_seed).tune(
                tasks=contexts,
                task_weights=[float(p.task.weight) for p in active],
                max_trials_global=remaining,
                max_trials_per_task=remaining,
                num_trials_per_iter=trials_per_batch,
                builder=measurer.builder,
                runner=_blocking_runner_class()(measurer.runner),
                measure_callbacks=callbacks,
                database=database,
                cost_model=cost_model,
            )
        skipped = sum(p.skipped for p in active)
        if control.interrupted:
            stopped = "interrupted"
        elif control.stopped_by_time:
            stopped = "time"
        elif control.left <= 0:
            stopped = "trials"
        else:
            stopped = "tasks"
        return finish(stopped, run_trials, skipped, control.lost)
    finally:
        measurer.close()


# ---------------------------------------------------------------------------------------------
# using the records


def _best_records(directory: Path, workloads: set[str] | None = None) -> tuple[list[list], list[list]]:
    """The workload lines that have a valid record, and for each one its fastest record (re-indexed)."""
    workload_lines = _read_lines(directory / WORKLOAD_FILE, _valid_workload).values
    records = _read_lines(directory / RECORD_FILE, _valid_record).values
    best: dict[int, tuple[float, list]] = {}
    for index, record in records:
        if not 0 <= index < len(workload_lines):
            continue
        if workloads is not None and workload_lines[index][0] not in workloads:
            continue
        seconds = _record_seconds(record)
        if seconds is not None and (index not in best or seconds < best[index][0]):
            best[index] = (seconds, record)
    kept = sorted(best)
    new_index = {old: i for i, old in enumerate(kept)}
    return [workload_lines[i] for i in kept], [[new_index[i], best[i][1]] for i in kept]


def write_best_records(tuning_dir: Path | str, dest: Path | str) -> int:
    """Copy ``tuning_dir`` as a compact tuning directory: the fastest record of each kernel only.

    ``dest`` is a complete tuning directory (``apply_tuning``/``load_tuning`` accept it), small enough
    to keep inside a build directory so that later rebuilds (e.g. a static library) use the same
    kernels. Returns the number of records written.
    """
    source, dest = Path(tuning_dir), Path(dest)
    load_tuning(source)  # a clear error if it is not a tuning directory
    workloads, records = _best_records(source)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / WORKLOAD_FILE).write_text("".join(json.dumps(w, separators=(",", ":")) + "\n" for w in workloads))
    (dest / RECORD_FILE).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    for name in (STATE_FILE, TASKS_FILE, META_FILE):  # tuning.json last: it marks a complete directory
        if (source / name).exists():
            shutil.copyfile(source / name, dest / name)
    return len(records)


def check_tuning(tuning_dir: Path | str, imported, target) -> TuningSummary:
    """The summary of ``tuning_dir`` if its records fit this model, input shapes and target; else a clear error."""
    directory = Path(tuning_dir)
    if not directory.is_dir():
        raise TuningError(f"Tuning directory {directory} does not exist.",
                          "Make it with `edgepack tune MODEL --profile PROFILE -o DIR`, or fix the --tuning path.")
    summary = load_tuning(directory)
    _check_meta(summary.meta, model_sha256=imported.info.sha256, inputs=[t.to_dict() for t in imported.inputs],
                target=_target_export(target), directory=directory, action="compile with these records")
    return summary


def tuned_pipeline(tuning_dir: Path | str, target, workloads: set[str] | None = None, *,
                   weight_prepack: bool = False, channels_last: bool = False):
    """The default Relax pipeline for a CPU target, with the best record of each kernel applied.

    Same passes as TVM's CPU default pipeline (dispatch, legalize + fuse, lower, finalize) with
    ``MetaScheduleApplyDatabase`` after fusion, so kernels without records stay as they are untuned.
    """
    import tvm
    from tvm import relax
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    cpu = _cpu_pipeline()

    with tempfile.TemporaryDirectory(prefix="edgepack-tuning-") as tmp:
        workload_lines, records = _best_records(Path(tuning_dir), workloads)
        (Path(tmp) / WORKLOAD_FILE).write_text("".join(json.dumps(w) + "\n" for w in workload_lines))
        (Path(tmp) / RECORD_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
        database = JSONDatabase(path_workload=str(Path(tmp) / WORKLOAD_FILE),
                                path_tuning_record=str(Path(tmp) / RECORD_FILE), module_equality="structural")
    if _is_gpu(target):  # edgepack.opencl.build_gpu applies it inside the GPU pipeline (and reports it)
        from edgepack.opencl import TuningDatabase

        return TuningDatabase(database)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackTunedPipeline")
    def _pipeline(mod, _ctx):
        with target, database:
            seq = tvm.transform.Sequential([
                *_prepare_passes(target, weight_prepack, channels_last),
                relax.transform.MetaScheduleApplyDatabase(enable_warning=False),
                *(_weight_prepack_passes() if weight_prepack else []),
                *cpu.dataflow_lower_passes(target),
                *cpu.finalize_passes(target),
            ])
            return seq(mod)

    return _pipeline


def apply_tuning(imported, target, tuning_dir: Path | str) -> AppliedTuning:
    """Check that ``tuning_dir`` fits the model and target, and return the pipeline that applies it.

    Use: ``tvm.compile(imported.mod, target, relax_pipeline=apply_tuning(...).relax_pipeline)``.
    """
    if target.kind.name not in ("llvm", "opencl"):
        raise TuningError(f"Tuning records apply to CPU (llvm) and OpenCL targets, not {target.kind.name}.",
                          "Compile this profile without --tuning.")
    summary = check_tuning(tuning_dir, imported, target)
    tuned = {t.workload for t in summary.tasks if t.best_seconds is not None}
    pipeline = tuned_pipeline(tuning_dir, target, tuned, weight_prepack=summary.meta.weight_prepack,
                              channels_last=summary.meta.channels_last)
    return AppliedTuning(pipeline, summary, len(tuned), len(summary.tasks))


def tuning_digest(tuning_dir: Path | str) -> str:
    """A short digest of the best records (what a compile with ``--tuning`` depends on)."""
    workloads, records = _best_records(Path(tuning_dir))
    data = json.dumps([workloads, records], separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:16]


__all__ = [
    "AppliedTuning", "TaskProgress", "TaskSummary", "TuningError", "TuningMeta", "TuningMismatchError",
    "TuningProgress", "TuningResult", "TuningSummary", "TuningTask", "apply_tuning", "check_tuning",
    "extract_tasks", "format_duration", "load_tuning", "parse_duration", "repair_database", "tune_model",
    "tuned_pipeline", "write_best_records",
]
