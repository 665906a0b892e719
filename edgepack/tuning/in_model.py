"""Tuning records checked inside the model, on this machine, before a build applies them.

The tuner times each candidate alone: one kernel, run after run, its weights flushed from the cache. In
the model the same kernel runs between others, on what the kernel before it has just written, with its
weights often still in the last-level cache, and a record that won alone can lose there (SqueezeNet's
1000-channel classifier: 1.28 ms tuned against 1.84 ms for the default schedule alone, 2.45 against 1.92
in the model; its tuned build ran 1.3x slower than the untuned one). So after a tuning run on this
machine the untuned and the tuned builds run the model, interleaved, each kernel timed where it runs,
and a record whose kernel takes longer there than the default schedule's is not applied
(``defaults.json``: ``in_model``; ``TaskSummary.tuned``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from edgepack.backends import backend_for
from edgepack.frontends import ImportedModel
from edgepack.profiles import Profile
from edgepack.progress import Progress
from edgepack.run.threads import use_threads_here
from edgepack.tensors import random_inputs
from edgepack.tuning.records import apply_tuning, load_tuning, record_in_model

RUNS = 15  # model runs per build, interleaved; the median per kernel
WARMUP = 3


def check_in_model(imported: ImportedModel, profile: Profile, directory: Path, say: Progress,
                   threads: int | None = None) -> int:
    """Time the untuned and the tuned builds' kernels inside the model, on ``threads`` threads (the
    tuning's; None: ``$TVM_NUM_THREADS``, else every core), and record, for every applied record, both
    times. Returns how many records lost there (they are no longer applied)."""
    import tvm
    from tvm import relax

    target = profile.tvm_target()
    applied = apply_tuning(imported, profile, target, directory)
    if applied.tuned_tasks == 0:
        return 0
    count = use_threads_here(threads)
    say(f"Checking {applied.tuned_tasks} tuned kernel(s) inside the model against their defaults "
        f"({count} thread(s))")
    backend = backend_for(profile)
    builds = [backend.build(imported, target).executable,
              backend.build(imported, target, records=applied.records).executable]
    device = tvm.cpu()
    machines = [relax.VirtualMachine(executable, device) for executable in builds]
    inputs = random_inputs(imported.inputs)
    args = [tvm.runtime.tensor(inputs[spec.name], device) for spec in imported.inputs]
    samples: list[dict[str, list[float]]] = [defaultdict(list), defaultdict(list)]
    for run in range(WARMUP + RUNS):
        for machine, times in zip(machines, samples):
            per_kernel = _timed_run(machine, args)
            if run >= WARMUP:
                for name, seconds in per_kernel.items():
                    times[name].append(seconds)
    default, tuned = ({_task_name(n): float(np.median(v)) for n, v in s.items()} for s in samples)
    summary = load_tuning(directory)
    checked = {t.workload: (default[t.name], tuned[t.name], t.best_seconds) for t in summary.tasks
               if t.tuned and t.name in default and t.name in tuned and t.best_seconds is not None}
    record_in_model(directory, checked)
    lost = [t.name for t in load_tuning(directory).tasks if t.workload in checked and t.lost_in_model]
    if lost:
        say(f"{len(lost)} of {len(checked)} tuned kernel(s) ran slower inside the model than their default "
            f"schedule and keep it: {', '.join(lost)}")
    return len(lost)


def _timed_run(machine, args) -> dict[str, float]:
    """One run of the model, the seconds each kernel (function symbol) took, summed over its calls."""
    times: dict[str, float] = defaultdict(float)
    started: list[float] = []

    def instrument(_func, symbol, before, _ret, *_args):
        if symbol.startswith("vm.builtin"):
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
