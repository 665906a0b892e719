"""``edgepack tune`` and ``edgepack tuning show``: thin commands over :mod:`edgepack.tuning`
(mounted by :mod:`edgepack.cli`), with their progress display and tables."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

import edgepack
from edgepack.cli import common, render
from edgepack.cli.common import InputShapeOption, InventoryOption, JsonOption, print_json
from edgepack.dims import parse_size_values
from edgepack.errors import EdgepackError
from edgepack.tuning import format_duration, parse_duration, signals

tuning_app = typer.Typer(help="Look at tuning directories made by `edgepack tune`.", no_args_is_help=True)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


# ---------------------------------------------------------------------------------------------
# progress


class TuningDisplay:
    """Renders :class:`~edgepack.tuning.TuningProgress` snapshots.

    In a terminal: an overall bar (trials, estimated kernel time, elapsed, time left) and one bar per
    task (trials, best latency, share of model time). Elsewhere: one line per finished batch on stderr.
    """

    def __init__(self, quiet: bool = False, max_rows: int = 20) -> None:
        self.quiet = quiet
        self.max_rows = max_rows
        self.live = not quiet and render.console.is_terminal
        self.progress: Progress | None = None
        self.overall: TaskID | None = None
        self.rows: dict[int, TaskID] = {}

    def __enter__(self):
        if self.live:
            self.progress = Progress(
                TextColumn("{task.description}", justify="left"),
                BarColumn(bar_width=28),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                console=render.console,
                refresh_per_second=4,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def step(self, message: str) -> None:
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.console.print(f"[dim]•[/] {message}", highlight=False)
        else:
            render.err_console.print(f"[dim]•[/] {message}", highlight=False)

    def update(self, snap) -> None:
        if self.quiet:
            return
        eta = f"left {format_duration(snap.eta_s)}" if snap.eta_s is not None else ""
        if snap.time_budget_s is not None:
            eta += f" (budget {format_duration(max(0.0, snap.time_budget_s - snap.seconds_total))})"
        known = [t.best_seconds * t.weight for t in snap.tasks if t.best_seconds is not None]
        total_info = f"kernels ≈ {sum(known) * 1e3:.2f} ms" if known else ""
        if self.progress is None:
            if snap.last_task is not None:
                task = snap.tasks[snap.last_task]
                render.err_console.print(
                    f"[trials {snap.trials}/{snap.trials_budget}] {task.name}: {task.trials} trials, best "
                    f"{_ms(task.best_seconds)} ms; {total_info}; {eta}".rstrip("; "), highlight=False)
            return
        progress = self.progress
        if self.overall is None:
            self.overall = progress.add_task("[bold]all tasks[/]", total=snap.trials_budget, info="", eta="")
        progress.update(self.overall, completed=min(snap.trials, snap.trials_budget), info=total_info, eta=eta)
        weighted = {i: t.best_seconds * t.weight for i, t in enumerate(snap.tasks) if t.best_seconds is not None}
        total = sum(weighted.values()) or 1.0
        touched = [i for i, t in enumerate(snap.tasks) if t.trials or i == snap.current_task]
        shown = set(sorted(touched, key=lambda i: (i != snap.current_task, -weighted.get(i, 0.0)))[: self.max_rows])
        for i in touched:
            task = snap.tasks[i]
            share = _pct(weighted[i] / total) if i in weighted else ""
            info = f"best {_ms(task.best_seconds)} ms  {share:>6}"
            done = task.finished and task.tuning and not snap.finished
            limit = task.cap if task.cap is not None else (task.trials if done or snap.finished else None)
            mark = "[bold cyan]→[/]" if i == snap.current_task and not snap.finished else " "
            name = task.name if len(task.name) <= 32 else task.name[:31] + "…"
            if i not in self.rows:
                self.rows[i] = progress.add_task("", total=limit, info="", eta="")
            progress.update(self.rows[i], description=f"{mark} {name}", completed=task.trials, total=limit,
                            info=info, eta="[green]done[/]" if done else "", visible=i in shown)


# ---------------------------------------------------------------------------------------------
# tables


def tuning_table(summary, title: str | None = None, limit: int | None = None, tried_only: bool = False) -> None:
    meta = summary.meta
    table = Table(title=title or f"Tuning of {meta.model_name} for {meta.profile} ({summary.directory})",
                  title_justify="left")
    tasks = sorted(summary.tasks, key=lambda t: (-(t.share or 0.0), t.best_seconds is None, t.name))
    candidates = [t for t in tasks if t.trials] if tried_only else tasks
    shown = candidates if limit is None else candidates[:limit]
    rows = []
    for t in shown:
        speedup = ("default*" if t.lost_in_model else "default") if t.best_seconds is not None and not t.tuned \
            else (f"{t.speedup:.2f}x" if t.speedup else "-")
        rows.append([t.name, str(t.weight), str(t.trials), str(t.failed) if t.failed else "",
                     _ms(t.default_seconds), _ms(t.best_seconds), speedup,
                     f"{t.gflops:.1f}" if t.gflops else "-", _pct(t.share)])
    if len(shown) < len(tasks):
        rest = [t for t in tasks if t not in shown]
        untried = sum(not t.trials for t in rest)
        label = f"… {len(rest)} more" + (f" ({untried} without trials)" if untried else "")
        rows.append([label, "", str(sum(t.trials for t in rest)), "", "", "", "", "", ""])
    # numbers keep their width (headers take two lines); a long kernel name is cut to what is left
    headers = ["task", "weight", "trials", "failed", "default\nms", "best\nms", "speed\nup", "GFLOP\n/s", "share"]
    if not any(row[3] for row in rows):  # no failed trial: no column for them
        headers.pop(3)
        rows = [row[:3] + row[4:] for row in rows]
    widths = [max([len(line) for line in head.split("\n")] + [len(row[i]) for row in rows])
              for i, head in enumerate(headers)]
    room = render.console.width - sum(widths[1:]) - 3 * len(headers) - 1
    for i, head in enumerate(headers):
        if i == 0:
            table.add_column(head, no_wrap=True, overflow="ellipsis", max_width=max(10, room))
        else:
            table.add_column(head, justify="right", no_wrap=True, min_width=widths[i])
    for row in rows:
        table.add_row(*row)
    render.console.print(table)
    estimate = summary.estimated_seconds
    untuned = len(summary.tasks) - summary.tuned_tasks
    line = (f"{summary.trials} trials; {summary.tuned_tasks}/{len(summary.tasks)} tasks have a record faster "
            f"than their default schedule; tuned for {format_duration(summary.seconds)} in {summary.runs} run(s)")
    if estimate is not None:
        line += f"; sum of kernel times {estimate * 1e3:.2f} ms"
    defaults = [t.default_seconds * t.weight for t in summary.tasks if t.default_seconds is not None]
    if len(defaults) == len(summary.tasks) and defaults:
        line += f" (default schedules: {sum(defaults) * 1e3:.2f} ms)"
    if untuned:
        line += f"; {untuned} task(s) keep their default schedule"
    lost = sum(t.lost_in_model for t in summary.tasks)
    if lost:
        line += (f" (*: {lost} of them have a record faster alone that ran slower inside the model, "
                 "checked after the last run)")
    render.console.print(line, highlight=False)


def tuning_result(result, model: Path | None = None, input_shapes: list[str] | None = None,
                  profile: str | None = None) -> None:
    tuning_table(result.summary, limit=25, tried_only=True)
    why = {"trials": "the trial budget is used", "time": "the time budget is used",
           "tasks": "every task has its trials or ran out of candidates",
           "nothing to do": "nothing was left to do", "interrupted": "it was interrupted"}.get(result.stopped, result.stopped)
    text = (f"[green]✓[/] {result.trials_run} new trials in {format_duration(result.seconds)} "
            f"(on {result.on}); stopped because {why}")
    if result.skipped:
        text += f"; {result.skipped} candidate(s) already measured were answered from the records"
    render.console.print(text, highlight=False)
    if result.lost:
        render.console.print(f"[yellow]{result.lost} measurement(s) were lost to a dropped device or link and not "
                             "recorded; rerun the same command to measure them.[/]", highlight=False)
    shapes = "".join(f" --input-shape {spec}" for spec in input_shapes or ())
    render.console.print(f"Compile with them: [bold]edgepack compile {model or 'MODEL'} --profile "
                         f"{profile or result.summary.meta.profile}{shapes} --tuning {result.directory}[/]",
                         highlight=False)


# ---------------------------------------------------------------------------------------------
# commands


def tune(
    model: Annotated[Path, typer.Argument(help="An .onnx or .tflite model.")],
    profile: Annotated[str, typer.Option("--profile", "-p", help="Device profile (see `edgepack profiles`).")] = "host",
    on: Annotated[str, typer.Option("--on", help="Where candidates are measured: host (host profiles), host-opencl (OpenCL "
                                                 "profiles, on this machine's OpenCL device), a device of the "
                                                 "inventory, or farm:PROFILE (every device of the running farm).")] = "host",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Tuning directory; an existing one for the same "
                                                                       "model and target is resumed "
                                                                       "\\[default: tuning/PROFILE-MODEL].")] = None,
    trials: Annotated[int, typer.Option("--trials", "-n", help="Total measurements for the directory (earlier runs "
                                                               "count).")] = 1000,
    time_budget: Annotated[str | None, typer.Option("--time-budget", "-t", metavar="DURATION",
                                                    help="Total tuning time for the directory, e.g. 30m, 1h30m "
                                                         "(earlier runs count).")] = None,
    max_trials_per_task: Annotated[int | None, typer.Option("--max-trials-per-task", help="Cap on any one task's "
                                                                                          "measurements.")] = None,
    batch: Annotated[int, typer.Option("--batch", help="Candidates per measurement batch (records are written "
                                                       "after each batch).")] = 16,
    task: Annotated[list[str] | None, typer.Option("--task", help="Only tune tasks whose names contain this (repeat "
                                                                  "for several).")] = None,
    input_shape: InputShapeOption = None,
    tune_size: Annotated[list[str] | None, typer.Option(
        "--tune-size", metavar="NAME=SIZE",
        help="Tune a model whose --input-shape names a dimension (x:1,3,48,W) at this size; a build with --dim "
             "W=MIN..MAX and --tuning applies the records across its range.")] = None,
    num_cores: Annotated[int | None, typer.Option("--num-cores", help="Cores of the device the schedules are for "
                                                                      "\\[default: this machine's for host, else the "
                                                                      "profile's or 4].")] = None,
    inventory: InventoryOption = None,
    as_json: JsonOption = False,
) -> None:
    """Tune a model's kernels with MetaSchedule; rerun the same command to resume after any interruption."""
    budget = parse_duration(time_budget)
    if not signals.enter_relayed() and signals.can_relay() and common.ENTRY_ARGV is not None:
        # tunes in a process of its own, so that no Ctrl-C is lost
        raise typer.Exit(signals.relay(common.ENTRY_ARGV, _say_after_kill))
    output = output or Path("tuning") / f"{profile}-{model.stem}"
    try:
        with TuningDisplay(quiet=as_json) as display:
            result = edgepack.tune(model, profile, output, on=on, trials=trials, time_budget_s=budget,
                                max_trials_per_task=max_trials_per_task, trials_per_batch=batch, only=task,
                                input_shapes=edgepack.parse_input_shapes(input_shape) or None,
                                tune_sizes=parse_size_values(tune_size), num_cores=num_cores,
                                inventory=inventory, on_progress=display.update, log=display.step)
    except KeyboardInterrupt:
        kept = ""
        try:
            kept = f"{edgepack.load_tuning(output).trials} records are kept in {output}. "
        except EdgepackError:
            pass
        render.error(EdgepackError("Tuning was interrupted.", f"{kept}Rerun the same command to resume."))
        sys.exit(130)
    if as_json:
        print_json(result.to_dict())
    else:
        tuning_result(result, model, input_shape, profile)
    if result.stopped == "interrupted":
        render.error(EdgepackError("Tuning was interrupted.",
                                   f"{result.summary.trials} records are kept in {output}. "
                                   "Rerun the same command to resume."))
        raise typer.Exit(130)


@tuning_app.command("show")
def tuning_show(
    directory: Annotated[Path, typer.Argument(help="A tuning directory made by `edgepack tune`.")],
    as_json: JsonOption = False,
) -> None:
    """Per task: best latency, trials, and share of model time; and what the records were made for."""
    summary = edgepack.load_tuning(directory)
    if as_json:
        print_json(summary.to_dict())
        return
    meta = summary.meta
    head = Table(show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("model", f"{meta.model_name}  sha256 {meta.model_sha256[:16]}…")
    head.add_row("inputs", ", ".join(f"{t['name']} {t['dtype']} [{', '.join(str(d) for d in t['shape'])}]"
                                     for t in meta.inputs))
    head.add_row("profile", meta.profile)
    head.add_row("target", " ".join(f"{k}={v}" for k, v in meta.tuning_target.items() if k not in ("keys", "tag")))
    head.add_row("TVM", meta.tvm_version)
    render.console.print(head)
    tuning_table(summary)
    if summary.ignored_lines:
        render.console.print(f"[yellow]{summary.ignored_lines} torn or unreadable line(s) were skipped; the next "
                             "`edgepack tune` into this directory repairs them.[/]")


def _say_after_kill(line: str) -> None:
    """The relay's word after it killed the tuning process mid-way through a line of its progress display,
    which had hidden the cursor."""
    if render.console.is_terminal:
        render.console.show_cursor(True)
        render.console.line()
    render.err_console.print(line, highlight=False)
