#!/usr/bin/env python3
"""Run the ONNX backend node test suite through edgepack's own import + compile + run path.

    python scripts/onnx_conformance.py                          # every case, 2 workers
    python scripts/onnx_conformance.py --filter 'conv|pool' --jobs 1
    python scripts/onnx_conformance.py --json results.json --resume   # continue an interrupted run
    python scripts/onnx_conformance.py --markdown docs/conformance.md # keep the summary

The cases are the ones shipped in the installed ``onnx`` wheel (``onnx/backend/test/data/node``):
every directory except the ``*_expanded*`` variants (those are the same operator written out as a
function body). Each case goes through exactly what ``edgepack compile`` does on the host:
``edgepack.frontends.import_model`` (ONNX Runtime's basic constant folding, then TVM's Relax ONNX
frontend with edgepack's converters) and the CPU backend's ``build`` (TVM's default pipeline for
the host target), then runs in the Relax VM; outputs are compared with the expected outputs shipped
with the case like ONNX's own backend runner does (same shape and dtype, ``rtol=1e-3, atol=1e-7``).

Isolation: cases run in long-lived worker processes (``--jobs``, default 2) that import TVM once and
take cases one at a time. A case that crashes its worker or runs past ``--timeout`` is recorded as
``crash`` / ``timeout``; the worker is replaced and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CRASH_CASE = "__crash__"  # a pseudo case whose worker dies (used by tests/test_conformance.py)
STATUSES = ("pass", "mismatch", "error", "crash", "timeout")
RTOL, ATOL = 1e-3, 1e-7  # onnx.backend.test's defaults

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


@dataclass
class CaseResult:
    case: str
    op: str
    status: str  # one of STATUSES
    kind: str = ""  # for errors: not-implemented / input / import / compile / run / output
    message: str = ""
    seconds: float = 0.0
    frozen: list[str] = field(default_factory=list)  # parameter inputs baked in as constants

    @property
    def vision(self) -> bool:
        return self.op in VISION_OPS


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


def _to_python(value):
    """A Relax VM result as numpy arrays and lists (tuples become lists: ONNX sequences)."""
    import numpy as np

    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (int, float, bool)):
        return np.array(value)
    return [_to_python(v) for v in value]


def compare_outputs(actual: list, expected: list) -> str:
    """'' when ``actual`` matches ``expected`` like ONNX's backend runner checks it, else why not."""
    import numpy as np

    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(actual, expected)):
        if isinstance(want, list):
            if not isinstance(got, list):
                return f"output {i}: a tensor where a sequence was expected"
            why = compare_outputs(got, want)
            if why:
                return f"output {i}: {why}"
            continue
        if want is None:
            if got is not None and not (isinstance(got, list) and not got):
                return f"output {i}: expected an empty optional"
            continue
        if isinstance(got, list):
            return f"output {i}: a sequence where a tensor was expected"
        want = np.asarray(want)
        got = np.asarray(got)
        if got.shape != want.shape:
            return f"output {i}: shape {list(got.shape)}, expected {list(want.shape)}"
        if want.dtype == object:
            if not np.array_equal(got.astype(str), want.astype(str)):
                return f"output {i}: strings differ"
            continue
        if got.dtype != want.dtype:
            return f"output {i}: dtype {got.dtype}, expected {want.dtype}"
        try:
            np.testing.assert_allclose(got.astype(np.float64) if got.dtype.kind == "V" else got,
                                       want.astype(np.float64) if want.dtype.kind == "V" else want,
                                       rtol=RTOL, atol=ATOL)
        except AssertionError as exc:
            detail = " ".join(ln.strip() for ln in str(exc).splitlines() if "Max" in ln)
            return f"output {i}: values differ ({detail or 'mismatch'})"
        except TypeError as exc:
            return f"output {i}: cannot compare ({exc})"
    return ""


def run_case(case: str, workdir: str) -> CaseResult:
    """Import, compile and run one case with edgepack's library functions; compare the outputs."""
    import numpy as np
    import tvm
    from tvm import relax

    from edgepack.backends import get_backend
    from edgepack.errors import EdgepackError
    from edgepack.frontends import import_model
    from edgepack.frontends.onnx_ops import from_container, to_container

    case_dir = node_test_dir() / case
    started = time.perf_counter()
    model, inputs, expected = load_case(case_dir)
    op = main_operator(model, case)

    frozen = freeze_parameter_inputs(model, inputs)

    def result(status: str, kind: str = "", message: str = "") -> CaseResult:
        return CaseResult(case, op, status, kind, message.strip()[:300], round(time.perf_counter() - started, 2),
                          frozen)

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
    try:
        imported = import_model(model_path, shapes)
    except EdgepackError as exc:
        text = str(exc)
        kind = "not-implemented" if ("cannot compile" in text or "not supported for frontend" in text
                                     or "not implemented" in text.lower()) else "import"
        return result("error", kind, text)
    except Exception as exc:  # noqa: BLE001 - anything else is a bug in the import path; record it
        return result("error", "import", f"{type(exc).__name__}: {exc}")
    try:
        executable = get_backend("cpu").build(imported, tvm.target.Target({"kind": "llvm"})).executable
    except Exception as exc:  # noqa: BLE001
        return result("error", "compile", str(exc))
    try:
        vm = relax.VirtualMachine(executable, tvm.cpu())
        # np.require, not ascontiguousarray: the latter turns 0-d arrays into 1-d ones
        # sub-byte types (int4, float4...) cross the compiled model's boundary in 8-bit containers
        args = [tvm.runtime.tensor(np.require(to_container(inputs[spec.name]), requirements="C"))
                for spec in imported.inputs]
        out = _to_python(vm["main"](*args))
    except Exception as exc:  # noqa: BLE001
        return result("error", "run", f"{type(exc).__name__}: {_last_line(str(exc))}")
    actual = out if len(expected) > 1 and isinstance(out, list) else [out]
    actual = [from_container(a, str(e.dtype)) if isinstance(a, np.ndarray) and isinstance(e, np.ndarray) else a
              for a, e in zip(actual, expected)]
    why = compare_outputs(actual, expected)
    return result("mismatch", "output", why) if why else result("pass")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else text


# --- the workers ---------------------------------------------------------------------------------


def _worker(conn) -> None:
    # Keep TVM's and the frontend's prints out of the report; results travel through the pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import warnings

    warnings.simplefilter("ignore")
    import tempfile

    import tvm  # noqa: F401 - imported once per worker, not once per case

    workdir = tempfile.mkdtemp(prefix="edgepack-conformance-")
    while True:
        case = conn.recv()
        if case is None:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
            return
        if case == CRASH_CASE:  # the tests' way to check that a dying worker cannot end the run
            os._exit(3)
        try:
            res = run_case(case, workdir)
        except Exception as exc:  # noqa: BLE001 - the runner itself must not die on a case
            res = CaseResult(case, "?", "error", "runner", f"{type(exc).__name__}: {exc}")
        conn.send(asdict(res))


@dataclass
class _Slot:
    proc: mp.Process
    conn: object
    case: str | None = None
    since: float = 0.0
    done: int = 0


@dataclass
class Run:
    results: dict[str, CaseResult] = field(default_factory=dict)


def run_cases(cases: list[str], jobs: int, timeout: float, on_result, recycle: int = 150) -> None:
    """Run ``cases`` on ``jobs`` workers; ``on_result(CaseResult)`` for each, in completion order."""
    ctx = mp.get_context("spawn")

    def start() -> _Slot:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent)

    def stop(slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(5)
        slot.conn.close()

    pending = list(reversed(cases))
    slots = [start() for _ in range(max(1, min(jobs, len(cases))))]
    try:
        while pending or any(s.case for s in slots):
            for i, slot in enumerate(slots):
                if slot.case is None and pending:
                    if slot.done >= recycle:  # long-lived workers grow; start a fresh one now and then
                        stop(slot)
                        slot = slots[i] = start()
                    slot.case, slot.since = pending.pop(), time.monotonic()
                    slot.conn.send(slot.case)
            busy = [s for s in slots if s.case]
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=1.0)
            now = time.monotonic()
            for i, slot in enumerate(slots):
                if slot.case is None:
                    continue
                if slot.conn in ready:
                    try:
                        data = slot.conn.recv()
                    except (EOFError, OSError):
                        data = None
                    if data is not None:
                        on_result(CaseResult(**data))
                        slot.case, slot.done = None, slot.done + 1
                        continue
                if slot.proc.sentinel in ready or not slot.proc.is_alive():
                    code = slot.proc.exitcode
                    on_result(CaseResult(slot.case, _op_of(slot.case), "crash", "worker",
                                         f"worker died (exit code {code})", round(now - slot.since, 2)))
                    stop(slot)
                    slots[i] = start()
                elif now - slot.since > timeout:
                    on_result(CaseResult(slot.case, _op_of(slot.case), "timeout", "worker",
                                         f"no result after {timeout:.0f} s", round(now - slot.since, 2)))
                    stop(slot)
                    slots[i] = start()
    finally:
        for slot in slots:
            try:
                slot.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            slot.proc.join(2)
            stop(slot)


def _op_of(case: str) -> str:
    import onnx

    try:
        return main_operator(onnx.load(str(node_test_dir() / case / "model.onnx")), case)
    except Exception:  # noqa: BLE001
        return "?"


# --- reporting -----------------------------------------------------------------------------------


def summarise(results: list[CaseResult]) -> dict:
    counts = Counter(r.status for r in results)
    vision = [r for r in results if r.vision]
    per_op: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        per_op[r.op][r.status] += 1
    kinds = Counter(f"{r.status}:{r.kind}" for r in results if r.status != "pass")
    return {
        "total": len(results),
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "vision": {"total": len(vision), "pass": sum(r.status == "pass" for r in vision)},
        "per_op": {op: dict(c) for op, c in sorted(per_op.items())},
        "failure_kinds": dict(kinds.most_common()),
        "pass_with_frozen_parameters": sum(r.status == "pass" and bool(r.frozen) for r in results),
        "case_seconds": round(sum(r.seconds for r in results), 1),
    }


def machine_line() -> str:
    from importlib.metadata import version

    return (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores), Python {platform.python_version()}, "
            f"apache-tvm {version('apache-tvm')}, onnx {version('onnx')}, onnxruntime {version('onnxruntime')}")


def print_report(results: list[CaseResult], summary: dict, show_failures: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    table = Table(title="ONNX node tests by operator", title_justify="left")
    for col in ("operator", "cases", "pass", "mismatch", "error", "crash", "timeout"):
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
    console.print(f"[bold]{summary['total']} cases:[/] [green]{c['pass']} pass[/], {c['mismatch']} mismatch, "
                  f"{c['error']} error, {c['crash']} crash, {c['timeout']} timeout.  Vision subset (*): "
                  f"{summary['vision']['pass']}/{summary['vision']['total']} pass.", highlight=False)


def write_markdown(path: Path, results: list[CaseResult], summary: dict, seconds: float, pattern: str | None) -> None:
    c = summary["counts"]
    lines = [
        "# ONNX backend node tests through edgepack",
        "",
        "Written by `python scripts/onnx_conformance.py --markdown docs/conformance.md`: every non-expanded",
        "node case shipped in the onnx wheel, imported, compiled for the host and run through edgepack's own",
        "path, outputs compared with the shipped ones (same shape and dtype, rtol 1e-3, atol 1e-7).",
        "",
        (f"- Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; import + compile + run time summed over"
         f" the cases {summary['case_seconds'] / 60:.1f} min (`--jobs` workers share it)"),
        f"- Machine: {machine_line()}",
        f"- Cases: {summary['total']}" + (f" (filter `{pattern}`)" if pattern else ""),
        f"- **pass {c['pass']}**, mismatch {c['mismatch']}, error {c['error']}, crash {c['crash']}, timeout {c['timeout']}",
        f"- Vision subset (operators marked *): {summary['vision']['pass']} / {summary['vision']['total']} pass",
        (f"- {summary['pass_with_frozen_parameters']} of the passes feed parameter inputs (axes, sizes/scales,"
         " pads, k, split sizes, ...) as constants, as deployable models carry them (see PARAMETER_INPUTS in the"
         " script); the rest pass with every input given at run time"),
        "",
        "Notes on what the numbers mean:",
        "- Sub-byte types (INT4, UINT4, INT2, UINT2, FLOAT4E2M1) cross the compiled model's boundary in 8-bit",
        "  containers, one value per byte (`edgepack.frontends.onnx_ops.to_container` / `from_container`): TVM",
        "  tensors must be whole bytes. The comparison is on the values.",
        "- Out of reach by design: string tensors (TVM has no string type), ImageDecoder, sequence/optional",
        "  values as model inputs, and random operators (Bernoulli, Dropout in training mode), whose outputs",
        "  cannot match a recorded sample.",
        "",
        "| operator | cases | pass | mismatch | error | crash | timeout |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op, cnt in summary["per_op"].items():
        lines.append(f"| {op}{' *' if op in VISION_OPS else ''} | {sum(cnt.values())} | "
                     + " | ".join(str(cnt.get(s, 0)) for s in STATUSES) + " |")
    lines += ["", "## Cases that do not pass", "", "| case | status | why |", "|---|---|---|"]
    for r in sorted(results, key=lambda r: r.case):
        if r.status != "pass":
            why = r.message.replace("|", "\\|").replace("\n", " ")[:140]
            lines.append(f"| {r.case} | {r.status} ({r.kind}) | {why} |")
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def _write_json(path: Path, results: dict[str, CaseResult], summary: dict | None) -> None:
    data = {"summary": summary, "results": [asdict(r) for r in sorted(results.values(), key=lambda r: r.case)]}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", help="only cases whose name matches this regular expression")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per case (default 180)")
    parser.add_argument("--json", type=Path, help="write per-case results here (kept up to date while running)")
    parser.add_argument("--resume", action="store_true", help="skip the cases already in the --json file")
    parser.add_argument("--markdown", type=Path, help="write the summary as Markdown (e.g. docs/conformance.md)")
    parser.add_argument("--failures", action="store_true", help="list every case that does not pass")
    args = parser.parse_args(argv)

    cases = list_cases(args.filter)
    results: dict[str, CaseResult] = {}
    if args.resume and args.json and args.json.exists():
        known = json.loads(args.json.read_text())["results"]
        results = {r["case"]: CaseResult(**r) for r in known if r["case"] in set(cases)}
    todo = [c for c in cases if c not in results]
    print(f"{len(cases)} cases, {len(todo)} to run on {args.jobs} worker(s)", flush=True)
    started = time.perf_counter()
    last_save = [time.monotonic()]

    def on_result(res: CaseResult) -> None:
        results[res.case] = res
        mark = {"pass": ".", "mismatch": "M", "error": "E", "crash": "C", "timeout": "T"}[res.status]
        print(mark, end="" if len(results) % 80 else "\n", flush=True)
        if args.json and time.monotonic() - last_save[0] > 20:
            _write_json(args.json, results, None)
            last_save[0] = time.monotonic()

    run_cases(todo, args.jobs, args.timeout, on_result)
    print(flush=True)
    ordered = [results[c] for c in cases if c in results]
    summary = summarise(ordered)
    if args.json:
        _write_json(args.json, results, summary)
    print_report(ordered, summary, args.failures)
    if args.markdown:
        write_markdown(args.markdown, ordered, summary, time.perf_counter() - started, args.filter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
