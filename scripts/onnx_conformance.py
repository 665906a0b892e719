#!/usr/bin/env python3
"""Run the ONNX backend node test suite through edgepack's own import + compile + run path.

    python scripts/onnx_conformance.py                          # every case on this machine, 2 workers
    python scripts/onnx_conformance.py --profile rpi4 --on emulator   # cross-compiled, C runner under qemu
    python scripts/onnx_conformance.py --profile vulkan-generic --on gpu --sample 8   # lavapipe (PoCL: mali-g610)
    python scripts/onnx_conformance.py --filter 'conv|pool' --jobs 1
    python scripts/onnx_conformance.py --resume                 # continue an interrupted run
    python scripts/onnx_conformance.py --markdown docs/conformance.md   # the report: every place run so far

The cases are the ones shipped in the installed ``onnx`` wheel (``onnx/backend/test/data/node``):
every directory except the ``*_expanded*`` variants (those are the same operator written out as a
function body). Each case goes through exactly what ``edgepack compile`` does:
``edgepack.frontends.import_model`` (ONNX Runtime's basic constant folding, then TVM's Relax ONNX
frontend with edgepack's converters) and the CPU backend's ``build``; on the host it then runs in the
Relax VM, on a device profile (``--on emulator``) as the device library under qemu-user, run by
edgepack's C runner (``scripts/conformance.py`` says how, and how it is cached). Outputs are compared
with the expected outputs shipped with the case like ONNX's own backend runner does (same shape and
dtype, ``rtol=1e-3, atol=1e-7``).

Results are kept per place (``<cache>/conformance/results/onnx-<place>.json``; a run updates the cases it
ran); ``--markdown`` writes the ONNX section of the report from every place's results, with the cases
whose result on a device differs from the host's.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conformance import (  # noqa: E402 - after the path set-up
    CRASH_CASE,
    STATUSES,
    CaseError,
    CaseResult,
    Place,
    compare_outputs,
    counts,
    differences,
    load_results,
    machine_line,
    nest_like,
    now_line,
    parse_place,
    results_dir,
    results_path,
    run_model,
    run_pool,
    save_results,
    write_section,
)

__all__ = ["CRASH_CASE", "CaseResult", "Place", "compare_outputs", "list_cases", "run_case", "run_cases"]

SUITE = "onnx_conformance"
HOST = Place()

# The operators real vision models are made of: the "vision subset".
VISION_OPS = {
    "Conv", "ConvTranspose", "AveragePool", "MaxPool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
    "GlobalLpPool", "BatchNormalization", "InstanceNormalization", "LayerNormalization", "GroupNormalization",
    "LRN", "MeanVarianceNormalization", "RMSNormalization", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu",
    "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Tanh", "Mish", "Gelu",
    "ThresholdedRelu", "Softmax", "LogSoftmax", "Hardmax", "Clip", "Gemm", "Resize", "Upsample",
    # convolution / GEMM variants and the rest of the family
    "ConvInteger", "QLinearConv", "DeformConv", "MaxUnpool", "LpNormalization", "Swish", "MatMul", "MatMulInteger",
    "QLinearMatMul",
}


# Inputs that ONNX passes as tensors but that configure the operation and decide its output shape
# (axes, target shapes, sizes/scales, pads, k, split sizes, depth, ranges): deployable models carry
# them as constants, and edgepack compiles for static shapes, so the runner bakes the case's values
# in as initializers (each case records which it froze). Operator -> input positions.
PARAMETER_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "TopK": (1,),
    "OneHot": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "CumSum": (1,), "CumProd": (1,),
    "NonMaxSuppression": (2, 3, 4), "CenterCropPad": (1,), "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (1, 3),
    "MelWeightMatrix": (0, 1, 2, 3, 4), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,),
    "AffineGrid": (1,), "MaxUnpool": (2,), "Dropout": (1, 2),
    "Loop": (0, 1),  # trip count and initial condition: a static loop (unrolled)
    **{op: (1,) for op in ("ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1",
                           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}


def freeze_parameter_inputs(model, inputs: dict) -> list[str]:
    """Turn the graph inputs that feed PARAMETER_INPUTS positions into initializers (in place)."""
    from onnx import numpy_helper

    names = []
    for node in model.graph.node:
        for pos in PARAMETER_INPUTS.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos] in inputs and node.input[pos] not in names:
                names.append(node.input[pos])
    if not names:
        return []
    keep = [v for v in model.graph.input if v.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    for name in names:
        model.graph.initializer.append(numpy_helper.from_array(inputs.pop(name), name))
    return names


def node_test_dir() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


def list_cases(pattern: str | None = None) -> list[str]:
    names = sorted(p.name for p in node_test_dir().iterdir() if p.is_dir() and "_expanded" not in p.name)
    if pattern:
        rx = re.compile(pattern)
        names = [n for n in names if rx.search(n)]
    return names


# --- one case (runs inside a worker) ------------------------------------------------------------


def main_operator(model, case: str) -> str:
    """The operator a case tests: its only operator, or the one its name names."""
    ops = []
    for node in model.graph.node:
        if node.op_type not in ("Constant",) and node.op_type not in ops:
            ops.append(node.op_type)
    if not ops:
        return "Constant"
    if len(ops) == 1:
        return ops[0]
    flat = case.lower().replace("_", "")
    named = [op for op in ops if op.lower() in flat]
    return max(named, key=len) if named else ops[0]


def _load_value(path: Path, type_proto):
    import onnx
    from onnx import numpy_helper

    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def load_case(case_dir: Path):
    """(model, inputs by name, expected outputs in graph order) of a case's first data set."""
    import onnx

    model = onnx.load(str(case_dir / "model.onnx"))
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [v for v in model.graph.input if v.name not in inits]
    data = case_dir / "test_data_set_0"
    inputs = {}
    for i, value in enumerate(graph_inputs):
        path = data / f"input_{i}.pb"
        if path.exists():
            inputs[value.name] = _load_value(path, value.type)
    expected = [_load_value(data / f"output_{i}.pb", v.type) for i, v in enumerate(model.graph.output)]
    return model, inputs, expected


def run_case(case: str, workdir: str, place: Place = HOST) -> CaseResult:
    """Import, compile and run one case at ``place`` with edgepack's library functions; compare the outputs."""
    import numpy as np

    from edgepack.errors import EdgepackError
    from edgepack.frontends import import_model
    from edgepack.frontends.onnx_ops import from_container, to_container

    case_dir = node_test_dir() / case
    started = time.perf_counter()
    model, inputs, expected = load_case(case_dir)
    op = main_operator(model, case)

    frozen = freeze_parameter_inputs(model, inputs)

    def result(status: str, kind: str = "", message: str = "", cached: bool = False) -> CaseResult:
        return CaseResult(case, op, status, kind, message.strip()[:300], round(time.perf_counter() - started, 2),
                          frozen, cached)

    for name, value in inputs.items():
        if not isinstance(value, np.ndarray):
            return result("error", "input", f"input {name} is a {type(value).__name__}, not a tensor")
        if value.dtype == object:
            return result("error", "input", f"input {name} holds strings")
    shapes = {name: tuple(int(d) for d in value.shape) for name, value in inputs.items()}
    model_path = case_dir / "model.onnx"
    if frozen:
        import onnx

        model_path = Path(workdir) / f"{case}.onnx"
        onnx.save(model, str(model_path))

    def do_import():
        try:
            return import_model(model_path, shapes)
        except EdgepackError as exc:
            text = str(exc)
            kind = "not-implemented" if ("cannot compile" in text or "not supported for frontend" in text
                                         or "not implemented" in text.lower()) else "import"
            raise CaseError(kind, text) from exc
        except Exception as exc:  # noqa: BLE001 - anything else is a bug in the import path; record it
            raise CaseError("import", f"{type(exc).__name__}: {exc}") from exc

    # sub-byte types (int4, float4...) cross the compiled model's boundary in 8-bit containers
    feeds = {name: to_container(value) for name, value in inputs.items()}
    try:
        out, cached = run_model(place, case, model_path, shapes, feeds, do_import)
    except CaseError as exc:
        return result("error", exc.kind, exc.message)
    if place.on == "host":
        actual = out if len(expected) > 1 and isinstance(out, list) else [out]
    else:
        actual = nest_like(list(out), expected)
    actual = [from_container(a, str(e.dtype)) if isinstance(a, np.ndarray) and isinstance(e, np.ndarray) else a
              for a, e in zip(actual, expected)] + actual[len(expected):]
    why = compare_outputs(actual, expected)
    return result("mismatch", "output", why, cached) if why else result("pass", cached=cached)


def op_of(case: str) -> str:
    import onnx

    try:
        return main_operator(onnx.load(str(node_test_dir() / case / "model.onnx")), case)
    except Exception:  # noqa: BLE001
        return "?"


def run_cases(cases: list[str], jobs: int, timeout: float, on_result, recycle: int = 150,
              place: Place = HOST) -> None:
    """Run ``cases`` at ``place`` on ``jobs`` workers; ``on_result(CaseResult)`` for each, in completion order."""
    run_pool(SUITE, cases, place, jobs, timeout, on_result, op_of, recycle)


# --- reporting -----------------------------------------------------------------------------------

# Why a case that passes on the host does not pass on a device, where the message alone does not say.
# Keys are regular expressions over case names; the report shows the first that matches.
DEVICE_CAUSES: dict[str, str] = {
    r"^test_top_k_uint64$": (
        "passes on the device only: the host runs TVM's own sort kernels (tvm.contrib.sort.topk in the wheel's"
        " libtvm_runtime_extra), which refuse uint64 input; devices run the C API's version"
        " (runtimes/api/c/src/edgepack.c), which sorts every integer type"),
}


def summarise(results: list[CaseResult]) -> dict:
    vision = [r for r in results if r.op in VISION_OPS]
    per_op: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        per_op[r.op][r.status] += 1
    kinds = Counter(f"{r.status}:{r.kind}" for r in results if r.status != "pass")
    return {
        "total": len(results),
        "counts": counts(results),
        "vision": {"total": len(vision), "pass": sum(r.status == "pass" for r in vision)},
        "per_op": {op: dict(c) for op, c in sorted(per_op.items())},
        "failure_kinds": dict(kinds.most_common()),
        "pass_with_frozen_parameters": sum(r.status == "pass" and bool(r.frozen) for r in results),
        "case_seconds": round(sum(r.seconds for r in results), 1),
    }


def print_report(results: list[CaseResult], summary: dict, show_failures: bool, place: Place = HOST) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    table = Table(title=f"ONNX node tests by operator: {place.label}", title_justify="left")
    for col in ("operator", "cases", *STATUSES):
        table.add_column(col, justify="left" if col == "operator" else "right")
    for op, c in summary["per_op"].items():
        total = sum(c.values())
        style = "green" if c.get("pass", 0) == total else ("red" if not c.get("pass") else "yellow")
        table.add_row(f"[{style}]{op}[/]" + (" *" if op in VISION_OPS else ""), str(total),
                      *(str(c.get(s, 0) or "") for s in STATUSES))
    console.print(table)
    if show_failures:
        for r in sorted(results, key=lambda r: (r.op, r.case)):
            if r.status != "pass":
                console.print(f"[red]{r.status:8}[/] {r.case} [dim]{r.kind}: {r.message[:160]}[/]", highlight=False)
    c = summary["counts"]
    console.print(f"[bold]{summary['total']} cases on {place.label}:[/] [green]{c['pass']} pass[/], "
                  f"{c['mismatch']} mismatch, {c['error']} error, {c['crash']} crash, {c['timeout']} timeout.  "
                  f"Vision subset (*): {summary['vision']['pass']}/{summary['vision']['total']} pass.", highlight=False)


def known_places() -> list[tuple[Place, dict, dict[str, CaseResult]]]:
    """Every place with stored ONNX results: the host first, then the devices by name."""
    found = []
    for path in sorted(results_dir().glob("onnx-*.json")):
        meta, results = load_results(path)
        place = Place(**meta["place"]) if "place" in meta else None
        if place is not None and results:
            found.append((place, meta, results))
    return sorted(found, key=lambda item: (item[0].on != "host", item[0].name))


def _cell(text: str, limit: int = 140) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:limit]


def device_cause(case: str) -> str:
    return next((why for rx, why in DEVICE_CAUSES.items() if re.search(rx, case)), "")


def markdown_section(places: list[tuple[Place, dict, dict[str, CaseResult]]]) -> str:
    """The ONNX section of docs/conformance.md from every place's stored results."""
    host = next(((m, r) for p, m, r in places if p.on == "host"), None)
    if host is None:
        raise SystemExit("no host results yet: run the sweep on the host first")
    host_meta, host_results = host
    host_list = [host_results[c] for c in sorted(host_results)]
    summary = summarise(host_list)
    devices = [(p, m, r) for p, m, r in places if p.on != "host"]
    lines = [
        "## ONNX backend node tests",
        "",
        "Written by `python scripts/onnx_conformance.py [--profile rpi4|rpi3 --on emulator] --markdown"
        " docs/conformance.md`:",
        "every non-expanded node case shipped in the onnx wheel, imported and compiled through edgepack's own path",
        "and run on the host (Relax VM) or, cross-compiled for a device profile, as the device library run by",
        "edgepack's C runner under qemu-user (what `validate --on emulator` does); outputs compared with the",
        "shipped ones (same shape and dtype, rtol 1e-3, atol 1e-7).",
        "",
        f"- Machine: {host_meta.get('machine', '?')}",
        f"- Cases: {len(list_cases())}",
        "",
        "| place | cases run | pass | mismatch | error | crash | timeout | last run | case time |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for place, meta, results in places:
        c = counts(list(results.values()))
        note = f" ({meta['sample']})" if meta.get("sample") else ""
        lines.append(f"| {place.label}{note} | {len(results)} | **{c['pass']}** | {c['mismatch']} | {c['error']} | "
                     f"{c['crash']} | {c['timeout']} | {meta.get('date', '?')} | "
                     f"{sum(r.seconds for r in results.values()) / 60:.0f} min |")
    lines += [
        "",
        f"- Vision subset (operators marked *): {summary['vision']['pass']} / {summary['vision']['total']} pass on the"
        " host"
        + "".join(f"; {sum(r.status == 'pass' for r in res.values() if r.op in VISION_OPS)} / "
                  f"{sum(r.op in VISION_OPS for r in res.values())} on {p.profile}" for p, _, res in devices),
        (f"- {summary['pass_with_frozen_parameters']} of the host passes feed parameter inputs (axes, sizes/scales,"
         " pads, k, split sizes, ...) as constants, as deployable models carry them (see PARAMETER_INPUTS in the"
         " script); the rest pass with every input given at run time"),
        "- Case time: import + compile (+ cross-link) + run, summed over the cases (`--jobs` workers share it);"
        " device builds and outputs are cached, so a rerun with nothing changed only compares (424 cases in 14 s"
        " here)",
        "",
        "Notes on what the numbers mean:",
        "- Sub-byte types (INT4, UINT4, INT2, UINT2, FLOAT4E2M1) cross the compiled model's boundary in 8-bit",
        "  containers, one value per byte (`edgepack.frontends.onnx_ops.to_container` / `from_container`): TVM",
        "  tensors must be whole bytes. The comparison is on the values.",
        "- Out of reach by design: string tensors (TVM has no string type), ImageDecoder, sequence/optional",
        "  values as model inputs, and random operators (Bernoulli, Dropout in training mode), whose outputs",
        "  cannot match a recorded sample.",
        "",
        "| operator | cases | pass | mismatch | error | crash | timeout |"
        + "".join(f" {p.profile} pass |" for p, _, _ in devices),
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(devices),
    ]
    for op, cnt in summary["per_op"].items():
        device_cells = ""
        for _, _, res in devices:
            ran = [r for r in res.values() if r.op == op]
            of = "" if len(ran) == sum(cnt.values()) else f" of {len(ran)}"
            device_cells += f" {sum(r.status == 'pass' for r in ran)}{of} |"
        lines.append(f"| {op}{' *' if op in VISION_OPS else ''} | {sum(cnt.values())} | "
                     + " | ".join(str(cnt.get(s, 0)) for s in STATUSES) + " |" + device_cells)
    lines += ["", "### Cases that do not pass on the host", "", "| case | status | why |", "|---|---|---|"]
    for r in host_list:
        if r.status != "pass":
            lines.append(f"| {r.case} | {r.status} ({r.kind}) | {_cell(r.message)} |")
    lines += ["", "### Device path: cases whose result differs from the host's", ""]
    rows: dict[tuple, list[str]] = {}  # the same difference on several devices is one row
    for p, _, res in devices:
        for h, d in differences(host_results, res):
            rows.setdefault((d.case, h.status, d.status, d.kind, d.message), []).append(p.profile)
    if not devices:
        lines.append("No device path has been run yet.")
    elif not rows:
        lines.append("None: every case that ran on a device has the host's result.")
    else:
        lines += ["| case | devices | host | device | why |", "|---|---|---|---|---|"]
        for (case, host_status, status, kind, message), profiles in sorted(rows.items()):
            why = device_cause(case) or _cell(message, 220)
            shown = f"{status} ({kind})" if kind else status
            lines.append(f"| {case} | {', '.join(profiles)} | {host_status} | {shown} | {why} |")
    return "\n".join(lines) + "\n"


def deterministic_sample(cases: list[str], every: int) -> list[str]:
    """Every ``every``-th case in name order (the same cases on every run)."""
    return cases[::every] if every > 1 else cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="host", help="device profile for --on emulator (rpi4, rpi3, ...)")
    parser.add_argument("--on", default="host", choices=["host", "emulator", "gpu"],
                        help="host: this machine's Relax VM; emulator: the device library by the C runner under qemu;"
                        " gpu: a GPU profile's build on this machine's driver (lavapipe, PoCL)")
    parser.add_argument("--filter", help="only cases whose name matches this regular expression")
    parser.add_argument("--sample", type=int, default=1, metavar="N",
                        help="only every N-th case in name order (a deterministic sample)")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per case (default 180 on the host, 300 under emulation)")
    parser.add_argument("--json", type=Path, help="results file (default: the place's in <cache>/conformance/results)")
    parser.add_argument("--resume", action="store_true", help="skip the cases already in the results file")
    parser.add_argument("--markdown", type=Path,
                        help="write the ONNX section of this report (e.g. docs/conformance.md) from every place's"
                        " results")
    parser.add_argument("--report-only", action="store_true", help="run nothing; only --markdown from stored results")
    parser.add_argument("--failures", action="store_true", help="list every case that does not pass")
    args = parser.parse_args(argv)

    place = parse_place(args.profile, args.on)
    if not args.report_only:
        run_place(place, args)
    if args.markdown:
        write_section(args.markdown, "onnx", markdown_section(known_places()))
        print(f"wrote the ONNX section of {args.markdown}")
    return 0


def run_place(place: Place, args) -> None:
    cases = deterministic_sample(list_cases(args.filter), args.sample)
    path = args.json or results_path("onnx", place)
    results: dict[str, CaseResult] = {}
    meta: dict = {}
    if path.exists():
        meta, results = load_results(path)
    todo = [c for c in cases if not (args.resume and c in results)]
    timeout = args.timeout or (180.0 if place.on == "host" else 300.0)
    print(f"{len(cases)} cases, {len(todo)} to run on {place.label} with {args.jobs} worker(s)", flush=True)
    meta = {**meta, "date": now_line(),
            "machine": machine_line("onnx", "onnxruntime")}
    if args.sample > 1 and not args.filter:
        meta["sample"] = f"every {args.sample}th case in name order"
    last_save = [time.monotonic()]
    done = [0]

    def on_result(res: CaseResult) -> None:
        results[res.case] = res
        done[0] += 1
        mark = {"pass": ".", "mismatch": "M", "error": "E", "crash": "C", "timeout": "T"}[res.status]
        print(mark, end="" if done[0] % 80 else f" {done[0]}/{len(todo)}\n", flush=True)
        if time.monotonic() - last_save[0] > 20:
            save_results(path, place, results, meta)
            last_save[0] = time.monotonic()

    run_cases(todo, args.jobs, timeout, on_result, place=place)
    print(flush=True)
    save_results(path, place, results, meta)
    ran = [results[c] for c in cases if c in results]
    print_report(ran, summarise(ran), args.failures, place)
    print(f"results: {path}")


if __name__ == "__main__":
    sys.exit(main())
