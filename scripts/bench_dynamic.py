"""Dynamic builds against fixed ones (issue 43): one ``--dim`` build of a zoo model timed at two sizes, the
fixed-size builds of the same model at those sizes, and ONNX Runtime on the same inputs, in one run, at 1 and 2
threads. Prints a markdown table (the rows of ``docs/benchmarks.md``, "Dynamic shapes"). Each thread count
runs in a process of its own (TVM sizes its pool once per process).

    python scripts/bench_dynamic.py [--models ppocr_rec,ppocr_rec_step32,ppocr_det] [--threads 1,2] [--repeat 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

# case: (zoo model, input shape with names, --dim values, sizes to time). A range with a step lets the
# kernels tile the dimension exactly (``ppocr_rec_step32``: W a multiple of 32, the same model)
CASES = {
    "ppocr_rec": ("ppocr_rec", {"x": (1, 3, 48, "W")}, ["W=32..1280"], [{"W": 160}, {"W": 640}]),
    "ppocr_rec_step32": ("ppocr_rec", {"x": (1, 3, 48, "W")}, ["W=32..1280:32"], [{"W": 160}, {"W": 640}]),
    "ppocr_rec_lstm": ("ppocr_rec_lstm", {"x": (1, 3, 32, "W")}, ["W=32..1280"], [{"W": 160}, {"W": 640}]),
    "ppocr_det": ("ppocr_det", {"x": (1, 3, "H", "W")}, ["H=64..640:32", "W=64..640:32"],
                  [{"H": 160, "W": 160}, {"H": 320, "W": 320}]),
}


def _time_vm(build: Path, feeds: dict[str, np.ndarray], repeat: int) -> float:
    import tvm

    from edgepack.manifest import read_manifest
    from edgepack.run.host import load_host_library

    manifest = read_manifest(build)
    vm = load_host_library(build / manifest.artifacts["host_library"].path, tvm.cpu())
    args = [tvm.runtime.tensor(feeds[s.name]) for s in manifest.inputs]
    for _ in range(3):
        vm["main"](*args)
    vm.set_input("main", *args)
    result = vm.time_evaluator("invoke_stateful", tvm.cpu(), number=1, repeat=repeat)("main")
    return float(np.median(result.results)) * 1e3


def _time_ort(model: Path, feeds: dict[str, np.ndarray], threads: int, repeat: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CASES))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    counts = args.threads.split(",")
    if len(counts) > 1:  # one process per thread count; the tables joined
        import subprocess

        lines = []
        for count in counts:
            out = subprocess.run([sys.executable, __file__, "--models", args.models, "--threads", count,
                                  "--repeat", str(args.repeat)], check=True, capture_output=True, text=True).stdout
            table = out.strip().splitlines()
            lines += table if not lines else table[2:]
        print("\n".join(lines))
        return 0
    from fetch_models import ensure_models

    from edgepack.compiling import compile_model
    from edgepack.dims import at_size
    from edgepack.manifest import read_manifest
    from edgepack.run.threads import use_threads_here
    from edgepack.tensors import random_inputs

    models = ensure_models()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgepack-bench-dynamic-") as tmp:
        for name in args.models.split(","):
            zoo_name, shapes, dims, sizes = CASES[name]
            model = models[zoo_name].path
            dynamic = compile_model(model, "host", Path(tmp) / f"{name}-dyn", input_shapes=shapes, dims=dims).output_dir
            fixed = {}
            for size in sizes:
                key = ",".join(f"{k}={v}" for k, v in size.items())
                concrete = {k: tuple(size[d] if isinstance(d, str) else d for d in v) for k, v in shapes.items()}
                fixed[key] = compile_model(model, "host", Path(tmp) / f"{name}-{key}", input_shapes=concrete).output_dir
            specs = read_manifest(dynamic).inputs
            for threads in (int(t) for t in args.threads.split(",")):
                use_threads_here(threads)
                for size in sizes:
                    key = ",".join(f"{k}={v}" for k, v in size.items())
                    feeds = random_inputs(at_size(specs, size), 0)
                    dyn = _time_vm(dynamic, feeds, args.repeat)
                    fix = _time_vm(fixed[key], feeds, args.repeat)
                    ref = _time_ort(model, feeds, threads, args.repeat)
                    rows.append((name, key, threads, dyn, fix, ref))
                    print(f"{name} {key} {threads}T: dynamic {dyn:.2f} ms, fixed {fix:.2f} ms, onnxruntime {ref:.2f} ms",
                          file=sys.stderr)
    print("| model | size | threads | dynamic build | fixed build | dynamic / fixed | ONNX Runtime | dynamic / ORT |")
    print("|---|---|---|---|---|---|---|---|")
    for name, key, threads, dyn, fix, ref in rows:
        print(f"| {name} | {key} | {threads} | {dyn:.2f} ms | {fix:.2f} ms | {dyn / fix:.2f}x | {ref:.2f} ms |"
              f" {dyn / ref:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
