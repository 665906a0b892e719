#!/usr/bin/env python3
"""edgepack (untuned and tuned) against ONNX Runtime / LiteRT on this machine, in one run, one table.

    python scripts/bench.py                         # default models, 1 thread and all cores
    python scripts/bench.py --markdown docs/benchmarks.md
    python scripts/bench.py --models mobilenetv2 --trials 0 --threads 1    # untuned only

For each test model (scripts/fetch_models.py):

* ``edgepack untuned``: ``compile_model`` for the host profile: edgepack's default CPU schedules;
* ``edgepack tuned``: ``tune_model`` on this machine with a fixed trial budget (``--trials N``, the same
  for every model unless ``MODEL=N`` gives one its own; 0: no tuned rows), then
  ``compile_model(..., tuning=...)``; tuned once, for the largest thread count;
* ``onnxruntime`` (CPU execution provider, all graph optimisations) or ``litert`` (TFLite models);
* with ``--processing``: MobileNetV2 with its pre/post-processing compiled in, against the same
  processing in NumPy around the unprocessed model (``scripts/bench_processing.py``).

Every row is timed at each ``--threads`` count (default: 1 and every core), every runtime with the same
number (``TVM_NUM_THREADS``, ORT ``intra_op_num_threads``, LiteRT ``num_threads``); latency is the median
of ``--repeat`` timed runs after warm-up runs, the ratio is edgepack's median over the reference's
median from the same run and thread count (below 1: edgepack is faster). Each runtime is timed in its
own processes (two runtimes' thread pools in one process fight over the cores), in blocks interleaved
with the other runtimes', so that a change in the machine's load hits them alike. Compile time is the
wall-clock time of ``compile_model`` (import, build for this machine, link).

Tuning directories are kept under ``--work`` (default: edgepack's cache): rerunning the bench resumes
tuning where it stopped; with the same ``--trials`` it does not tune again, with more it tunes on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fetch_models import DYNAMIC_MODELS, LIGHT_MODELS, QUANTIZED_MODELS, ZOO

MODELS = ("mobilenetv2", *LIGHT_MODELS, *(entry.name for entry in ZOO), *QUANTIZED_MODELS, *DYNAMIC_MODELS)  # every model has a row
DEFAULT_MODELS = ("mobilenetv2", "light_resnet50", "ppocr_cls", "face_detection_short_range")


@dataclass
class Row:
    model: str
    runtime: str
    threads: int
    median_ms: float
    samples: list[float] = field(default_factory=list)
    block_runs: int | None = None  # samples per fresh process (``--time-one`` block), in timing order
    ratio: float | None = None  # median / reference median
    compile_s: float | None = None
    tuning_s: float | None = None
    trials: int | None = None
    tuned_tasks: str = ""
    model_bytes: int | None = None
    runtime_bytes: int | None = None
    gflops: float | None = None  # the model's FLOP (direct convolutions) per second of median latency
    note: str = ""


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def machine() -> dict[str, str]:
    info = {"cpu": platform.processor() or platform.machine(), "cores": str(os.cpu_count())}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info["cpu"] = fields.get("Model name", info["cpu"])
        info["cores"] = f"{fields.get('CPU(s)', '?')} CPU(s), {fields.get('Thread(s) per core', '?')} thread(s) per core"
        flags = fields.get("Flags", "").split()
        simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "neon") if f in flags]
        if simd:
            info["simd"] = " ".join(simd)
    except OSError:
        pass
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory"] = f"{int(mem) / 1024 / 1024:.0f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    return info


def host_profile(work: Path):
    """The host profile (its target names this machine's CPU: ``mcpu = "native"``)."""
    from edgepack.profiles import get_profile, host_cpu

    return get_profile("host"), f"mcpu={host_cpu()}"


def tvm_runtime_bytes() -> int:
    import tvm
    import tvm_ffi

    libs = [Path(tvm.__file__).parent / "lib" / "libtvm_runtime.so", Path(tvm_ffi.__file__).parent / "lib" / "libtvm_ffi.so"]
    return sum(p.stat().st_size for p in libs if p.exists())


def ort_runtime_bytes() -> int:
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    return sum(p.stat().st_size for p in capi.glob("libonnxruntime.so*"))


def litert_runtime_bytes() -> int:
    import ai_edge_litert

    base = Path(ai_edge_litert.__file__).parent
    return sum(p.stat().st_size for p in (base / "libpywrap_litert_common.so",
                                          base / "_pywrap_litert_interpreter_wrapper.so") if p.exists())


def make_inputs(specs, seed: int = 0) -> dict:
    from edgepack.tensors import random_inputs

    return random_inputs(specs, seed)


def tvm_runner(library: Path, names: list[str], inputs):
    import tvm

    from edgepack.run.host import load_host_library

    vm = load_host_library(library, tvm.cpu())  # as edgepack runs it: its memory on huge pages
    args = [tvm.runtime.tensor(inputs[name]) for name in names]
    main = vm["main"]
    return lambda: main(*args)


def ort_runner(model: Path, inputs, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in inputs.items() if k in names}
    return lambda: session.run(None, feeds)


def litert_runner(model: Path, inputs, threads: int):
    from ai_edge_litert.interpreter import Interpreter

    from edgepack.frontends.reference import quiet_native_stderr

    with quiet_native_stderr():
        interpreter = Interpreter(model_path=str(model), num_threads=threads)
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()

    def run():
        for detail in details:
            interpreter.set_tensor(detail["index"], inputs[detail["name"]])
        interpreter.invoke()

    return run


def time_one(spec: dict) -> list[float]:
    """In a fresh process (``--time-one``): load one runtime, warm it up, time ``repeat`` runs (ms)."""
    import numpy as np

    with np.load(spec["inputs"]) as data:
        inputs = {k: data[k] for k in data.files}
    if spec["kind"] == "tvm":
        run = tvm_runner(Path(spec["path"]), spec["names"], inputs)
    elif spec["kind"] == "onnxruntime":
        run = ort_runner(Path(spec["path"]), inputs, spec["threads"])
    else:
        run = litert_runner(Path(spec["path"]), inputs, spec["threads"])
    for _ in range(spec["warmup"]):
        run()
    samples = []
    for _ in range(spec["repeat"]):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1e3)
    return samples


def runs_per_block(repeat: int, rounds: int) -> int:
    return max(1, repeat // rounds)


class BackgroundLoad:
    """``count`` processes that each spin on a core (a phone's other apps) while the block runs."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> Self:
        self.processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.count)]
        return self

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def time_runtimes(specs: dict[str, dict], repeat: int, warmup: int, threads: int,
                  rounds: int = 5, load: int = 0) -> dict[str, list[float]]:
    """Each runtime in its own process (thread pools of two runtimes in one process fight over the
    cores: TVM's and ONNX Runtime's spinning workers slowed each other down several times over), in
    ``rounds`` interleaved blocks of ``repeat / rounds`` runs, each after ``warmup`` untimed runs: the
    same machine load for all; with ``load`` spinning processes beside them the whole time."""
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    samples: dict[str, list[float]] = {name: [] for name in specs}
    per_block = runs_per_block(repeat, rounds)
    with BackgroundLoad(load):
        for _ in range(rounds):
            for name, spec in specs.items():
                payload = json.dumps(spec | {"repeat": per_block, "warmup": warmup, "threads": threads})
                result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--time-one", payload],
                                        capture_output=True, text=True, env=env | spec.get("env", {}), check=False)
                if result.returncode != 0:
                    raise RuntimeError(f"timing {name} failed:\n{result.stdout}\n{result.stderr}")
                samples[name].extend(json.loads(result.stdout.strip().splitlines()[-1]))
    return samples


def host_tasks(path: Path, shapes, direct: bool = False) -> list:
    """The kernels of the model's untuned host build as tuning tasks (name, calls per inference, FLOP as
    TVM counts them; ``direct``: 3x3 convolutions as direct convolutions, not Winograd kernels)."""
    from dataclasses import replace

    from edgepack.backends import get_backend
    from edgepack.backends.cpu.pipeline import UNTUNED_FORM
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile
    from edgepack.tuning import extract_tasks

    backend = get_backend("cpu")
    target = backend.tuning_target(get_profile("host"), num_cores=1, here=True)
    form = replace(UNTUNED_FORM, winograd=0) if direct else UNTUNED_FORM
    return extract_tasks(import_model(path, input_shapes=shapes), backend, target, form)[0]


def model_gflop(path: Path, shapes) -> float:
    """The model's GFLOP per inference as TVM counts its kernels (a multiply-add is two), every
    convolution counted direct: the same work whichever algorithm a runtime picks, so that GFLOP/s
    compare across runtimes."""
    return sum(t.flop * t.weight for t in host_tasks(path, shapes, direct=True)) / 1e9


def sgemm_gflops(threads: int, n: int = 512, runs: int = 50) -> float:
    """ONNX Runtime's single-precision matrix product (MLAS), n x n by n x n, best of ``runs``: what
    this machine's cores reach on the densest work there is, the ceiling for a model's GFLOP/s."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "sgemm",
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {x: rng.random((n, n), dtype=np.float32) for x in "ab"}
    best = float("inf")
    for _ in range(runs + 3):
        started = time.perf_counter()
        session.run(None, feed)
        best = min(best, time.perf_counter() - started)
    return 2 * n ** 3 / best / 1e9


def bench_model(name: str, test_model, profile, args, work: Path, say) -> list[Row]:
    from edgepack.compiling import compile_model
    from edgepack.frontends import inspect_model
    from edgepack.tuning import load_tuning, tune_model

    info = inspect_model(test_model.path)
    shapes = test_model.input_shapes or None
    builds = work / "builds"

    say(f"{name}: compiling untuned")
    started = time.perf_counter()
    untuned = compile_model(test_model.path, profile, builds / f"{name}-untuned", input_shapes=shapes, force=True)
    untuned_compile = time.perf_counter() - started

    trials = args.trials.get(name, args.trials["*"])
    tuned = summary = None
    if trials:
        # a rerun with more --trials tunes on from here; schedules are for the largest thread count
        cores = max(args.threads)
        tuning_dir = work / "tuning" / f"{name}-{profile.name}-{cores}t"
        say(f"{name}: tuning ({trials} trials, resumable in {tuning_dir})")

        def progress(p) -> None:
            if p.last_task is not None and args.verbose:
                task = p.tasks[p.last_task]
                say(f"  {p.trials}/{p.trials_budget} {task.name} best "
                    f"{task.best_seconds and task.best_seconds * 1e3:.3f} ms")

        os.environ["TVM_NUM_THREADS"] = str(cores)  # before TVM starts its thread pool (tuning measures so)
        tuned_result = tune_model(test_model.path, profile, tuning_dir, trials=trials, input_shapes=shapes,
                                  trials_per_batch=args.batch, num_cores=cores, on_progress=progress,
                                  log=(lambda m: say(f"  {m}")) if args.verbose else None)
        if tuned_result.stopped == "interrupted":
            raise KeyboardInterrupt
        summary = load_tuning(tuning_dir)
        say(f"{name}: compiling tuned")
        started = time.perf_counter()
        tuned = compile_model(test_model.path, profile, builds / f"{name}-tuned", input_shapes=shapes, force=True,
                              tuning=tuning_dir)
        tuned_compile = time.perf_counter() - started

    import numpy as np

    gflop = model_gflop(test_model.path, shapes)
    specs = untuned.manifest.inputs
    inputs_path = builds / f"{name}-inputs.npz"
    if test_model.natural is not None:  # a real input (Silero VAD takes no random sample rate)
        shutil.copyfile(test_model.natural, inputs_path)
    else:
        np.savez(inputs_path, **make_inputs(specs))
    names = [spec.name for spec in specs]
    reference_name = "onnxruntime" if info.format == "onnx" else "litert"
    runtimes = {"edgepack untuned": {"kind": "tvm", "path": str(untuned.host_library), "names": names}}
    if args.tvm_pool:  # the same library on TVM's own thread pool, for comparison
        runtimes["edgepack untuned, TVM's pool"] = runtimes["edgepack untuned"] | {"env": {"EDGEPACK_PARALLEL": "tvm"}}
    if tuned is not None:
        runtimes["edgepack tuned"] = {"kind": "tvm", "path": str(tuned.host_library), "names": names}
    runtimes[reference_name] = {"kind": reference_name, "path": str(test_model.path)}
    for spec in runtimes.values():
        spec["inputs"] = str(inputs_path)
    tvm_bytes = tvm_runtime_bytes()
    rows = []
    for threads in args.threads:
        say(f"{name}: timing at {threads} thread(s) ({args.repeat} runs each, one process per runtime, interleaved)")
        samples = time_runtimes(runtimes, args.repeat, args.warmup, threads, args.rounds, args.load)
        reference_median = statistics.median(samples[reference_name])
        group = [Row(name, runtime, threads, statistics.median(samples[runtime]), samples[runtime],
                     compile_s=untuned_compile, model_bytes=untuned.device_library.stat().st_size,
                     runtime_bytes=tvm_bytes) for runtime in runtimes if runtime.startswith("edgepack untuned")]
        if tuned is not None:
            group.append(Row(
                name, "edgepack tuned", threads, statistics.median(samples["edgepack tuned"]),
                samples["edgepack tuned"], compile_s=tuned_compile, tuning_s=summary.seconds, trials=summary.trials,
                tuned_tasks=f"{summary.tuned_tasks}/{len(summary.tasks)} beat the default",
                model_bytes=tuned.device_library.stat().st_size, runtime_bytes=tvm_bytes))
        group.append(Row(name, reference_name, threads, reference_median, samples[reference_name],
                         model_bytes=test_model.path.stat().st_size,
                         runtime_bytes=ort_runtime_bytes() if reference_name == "onnxruntime"
                         else litert_runtime_bytes()))
        for row in group:
            row.ratio = row.median_ms / reference_median
            row.block_runs = runs_per_block(args.repeat, args.rounds)
            row.gflops = gflop / (row.median_ms / 1e3)
        rows.extend(group)
    return rows


def processing_rows(models, profile, args, work: Path, say) -> list[Row]:
    """MobileNetV2 with its processing compiled in vs the processing in NumPy (ratio: over NumPy's)."""
    from bench_processing import processing_rows as measure

    rows = []
    for threads in args.threads:
        for data in measure(models["mobilenetv2"].path, profile, work=work, threads=threads, repeat=args.repeat,
                            say=say):
            rows.append(Row(data["model"], data["runtime"], threads, data["median_ms"], data["samples"],
                            ratio=data["ratio"], compile_s=data.get("compile_s"),
                            model_bytes=data.get("model_bytes"), note=data.get("note", "")))
    return rows


def parse_trials(values: list[str]) -> dict[str, int]:
    """``["600", "mobilenetv2=2400"]`` -> ``{"*": 600, "mobilenetv2": 2400}`` (``*``: every other model)."""
    budgets = {"*": 600}
    for value in values:
        model, _, number = value.rpartition("=")
        if model and model not in MODELS:
            raise ValueError(f"--trials {value}: unknown model {model!r} (known: {', '.join(MODELS)})")
        if not number.isdigit():
            raise ValueError(f"--trials {value}: expected a number of trials (0: no tuning), as N or MODEL=N")
        budgets[model or "*"] = int(number)
    return budgets


def trials_text(budgets: dict[str, int], models: list[str]) -> str:
    default = budgets["*"]
    own = [f"{m} {budgets[m]}" for m in models if m in budgets and budgets[m] != default]
    return f"{default} trials per model" + (f" ({', '.join(own)})" if own else "")


def p90(row: Row) -> str:
    """The 90th percentile of the row's runs (what a user notices under load), in ms."""
    return f"{statistics.quantiles(row.samples, n=10)[-1]:.2f}" if len(row.samples) >= 10 else "-"


def render_markdown(rows: list[Row], meta: dict) -> str:
    lines = [
        ("| model | runtime | threads | median ms | p90 ms | blocks p25-p75 ms | vs ORT/LiteRT | GFLOP/s | compile s "
         "| tuning (trials, tasks) | model library | runtime |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        tuning = f"{r.tuning_s / 60:.1f} min ({r.trials}, {r.tuned_tasks})" if r.tuning_s is not None else "-"
        lines.append(f"| {r.model} | {r.runtime} | {r.threads} | {r.median_ms:.2f} | {p90(r)} | {block_spread(r)} | "
                     f"{r.ratio:.2f}x | {_gflops(r)} | "
                     f"{'-' if r.compile_s is None else f'{r.compile_s:.1f}'} | {tuning} | {_size(r.model_bytes)} | "
                     f"{_size(r.runtime_bytes)} |")
    return "\n".join(lines)


def block_spread(row: Row) -> str:
    """The quartiles of the row's block medians (one block per fresh process): far apart where the
    machine's speed changed from process to process (a VM whose second core comes and goes), which makes
    the row's median, and its ratio, less sure than the table's two decimals suggest."""
    n = row.block_runs
    if not n or len(row.samples) < 4 * n:
        return "-"
    medians = [statistics.median(row.samples[i:i + n]) for i in range(0, len(row.samples) - n + 1, n)]
    quartiles = statistics.quantiles(medians, n=4)
    return f"{quartiles[0]:.2f}-{quartiles[2]:.2f}"


def _gflops(row: Row) -> str:
    return "-" if row.gflops is None else f"{row.gflops:.0f}"


def ceiling_text(meta: dict) -> str:
    return ", ".join(f"{gflops:.0f} GFLOP/s at {threads} thread(s)" for threads, gflops in meta["sgemm"].items())


def print_table(rows: list[Row], meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"edgepack vs ONNX Runtime / LiteRT, {meta['threads']} thread(s), {meta['cpu']}",
                  title_justify="left")
    for col in ("model", "runtime", "threads", "median ms", "p90 ms", "blocks p25-p75", "vs ORT/LiteRT", "GFLOP/s",
                "compile s", "tuning", "model lib", "runtime"):
        table.add_column(col, justify="left" if col in ("model", "runtime", "tuning") else "right")
    for r in rows:
        tuning = f"{r.tuning_s / 60:.1f} min ({r.trials} trials, {r.tuned_tasks})" if r.tuning_s is not None else ""
        style = "green" if r.runtime.startswith("edgepack") and r.ratio < 1 else None
        table.add_row(r.model, r.runtime, str(r.threads), f"{r.median_ms:.2f}", p90(r), block_spread(r), f"{r.ratio:.2f}x",
                      _gflops(r), "" if r.compile_s is None else f"{r.compile_s:.1f}", tuning,
                      _size(r.model_bytes), _size(r.runtime_bytes), style=style)
    console = Console(width=max(160, Console().width))
    console.print(table)
    console.print(f"GFLOP/s: the model's FLOP (convolutions counted direct) per second; ceiling, ONNX Runtime's "
                  f"512x512 SGEMM: {ceiling_text(meta)}", highlight=False)


def write_markdown(path: Path, rows: list[Row], meta: dict, command: str) -> None:
    text = f"""# Benchmarks

Latest run of `scripts/bench.py` (numbers from one run on one machine; rerun it to get yours):

    {command}

Machine: **{meta['cpu']}**, {meta['cores']}{', ' + meta['memory'] + ' RAM' if 'memory' in meta else ''}{', SIMD: ' + meta['simd'] if 'simd' in meta else ''}.
Date: {meta['date']}. Background load: **{meta.get('load', 0)} spinning process(es)** beside every row. Threads: **{meta['threads']}**, the same for every runtime of a row (`TVM_NUM_THREADS`, ORT
`intra_op_num_threads`, LiteRT `num_threads`). Latency: median of {meta['repeat']} runs, timed in {meta['rounds']} interleaved blocks
per runtime, each block in a fresh process after {meta['warmup']} warm-up runs ("blocks": the quartiles of the blocks'
medians; far apart, the machine's speed changed from process to process and the median is less sure). Ratio: median over the ONNX Runtime / LiteRT median
of the same run and thread count (below 1.00x: edgepack is faster). GFLOP/s: the model's FLOP per inference as TVM
counts its kernels (a multiply-add is two), every convolution counted direct whatever algorithm a runtime uses, over
the median latency; the ceiling, ONNX Runtime's single-precision 512x512 matrix product in the same run (best of 50):
**{ceiling_text(meta)}**.

Untuned: edgepack's default CPU schedules (`edgepack/backends/cpu/schedules/`; 3x3 convolutions of stride 1 as Winograd
F(4x4, 3x3) or F(2x2, 3x3) kernels), target {meta['target']}
({meta['profile_note']}). Tuning: MetaSchedule on this machine, **{meta['trials']}** (batches of {meta['batch']}),
schedules for {max(meta['thread_counts'])} core(s); every kernel's default schedule is measured first and a record
is applied only where it beats it, alone and inside the model ("tasks": how many). Tuning time is the wall-clock time of `edgepack tune` (all runs of
the tuning directory); compile time is `compile_model`'s, import included.
Model library: the stripped `device/model.so` of the build, or the model file for ONNX Runtime/LiteRT.
Runtime: `libtvm_runtime.so` + `libtvm_ffi.so`; `libonnxruntime.so`; LiteRT's native libraries
(`libpywrap_litert_common.so` + interpreter wrapper) as shipped in their Python wheels.

{render_markdown(rows, meta)}

Versions: {meta['versions']}.
"""
    # the notes under the table ("## ..." sections, written by people) survive a rerun
    old = path.read_text() if path.exists() else ""
    notes = old[old.index("\n## ") + 1:] if "\n## " in old else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + ("\n" + notes if notes else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(DEFAULT_MODELS))
    parser.add_argument("--threads", default="1,all",
                        help="comma-separated thread counts, each timed for every runtime ('all': every core)")
    parser.add_argument("--processing", action="store_true",
                        help="also time MobileNetV2 with compiled-in pre/post-processing vs NumPy processing")
    parser.add_argument("--trials", nargs="+", default=["600"], metavar="N|MODEL=N",
                        help="tuning trials per model (default 600); MODEL=N gives one model its own budget, "
                             "e.g. --trials 600 mobilenetv2=2400")
    parser.add_argument("--batch", type=int, default=16, help="candidates per measurement batch")
    parser.add_argument("--repeat", type=int, default=50, help="timed runs per runtime")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before each block of timed runs")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved blocks per runtime, each in a fresh process (more of them even out a "
                             "machine whose speed changes from process to process)")
    parser.add_argument("--work", type=Path, default=None,
                        help="builds and tuning directories [default: $EDGEPACK_CACHE_DIR/bench]")
    parser.add_argument("--markdown", type=Path, help="also write the table, machine and command to this file")
    parser.add_argument("--json", type=Path, help="also write every sample to this JSON file")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="N processes spinning on the cores beside every row (a phone's other apps)")
    parser.add_argument("--tvm-pool", action="store_true",
                        help="also time the untuned build on TVM's own thread pool (EDGEPACK_PARALLEL=tvm)")
    parser.add_argument("--verbose", "-v", action="store_true")
    parser.add_argument("--time-one", metavar="JSON", help=argparse.SUPPRESS)  # internal: one timing process
    args = parser.parse_args(argv)
    try:
        args.trials = parse_trials(args.trials)
    except ValueError as exc:
        parser.error(str(exc))
    if args.time_one:
        print(json.dumps(time_one(json.loads(args.time_one))))
        return 0

    from edgepack.run.threads import physical_cores

    try:
        args.threads = sorted({physical_cores() if t.strip() == "all" else int(t) for t in args.threads.split(",")})
        assert args.threads and min(args.threads) > 0
    except (ValueError, AssertionError):
        parser.error(f"--threads {args.threads}: expected counts like 1,2 or 1,all")
    import importlib.metadata as md

    from fetch_models import ensure_models

    def say(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    from edgepack.paths import cache_root

    models = ensure_models()
    args.work = args.work or cache_root() / "bench"
    args.work.mkdir(parents=True, exist_ok=True)
    profile, note = host_profile(args.work)
    rows: list[Row] = []
    sgemm = {threads: sgemm_gflops(threads) for threads in args.threads}
    for name in args.models:
        rows.extend(bench_model(name, models[name], profile, args, args.work, say))
    if args.processing:
        rows.extend(processing_rows(models, profile, args, args.work, say))

    info = machine()
    versions = ", ".join(f"{p} {md.version(p)}" for p in ("apache-tvm", "apache-tvm-ffi", "onnxruntime", "ai-edge-litert"))
    target = " ".join(f"{k}={v}" for k, v in profile.target.items())
    meta = info | {"load": args.load, "threads": " and ".join(map(str, args.threads)), "thread_counts": args.threads, "repeat": args.repeat, "rounds": args.rounds, "warmup": args.warmup, "trials": trials_text(args.trials, args.models),
                   "batch": args.batch, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                   "profile_note": note, "target": f"`{target}`", "versions": versions, "sgemm": sgemm}
    print_table(rows, meta)
    # the command that reproduces the table, without where this run wrote its outputs
    given = list(argv if argv is not None else sys.argv[1:])
    shown = []
    for i, arg in enumerate(given):
        if arg.startswith(("--markdown", "--json")) or (i and given[i - 1] in ("--markdown", "--json")):
            continue
        shown.append(arg)
    command = "python scripts/bench.py " + " ".join(shown)
    if args.markdown:
        write_markdown(args.markdown, rows, meta, command.strip())
        say(f"Wrote {args.markdown}")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": [r.__dict__ for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
