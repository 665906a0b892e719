"""What every command shares: the ``--json`` and ``--input-shape`` options and JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts).")]
InputShapeOption = Annotated[
    list[str] | None,
    typer.Option("--input-shape", "-s", metavar="NAME:D0,D1,...",
                 help="Fix a dynamic input's shape, e.g. x:1,3,224,224; a dimension may name a --dim range "
                      "(x:1,3,48,W). Repeat for several inputs."),
]
DimOption = Annotated[
    list[str] | None,
    typer.Option("--dim", metavar="NAME=MIN..MAX[:STEP]",
                 help="A dimension that changes at run time, named in --input-shape: the build runs at every size "
                      "from MIN to MAX (in STEPs), e.g. --dim W=32..1280 or --dim H=320..640:32. Repeat per name."),
]
InventoryOption = Annotated[
    Path | None,
    typer.Option("--inventory", envvar="EDGEPACK_INVENTORY", metavar="PATH",
                 help="Device inventory (TOML) \\[default: ~/.config/edgepack/devices.toml]."),
]


#: The arguments ``edgepack`` was started with, set by the console entry point (``cli.main.main``); None
#: when the Typer app is called from Python. ``edgepack tune`` reruns itself with them (``tuning.signals``).
ENTRY_ARGV: list[str] | None = None


def print_json(data) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))

ThreadsOption = Annotated[
    int | None,
    typer.Option("--threads", "-t", min=1, metavar="N",
                 help="CPU threads for the model's parallel kernels \\[default: $TVM_NUM_THREADS, else every core; "
                      "on a device, its RPC server's own setting]."),
]
