"""A tuning directory: MetaSchedule's record database plus what it was made for, read, repaired, and
its best record per kernel applied to a build.

A tuning directory holds::

    tuning.json                  what was tuned: model sha256, input shapes, profile, target, TVM version
    tasks.json                   the model's tuning tasks (fused kernels): name, workload hash, weight, flop
    database_workload.json       MetaSchedule's JSON database (append-only, one JSON value per line):
    database_tuning_record.json    every finished measurement is one line of the record file
    state.json                   time spent tuning so far (all runs), number of runs
    defaults.json                per task, the untuned build's schedule (its rule and fingerprint) and its
                                 measured time: a record is applied only where it is faster, and only
                                 while edgepack's default schedule is still the one timed (a newer
                                 release's may be faster: ``edgepack tune`` times it again); after a run
                                 on this machine also both kernels' times inside the model ("in_model",
                                 ``tuning/in_model.py``): a record slower there is not applied
    logs/tune.log                MetaSchedule's own log
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from edgepack.backends import Backend, KernelForm, TuningRecords, backend_for, target_dict
from edgepack.dims import at_size
from edgepack.errors import EdgepackError
from edgepack.files import atomic_file, write_json_atomic
from edgepack.frontends import ImportedModel
from edgepack.profiles import Profile
from edgepack.versions import installed_tvm

META_FILE = "tuning.json"
TASKS_FILE = "tasks.json"
STATE_FILE = "state.json"
DEFAULTS_FILE = "defaults.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOCK_FILE = ".lock"
LOG_DIR = "logs"
FORMAT_VERSION = 1
FAILED_SECONDS = 1e9  # run_secs at or above this mean "did not run" (MetaSchedule writes 1e10)


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
    # CPU kernels were tuned with their constant weights layout-free (backends/cpu/pipeline.py); directories
    # made before this existed were not, and stay usable as they were made
    weight_prepack: bool = False
    # host CPU candidates were timed with their weights flushed from the cache before every run, as
    # they are in the model (read once per inference); older directories timed them cache-warm
    cold_weights: bool = False
    # CPU convolutions were tuned channels-last (NHWC) (backends/cpu/pipeline.py); older directories NCHW
    channels_last: bool = False
    # CPU 3x3 convolutions were tuned as Winograd kernels with tiles of up to this size (KernelForm.winograd);
    # directories of the first Winograd kernels wrote true (F(2x2, 3x3) only), older ones nothing (direct)
    winograd: int = 0
    # ... and F(4x4, 3x3) only where its weights serve enough tiles (KernelForm.winograd_reuse); older: 0
    winograd_reuse: int = 0
    # ... and their transformed weights within this share of the constants (KernelForm.winograd_budget); older: 0
    winograd_budget: float = 0.0
    # CPU convolutions were tuned with their output channels padded to whole SIMD vectors
    # (KernelForm.padded_channels); older directories without
    padded_channels: bool = False
    # CPU depthwise convolutions were tuned fused with the 1x1 convolution after them
    # (KernelForm.fused_depthwise); older directories as kernels of their own
    fused_depthwise: bool = False
    # CPU per-channel scalings were tuned merged into the 1x1 convolution after them
    # (KernelForm.fused_scale); older directories as kernels of their own
    fused_scale: bool = False
    # CPU kernels were tuned with float16-valued weights passed as float16 (KernelForm.half_weights); older
    # directories with float32 weights
    half_weights: bool = False

    @property
    def form(self) -> KernelForm:
        """The form of the kernels this directory's records were tuned on."""
        return KernelForm(**{name: getattr(self, name) for name in KernelForm.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = list(self.inputs)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuningMeta:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        fields["inputs"] = tuple(fields.get("inputs", ()))
        if isinstance(fields.get("winograd"), bool):
            fields["winograd"] = 2 if fields["winograd"] else 0
        return cls(**fields)


class InModelTime(NamedTuple):
    """A kernel's seconds per inference inside the model with its default schedule and with its best
    record, at one thread count (None: checked by a release that did not record it)."""
    threads: int | None
    default: float
    tuned: float


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
    default_seconds: float | None = None  # the untuned build's schedule, measured the same way
    default_rule: str | None = None  # the rule that made it ("cpu.Conv2D")
    # default and tuned seconds per inference inside the model, per thread count checked, where checked
    # for the current best record
    in_model: tuple[InModelTime, ...] | None = None

    @property
    def tuned(self) -> bool:
        """A record beats the default schedule, timed alone and (where checked) inside the model: the
        build applies it (else it keeps the default)."""
        if self.lost_in_model:
            return False
        return self.best_seconds is not None and (self.default_seconds is None
                                                  or self.best_seconds < self.default_seconds)

    @property
    def lost_in_model(self) -> bool:
        """Its best record ran slower inside the model than the default schedule, at any thread count
        checked (``tuning/in_model.py``)."""
        return self.in_model is not None and any(t.tuned >= t.default for t in self.in_model)

    @property
    def weighted_seconds(self) -> float | None:
        return None if self.best_seconds is None else self.best_seconds * self.weight

    @property
    def speedup(self) -> float | None:
        """Default time over best time (1.0 where the default schedule stays the best)."""
        if self.best_seconds is None or self.default_seconds is None:
            return None
        return self.default_seconds / self.best_seconds

    @property
    def gflops(self) -> float | None:
        if not self.best_seconds or not self.flop:
            return None
        return self.flop / self.best_seconds / 1e9

    def to_dict(self) -> dict[str, Any]:
        in_model = None if self.in_model is None else [t._asdict() for t in self.in_model]
        return asdict(self) | {"weighted_seconds": self.weighted_seconds, "gflops": self.gflops, "tuned": self.tuned,
                               "speedup": self.speedup, "in_model": in_model, "lost_in_model": self.lost_in_model}


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
        """Tasks whose best record a build applies (faster than the default schedule)."""
        return sum(t.tuned for t in self.tasks)

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
class AppliedTuning:
    """What ``compile`` needs: the records to apply (for the backend's build), and what they cover."""

    records: TuningRecords
    summary: TuningSummary
    tuned_tasks: int
    total_tasks: int
    # tasks whose record beat a default schedule that edgepack no longer gives them: they keep today's
    # default (a record is applied only where it beats that one) until ``edgepack tune`` times it
    stale_tasks: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.summary.directory), "tuned_tasks": self.tuned_tasks,
                "total_tasks": self.total_tasks, "trials": self.summary.trials, "stale_tasks": list(self.stale_tasks)}


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


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TuningError(f"Cannot read {path}: {exc}.",
                          "The tuning directory is damaged; tune into a new directory.") from exc


def record_seconds(record: list) -> float | None:
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


def normalized_target(target: dict[str, Any]) -> dict[str, Any]:
    """A target dict for comparisons: without the core count (a scheduling hint) and empty tags."""
    return {key: normalized_target(value) if isinstance(value, dict) else value
            for key, value in target.items() if key not in ("num-cores", "tag")}


# ---------------------------------------------------------------------------------------------
# reading the database without TVM


@dataclass(frozen=True)
class _Lines:
    values: list[Any]
    complete_bytes: int  # length of the prefix made of complete, valid lines
    ignored: int  # lines skipped (torn last line, unreadable lines)
    torn_tail: bool  # the file ends with an incomplete line


def read_lines(path: Path, valid: Callable[[Any], bool]) -> _Lines:
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


def valid_workload(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], str)


def valid_record(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and isinstance(value[1], list) and len(value[1]) >= 2)


def read_database(directory: Path) -> tuple[list[str], list[list], int]:
    """(workload hashes by index, [workload index, record] pairs, ignored lines) from the JSON files."""
    workloads = read_lines(directory / WORKLOAD_FILE, valid_workload)
    records = read_lines(directory / RECORD_FILE, valid_record)
    hashes = [w[0] for w in workloads.values]
    good = [r for r in records.values if 0 <= r[0] < len(hashes)]
    return hashes, good, workloads.ignored + records.ignored + (len(records.values) - len(good))


def load_tuning(directory: Path | str) -> TuningSummary:
    """Read a tuning directory: per task, records, best latency, weight and share of model time."""
    directory = Path(directory)
    meta_data = read_json(directory / META_FILE)
    tasks_data = read_json(directory / TASKS_FILE)
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
    state = read_json(directory / STATE_FILE) or {}
    defaults = read_defaults(directory)
    hashes, records, ignored = read_database(directory)
    counts: dict[str, int] = {}
    failed: dict[str, int] = {}
    best: dict[str, float] = {}
    for index, record in records:
        workload = hashes[index]
        counts[workload] = counts.get(workload, 0) + 1
        seconds = record_seconds(record)
        if seconds is None:
            failed[workload] = failed.get(workload, 0) + 1
        elif workload not in best or seconds < best[workload]:
            best[workload] = seconds
    total = sum(best[t.workload] * t.weight for t in tasks if t.workload in best)
    summaries = tuple(
        TaskSummary(t.name, t.workload, t.weight, t.flop, counts.get(t.workload, 0), failed.get(t.workload, 0),
                    best.get(t.workload),
                    (best[t.workload] * t.weight / total) if t.workload in best and total > 0 else None,
                    defaults.get(t.workload, {}).get("seconds"), defaults.get(t.workload, {}).get("rule"),
                    _in_model(defaults.get(t.workload, {}), best.get(t.workload)))
        for t in tasks
    )
    return TuningSummary(directory, meta, summaries, float(state.get("seconds", 0.0)), int(state.get("runs", 0)),
                         ignored)


def read_defaults(directory: Path) -> dict[str, dict[str, Any]]:
    """``defaults.json``: per workload hash, {"rule", "seconds", "schedule"} of the default schedule."""
    data = read_json(directory / DEFAULTS_FILE) or {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("seconds"), (int, float))}


def record_default(directory: Path, workload: str, rule: str, seconds: float, fingerprint: str | None = None) -> None:
    """Write down the measured time of a task's default schedule (``DefaultSchedule.fingerprint``: which
    one it was), atomically, after its record."""
    defaults = read_defaults(directory)
    defaults[workload] = {"rule": rule, "schedule": fingerprint, "seconds": seconds}
    write_json_atomic(directory / DEFAULTS_FILE, defaults)


def schedule_hash(mod) -> int:
    import tvm_ffi

    return int(tvm_ffi.structural_hash(mod))


@dataclass(frozen=True)
class DefaultSchedule:
    """What an untuned build runs for a task's kernel: the rule that scheduled it, the schedule, and its
    fingerprint (the scheduled kernel and the TIR pipeline that lowers it). A default time recorded under
    another fingerprint is stale: edgepack's default schedules changed since it was measured."""

    rule: str
    schedule: Any  # tvm.s_tir.Schedule
    fingerprint: str


def default_schedule(backend: Backend, mod: Any, target: Any) -> DefaultSchedule | None:
    """The default schedule of a tuning task's kernel (``mod``), None where the backend has none."""
    found = backend.default_schedule(mod, target)
    if found is None:
        return None
    rule, sch = found
    return DefaultSchedule(rule, sch, f"{backend.tir_pipeline()}/{schedule_hash(sch.mod) & (1 << 64) - 1:016x}")


def stale_defaults(directory: Path, backend: Backend, target: Any, workloads: set[str]) -> set[str]:
    """Of ``workloads``, those whose recorded default time was measured for another default schedule
    than the one this edgepack gives their kernel (or by a release that recorded no fingerprint)."""
    from tvm.s_tir.meta_schedule.database import Workload

    defaults = read_defaults(directory)
    stale = set()
    for line in read_lines(directory / WORKLOAD_FILE, valid_workload).values:
        if line[0] not in workloads or line[0] not in defaults:
            continue
        try:
            current = default_schedule(backend, Workload.from_json(line).mod, target)
        except Exception:  # noqa: BLE001 - as in a build: a kernel no rule takes has no default to compare
            current = None
        if current is not None and defaults[line[0]].get("schedule") != current.fingerprint:
            stale.add(line[0])
    return stale


def record_in_model(directory: Path, checked: dict[str, tuple[float, tuple[InModelTime, ...]]]) -> None:
    """Write down, per workload, the best record's (tuner-measured) seconds and the default and tuned
    kernels' seconds per inference inside the model at each thread count checked:
    ``{workload: (best, (InModelTime, ...))}``."""
    defaults = read_defaults(directory)
    for workload, (best, times) in checked.items():
        if workload in defaults:
            defaults[workload]["in_model"] = {"record_seconds": best, "times": [t._asdict() for t in times]}
    write_json_atomic(directory / DEFAULTS_FILE, defaults)


def _in_model(default: dict[str, Any], best: float | None) -> tuple[InModelTime, ...] | None:
    """A task's in-model times, if they were taken for its current best record (a later run may have
    found a faster one: unchecked until the check after that run). A directory of the release that
    checked one thread count holds one (default, tuned) pair without it."""
    checked = default.get("in_model")
    if not isinstance(checked, dict) or best is None or checked.get("record_seconds") != best:
        return None
    try:
        if "times" not in checked:
            return (InModelTime(None, float(checked["default"]), float(checked["tuned"])),)
        return tuple(InModelTime(int(t["threads"]) if t.get("threads") else None, float(t["default"]),
                                 float(t["tuned"])) for t in checked["times"]) or None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def repair_database(directory: Path | str) -> list[str]:
    """Make the JSON database loadable after a kill: drop a torn last line, and unreadable lines.

    Only ever removes bytes that TVM could not load anyway; returns what was done, for the log.
    Must not run while a tuner writes to the directory (``tune_model`` holds the lock).
    """
    directory = Path(directory)
    done = []
    workloads = read_lines(directory / WORKLOAD_FILE, valid_workload)
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
    records = read_lines(records_path, valid_record)
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
            with atomic_file(records_path) as tmp:
                tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep))
            done.append(f"rewrote {RECORD_FILE} without {records.ignored + len(dangling)} unreadable lines "
                        f"(the original is kept as {backup.name})")
    return done


def check_meta(existing: TuningMeta, *, model_sha256: str, inputs: list[dict[str, Any]] | None,
                target: dict[str, Any], directory: Path, action: str) -> None:
    """Refuse records made for another model, input shapes, target or TVM version."""
    tvm_version, _ = installed_tvm()
    problems = []
    if existing.model_sha256 != model_sha256:
        problems.append(f"another model ({existing.model_name}, sha256 {existing.model_sha256[:12]}…, "
                        f"not {model_sha256[:12]}…)")
    if inputs is not None:
        want = {t["name"]: list(t["shape"]) for t in existing.inputs}
        got = {t["name"]: list(t["shape"]) for t in inputs}
        if want != got:
            problems.append(f"other input shapes ({_shapes_text(existing.inputs)}, not {_shapes_text(inputs)})")
    if normalized_target(existing.target) != normalized_target(target):
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


# ---------------------------------------------------------------------------------------------
# using the records


def best_records(directory: Path, workloads: set[str] | None = None) -> tuple[list[list], list[list]]:
    """The workload lines that have a valid record faster than the kernel's default schedule, and for
    each one that fastest record (re-indexed). A kernel whose default schedule is the fastest keeps
    it: a build schedules it with its rule."""
    workload_lines = read_lines(directory / WORKLOAD_FILE, valid_workload).values
    records = read_lines(directory / RECORD_FILE, valid_record).values
    defaults = read_defaults(directory)
    best: dict[int, tuple[float, list]] = {}
    for index, record in records:
        if not 0 <= index < len(workload_lines):
            continue
        if workloads is not None and workload_lines[index][0] not in workloads:
            continue
        seconds = record_seconds(record)
        if seconds is not None and (index not in best or seconds < best[index][0]):
            best[index] = (seconds, record)
    kept = sorted(i for i in best
                  if best[i][0] < defaults.get(workload_lines[i][0], {}).get("seconds", math.inf))
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
    workloads, records = best_records(source)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / WORKLOAD_FILE).write_text("".join(json.dumps(w, separators=(",", ":")) + "\n" for w in workloads))
    (dest / RECORD_FILE).write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
    for name in (STATE_FILE, DEFAULTS_FILE, TASKS_FILE, META_FILE):  # tuning.json last: marks it complete
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
    inputs = at_size(imported.inputs, tuned_sizes(summary.meta, imported, directory))
    check_meta(summary.meta, model_sha256=imported.info.sha256, inputs=[t.to_dict() for t in inputs],
                target=target_dict(target), directory=directory, action="compile with these records")
    return summary


def tuned_sizes(meta: TuningMeta, imported, directory: Path) -> dict[str, int]:
    """For a build whose sizes change at run time (``imported.dims``): the size of each dim at which the records
    were tuned (``tune --tune-size``), read from the tuning's input shapes; a TuningMismatchError where that size
    is outside the build's range. {} for a fixed build, or where the shapes do not line up (``check_meta`` says
    how)."""
    if not getattr(imported, "dims", None):
        return {}
    recorded = {t["name"]: list(t["shape"]) for t in meta.inputs}
    sizes: dict[str, int] = {}
    for spec in imported.inputs:
        shape = recorded.get(spec.name)
        if shape is None or len(shape) != len(spec.shape):
            return {}
        for want, got in zip(spec.shape, shape):
            if isinstance(want, str) and isinstance(got, int) and sizes.setdefault(want, got) != got:
                return {}
    for name, value in sizes.items():
        r = imported.dims[name]
        if not r.takes(value):
            raise TuningMismatchError(
                f"The records in {directory} were tuned at {name}={value}, which this build's range {r} does not "
                "take.", f"Tune at a size in the range (edgepack tune ... --tune-size {name}={r.min}), or widen "
                         "--dim.")
    return sizes


def tuning_database(tuning_dir: Path | str, workloads: set[str] | None = None):
    """A MetaSchedule database (in memory) holding the best record of each kernel of ``tuning_dir``."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    with tempfile.TemporaryDirectory(prefix="edgepack-tuning-") as tmp:
        workload_lines, records = best_records(Path(tuning_dir), workloads)
        (Path(tmp) / WORKLOAD_FILE).write_text("".join(json.dumps(w) + "\n" for w in workload_lines))
        (Path(tmp) / RECORD_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
        return JSONDatabase(path_workload=str(Path(tmp) / WORKLOAD_FILE),
                            path_tuning_record=str(Path(tmp) / RECORD_FILE), module_equality="structural")


def apply_tuning(imported: ImportedModel, profile: Profile, target, tuning_dir: Path | str) -> AppliedTuning:
    """Check that ``tuning_dir`` fits the model and target, and return the records to build with
    (``backend.build(imported, target, records=applied.records)``)."""
    backend: Backend = backend_for(profile)
    if not backend.tunable:
        raise TuningError(f"Tuning records apply to tunable backends (CPU, OpenCL), not to {backend.label}.",
                          "Compile this profile without --tuning.")
    summary = check_tuning(tuning_dir, imported, target)
    tuned = {t.workload for t in summary.tasks if t.tuned}
    stale = stale_defaults(Path(tuning_dir), backend, target, tuned)
    sizes = tuned_sizes(summary.meta, imported, Path(tuning_dir))  # a dynamic build: where they were tuned
    variables = {k: v for name, value in sizes.items() for k, v in imported.dims[name].variables(value).items()}
    records = TuningRecords(tuning_database(tuning_dir, tuned - stale), form=summary.meta.form,
                            sizes=variables or None)
    names = tuple(t.name for t in summary.tasks if t.workload in stale)
    return AppliedTuning(records, summary, len(tuned - stale), len(summary.tasks), names)
