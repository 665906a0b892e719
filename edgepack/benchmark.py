"""Benchmark a build where ``on`` says: this machine, a device over SSH, or a farm's devices."""

from __future__ import annotations

from pathlib import Path

from edgepack.devices.session import DEFAULT_RECONNECT_WINDOW, DEFAULT_SESSION_TIMEOUT
from edgepack.errors import EdgepackError
from edgepack.progress import Progress
from edgepack.run.places import parse_place
from edgepack.run.results import BenchResult


def bench(build_dir: Path | str, on: str = "host", *, repeat: int = 50, number: int = 1, warmup: int = 1,
          all_devices: bool = False, threads: int | None = None, inventory: Path | str | None = None,
          session_timeout: float = DEFAULT_SESSION_TIMEOUT, reconnect_window: float = DEFAULT_RECONNECT_WINDOW,
          progress: Progress | None = None) -> list[BenchResult | EdgepackError]:
    """Time ``main`` of a build: ``repeat`` samples, each the mean of ``number`` runs, after ``warmup``
    untimed runs, on seeded random inputs. Timing happens where the model runs (TVM's
    ``time_evaluator``), so no link latency is in it. One result per device; with ``all_devices`` every
    device of ``farm:PROFILE`` in turn, a device that fails giving its error instead. ``threads``: CPU
    threads of the run (None: here ``$TVM_NUM_THREADS``, else every core; on a device, its server's own)."""
    if repeat < 1 or number < 1 or warmup < 0:
        raise EdgepackError("--repeat and --number must be at least 1, and --warmup at least 0.",
                            "e.g. --repeat 50 --number 1 --warmup 1.")
    place = parse_place(on, inventory)
    return place.bench(Path(build_dir), repeat=repeat, number=number, warmup=warmup, all_devices=all_devices,
                       threads=threads, session_timeout=session_timeout, reconnect_window=reconnect_window, progress=progress)
