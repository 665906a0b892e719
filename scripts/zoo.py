#!/usr/bin/env python3
"""The model zoo swept: every real model of ``scripts/fetch_models.py`` compiled for each profile and
validated where its build runs, on seeded random inputs and on its natural input.

    python scripts/zoo.py                                   # every real model; host, rpi4, rpi3
    python scripts/zoo.py --profiles mali-g610,vulkan-generic --models ppocr_det,yolov8n
    python scripts/zoo.py --markdown docs/conformance.md    # rewrites its section there ("## Real models")
    python scripts/zoo.py --profiles vulkan-generic --precision fp16 --json fp16.json   # fp16 builds (GPUs)

Where a build runs: host builds on this machine, other CPU profiles as device libraries under qemu-user
(``--on emulator``), GPU profiles on this machine's OpenCL / Vulkan device (PoCL, lavapipe). Each (model,
profile) runs in its own process, so a driver that aborts costs one row, not the sweep. A row is PASS when
every validation passed and some output of some run had a reference that can show a wrong build (not
degenerate).
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

DEFAULT_PROFILES = ("host", "rpi4", "rpi3")
SECTION = "## Real models (scripts/zoo.py)"


def place_for(profile_name: str) -> str:
    """Where a build of the profile runs here: its backend's own place, or qemu for another CPU's triple."""
    from edgepack.backends import backend_for
    from edgepack.profiles import get_profile
    from edgepack.toolchain.compilers import HOST_TRIPLE

    profile = get_profile(profile_name)
    backend = backend_for(profile)
    if backend.host_place != "host" or profile.triple == HOST_TRIPLE:
        return backend.host_place
    return "emulator"


def one(name: str, profile: str, work: Path, precision: str | None = None) -> dict:
    """Compile and validate one model for one profile: a row of the sweep."""
    from edgepack.compiling import compile_model
    from edgepack.errors import EdgepackError
    from edgepack.validation import validate

    model = ensure_models()[name]
    row = {"model": name, "family": model.family, "profile": profile, "on": place_for(profile),
           "precision": precision}
    started = time.monotonic()
    try:
        build = compile_model(model.path, profile, work / f"{name}-{profile}{'-' + precision if precision else ''}",
                              input_shapes=model.input_shapes, force=True, precision=precision)
    except EdgepackError as exc:
        return row | {"result": "COMPILE ERROR", "error": exc.message[:300]}
    row["compile_s"] = round(time.monotonic() - started, 1)
    row["library_bytes"] = build.manifest.artifacts["device_library"].size
    row["model_bytes"] = model.path.stat().st_size
    row["constants_bytes"] = build.manifest.extra.get("constants", {}).get("bytes")
    runs = []
    for kind, inputs in (("random", None if model.random_inputs else False), ("natural", model.natural)):
        if inputs is False or (kind == "natural" and inputs is None):
            continue
        try:
            report = validate(build.output_dir, row["on"], inputs=inputs,
                              **({"atol": model.atol} if model.atol is not None else {}))
        except EdgepackError as exc:
            runs.append({"inputs": kind, "result": "ERROR", "error": exc.message[:300]})
            continue
        worst = max(report.outputs, key=lambda o: o.max_rel_error)
        runs.append({"inputs": kind, "result": "PASS" if report.passed else "FAIL",
                     "degenerate": [o.degenerate for o in report.outputs if o.degenerate],
                     "informative": sum(not o.degenerate for o in report.outputs),
                     "max_abs_error": worst.max_abs_error, "max_rel_error": worst.max_rel_error,
                     "mismatched": sum(o.mismatched for o in report.outputs)})
    row["runs"] = runs
    passed = runs and all(r["result"] == "PASS" for r in runs)
    informative = any(r["result"] == "PASS" and r["informative"] for r in runs)
    row["result"] = "PASS" if passed and informative else "DEGENERATE" if passed else \
        next(r["result"] for r in runs if r["result"] != "PASS") if runs else "NO INPUTS"
    errors = [r["error"] for r in runs if r["result"] == "ERROR"]
    if errors:  # what the summary line prints of the row
        row["error"] = errors[0]
    return row


def _run_row(name: str, profile: str, work: Path, timeout: float, precision: str | None = None) -> dict:
    command = [sys.executable, __file__, "--one", name, profile, "--work", str(work),
               *(["--precision", precision] if precision else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"model": name, "profile": profile, "result": "TIMEOUT", "error": f"over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"model": name, "profile": profile, "result": "CRASH",
                "error": f"exit {done.returncode}: {' / '.join(tail)[:300]}"}
    return json.loads(lines[-1])


def _cell(row: dict) -> str:
    if row["result"] in ("PASS", "DEGENERATE", "FAIL"):
        errors = ", ".join(f"{r['inputs']} {r['result'].lower()} {r['max_rel_error']:.1e}" for r in row["runs"])
        return f"{row['result']} ({errors})"
    return f"{row['result']}: {row.get('error', '')}"


def markdown(rows: list[dict], profiles: list[str], command: str) -> str:
    by = {(r["model"], r["profile"]): r for r in rows}
    names = list(dict.fromkeys(r["model"] for r in rows))
    lines = [SECTION, "",
             "Every real model of `scripts/fetch_models.py`, compiled for each profile and validated where its build",
             "runs (host: this machine; rpi4/rpi3: the device library under qemu-user; GPU profiles: PoCL, lavapipe),",
             "on seeded random inputs and on its natural input (a photo, a scanned page, speech). PASS: every",
             "validation passed and some reference output could show a wrong build; the error is the largest",
             "relative one of a run. MediaPipe pose is validated with atol 1.0: its segmentation logits reach",
             "1700, and LiteRT's own XNNPACK and built-in kernels differ by 0.71 there. Reproduce:", "",
             f"    {command}", "",
             "| model | family | " + " | ".join(profiles) + " |",
             "|---|---|" + "---|" * len(profiles)]
    for name in names:
        family = next(r.get("family", "") for r in rows if r["model"] == name)
        cells = [_cell(by[(name, p)]) if (name, p) in by else "-" for p in profiles]
        lines.append(f"| {name} | {family} | " + " | ".join(cells) + " |")
    counts = {p: sum(by.get((n, p), {}).get("result") == "PASS" for n in names) for p in profiles}
    lines += ["", "PASS per profile: " + ", ".join(f"{p} {counts[p]}/{len(names)}" for p in profiles) + ".", ""]
    return "\n".join(lines)


def write_section(path: Path, text: str) -> None:
    from edgepack.files import write_text_atomic

    old = path.read_text() if path.exists() else ""
    if SECTION in old:
        start = old.index(SECTION)
        end = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + (old[end + 1:] if end != -1 else "")
    else:
        new = old.rstrip() + "\n\n" + text
    write_text_atomic(path, new)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated model names (default: every real model)")
    parser.add_argument("--profiles", default=",".join(DEFAULT_PROFILES))
    parser.add_argument("--work", type=Path, help="where builds go (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per (model, profile)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    parser.add_argument("--markdown", type=Path, help="rewrite the real-models section of this file")
    parser.add_argument("--precision", help="compile --precision for every build (default: each profile's)")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "PROFILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(*args.one, args.work, args.precision)), flush=True)
        return 0
    models = ensure_models()
    names = args.models.split(",") if args.models else [n for n, m in models.items() if m.real_weights]
    unknown = sorted(set(names) - set(models))
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(models)}")
    profiles = args.profiles.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgepack-zoo-") as tmp:
        work = args.work or Path(tmp)
        for name in names:
            for profile in profiles:
                row = _run_row(name, profile, work, args.timeout, args.precision)
                rows.append(row)
                size = (f" library {row['library_bytes'] / row['model_bytes']:.2f}x the model"
                        if row.get("library_bytes") else "")
                print(f"[{time.strftime('%H:%M:%S')}] {name:24s} {profile:16s} {_cell(row)}{size}", file=sys.stderr,
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    shown = [a for a in (argv if argv is not None else sys.argv[1:])]
    skip = {"--json", "--markdown", "--work"}
    command = " ".join(["python scripts/zoo.py", *[a for i, a in enumerate(shown) if a not in skip
                                                    and (i == 0 or shown[i - 1] not in skip)]])
    text = markdown(rows, profiles, command)
    print(text)
    if args.markdown:
        write_section(args.markdown, text)
    return 0 if all(r["result"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
