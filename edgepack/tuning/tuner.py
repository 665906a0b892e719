"""Tune a model's kernels with MetaSchedule into a tuning directory (``tuning.records``), resumably.

Resuming: every measurement batch is recorded as soon as it is measured (one appended line per
record; TVM's ``JSONDatabase`` closes the file after each). The runner is made blocking and the task
scheduler joins finished batches before every pick: MetaSchedule by default builds the next batch
while the last one runs and records a batch only when it comes back to its task, so a kill could
lose several. A run killed at any moment thus loses at most the batch in flight; Ctrl-C (or
SIGTERM) finishes and records that batch, then stops (``tuning.signals``: ``edgepack tune`` tunes in a
process of its own so that no Ctrl-C is lost). A rerun repairs a torn last line, counts the
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

Measuring happens where ``on`` says (``run.places``; ``tuning.measure``): this machine (its CPU for
host profiles, or its GPU through a local RPC server), a device of the inventory (its RPC server
through an SSH tunnel), or every device of a profile through the farm's RPC tracker. Candidates for
devices are built on this machine and linked with the profile's cross compiler.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from edgepack.backends import Backend, backend_for, target_dict
from edgepack.dims import substitute_sizes
from edgepack.errors import first_line
from edgepack.files import write_json_atomic
from edgepack.frontends import ImportedModel, import_model
from edgepack.profiles import Profile, get_profile, require_supported
from edgepack.progress import Progress
from edgepack.run.places import Place, ThisMachine, parse_place
from edgepack.text import utc_timestamp
from edgepack.tuning.in_model import check_in_model
from edgepack.tuning.measure import check_place, measurer_for
from edgepack.tuning.records import (
    FAILED_SECONDS,
    LOCK_FILE,
    LOG_DIR,
    META_FILE,
    RECORD_FILE,
    STATE_FILE,
    TASKS_FILE,
    WORKLOAD_FILE,
    TuningError,
    TuningMeta,
    TuningMismatchError,
    TuningSummary,
    TuningTask,
    check_meta,
    default_schedule,
    format_duration,
    load_tuning,
    read_database,
    read_defaults,
    read_json,
    record_default,
    record_seconds,
    repair_database,
)
from edgepack.tuning.search import (
    Control,
    TaskPlan,
    blocking_runner_class,
    history_from_records,
    load_known,
    record_callback_class,
    resumable_strategy_class,
    scheduler_class,
    warm_start,
)
from edgepack.tuning.signals import stop_on_signals
from edgepack.tuning.tasks import extract_tasks
from edgepack.versions import __version__, installed_tvm

DEFAULT_TRIALS = 1000
DEFAULT_BATCH = 16  # candidates per measurement batch: records are flushed after each batch
LOCK_GRACE_S = 3.0  # how long a run waits for another one's lock before it says so


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


#: Receives a :class:`TuningProgress` snapshot at the start, after every batch and at the end.
ProgressSnapshots = Callable[[TuningProgress], None]


def _untimed_defaults(plans: list[TaskPlan], extracted, backend: Backend, target, defaults: dict[str, dict],
                     logger: logging.Logger, control: Control) -> None:
    """Give each plan whose default schedule (what an untuned build runs) has no time recorded for it
    that schedule to measure first: a new task, or one timed when edgepack scheduled it otherwise."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    for plan in plans:
        try:
            found = default_schedule(backend, extracted[plan.index].dispatched[0], target)
        except Exception as exc:  # noqa: BLE001 - the search still runs without a baseline
            control.checkpoint()  # or a Ctrl-C, which TVM's C++ gave back as another exception
            logger.warning("no default schedule for %s: %s", plan.task.name, exc)
            found = None
        if found is None or defaults.get(plan.task.workload, {}).get("schedule") == found.fingerprint:
            continue
        plan.default_of = found
        plan.default = MeasureCandidate(found.schedule, ArgInfo.from_entry_func(found.schedule.mod, remove_preproc=True))


# ---------------------------------------------------------------------------------------------
# tuning


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    import fcntl

    path = directory / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 - held for the whole run
    try:
        # a moment's grace: a tuning process killed with the command that relayed to it lets go of the
        # lock a little after that command is gone
        deadline = time.monotonic() + LOCK_GRACE_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
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


def _meta_for(imported: ImportedModel, profile: Profile, backend: Backend, tuning_target, place: Place) -> TuningMeta:
    tvm_version, ffi_version = installed_tvm()
    layout = backend.tuning_layout()
    timed_here = isinstance(place, ThisMachine) and place.backend is None  # MetaSchedule's local runner
    return TuningMeta(
        model_name=imported.info.path.name,
        model_sha256=imported.info.sha256,
        model_format=imported.info.format,
        inputs=tuple(t.to_dict() for t in imported.inputs),
        profile=profile.name,
        target=target_dict(profile.tvm_target()),
        tuning_target=target_dict(tuning_target),
        tvm_version=tvm_version,
        tvm_ffi_version=ffi_version,
        edgepack_version=__version__,
        created=utc_timestamp(),
        cold_weights=layout.cold_weights and timed_here,
        **asdict(layout.form),  # TuningMeta keeps the form's fields by their names (tuning.json)
    )


def _ensure_directory(directory: Path, meta: TuningMeta, tasks: list[TuningTask]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / TASKS_FILE).exists():
        write_json_atomic(directory / TASKS_FILE, {"tasks": [t.to_dict() for t in tasks]})
    if not (directory / META_FILE).exists():  # written last: it marks the directory as a tuning directory
        write_json_atomic(directory / META_FILE, meta.to_dict())


def _existing_meta(directory: Path) -> TuningMeta | None:
    data = read_json(directory / META_FILE)
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
    input_shapes: dict[str, tuple[int | str, ...]] | None = None,
    tune_sizes: dict[str, int] | None = None,
    trials_per_batch: int = DEFAULT_BATCH,
    only: list[str] | tuple[str, ...] | None = None,
    num_cores: int | None = None,
    inventory: Path | str | None = None,
    session_timeout: float = 600.0,
    seed: int | None = None,
    on_progress: ProgressSnapshots | None = None,
    log: Progress | None = None,
) -> TuningResult:
    """Tune ``model``'s kernels for ``profile``, measuring ``on`` host / a device / ``farm:PROFILE``.

    ``output_dir`` is created, or resumed when it holds records for the same model, shapes and
    target. ``trials`` and ``time_budget_s`` are totals for the directory (see the module docstring).
    ``max_trials_per_task`` caps each task's records; ``only`` tunes just the tasks whose names
    contain one of the given strings. ``on_progress`` gets a :class:`TuningProgress` at the start,
    after every batch and at the end; ``log`` gets one line per step.

    ``input_shapes`` may name dims (``{"x": (1, 3, 48, "W")}``) that ``tune_sizes`` gives a size (``{"W": 320}``):
    the model is tuned at that size, and a build with ``--dim W=...`` applies the records across its range
    (``backends/sized_records.py``).
    """
    say = log or (lambda _msg: None)
    started = time.monotonic()
    model, directory = Path(model), Path(output_dir)
    profile = get_profile(profile) if isinstance(profile, str) else profile
    require_supported(profile)
    backend = backend_for(profile)
    place = parse_place(on, inventory)
    check_place(profile, place)
    if trials < 0 or (max_trials_per_task is not None and max_trials_per_task < 1) or trials_per_batch < 1:
        raise TuningError("Trial counts must be positive.", "Use e.g. --trials 1000 --batch 16.")
    if directory.exists() and not directory.is_dir():
        raise TuningError(f"{directory} exists and is not a directory.", "Choose another -o/--output.")
    existing = _existing_meta(directory) if directory.is_dir() else None
    if directory.is_dir() and existing is None and any(p.name != LOCK_FILE for p in directory.iterdir()):
        raise TuningError(f"{directory} exists and is not a tuning directory.",
                          "Choose a new or empty directory for -o/--output.")
    if input_shapes is not None:
        input_shapes = substitute_sizes(input_shapes, tune_sizes or {})
    if input_shapes is None and existing is not None:
        input_shapes = {t["name"]: tuple(t["shape"]) for t in existing.inputs}

    # a Ctrl-C from here on marks the run stopped (``tuning.signals``). Before tuning starts it is also a
    # KeyboardInterrupt, which TVM's C++ gives back as a RuntimeError when it is raised inside a Python
    # function that C++ calls (a pass, a schedule rule): checkpoints raise it again wherever such an error
    # is caught, or where C++ swallowed it
    control = Control(None, 0)
    with stop_on_signals(control, say):
        try:
            return _prepare_and_tune(model, directory, profile, backend, place, existing, input_shapes, control,
                                     trials=trials, time_budget_s=time_budget_s,
                                     max_trials_per_task=max_trials_per_task, trials_per_batch=trials_per_batch,
                                     only=tuple(only or ()), num_cores=num_cores, session_timeout=session_timeout,
                                     seed=seed, on_progress=on_progress, say=say, started=started)
        except Exception:
            control.checkpoint()
            raise


def _prepare_and_tune(model: Path, directory: Path, profile: Profile, backend: Backend, place: Place,
                      existing: TuningMeta | None, input_shapes, control: Control, *, num_cores: int | None,
                      say: Progress, **run) -> TuningResult:
    say(f"Importing {model.name}")
    imported = import_model(model, input_shapes)
    control.checkpoint()
    tuning_target = backend.tuning_target(profile, num_cores=num_cores, here=isinstance(place, ThisMachine))
    meta = _meta_for(imported, profile, backend, tuning_target, place)
    if existing is not None:
        check_meta(existing, model_sha256=meta.model_sha256, inputs=list(meta.inputs), target=meta.target,
                    directory=directory, action="resume tuning")

    say("Extracting the tuning tasks")
    if existing is not None:
        # resume the directory as it was made
        meta = replace(meta, cold_weights=existing.cold_weights, **asdict(existing.form))
    tasks, extracted = extract_tasks(imported, backend, tuning_target, meta.form, profile.limits)
    control.checkpoint()
    if not tasks:
        raise TuningError(f"{model.name} has no kernels to tune.", "Nothing to do; compile it without --tuning.")
    if existing is not None:
        recorded = read_json(directory / TASKS_FILE) or {"tasks": []}
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
        return _run_tuning(directory, profile, imported, tuning_target, tasks, extracted, control, place=place,
                           say=say, logger=ms_logger, repaired=repaired, cold_weights=meta.cold_weights, **run)


def _run_tuning(directory: Path, profile: Profile, imported: ImportedModel, tuning_target, tasks: list[TuningTask],
                extracted, control: Control, *, place: Place,
                trials: int, time_budget_s: float | None, max_trials_per_task: int | None, trials_per_batch: int,
                only: tuple[str, ...], session_timeout: float, seed: int | None, on_progress: ProgressSnapshots | None,
                say: Progress, logger: logging.Logger, started: float, repaired: tuple[str, ...],
                cold_weights: bool = False) -> TuningResult:
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.cost_model import CostModel
    from tvm.s_tir.meta_schedule.database import JSONDatabase
    from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

    before = load_tuning(directory)
    defaults = read_defaults(directory)
    state = read_json(directory / STATE_FILE) or {}
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
        plans.append(TaskPlan(index, task, summary.trials, left, summary.best_seconds, cap))
    remaining = max(0, trials - trials_before)
    time_left = None if time_budget_s is None else max(0.0, time_budget_s - seconds_before)
    _untimed_defaults(plans, extracted, backend_for(profile), tuning_target, defaults, logger, control)
    untimed = [p for p in plans if p.default is not None and p.task.workload in defaults]
    if untimed:  # timed again with or without trials left: until then their records are not applied
        say(f"Timing the default schedules of {len(untimed)} task(s) again: edgepack schedules them "
            "differently than when they were tuned")
    active = [p for p in plans if (p.left > 0 and remaining > 0) or p in untimed]
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
    report = on_progress or (lambda _p: None)

    def finish(stopped: str, run_trials: int, skipped: int, lost: int = 0) -> TuningResult:
        if cold_weights and (run_trials > 0 or untimed) and stopped != "interrupted":  # timed on this machine
            control.phase = "checking"
            try:
                cores = target_dict(tuning_target).get("num-cores")
                check_in_model(imported, profile, directory, say, (int(cores) if cores else None, 1))
            except Exception as exc:  # noqa: BLE001 - the records stay; the check runs again after the next run
                logger.warning("in-model check failed: %s", exc)
                say(f"Could not check the tuned kernels inside the model ({first_line(str(exc))}); "
                    "their records apply as timed alone")
        elapsed = time.monotonic() - started
        write_json_atomic(directory / STATE_FILE, {"seconds": round(seconds_before + elapsed, 1),
                                                    "runs": runs_now, "updated": utc_timestamp()})
        report(snapshot(run_trials, finished=True, message=stopped))
        return TuningResult(load_tuning(directory), place.on, trials_before, run_trials, skipped, elapsed, stopped, repaired,
                            lost)

    if not active or time_left == 0.0:
        why = ("the trial budget is used up" if remaining <= 0 else
               "the time budget is used up" if time_left == 0.0 else
               "every task has its trials" if not only else f"no task matches {', '.join(only)} or they have their trials")
        say(f"Nothing to tune: {why} ({trials_before} records); raise the budget to tune more")
        report(snapshot(0))
        return finish("nothing to do", 0, 0)

    measurer = measurer_for(profile, place, session_timeout, say, cold_weights)
    try:
        say(f"Reading {trials_before} records")
        database = JSONDatabase(path_workload=str(directory / WORKLOAD_FILE),
                                path_tuning_record=str(directory / RECORD_FILE), module_equality="structural")
        known = load_known(database, tasks)
        hashes, lines, _ignored = read_database(directory)  # file order: the order of measurement
        in_order: dict[str, list[float | None]] = {}
        for index, record in lines:
            in_order.setdefault(hashes[index], []).append(record_seconds(record))
        for plan in plans:
            entries = known.get(plan.task.workload, [])
            plan.known = {digest: run_secs for _r, run_secs, digest, _s in entries if digest != -1}
            plan.history = history_from_records(in_order.get(plan.task.workload, []), trials_per_batch)

        say(f"Preparing {len(active)} of {len(tasks)} tasks (MetaSchedule search spaces)")
        control.left = remaining
        strategy_class = resumable_strategy_class()
        run_seed = (seed if seed is not None else 0) + runs_before * 7919 + trials_before
        contexts, schedulable = [], []
        for plan in active:
            context, last_error = None, None
            # the scheduler would stop everything on the first kernel MetaSchedule cannot schedule: try
            # its default search space, then simpler ones (_space_generators), and skip the kernel last
            for label, space in backend_for(profile).search_spaces(tuning_target):
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
                    control.checkpoint()  # or a Ctrl-C, given back as another exception
                    logger.warning("%s search space of %s failed: %s", label, plan.task.name, exc)
                    last_error = exc
                    continue
                if label != "default":
                    logger.warning("%s uses the %s search space", plan.task.name, label)
                context = candidate
                break
            control.checkpoint()
            if context is None:
                say(f"Skipping {plan.task.name}: MetaSchedule cannot schedule it ({first_line(last_error)}); "
                    "it keeps its untuned schedule")
                plan.tuning, plan.exhausted = False, True
                continue
            contexts.append(context)
            schedulable.append(plan)
        active[:] = schedulable
        if not active:
            return finish("tasks", 0, 0)
        cost_model = CostModel.create("xgb", num_tuning_cores=max(1, os.cpu_count() or 1), tree_method="auto")
        warm = warm_start(cost_model, contexts, active, known)
        control.checkpoint()
        if warm:
            say(f"Trained the cost model on {warm} recorded measurements")

        run_trials = 0

        def on_batch(task_id: int, recorded: list[tuple[int, list[float] | None]], baseline: bool) -> None:
            nonlocal run_trials
            plan = active[task_id]
            if baseline:  # the batch's first entry is the default schedule: its time goes to defaults.json
                plan.default_first = False
                for position, run_secs in recorded:
                    if position == 0 and run_secs:
                        mean = sum(run_secs) / len(run_secs)
                        record_default(directory, plan.task.workload, plan.default_of.rule, mean,
                                       plan.default_of.fingerprint)
                        plan.best = mean if plan.best is None else min(plan.best, mean)
                recorded = [(position - 1, run_secs) for position, run_secs in recorded if position > 0]
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
            write_json_atomic(directory / STATE_FILE, {"seconds": round(seconds_before + elapsed, 1),
                                                        "runs": runs_now, "updated": utc_timestamp()})
            report(snapshot(run_trials, last=plan.index))

        def on_pick(task_id: int) -> None:
            if not control.expired() and control.left > 0:
                report(snapshot(run_trials, current=active[task_id].index))

        from tvm.s_tir.meta_schedule.measure_callback import RemoveBuildArtifact, UpdateCostModel

        callbacks = [record_callback_class()(database, control, on_batch, lambda i: active[i].default_first,
                                             remote=measurer.remote), RemoveBuildArtifact(), UpdateCostModel()]
        tuning_started = time.monotonic()
        if time_left is not None:
            control.deadline = started + time_left  # the budget counts this run's setup too
        report(snapshot(0))
        say(f"Tuning: up to {remaining} trials" + (f" within {format_duration(time_left)}" if time_left else ""))
        # MetaSchedule's scheduler counts every measurement against its limits, the default schedules
        # (baselines, not trials) too: its limits leave room for them, and the budgets are enforced by
        # the search strategy (plan.left, control.left)
        baselines = sum(1 for p in active if p.default is not None)
        control.phase = "tuning"
        scheduler_class()(active, on_pick, seed=run_seed).tune(
            tasks=contexts,
            task_weights=[float(p.task.weight) for p in active],
            max_trials_global=remaining + baselines,
            max_trials_per_task=remaining + 1,
            num_trials_per_iter=trials_per_batch,
            builder=measurer.builder,
            runner=blocking_runner_class()(measurer.runner),
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


