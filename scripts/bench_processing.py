#!/usr/bin/env python3
"""Processing fused into the model vs the same processing done in NumPy around the unprocessed model.

    python scripts/bench_processing.py [--model mobilenetv2] [--threads 2] [--repeat 50]

Both run MobileNetV2 compiled for this machine by edgepack (the host profile, the same pipeline):

* ``edgepack fused processing``: compiled with ``--preprocess input=image:bgr8,size=480x640,...`` and
  ``--postprocess logits=topk:5``: one call takes the uint8 480x640 BGR frame and returns the top 5;
* ``NumPy processing + edgepack``: the model compiled without processing; each call converts the
  frame in NumPy (BGR to RGB, float, bilinear resize with half-pixel centres, mean/std, NCHW), runs
  the model, and takes the top 5 with ``np.argsort``, what an app does in its own code. The NumPy
  code is vectorised (fancy indexing, no Python loops).

The model's own time is the same in both (the same kernels), so the difference is the processing's.
Two more rows isolate it: the pre-processing alone, compiled around a pass-through model (the kernel
TVM makes of it) against the same NumPy code. Each variant is timed in its own process
(``TVM_NUM_THREADS`` threads), in interleaved blocks. The scripts/bench.py rows come from
:func:`processing_rows`; this file also runs on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

PREPROCESS = "input=image:bgr8,size=480x640,resize=bilinear,mean=123.7/116.3/103.5,std=58.4/57.1/57.4"
POSTPROCESS = "logits=topk:5"
FUSED = "edgepack fused processing"
NUMPY = "NumPy processing + edgepack"
FUSED_PRE = "edgepack pre-processing kernel"
NUMPY_PRE = "NumPy pre-processing"


def numpy_preprocess(frame_shape: tuple[int, int], model_shape: tuple[int, ...]):
    """``pre(frame)``: BGR to RGB, float, bilinear (half-pixel), mean/std, NCHW, vectorised NumPy."""
    import numpy as np

    from edgepack.processing.frames import bilinear_taps

    (fh, fw), (h, w) = frame_shape, model_shape[2:]
    y_lo, y_hi, wy_lo, wy_hi = bilinear_taps(fh, h)
    x_lo, x_hi, wx_lo, wx_hi = bilinear_taps(fw, w)
    wy_lo, wy_hi, wx_lo, wx_hi = wy_lo[:, None, None], wy_hi[:, None, None], wx_lo[None, :, None], wx_hi[None, :, None]
    mean = np.array([123.7, 116.3, 103.5], np.float32)
    std = np.array([58.4, 57.1, 57.4], np.float32)

    def pre(frame):
        rgb = frame[:, :, ::-1].astype(np.float32)
        top, bottom = rgb[y_lo], rgb[y_hi]
        resized = wy_lo * (wx_lo * top[:, x_lo] + wx_hi * top[:, x_hi]) + \
            wy_hi * (wx_lo * bottom[:, x_lo] + wx_hi * bottom[:, x_hi])
        return np.ascontiguousarray(((resized - mean) / std).transpose(2, 0, 1)[None])

    return pre


def numpy_pipeline(library: Path, frame_shape: tuple[int, int], model_shape: tuple[int, ...]):
    """``run(frame)``: the pre-processing in NumPy, the unprocessed model, top-5 in NumPy."""
    import numpy as np
    import tvm

    from edgepack.frontends.reference import quiet_native_stderr
    from edgepack.run.host import load_host_library

    with quiet_native_stderr():
        vm = load_host_library(library, tvm.cpu())
    main = vm["main"]
    pre = numpy_preprocess(frame_shape, model_shape)

    def run(frame):
        logits = main(tvm.runtime.tensor(pre(frame))).numpy()
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :5]
        return order, np.take_along_axis(logits, order, axis=-1)

    return run


def fused_pipeline(library: Path):
    import tvm

    from edgepack.frontends.reference import quiet_native_stderr
    from edgepack.run.host import load_host_library

    with quiet_native_stderr():
        vm = load_host_library(library, tvm.cpu())
    main = vm["main"]

    def run(frame):
        result = main(tvm.runtime.tensor(frame))
        return tuple(r.numpy() for r in result) if not hasattr(result, "numpy") else result.numpy()

    return run


def passthrough_model(path: Path, shape: tuple[int, ...]) -> Path:
    """An ONNX model returning its input (times 1): compiled with the pre-processing, its program is
    the pre-processing kernel alone."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Mul", ["input", "one"], ["output"])], "passthrough",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(shape))],
                              [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def time_one(spec: dict) -> list[float]:
    """In a fresh process: one variant, warmed up, ``repeat`` timed calls on the same frame (ms)."""
    import numpy as np

    frame = np.load(spec["frame"])
    if spec["kind"] in (FUSED, FUSED_PRE):
        run = fused_pipeline(Path(spec["library"]))
    elif spec["kind"] == NUMPY_PRE:
        run = numpy_preprocess(tuple(spec["frame_shape"]), tuple(spec["model_shape"]))
    else:
        run = numpy_pipeline(Path(spec["library"]), tuple(spec["frame_shape"]), tuple(spec["model_shape"]))
    for _ in range(spec["warmup"]):
        run(frame)
    samples = []
    for _ in range(spec["repeat"]):
        started = time.perf_counter()
        run(frame)
        samples.append((time.perf_counter() - started) * 1e3)
    return samples


def processing_rows(model_path: Path | str, profile="host", *, work: Path, threads: int = 2, repeat: int = 50,
                    warmup: int = 5, rounds: int = 5, say=print) -> list[dict]:
    """Rows for scripts/bench.py: keys ``model, runtime, median_ms, samples, ratio, compile_s, model_bytes,
    note``; ``ratio`` is each variant's median over the NumPy variant's (below 1: faster)."""
    import numpy as np

    from edgepack.compiling import compile_model
    from edgepack.processing import manifest_plan, picture_frames

    work = Path(work) / "processing"
    say("processing: compiling MobileNetV2 with and without compiled-in processing")
    started = time.perf_counter()
    fused = compile_model(model_path, profile, work / "fused", preprocess=PREPROCESS, postprocess=POSTPROCESS,
                          force=True)
    fused_s = time.perf_counter() - started
    started = time.perf_counter()
    plain = compile_model(model_path, profile, work / "plain", force=True)
    plain_s = time.perf_counter() - started
    model_shape = [int(d) for d in plain.manifest.inputs[0].shape]
    pre_only = compile_model(passthrough_model(work / "passthrough.onnx", tuple(model_shape)), profile,
                             work / "pre-only", preprocess=PREPROCESS, force=True)
    plan = manifest_plan(fused.manifest)
    frame = picture_frames(plan)["input"]
    np.save(work / "frame.npy", frame)
    shapes = {"frame_shape": [480, 640], "model_shape": model_shape}
    specs = {
        FUSED: {"kind": FUSED, "library": str(fused.host_library)},
        NUMPY: {"kind": NUMPY, "library": str(plain.host_library), **shapes},
        FUSED_PRE: {"kind": FUSED_PRE, "library": str(pre_only.host_library)},
        NUMPY_PRE: {"kind": NUMPY_PRE, **shapes},
    }
    # both give the same answer before either is timed
    fused_top = fused_pipeline(fused.host_library)(frame)[0]
    numpy_top = numpy_pipeline(plain.host_library, (480, 640), model_shape)(frame)[0]
    if not np.array_equal(fused_top, numpy_top):
        raise RuntimeError(f"the two pipelines disagree: {fused_top} vs {numpy_top}")
    pre_error = np.abs(fused_pipeline(pre_only.host_library)(frame) - numpy_preprocess((480, 640), model_shape)(frame))
    if pre_error.max() > 1e-4:
        raise RuntimeError(f"the two pre-processings differ by {pre_error.max()}")
    say(f"processing: timing ({repeat} calls each, one process per variant, interleaved)")
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    samples: dict[str, list[float]] = {name: [] for name in specs}
    for _ in range(rounds):
        for name, spec in specs.items():
            payload = json.dumps(spec | {"frame": str(work / "frame.npy"), "repeat": max(1, repeat // rounds),
                                         "warmup": warmup})
            result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--time-one", payload],
                                    capture_output=True, text=True, env=env, check=False)
            if result.returncode != 0:
                raise RuntimeError(f"timing {name} failed:\n{result.stdout}\n{result.stderr}")
            samples[name].extend(json.loads(result.stdout.strip().splitlines()[-1]))
    median = {name: statistics.median(values) for name, values in samples.items()}
    note = "uint8 480x640 BGR frame -> bilinear 224x224, mean/std, NCHW"
    return [
        {"model": "mobilenetv2 + processing", "runtime": FUSED, "median_ms": median[FUSED], "samples": samples[FUSED],
         "ratio": median[FUSED] / median[NUMPY], "compile_s": fused_s,
         "model_bytes": fused.device_library.stat().st_size,
         "note": note + " -> MobileNetV2 -> top-5, one compiled program"},
        {"model": "mobilenetv2 + processing", "runtime": NUMPY, "median_ms": median[NUMPY], "samples": samples[NUMPY],
         "ratio": 1.0, "compile_s": plain_s, "model_bytes": plain.device_library.stat().st_size,
         "note": note + " in NumPy -> MobileNetV2 -> top-5 in NumPy"},
        {"model": "pre-processing alone", "runtime": FUSED_PRE, "median_ms": median[FUSED_PRE],
         "samples": samples[FUSED_PRE], "ratio": median[FUSED_PRE] / median[NUMPY_PRE],
         "note": note + ": the fused kernel (around a pass-through model)"},
        {"model": "pre-processing alone", "runtime": NUMPY_PRE, "median_ms": median[NUMPY_PRE],
         "samples": samples[NUMPY_PRE], "ratio": 1.0, "note": note + ", vectorised NumPy"},
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-one", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mobilenetv2", help="a test model name (scripts/fetch_models.py)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--work", type=Path, default=None, help="where the builds go [default: edgepack's cache]")
    args = parser.parse_args(argv)
    if args.time_one:
        print(json.dumps(time_one(json.loads(args.time_one))))
        return 0
    from fetch_models import ensure_models

    from edgepack.paths import cache_root

    model = ensure_models()[args.model]
    rows = processing_rows(model.path, work=args.work or cache_root() / "bench", threads=args.threads,
                           repeat=args.repeat)
    print(f"| what | runtime | median ms | vs NumPy | threads: {args.threads} |")
    print("| --- | --- | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['runtime']} | {r['median_ms']:.2f} | {r['ratio']:.2f}x | {r['note']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
