"""MetaSchedule made resumable: a search that never measures a schedule twice, a runner that blocks until
a batch is measured, a task scheduler that joins finished batches before every pick, and records written
as soon as they are measured."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgepack.tuning.records import FAILED_SECONDS, TuningTask, schedule_hash

PROBE_TRIALS = 4  # a task's first batch: every kernel gets a measured schedule before any gets many

# ---------------------------------------------------------------------------------------------
# resumable search: never measure a schedule that already has a record


@dataclass
class TaskPlan:
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
    default: Any = None  # the default schedule's MeasureCandidate, measured with the first batch (None: none or done)
    default_of: Any = None  # what ``default`` measures (records.DefaultSchedule: rule, fingerprint)
    default_first: bool = False  # the batch in flight starts with the default schedule (a baseline, not a trial)


@dataclass
class Control:
    deadline: float | None  # time.monotonic() after which no new batch starts
    left: int  # trials this run may still measure, all tasks together
    stopped_by_time: bool = False
    interrupted: bool = False  # SIGINT/SIGTERM: finish the batch in flight, then stop
    lost: int = 0  # remote measurements lost to a dropped connection (not recorded)
    batches: int = 0  # batches this run started
    phase: str = "preparing"  # "preparing" (nothing measured yet), "tuning", "checking" (the in-model check)

    def checkpoint(self) -> None:
        """Before tuning starts, a Ctrl-C ends the run (nothing is measured yet): raise it again here."""
        if self.interrupted and self.phase == "preparing":
            raise KeyboardInterrupt

    def expired(self) -> bool:
        # a run always starts one batch: a budget spent on setup (imports, search spaces, a slow
        # machine) would otherwise end the run with nothing measured and nothing left to spend
        if self.deadline is not None and self.batches > 0 and time.monotonic() >= self.deadline:
            self.stopped_by_time = True
        return self.stopped_by_time


def replay(workload_mod, trace):
    """A record's schedule: its trace (postprocessing included) replayed on its kernel, as the trace reads
    once written to the records file. The file holds booleans as 0/1, so a trace straight from the search
    replays to another program (``{"meta_schedule.layout_rewrite_preproc": True}`` vs ``1``) and a
    resumed run did not recognise any schedule it had measured before."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    sch = Schedule(workload_mod)
    Trace.apply_json_to_schedule(_as_written(trace.as_json(remove_postproc=False)), sch)
    return sch


def _as_written(node):
    """A trace's JSON form as the records file gives it back: booleans as integers."""
    if isinstance(node, bool):
        return int(node)
    if isinstance(node, (str, int, float)) or node is None:
        return node
    if hasattr(node, "__len__") and hasattr(node, "__getitem__") and not hasattr(node, "keys"):
        return [_as_written(item) for item in node]
    return node


def resumable_strategy_class():
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

        def __init__(self, inner, plan: TaskPlan, control: Control) -> None:
            self.inner = inner
            self.plan = plan
            self.control = control
            self._pending: tuple[list, list] = ([], [])
            self._default_in_batch = False  # the batch in flight starts with the default schedule
            self._workload = None

        def _initialize_with_tune_context(self, context) -> None:
            self._workload = context.mod
            self.inner._initialize_with_tune_context(context)

        def _digest(self, candidate) -> int:
            """The schedule a candidate's trace gives when replayed on the kernel, as records are keyed
            (``load_known``): two candidates whose own modules hash apart can replay to the same schedule
            (seen: one schedule measured twice in a batch)."""
            try:
                return schedule_hash(replay(self._workload, candidate.sch.trace).mod)
            except Exception:  # noqa: BLE001 - a trace that does not replay: its own module identifies it
                return schedule_hash(candidate.sch.mod)

        def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None):
            # the inner search gets no trial limit of its own: budgets are enforced in this wrapper
            self.inner.pre_tuning(1 << 30, num_trials_per_iter, design_spaces, database, cost_model)

        def post_tuning(self) -> None:
            self.inner.post_tuning()

        def generate_measure_candidates(self):
            plan, control = self.plan, self.control
            if control.interrupted or control.expired():
                return None
            if plan.left <= 0 or control.left <= 0:
                # a default schedule timed for another edgepack is timed again with no trial left, alone
                return self._with_default([]) if plan.default is not None else None
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
                    digest = self._digest(candidate)
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
                    return self._with_default(fresh)
                self.inner.notify_runner_results(known, known_results)
            plan.exhausted = True
            return None

        def _with_default(self, trials: list) -> list:
            """A batch: the task's default schedule first if it has not been timed (the untuned build's
            schedule, the baseline every record must beat), then the trials. The default is timed only
            for a task that gets trials (or whose recorded default is stale), in its first batch: timing
            every task's default before any trial spent a short time budget many times over."""
            plan = self.plan
            plan.default_first = self._default_in_batch = plan.default is not None
            batch = ([plan.default] if plan.default is not None else []) + list(trials)
            plan.default = None
            if not trials:
                self._pending = ([], [])
                plan.in_flight = []
            self.control.batches += 1
            return batch

        def notify_runner_results(self, measure_candidates, results) -> None:
            known, known_results = self._pending
            self._pending = ([], [])
            if self._default_in_batch:  # the default schedule is a baseline, not a trial of the search
                measure_candidates, results = list(measure_candidates)[1:], list(results)[1:]
                self._default_in_batch = False
            self.inner.notify_runner_results(list(known) + list(measure_candidates),
                                             list(known_results) + list(results))
            # plan.known learns of this batch from the recorder: only what it records counts as done
            self.plan.left -= len(measure_candidates)

        def clone(self):
            copy = ResumableSearch(self.inner.clone(), self.plan, self.control)
            copy._workload = self._workload
            return copy

    return ResumableSearch


def blocking_runner_class():
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


def scheduler_class():
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

        def __init__(self, plans: list[TaskPlan], on_pick: Callable[[int], None], alpha: float = 0.2,
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


def history_from_records(latencies: list[float | None], batch: int) -> list[float]:
    """Best latency after each batch-sized chunk of a task's records (in the order they were made)."""
    history, best = [], FAILED_SECONDS * 10
    for start in range(0, len(latencies), batch):
        for value in latencies[start:start + batch]:
            if value is not None and value < best:
                best = value
        history.append(best)
    return history


def record_callback_class():
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.database import TuningRecord
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class RecordAndReport(PyMeasureCallback):
        """MetaSchedule's ``AddToDatabase`` (one appended line per measurement), then progress.

        The difference: after an interrupt, candidates whose build or run failed are not recorded;
        their workers were most likely killed by the same Ctrl-C, and a rerun should try them again.
        """

        def __init__(self, database, control: Control, on_batch: Callable[[int, list, bool], None],
                     baseline: Callable[[int], bool], remote: bool = False) -> None:
            self.database = database
            self.control = control
            self.on_batch = on_batch
            self.baseline = baseline  # task id -> its batch starts with the default schedule: measured, not recorded
            self.remote = remote

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
            context = task_scheduler.tasks_[task_id].ctx
            workload = self.database.commit_workload(context.mod)
            baseline = self.baseline(int(task_id))
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
                # the default schedule is not a MetaSchedule record: the search would start from its trace,
                # which it cannot replay (the weight layout rewrite would be applied twice)
                if not (baseline and position == 0):
                    self.database.commit_tuning_record(TuningRecord(
                        candidate.sch.trace, workload, run_secs or [1e10], context.target, candidate.args_info))
                recorded.append((position, run_secs))
            self.on_batch(int(task_id), recorded, baseline)

    return RecordAndReport


_LOST_DEVICE = ("timeout", "timed out", "connection", "connect to", "broken pipe", "reset by peer", "closed",
                "kshutdown", "eof", "subprocess terminated", "no route", "unreachable", "session")


def _lost_device(message: str | None) -> bool:
    """Whether a remote run failed because the link or the device went away (not the candidate)."""
    text = (message or "").lower()
    return any(word in text for word in _LOST_DEVICE)


def load_known(database, tasks: list[TuningTask]) -> dict[str, list[tuple[Any, list[float] | None, int]]]:
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
            sch = replay(record.workload.mod, record.trace)
            digest = schedule_hash(sch.mod)
        except Exception:  # noqa: BLE001 - a record that no longer applies is still a finished trial
            digest = -1
            sch = None
        by_workload.setdefault(workload, []).append((record, run_secs, digest, sch))
    return by_workload


def warm_start(cost_model, contexts, plans: list[TaskPlan], known: dict[str, list]) -> int:
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


