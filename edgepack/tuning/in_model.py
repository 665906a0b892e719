"""Tuning records checked inside the model, on this machine, before a build applies them.

The tuner times each candidate alone: one kernel, run after run, its weights flushed from the cache. In
the model the same kernel runs between others, on what the kernel before it has just written, with its
weights often still in the last-level cache, and a record that won alone can lose there (SqueezeNet's
1000-channel classifier: 1.28 ms tuned against 1.84 ms for the default schedule alone, 2.45 against 1.92
in the model; its tuned build ran 1.3x slower than the untuned one). So after a tuning run on this
machine the untuned and the tuned builds run the model, interleaved, each kernel timed where it runs,
and a record whose kernel takes longer there than the default schedule's is not applied
(``defaults.json``: ``in_model``; ``TaskSummary.tuned``).

The check runs at the tuning's thread count and at one thread: one build serves every thread count, and
a record tuned for two cores can lose at one (SqueezeNet's tuned build, checked at two threads only, ran
6% slower than the untuned one at one thread). A record must win at both.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgepack.backends import backend_for
from edgepack.frontends import ImportedModel
from edgepack.profiles import Profile
from edgepack.progress import Progress
from edgepack.run.host import VM_BUILTIN
from edgepack.run.threads import resolve_threads, threads_here
from edgepack.tensors import random_inputs
from edgepack.tuning.records import InModelTime, apply_tuning, load_tuning, record_in_model

RUNS = 15  # model runs per build, interleaved; the median per kernel
WARMUP = 3


def check_in_model(imported: ImportedModel, profile: Profile, directory: Path, say: Progress,
                   threads: Sequence[int | None] = (None, 1)) -> int:
    """Time the untuned and the tuned builds' kernels inside the model at each of ``threads`` (thread
    counts; None: ``$TVM_NUM_THREADS``, else every core), and record, for every applied record, both
    times at each. Returns how many records lost there at any count (they are no longer applied)."""
    import tvm
    from tvm import relax

    target = profile.tvm_target()
    applied = apply_tuning(imported, profile, target, directory)
    if applied.tuned_tasks == 0:
        return 0
    # a thread pool can shrink but not grow once made: the largest count first
    counts = sorted({resolve_threads(count) for count in threads}, reverse=True)
    say(f"Checking {applied.tuned_tasks} tuned kernel(s) inside the model against their defaults "
        f"({' and '.join(map(str, counts))} thread(s))")
    backend = backend_for(profile)
    builds = [backend.build(imported, target, limits=profile.limits).executable,
              backend.build(imported, target, records=applied.records, limits=profile.limits).executable]
    device = tvm.cpu()
    machines = [relax.VirtualMachine(executable, device) for executable in builds]
    inputs = random_inputs(imported.inputs)
    args = [tvm.runtime.tensor(inputs[spec.name], device) for spec in imported.inputs]
    timed: dict[str, list[InModelTime]] = defaultdict(list)  # per task name
    for count in counts:
        with threads_here(count):
            default, tuned = _kernel_medians(machines, args)
        for name in default.keys() & tuned.keys():
            timed[name].append(InModelTime(count, default[name], tuned[name]))
    summary = load_tuning(directory)
    checked = {t.workload: (t.best_seconds, tuple(timed[t.name])) for t in summary.tasks
               if t.tuned and len(timed.get(t.name, ())) == len(counts) and t.best_seconds is not None}
    record_in_model(directory, checked)
    lost = [t.name for t in load_tuning(directory).tasks if t.workload in checked and t.lost_in_model]
    if lost:
        say(f"{len(lost)} of {len(checked)} tuned kernel(s) ran slower inside the model than their default "
            f"schedule and keep it: {', '.join(lost)}")
    return len(lost)


def _kernel_medians(machines, args) -> list[dict[str, float]]:
    """Run the models in turn, WARMUP + RUNS times each; per model, each task's median seconds."""
    samples: list[dict[str, list[float]]] = [defaultdict(list) for _ in machines]
    for run in range(WARMUP + RUNS):
        for machine, times in zip(machines, samples):
            per_kernel = _timed_run(machine, args)
            if run >= WARMUP:
                for name, seconds in per_kernel.items():
                    times[name].append(seconds)
    return [{_task_name(n): float(np.median(v)) for n, v in s.items()} for s in samples]


def _timed_run(machine, args) -> dict[str, float]:
    """One run of the model, the seconds each kernel (function symbol) took, summed over its calls."""
    times: dict[str, float] = defaultdict(float)
    started: list[float] = []

    def instrument(_func, symbol, before, _ret, *_args):
        if symbol.startswith(VM_BUILTIN):
            return 0
        if before:
            started.append(time.perf_counter())
        else:
            times[symbol] += time.perf_counter() - started.pop()
        return 0

    machine.set_instrument(instrument)
    machine["main"](*args)
    return times


def _task_name(symbol: str) -> str:
    """The tuning task a kernel's symbol belongs to (a kernel whose weights are prepacked at compile
    time has its task's name with a suffix)."""
    return symbol.removesuffix("_prepacked")
