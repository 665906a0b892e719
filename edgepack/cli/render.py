"""How results look in a terminal (rich tables, progress, errors). No logic lives here."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from edgepack.backends import backend_for
from edgepack.errors import EdgepackError
from edgepack.inspection import LibrarySizes

console = Console()
err_console = Console(stderr=True)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shape(shape) -> str:
    """``[1, 3, 224, 224]``, escaped: rich would take ``[batch, seq]`` (all dimensions named) for markup."""
    return escape("[" + ", ".join(str(d) for d in shape) + "]")


def error(exc: EdgepackError) -> None:
    text = f"[bold red]Error:[/] {escape(exc.message)}"  # messages name TOML tables ([limits]): not markup
    if exc.hint:
        text += f"\n[bold]Fix:[/] {escape(exc.hint)}"
    err_console.print(Panel(text, border_style="red", expand=False), highlight=False)


@contextmanager
def steps(quiet: bool = False) -> Iterator:
    """A spinner that shows the current step of a long operation, and ticks off finished ones."""
    if quiet or not console.is_terminal:
        def plain(msg: str) -> None:
            if not quiet:
                err_console.print(f"[dim]•[/] {msg}", highlight=False)

        yield plain
        return
    current: dict = {"msg": None, "t": 0.0}
    with console.status("") as status:
        def step(msg: str) -> None:
            if current["msg"]:
                console.print(f"[green]✓[/] {current['msg']} [dim]({time.perf_counter() - current['t']:.1f}s)[/]",
                              highlight=False)
            current["msg"], current["t"] = msg, time.perf_counter()
            status.update(f"{msg} …")

        try:
            yield step
        finally:
            if current["msg"]:
                console.print(f"[green]✓[/] {current['msg']} [dim]({time.perf_counter() - current['t']:.1f}s)[/]",
                              highlight=False)


def profiles_table(profiles) -> None:
    table = Table(title="Device profiles", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("backend")
    table.add_column("triple", no_wrap=True)
    table.add_column("cpu / gpu", no_wrap=True)
    table.add_column("status", no_wrap=True)
    # on a narrow terminal the descriptions go under the table instead of wrapping a word per line
    wide = console.width >= 140
    if wide:
        table.add_column("description")
    notes = []
    for p in profiles:
        status = "[green]supported[/]"
        if p.status != "supported":
            notes.append(f"[yellow]{p.name}[/]: {p.status_note or p.status}")
            status = f"[yellow]{p.status}[/]"
        chip = p.target.get("mcpu") or p.target.get("device") or "generic"
        table.add_row(p.name, p.backend, p.triple, chip, status, *([p.description] if wide else []))
    console.print(table)
    if not wide:
        for p in profiles:
            console.print(f"[bold]{p.name}[/]: {p.description}", highlight=False)
    for note in notes:
        console.print(note, highlight=False)


def library_lines(sizes) -> list[tuple[str, str]]:
    """(what, text) lines for a build's ``inspection.LibrarySizes``: the device library as its constants
    (weights) and the rest, against the model file; the memory a run allocates."""
    text = f"{_size(sizes.library_bytes)} ({sizes.library_bytes / max(sizes.model_bytes, 1):.2f}x the model's " \
           f"{_size(sizes.model_bytes)})"
    constants = sizes.constants
    if constants is not None:
        largest = ", ".join(f"{dtype} {_shape(shape)} {_size(n)}" for dtype, shape, n in constants.largest)
        text += f": constants {_size(constants.bytes)} in {constants.count} tensors" + (f" (largest {largest})" if largest else "")
        if constants.bytes < sizes.library_bytes:
            text += f", kernels and program {_size(sizes.library_bytes - constants.bytes)}"
        else:  # mostly zeros: the program is stored compressed (toolchain/packed_kernels.py), decoded at load
            text += ", stored compressed with the program (decoded when the library is loaded)"
    lines = [("library size", text)]
    if sizes.run_memory is not None:
        lines.append(("run memory", (f"{_size(sizes.run_memory)} (intermediate tensors as memory planning packed "
                                     "them, and outputs; at the largest sizes)")))
    return lines


def build_program(build) -> None:
    """What a build's program takes and returns (``inspect BUILD``), with its compiled-in processing."""
    table = Table(title=f"The build {build.build_dir} ({build.profile}) takes and returns", title_justify="left")
    for col in ("", "name", "dtype", "shape", "processing"):
        table.add_column(col, overflow="fold")
    for kind, specs in (("input", build.inputs), ("output", build.outputs)):
        for t in specs:
            table.add_row(kind, t.name, t.dtype, _shape(t.shape), escape(build.described.get(t.name, "")))
    console.print(table)
    for setting in build.settings:
        console.print(f"  compiled in: {escape(setting)}", highlight=False)
    for dim in build.dims:
        console.print(f"  runs at every size {escape(dim)} (one program; '?' output extents follow it)", highlight=False)
    console.print(f"  precision: {_precision(build.precision)}", highlight=False)
    if build.cpu_operators:
        console.print(f"  on the device's CPU (no exact GPU form): {escape(', '.join(build.cpu_operators))}",
                      highlight=False)
    for what, text in library_lines(build.library) if build.library else ():
        console.print(f"  {what}: {text}", highlight=False)


def model_info(info, ir_text=None) -> None:
    console.print(f"[bold]{info.path}[/]  {info.format.upper()}"
                  + (f" opset {info.opset}" if info.opset else "") + f"  sha256 {info.sha256[:16]}…")
    table = Table(title="Inputs and outputs", title_justify="left")
    for col in ("", "name", "dtype", "shape"):
        table.add_column(col)
    for kind, specs in (("input", info.inputs), ("output", info.outputs)):
        for t in specs:
            dyn = " [yellow](dynamic)[/]" if not t.is_static else ""
            table.add_row(kind, t.name, t.dtype, _shape(t.shape) + dyn)
    console.print(table)
    ops = Table(title=f"Operators ({sum(info.operator_counts.values())} nodes)", title_justify="left")
    ops.add_column("operator")
    ops.add_column("count", justify="right")
    ops.add_column("edgepack")
    for op, n in info.operator_counts.items():
        ok = op not in info.unsupported_operators
        ops.add_row(op, str(n), "[green]supported[/]" if ok else "[bold red]unsupported[/]")
    console.print(ops)
    support = info.support_summary()
    console.print(f"{support['supported_operators']} of {support['operators']} operator types supported"
                  f" ({support['supported_nodes']} of {support['nodes']} nodes).", highlight=False)
    if info.unsupported_operators:
        listing = ", ".join(f"{op} (x{n})" for op, n in info.unsupported_operators.items())
        console.print(f"[bold red]Unsupported operators:[/] {listing}")
    else:
        console.print("[green]Every operator is supported.[/]")
    if ir_text:
        before, after = ir_text
        console.rule("Relax IR before fusion")
        console.print(before, markup=False, highlight=False)
        console.rule("Relax IR after fusion")
        console.print(after, markup=False, highlight=False)


def _precision(precision: str, accumulate: str | None = None) -> str:
    if precision != "fp16":
        return precision
    sums = f", products summed in {accumulate}" if accumulate else ""
    return f"fp16 (weights and activations in half precision{sums}; inputs and outputs float32)"


def compile_summary(result) -> None:
    m = result.manifest
    table = Table(title=f"Compiled {m.model_source.rsplit('/', 1)[-1]} for {m.profile_name}", title_justify="left",
                  show_header=False)
    table.add_column("")
    table.add_column("")
    table.add_row("output", str(result.output_dir))
    table.add_row("target", f"{m.target.get('kind')} {m.target.get('mtriple', '')} {m.target.get('mcpu', '')}".strip())
    described = {**(m.processing or {}).get("inputs", {}), **(m.processing or {}).get("outputs", {})}
    for kind, specs in (("input", m.inputs), ("output", m.outputs)):
        for spec in specs:
            note = f"\n  {escape(described[spec.name])}" if spec.name in described else ""
            table.add_row(kind, f"{spec.name} {spec.dtype} {_shape(spec.shape)}{note}")
    table.add_row("precision", _precision(m.precision, m.profile.get("precision", {}).get("accumulate", "fp32")))
    for name, r in (m.dims or {}).items():
        step = f" in steps of {r['step']}" if r["step"] != 1 else ""
        table.add_row("dim", f"{name} from {r['min']} to {r['max']}{step} (memory planned for {r['max']})")
    for key, art in m.artifacts.items():
        table.add_row(key.replace("_", " "), f"{art.path}  {_size(art.size)}")
    for what, text in library_lines(LibrarySizes.of(m)):
        table.add_row(what, text)
    backend = backend_for(m)
    for line in backend.summary_lines(m):
        table.add_row(backend.name, line)
    table.add_row("toolchain", m.toolchain["version"])
    table.add_row("TVM", m.tvm_version)
    table.add_row("time", f"{m.compile_seconds:.1f} s")
    console.print(table)


def validation_report(report) -> None:
    atol = f"{report.atol:g}" + (" of each output's largest value" if report.atol_scaled else "")
    table = Table(title=f"Validation of {report.build_dir} on {report.on} vs {report.reference}"
                        f" (atol {atol}, rtol {report.rtol:g})", title_justify="left")
    for col in ("output", "shape", "max abs err", "max rel err", "mismatched", "result"):
        table.add_column(col, justify="right" if "err" in col or col == "mismatched" else "left",
                         no_wrap=col != "output")
    for o in report.outputs:
        table.add_row(o.name, _shape(o.shape), f"{o.max_abs_error:.3g}", f"{o.max_rel_error:.3g}",
                      str(o.mismatched), "[green]PASS[/]" if o.passed else "[bold red]FAIL[/]")
    console.print(table)
    if report.sizes:
        console.print("sizes run (each compared; errors above are the largest of them): "
                      + "; ".join(", ".join(f"{k}={v}" for k, v in size.items()) for size in report.sizes),
                      highlight=False)
    for o in report.outputs:
        if o.step is not None:
            console.print(f"{o.name}: quantized, values within one step ({o.step:.3g}) of the reference pass",
                          highlight=False)
    for o in report.outputs:
        if o.problem:
            console.print(f"[bold red]{o.name}[/]: {o.problem}", highlight=False)
    for o in report.outputs:
        if o.degenerate:
            console.print(f"[yellow]warning[/]: the reference output {o.name!r} is degenerate ({o.degenerate}); "
                          "a wrong build could pass on it. Validate with inputs that give a decisive output "
                          "(--inputs inputs.npz, or another --seed).", highlight=False)
    if report.passed:
        console.print(f"[bold green]PASS[/] all {len(report.outputs)} outputs match the reference"
                      + (f" on {report.inputs}." if report.inputs else "."), highlight=False)
    else:
        failed = sum(not o.passed for o in report.outputs)
        console.print(f"[bold red]FAIL[/] {failed} of {len(report.outputs)} outputs differ from the reference.")


def quantize_summary(result) -> None:
    table = Table(title=f"{result.output} ({result.method}, weights per {'channel' if result.per_channel else 'tensor'}; "
                        f"{result.calibration_samples} calibration, {result.held_out_samples} held-out sample(s))",
                  title_justify="left")
    for col in ("output", "max abs err", "mean abs err", "top-1 agreement"):
        table.add_column(col, justify="left" if col == "output" else "right")
    for o in result.outputs:
        table.add_row(o.name, f"{o.max_abs_error:.3g}", f"{o.mean_abs_error:.3g}",
                      "-" if o.top1_agreement is None else f"{o.top1_agreement:.0%}")
    console.print(table)
    if result.note:
        console.print(f"[yellow]note[/]: {result.note}", highlight=False)
    if result.kept_float:
        console.print(f"kept in float: {', '.join(result.kept_float)}", highlight=False)
    console.print(f"Wrote {result.output}; compile it with `edgepack compile {result.output}`.", highlight=False)


def doctor_table(checks) -> None:
    table = Table(title="edgepack doctor", title_justify="left")
    table.add_column("")
    table.add_column("piece", no_wrap=True)
    table.add_column("version", no_wrap=True)
    table.add_column("for")
    for c in checks:
        mark = "[green]✓[/]" if c.ok else ("[bold red]✗[/]" if c.required else "[yellow]–[/]")
        table.add_row(mark, c.name, c.version, c.purpose)
    console.print(table)
    for c in checks:
        if not c.ok and c.hint:
            console.print(f"[yellow]{c.name}[/]: {c.hint}", highlight=False)


def bundle_summary(bundle) -> None:
    table = Table(title=f"C bundle for {bundle.profile} ({bundle.triple})", title_justify="left")
    table.add_column("")
    table.add_column("", justify="right")
    table.add_column("")
    table.add_row("bundle", "", str(bundle.output_dir))
    model = [f for f in bundle.files if f.role == "model"]
    runtime = [f for f in bundle.files if f.role == "runtime"]
    for f in model + runtime:
        table.add_row(f.role, _size(f.size), f.path)
    for f in bundle.files:
        if f.role == "program":
            table.add_row("runner", _size(f.size), f.path)
    sizes = {f.path: f.size for f in bundle.files}
    model_so = sizes.get("lib/model.so", 0)
    runtime_so = sum(f.size for f in runtime if f.path.endswith(".so"))
    table.add_row("on the device", _size(model_so + runtime_so),
                  f"shared: model {_size(model_so)} + TVM runtime {_size(runtime_so)} ({bundle.runtime_origin})")
    if "bin/edgepack_run_static" in sizes:
        table.add_row("", _size(sizes["bin/edgepack_run_static"]), "static: one executable holding model and runtime")
    console.print(table)
    console.print(f"Build your program: [bold]cmake -S {bundle.output_dir} -B build-c "
                  f"-DCMAKE_C_COMPILER=<cross gcc> && cmake --build build-c[/]  (or `make CC=<cross gcc>`)",
                  highlight=False)


def run_outputs(specs, result, saved_to=None) -> None:
    import numpy as np

    table = Table(title=f"Outputs ({result.seconds:.2f} s)", title_justify="left")
    for col in ("output", "dtype", "shape", "min", "max", "first values"):
        table.add_column(col)
    for spec, array in zip(specs, result.outputs):
        flat = np.asarray(array).ravel()
        table.add_row(spec.name, str(array.dtype), _shape(array.shape), f"{flat.min():.4g}" if flat.size else "",
                      f"{flat.max():.4g}" if flat.size else "", " ".join(f"{v:.4g}" for v in flat[:4]))
    console.print(table)
    if saved_to:
        console.print(f"Saved to {saved_to}")
