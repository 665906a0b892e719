#!/usr/bin/env python3
"""Where a build's time goes: each kernel's time inside the model, on this machine.

    python scripts/kernel_profile.py BUILD                      # every core
    python scripts/kernel_profile.py BUILD --threads 1 --top 10
    python scripts/kernel_profile.py BUILD --json

One inference is recorded through the Relax VM's instrument (every kernel call with its arguments, in
order); those calls are then replayed back to back ``--runs`` times, each one timed, and the VM's own
inference is timed in turn with them. A replay is the model less the VM's bookkeeping: each kernel reads
what the one before it has just written and the weights come back from memory on every inference, as in
the model (a kernel timed alone finds its data hot in cache: MobileNetV2's stride-2 depthwise kernel on
112x112x96 ran 0.22 ms alone and 0.26 ms in the model, Zen 4, 1 thread), and a whole replay takes what
the VM's inference does (MobileNetV2: 6.22 / 6.22 ms at 1 thread, 3.45 / 3.43 ms at 2), so the kernels'
times add up to the model's. GFLOP/s: the kernel's FLOP as TVM counts them in its unscheduled form (a
multiply-add is two; a Winograd kernel's own work, not the convolution's) over its time in the model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench import host_tasks  # the bench's kernels and FLOP counts, said once

from edgepack.run.host import VM_BUILTIN

PREPACKED = "_prepacked"  # the name a kernel takes when its weight layout is rewritten at compile time


@dataclass
class KernelTime:
    name: str
    calls: int
    ms: float  # per inference: the sum over its calls of each call's median
    share: float  # of the sum over all kernels
    gflops: float | None = None


@dataclass
class Profile:
    build: str
    threads: int
    runs: int
    replay_ms: float  # median of whole replays (the kernels back to back, Python's loop between them)
    model_ms: float  # median of the VM's own inferences, timed in turn with the replays
    kernels: list[KernelTime]


def record_calls(vm, args) -> list[tuple[str, object, list]]:
    """The kernel calls of one inference, in order: (name, function, arguments)."""
    calls: list[tuple[str, object, list]] = []

    def instrument(func, name, before, _ret, *call_args):
        if before and not str(name).startswith(VM_BUILTIN):  # allocation, shape checks: done once in a replay
            calls.append((str(name), func, list(call_args)))
        return 0

    vm.set_instrument(instrument)
    vm["main"](*args)
    vm.set_instrument(None)  # the VM runs without it again
    return calls


def kernel_flops(build: Path, manifest) -> dict[str, float]:
    """FLOP per call of each kernel of the build's model, by the name it has before weight prepacking."""
    shapes = {t.name: [int(d) for d in t.shape] for t in manifest.inputs}
    return {t.name: t.flop for t in host_tasks(build / manifest.model_file, shapes)}


def profile_build(build: Path, threads: int, runs: int, warmup: int = 5, flops: dict[str, float] | None = None,
                  size: dict[str, int] | None = None) -> Profile:
    """Time every kernel of ``build`` inside the model (TVM's pool already set to ``threads``:
    ``edgepack.run.threads.use_threads_here``); a build with ``--dim`` ranges at ``size`` (default: each dim
    at its smallest)."""
    import tvm

    from edgepack.dims import at_size, check_sizes, dims_from_dict
    from edgepack.manifest import read_manifest
    from edgepack.run.host import load_host_library
    from edgepack.tensors import random_inputs

    manifest = read_manifest(build)
    device = tvm.cpu()
    vm = load_host_library(build / manifest.artifacts["host_library"].path, device)
    specs = at_size(manifest.inputs, size or check_sizes(dims_from_dict(manifest.dims))[0])
    inputs = random_inputs(specs, 0)
    args = [tvm.runtime.tensor(inputs[t.name], device) for t in manifest.inputs]
    main = vm["main"]
    for _ in range(warmup):
        main(*args)
    calls = record_calls(vm, args)
    per_call = [[0.0] * len(calls) for _ in range(runs)]
    replays, models = [], []
    clock = time.perf_counter
    for _ in range(warmup):
        for _name, func, call_args in calls:
            func(*call_args)
    for run in range(runs):
        started = clock()
        for i, (_name, func, call_args) in enumerate(calls):
            t0 = clock()
            func(*call_args)
            per_call[run][i] = clock() - t0
        replays.append(clock() - started)
        started = clock()
        main(*args)
        models.append(clock() - started)
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for i, (name, _func, _args) in enumerate(calls):
        totals[name] = totals.get(name, 0.0) + statistics.median(run[i] for run in per_call) * 1e3
        counts[name] = counts.get(name, 0) + 1
    whole = sum(totals.values()) or 1.0
    kernels = []
    for name, ms in sorted(totals.items(), key=lambda item: -item[1]):
        flop = (flops or {}).get(name.removesuffix(PREPACKED))
        gflops = flop * counts[name] / (ms * 1e6) if flop and ms > 0 else None
        kernels.append(KernelTime(name, counts[name], ms, ms / whole, gflops))
    return Profile(str(build), threads, runs, statistics.median(replays) * 1e3, statistics.median(models) * 1e3,
                   kernels)


def print_profile(result: Profile, top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result.build}: kernels in the model, {result.threads} thread(s), median of {result.runs} replays")
    for column in ("kernel", "calls", "ms", "share", "GFLOP/s"):
        table.add_column(column, justify="left" if column == "kernel" else "right", overflow="fold")
    for k in result.kernels[:top]:
        table.add_row(k.name, str(k.calls), f"{k.ms:.3f}", f"{100 * k.share:.1f}%",
                      "-" if k.gflops is None else f"{k.gflops:.1f}")
    console = Console()
    console.print(table)
    rest = result.kernels[top:]
    if rest:
        console.print(f"{len(rest)} more kernel(s): {sum(k.ms for k in rest):.3f} ms")
    console.print(f"kernels {sum(k.ms for k in result.kernels):.3f} ms, replay {result.replay_ms:.3f} ms, "
                  f"the model through the VM {result.model_ms:.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="a build directory made by `edgepack compile` for this machine")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for parallel kernels (default: $TVM_NUM_THREADS, else every core)")
    parser.add_argument("--runs", type=int, default=200, help="timed replays")
    parser.add_argument("--top", type=int, default=25, help="kernels in the table (the rest summed)")
    parser.add_argument("--no-flops", action="store_true", help="skip GFLOP/s (no import of the model)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--size", action="append", metavar="NAME=VALUE",
                        help="a build with --dim ranges: the size to run at (repeat per dim) [default: the smallest]")
    args = parser.parse_args(argv)
    if (args.threads is not None and args.threads < 1) or args.runs < 1:
        parser.error("--threads and --runs must be at least 1")
    if not (args.build / "manifest.json").is_file():
        parser.error(f"{args.build} is not a build directory (no manifest.json): give the directory that "
                     "`edgepack compile MODEL --profile host -o DIR` wrote")
    from edgepack.manifest import read_manifest
    from edgepack.profiles import get_profile
    from edgepack.run.threads import use_threads_here

    manifest = read_manifest(args.build)
    if not get_profile(manifest.profile_name).is_host:
        parser.error(f"{args.build} was built for the {manifest.profile_name} profile; this script times a build "
                     "on this machine: compile the model with `--profile host` (or another x86-64 profile) and "
                     "profile that build")
    from edgepack.dims import dims_from_dict, parse_sizes

    size = parse_sizes(args.size, dims_from_dict(manifest.dims))
    flops = None if args.no_flops or manifest.dims else kernel_flops(args.build, manifest)
    threads = use_threads_here(args.threads)  # before the first parallel kernel sizes TVM's pool
    result = profile_build(args.build, threads, args.runs, flops=flops, size=size)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print_profile(result, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
