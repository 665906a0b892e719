#!/usr/bin/env python3
"""Device library size against model file size for every real model of the zoo (issue 42: <= 1.3x).

    python scripts/library_sizes.py                                  # rpi4, mali-g610, vulkan-generic
    python scripts/library_sizes.py --profiles vulkan-generic --models ppocr_cls,iris_landmark --json sizes.json

Each model is compiled (not run) for each profile. A model that stores float16 weights (a TFLite model's
FLOAT16 tensors, an ONNX model's FLOAT16 initializers) is compiled with ``--precision fp16`` for the GPU
profiles, as the issue compares them; the others in fp32 (the profile's default for rpi4, mali-g610 and
vulkan-generic). A row gives the library in bytes, its ratio to the model file, and what is in it: constants
(weights) and the rest (host code, the VM program, the GPU kernels: compressed, ``toolchain/packed_kernels.py``).
Each compile runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fetch_models import ensure_models

DEFAULT_PROFILES = ("rpi4", "mali-g610", "vulkan-generic")
TARGET = 1.3


def stores_float16(path: Path) -> bool:
    """Whether the model file keeps float16 weights."""
    if path.suffix == ".tflite":
        import tflite

        model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
        graph = model.Subgraphs(0)
        return any(graph.Tensors(i).Type() == tflite.TensorType.FLOAT16 for i in range(graph.TensorsLength()))
    import onnx

    return any(t.data_type == onnx.TensorProto.FLOAT16 for t in onnx.load(str(path)).graph.initializer)


def one(name: str, profile: str, work: Path) -> dict:
    from edgepack.backends import backend_for
    from edgepack.compiling import compile_model
    from edgepack.errors import EdgepackError
    from edgepack.profiles import get_profile

    model = ensure_models()[name]
    half = stores_float16(model.path) and backend_for(get_profile(profile)).no_half_precision is None
    precision = "fp16" if half else "fp32"
    row = {"model": name, "profile": profile, "precision": precision, "model_bytes": model.path.stat().st_size}
    started = time.monotonic()
    try:
        build = compile_model(model.path, profile, work / f"{name}-{profile}", input_shapes=model.input_shapes,
                              force=True, precision=precision)
    except EdgepackError as exc:
        return row | {"error": exc.message[:300]}
    library = build.manifest.artifacts["device_library"].size
    constants = build.manifest.extra.get("constants", {}).get("bytes", 0)
    return row | {"library_bytes": library, "constants_bytes": constants, "ratio": round(library / row["model_bytes"], 3),
                  "compile_s": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated model names (default: every real model)")
    parser.add_argument("--profiles", default=",".join(DEFAULT_PROFILES))
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "PROFILE", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], Path(args.one[2]))), flush=True)
        return 0
    models = ensure_models()
    names = args.models.split(",") if args.models else [n for n, m in models.items() if m.real_weights]
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgepack-sizes-") as tmp:
        for name in names:
            for profile in args.profiles.split(","):
                done = subprocess.run([sys.executable, __file__, "--one", name, profile, tmp], capture_output=True,
                                      text=True, check=False)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                row = json.loads(lines[-1]) if lines else {"model": name, "profile": profile,
                                                            "error": (done.stderr or "no output")[-300:]}
                rows.append(row)
                shown = (f"{row['ratio']:.2f}x ({row['precision']}, library {row['library_bytes'] / 1e6:.2f} MB, "
                         f"constants {row['constants_bytes'] / 1e6:.2f} MB)" if "ratio" in row else row["error"])
                print(f"[{time.strftime('%H:%M:%S')}] {name:26s} {profile:16s} {shown}", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    profiles = args.profiles.split(",")
    by = {(r["model"], r["profile"]): r for r in rows}
    print("| model | model MB | " + " | ".join(profiles) + " |")
    print("|---|---:|" + "---:|" * len(profiles))
    for name in names:
        cells = []
        for p in profiles:
            r = by.get((name, p), {})
            cells.append(f"{r['ratio']:.2f}x" + (" (fp16)" if r["precision"] == "fp16" and p != "rpi4" else "")
                         if "ratio" in r else "error")
        print(f"| {name} | {models[name].path.stat().st_size / 1e6:.2f} | " + " | ".join(cells) + " |")
    within = {p: sum(by.get((n, p), {}).get("ratio", 99) <= TARGET for n in names) for p in profiles}
    print("\nWithin 1.3x: " + ", ".join(f"{p} {within[p]}/{len(names)}" for p in profiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
