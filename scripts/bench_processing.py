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

Each variant is timed in its own process (``TVM_NUM_THREADS`` threads), in interleaved blocks. The
scripts/bench.py row comes from :func:`processing_rows`; this file also runs on its own.
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


def numpy_pipeline(library: Path, frame_shape: tuple[int, int], model_shape: tuple[int, ...]):
    """``run(frame)``: the pre-processing in NumPy, the unprocessed model, top-5 in NumPy."""
    import numpy as np
    import tvm
    from tvm import relax

    from edgepack.frontends.reference import quiet_native_stderr
    from edgepack.processing.frames import bilinear_taps

    with quiet_native_stderr():
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    main = vm["main"]
    (fh, fw), (h, w) = frame_shape, model_shape[2:]
    y_lo, y_hi, wy_lo, wy_hi = bilinear_taps(fh, h)
    x_lo, x_hi, wx_lo, wx_hi = bilinear_taps(fw, w)
    wy_lo, wy_hi, wx_lo, wx_hi = wy_lo[:, None, None], wy_hi[:, None, None], wx_lo[None, :, None], wx_hi[None, :, None]
    mean = np.array([123.7, 116.3, 103.5], np.float32)
    std = np.array([58.4, 57.1, 57.4], np.float32)

    def run(frame):
        rgb = frame[:, :, ::-1].astype(np.float32)
        top, bottom = rgb[y_lo], rgb[y_hi]
        resized = wy_lo * (wx_lo * top[:, x_lo] + wx_hi * top[:, x_hi]) + \
            wy_hi * (wx_lo * bottom[:, x_lo] + wx_hi * bottom[:, x_hi])
        x = np.ascontiguousarray(((resized - mean) / std).transpose(2, 0, 1)[None])
        logits = main(tvm.runtime.tensor(x)).numpy()
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :5]
        return order, np.take_along_axis(logits, order, axis=-1)

    return run


def fused_pipeline(library: Path):
    import tvm
    from tvm import relax

    from edgepack.frontends.reference import quiet_native_stderr

    with quiet_native_stderr():
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    main = vm["main"]

    def run(frame):
        indices, scores = main(tvm.runtime.tensor(frame))
        return indices.numpy(), scores.numpy()

    return run


def time_one(spec: dict) -> list[float]:
    """In a fresh process: one variant, warmed up, ``repeat`` timed calls on the same frame (ms)."""
    import numpy as np

    frame = np.load(spec["frame"])
    if spec["kind"] == FUSED:
        run = fused_pipeline(Path(spec["library"]))
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
    plan = manifest_plan(fused.manifest)
    frame = picture_frames(plan)["input"]
    np.save(work / "frame.npy", frame)
    model_shape = [int(d) for d in plain.manifest.inputs[0].shape]
    specs = {
        FUSED: {"kind": FUSED, "library": str(fused.host_library)},
        NUMPY: {"kind": NUMPY, "library": str(plain.host_library), "frame_shape": [480, 640],
                "model_shape": model_shape},
    }
    # both give the same answer before either is timed
    outs = {name: (fused_pipeline if name == FUSED else lambda p: numpy_pipeline(p, (480, 640), model_shape))(
        Path(spec["library"]))(frame) for name, spec in specs.items()}
    if not np.array_equal(outs[FUSED][0], outs[NUMPY][0]):
        raise RuntimeError(f"the two pipelines disagree: {outs[FUSED][0]} vs {outs[NUMPY][0]}")
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
    base = statistics.median(samples[NUMPY])
    note = "uint8 480x640 BGR frame -> bilinear 224x224, mean/std, NCHW -> MobileNetV2 -> top-5"
    return [
        {"model": "mobilenetv2 + processing", "runtime": FUSED, "median_ms": statistics.median(samples[FUSED]),
         "samples": samples[FUSED], "ratio": statistics.median(samples[FUSED]) / base, "compile_s": fused_s,
         "model_bytes": fused.device_library.stat().st_size, "note": note + " (one compiled program)"},
        {"model": "mobilenetv2 + processing", "runtime": NUMPY, "median_ms": base, "samples": samples[NUMPY],
         "ratio": 1.0, "compile_s": plain_s, "model_bytes": plain.device_library.stat().st_size,
         "note": note + " (NumPy before and after the model)"},
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
    print(f"| model | runtime | median ms | vs NumPy | threads: {args.threads} |")
    print("| --- | --- | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['runtime']} | {r['median_ms']:.2f} | {r['ratio']:.2f}x | {r['note']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
